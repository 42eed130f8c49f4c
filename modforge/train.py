"""Entry point: ``python -m modforge.train [group=option ...] [key=value ...]``.

Thin on purpose: load the registry (built-ins and plugins), check the command
line, let Hydra compose, then build data, task and Trainer and fit. Any
:class:`~modforge.registry.ModforgeError` is printed as one line, with no traceback.
"""
import contextlib
import json
import math
import os
import sys
import time

_IMPORTED = time.perf_counter()  # `python -m modforge.train` imports this module first: the command's clock
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.builtins import load_all
from modforge.checkpoints import facts_state, find_checkpoint, init_config, load_matching, read_checkpoint
from modforge.cli import one_line_errors
from modforge.output import quiet, say
from modforge.config import (CONF_DIR, ROOT_KEYS, check_callbacks, check_loggers, check_overrides,
                             check_root_value, check_trainer_key, to_plain)
from modforge.launchers import (_HYDRA_VALUE_FLAGS, DECISION, announce, check_slots, hydra_value, job_argv,
                                launched_rank, rank0_decision, runs_elsewhere, slot_count)
from modforge.runs import RESUME_FREE_KEYS, RunDirTaken


def validate(cfg: DictConfig, here: bool = True) -> None:
    """Everything that can be checked before any work: every component group resolved to its typed config
    (values in range), task, model and data fitting together, the root keys' types, the Trainer's values
    (with ``here=False``, for jobs a cluster runs elsewhere, not those that depend on this machine's devices)."""
    typed = {g: registry.make_config(g, cfg[g]) for g in registry.group_kinds() if g in cfg}
    check_trainer_keys(cfg.trainer)
    check_callbacks(cfg.get("callbacks"))
    check_loggers(cfg.get("logger"))
    check_trainer_values(cfg.trainer, here)
    for key in ROOT_KEYS:
        check_root_value(key, cfg.get(key))
    for kind in registry.kinds():  # nested kinds (ffn.activation, data.tokenizer): their names, now
        where = registry.kind(kind).nested_in
        name = OmegaConf.select(cfg, where) if where else None
        if isinstance(name, str):
            registry.get(kind, name)
    if "data" in typed and hasattr(typed["data"][1], "tokenizer"):
        from modforge.data.tokenizers import make_tokenizer

        make_tokenizer(typed["data"][1])  # its keys (vocab_size, tokenizer_path) checked against the tokenizer
    if "optim" in typed and "scheduler" in typed:  # built once on a dummy parameter: their own checks, now
        import torch

        opt = registry.build("optim", cfg.optim, [torch.nn.Parameter(torch.zeros(1))])
        total = cfg.trainer.max_steps if cfg.trainer.max_steps > 0 else None
        d_model = getattr(typed.get("model", (None, None))[1], "d_model", 1)
        registry.build("scheduler", cfg.scheduler, opt, d_model=d_model, total_steps=total)
    if {"task", "model", "data"} <= set(typed):
        from modforge.tasks.base import check_fit

        check_fit(typed["task"][0], typed["model"][0], typed["data"][0])
    if "data" in typed:
        typed["data"][0].cls.check_files(typed["data"][1])
    if "data" in typed and "model" in typed:
        (data_entry, data), (_, model) = typed["data"], typed["model"]
        check_positions(data_entry.cls.max_positions(data), model.max_len, f"data={cfg.data.name}")
    if cfg.get("eval_block_sizes") and "data" in typed and not hasattr(typed["data"][1], "block_size"):
        raise registry.ConfigError(f"eval_block_sizes={list(cfg.eval_block_sizes)}: data={cfg.data.name} has no "
                                   "block_size (evaluating at other lengths needs language-modelling data cut "
                                   "into windows: stdlib, tinyshakespeare, text, hf)")


def check_trainer_values(t: Any, here: bool = True) -> None:
    """The Trainer values that Lightning or torch would only reject after data preparation, or never; with
    ``here=False`` not those that depend on this machine's devices (a login node has no GPU)."""
    def bad(key: str, why: str) -> None:
        raise registry.ConfigError(f"trainer.{key}={t.get(key)}: {why}")

    ms = t.get("max_steps")
    if not isinstance(ms, int) or isinstance(ms, bool) or not (ms >= 1 or ms == -1):
        bad("max_steps", "a positive number of optimizer steps (or -1: no limit, then set max_epochs)")
    agb = t.get("accumulate_grad_batches")
    if not isinstance(agb, int) or isinstance(agb, bool) or agb < 1:
        bad("accumulate_grad_batches", "an integer >= 1")
    vci = t.get("val_check_interval")
    if isinstance(vci, bool) or (isinstance(vci, (int, float)) and vci <= 0):
        bad("val_check_interval", "a positive number of steps (int), a fraction of an epoch (float), or a time")
    if isinstance(vci, float) and t.get("check_val_every_n_epoch") is None:
        bad("val_check_interval", "a fraction of an epoch needs trainer.check_val_every_n_epoch=1 (the default "
            "validates by steps across epochs)")
    cve = t.get("check_val_every_n_epoch")
    if cve is not None and (isinstance(cve, bool) or not isinstance(cve, int) or cve < 1):
        bad("check_val_every_n_epoch", "an integer >= 1, or null (validate by steps)")
    lvb = t.get("limit_val_batches")
    if lvb is not None and (isinstance(lvb, bool) or not isinstance(lvb, (int, float)) or lvb < 0):
        bad("limit_val_batches", "a number >= 0")
    clip = t.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        bad("gradient_clip_val", "a number >= 0 (or null: no clipping)")
    if not here:
        return
    acc = str(t.get("accelerator") or "auto")
    if acc in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise registry.ConfigError(f"trainer.accelerator={acc}: no CUDA GPU is visible here "
                                       "(torch.cuda.is_available() is False); use trainer=cpu")
    # everything else the Trainer itself checks when it is built: build one now, before any data is read
    import lightning as L

    settings = {k: v for k, v in OmegaConf.to_container(t, resolve=True).items()
                if k not in ("enable_progress_bar", "enable_checkpointing", "enable_model_summary")}
    try:
        import logging
        import warnings

        quiet = logging.getLogger("lightning.pytorch")  # its "GPU available" lines and tips belong to the real run
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = L.Trainer(**settings, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                  enable_model_summary=False)
        finally:
            quiet.setLevel(level)
    except Exception as e:  # noqa: BLE001 - Lightning's MisconfigurationException, ValueError, TypeError ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        named = [k for k in settings if f"{k}=" in first] or [k for k in settings if k in first]
        where = f"trainer.{named[0]}={settings[named[0]]}" if named else "trainer"
        raise registry.ConfigError(f"{where}: {first}") from None
    if isinstance(lvb, float) and 0 < lvb < 1 and built.world_size > 1:
        bad("limit_val_batches", f"a fraction cannot be validated exactly once over {built.world_size} DDP ranks "
            "(each would take the fraction of its own part); give a number of batches, e.g. 50: the batches one "
            "process would validate, split between the ranks")


def user_override_keys(argv: Optional[list] = None) -> Optional[list]:
    """The keys the user set on the command line (this job's, in a sweep); None when unknown (in-process use:
    the config given is taken as meant, key by key)."""
    if argv is None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        argv = list(HydraConfig.get().overrides.task)
    return [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")]


def resumed_config(cfg: DictConfig, resume: str, user_keys: Optional[list], ckpt: Optional[dict] = None,
                   finished_ok: bool = False) -> DictConfig:
    """The config a resumed run trains with: the saved run's, with the keys this command line sets on top
    (trainer.*, seed, where the data lives ...; keys the run predates take today's defaults). When the keys set
    are not known (``user_keys`` None: a config composed in-process), every key but the components is ``cfg``'s.
    A command-line key that would change a component is refused, naming it; so is a run that has finished
    (unless ``finished_ok``: a run killed after its last checkpoint and before its final record)."""
    from omegaconf import open_dict

    if ckpt is None:  # weights only: a file that would run code is refused, in one line
        ckpt = read_checkpoint(resume, "resume")
    if "converted_from" in ckpt:
        raise registry.ConfigError(f"resume={resume}: a converted pretrained checkpoint holds weights only (no "
                                   f"optimizer, no step); fine-tune from it with init_from={resume}")
    saved = ckpt["hyper_parameters"]["run_cfg"]
    groups = [g for g in registry.group_kinds() if g in saved]
    if user_keys is None:
        saved = {g: saved[g] for g in groups}
        user_keys = [k for k in cfg if k not in groups and k != "hydra"]
    for key in user_keys:
        head = key.split(".")[0].split("/")[0]
        if head not in groups or key in RESUME_FREE_KEYS:
            continue
        if "." in key and OmegaConf.select(OmegaConf.create(saved), key, default="<absent>") == "<absent>":
            continue  # a key the saved run did not have yet (its default then): nothing to compare
        now = OmegaConf.select(cfg, key if "." in key else f"{key}.name")
        was = OmegaConf.select(OmegaConf.create(saved), key if "." in key else f"{key}.name")
        if now != was and not (isinstance(now, (DictConfig,)) and OmegaConf.to_container(now) == was):
            raise registry.ConfigError(
                f"{key}={now}: the run being resumed has {key}={was}; a resumed run keeps its model, data, "
                "tokenizer, task and optimizer (only trainer.*, seed and the like may change). "
                "To train a changed configuration, start a new run without resume=")
    # the run as it was (keys it did not have yet: today's defaults), then what this command line sets
    base = cfg.copy()
    with open_dict(base):
        base.pop("hydra", None)
    merged = OmegaConf.merge(base, OmegaConf.create(saved))
    with open_dict(merged):
        for key in user_keys:
            head = key.split(".")[0].split("/")[0]
            if (head in groups and key not in RESUME_FREE_KEYS) or key == "resume":
                continue  # components stay the checkpoint's (checked above)
            value = OmegaConf.select(cfg, key, default="<absent>")
            if not isinstance(value, str) or value != "<absent>":
                OmegaConf.update(merged, key, value, merge=False)
        merged.resume = cfg.get("resume")
    step, max_steps = int(ckpt.get("global_step", 0)), merged.trainer.max_steps
    if max_steps > 0 and step >= max_steps and not finished_ok:
        raise registry.ConfigError(
            f"resume={resume}: that run has finished (step {step} of trainer.max_steps={max_steps}); to train it "
            f"further, raise the limit, e.g. resume={resume} trainer.max_steps={2 * step}")
    validate(merged)
    return merged


def check_positions(longest: Optional[int], max_len: int, what: str) -> None:
    """The longest sequence the data can produce must fit the model's positions / KV cache."""
    if longest is not None and longest > max_len:
        raise registry.ConfigError(
            f"model.max_len={max_len} is shorter than the sequences of {what} ({longest} "
            "positions, from its block_size / max_len); raise model.max_len or shorten the data"
        )


def resume_path(value: Any) -> Optional[str]:
    """``resume=``: a checkpoint file, or a run directory (its ``checkpoints/last.ckpt``); None for a fresh run."""
    return None if value in (None, "", False) else str(find_checkpoint("resume", value))


def check_trainer_keys(trainer_cfg: Any) -> None:
    for key in trainer_cfg:
        check_trainer_key(key)


FOLLOW_ENV = "MODFORGE_RESUMED_FROM"  # rank 0's resume decision, for the DDP ranks Lightning starts


def unrecorded(ckpt: Any) -> bool:
    """Whether ``ckpt`` is the ``last.ckpt`` of a run that never wrote its final record (killed after its last
    checkpoint): resuming it only completes it, so a step count at its limit is no reason to refuse."""
    from modforge.runs import FINAL, read_state

    p = Path(str(ckpt))
    return p.name == "last.ckpt" and p.parent.name == "checkpoints" and \
        read_state(p.parent.parent).status not in FINAL


def with_init_from(cfg: DictConfig, user_keys: Optional[list]) -> tuple:
    """-> (the config to run, the ``init_from=`` checkpoint or None): the checkpoint's architecture with this
    command line's overrides on top (:func:`~modforge.checkpoints.init_config`). Its tensors are memory-mapped,
    read when copied."""
    if not cfg.get("init_from") or cfg.get("resume"):
        return cfg, None
    init = read_checkpoint(find_checkpoint("init_from", cfg.init_from), "init_from", mmap=True)
    return init_config(cfg, init, user_keys), init


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Train one configuration in ``out_dir``: config.yaml, checkpoints, CSV logs, then metrics.json.

    ``out_dir`` may already hold this run: finished, it is left as it is; interrupted (killed, failed,
    preempted), it continues from its ``checkpoints/last.ckpt`` in place, exactly where it stopped; with no
    checkpoint it starts again. A directory holding a run of another configuration is refused.
    ``resume=`` continues the run it names: in place when that is ``out_dir``'s own, else in ``out_dir``.
    """
    from modforge.runs import run_lock

    t_start = time.perf_counter()
    quiet()
    load_all()
    cfg, init = with_init_from(cfg, user_override_keys())
    validate(cfg)
    resume = resume_path(cfg.get("resume"))  # a missing checkpoint fails here, before any output
    rank, launch = launched_rank()
    # a DDP rank that rank 0 decides for: one Lightning started (the decision in its environment), or one that srun
    # or torchrun started beside rank 0 (the decision in a file of the run directory)
    follower = (os.environ.get("LOCAL_RANK", "0") != "0" and FOLLOW_ENV in os.environ) or rank > 0
    try:
        with contextlib.nullcontext() if follower else run_lock(out_dir):  # one process trains a run at a time
            if launch is not None and not follower:
                with contextlib.suppress(FileNotFoundError):
                    (out_dir / DECISION).unlink()  # an earlier launch's: never followed
            try:
                return _run_locked(cfg, out_dir, t_start, resume, follower, init)
            except BaseException as e:
                if launch is not None and not follower and not (out_dir / DECISION).exists():
                    announce(out_dir, {"error": (f"{type(e).__name__}: {e}".splitlines() or [""])[0]})
                raise
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """A DDP rank (rank 0 too) leaves its process group when its run ends, however it ends: a live gloo group
    torn down by interpreter exit can abort the process ("terminate called without an active exception",
    exit -6: once in ten runs of the DDP test), and the next job of a sweep must start without one. Local:
    no collective, so a rank that finished first may already have left."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _run_locked(cfg: DictConfig, out_dir: Path, t_start: float, resume: Optional[str], follower: bool,
                init: Optional[dict] = None) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor
    from torch import nn

    from modforge.callbacks import (FAULT_ENV, AtomicCheckpointIO, Checkpoints, DivergenceStop, FaultInjector,
                                    RunRecord, SaveOnPreemption, weights_fingerprint)
    from modforge.monitoring import (AppendingCSVLogger, configured_callbacks, configured_loggers, finish_loggers,
                                     progress_callbacks)
    import torch

    from modforge import devices
    from modforge.io import write_json, write_text
    from modforge.runs import FINAL, clear_records, config_difference, read_state, trim_metrics_csv

    in_place = False
    if follower:
        decided = json.loads(os.environ[FOLLOW_ENV]) if FOLLOW_ENV in os.environ else rank0_decision(out_dir)
        if "error" in decided:
            raise RuntimeError(f"rank 0 stopped before training: {decided['error']}")
        if decided.get("done"):
            return {}
        resume, in_place = decided["resume"], decided["in_place"]
    else:
        state = read_state(out_dir)
        if state.status == "foreign":
            raise RunDirTaken(f"{out_dir} {state.error}; choose an empty hydra.run.dir")
        if resume:
            in_place = Path(resume).resolve() == (out_dir / "checkpoints" / "last.ckpt").resolve()
            if state.holds_run and not in_place and state.config is not None:
                raise RunDirTaken(f"{out_dir} holds another run ({state.status}); resume it there with "
                                  f"resume={out_dir}, or choose an empty hydra.run.dir")
        elif state.holds_run and state.config is None:
            clear_records(out_dir)  # failed before it wrote its config (status.json alone): from step 0
        elif state.holds_run:
            diff = config_difference(state.config, to_plain(cfg))
            if diff:
                raise RunDirTaken(f"{out_dir} holds a run of another configuration ({'; '.join(diff)})"
                                  "; choose an empty hydra.run.dir (or hydra.sweep.dir)")
            if state.status in FINAL:
                if launched_rank()[1] is not None:
                    announce(out_dir, {"done": True})
                say(f"[modforge] {out_dir} holds this run, {state.status} already: nothing to do "
                    "(delete the directory to train it again)")
                return state.metrics
            if state.checkpoint is not None:
                resume, in_place = str(state.checkpoint), True
            else:
                clear_records(out_dir)  # interrupted before its first checkpoint: from step 0
    if launched_rank()[1] is not None and not follower:  # ranks started beside this one wait for it
        announce(out_dir, {"resume": resume, "in_place": in_place})
    tokenizer = None
    ckpt_step = 0
    if resume:
        from modforge.data.base import DataFacts

        ckpt = read_checkpoint(resume, "resume")
        ckpt_step = int(ckpt.get("global_step", 0))
        cfg = resumed_config(cfg, resume, user_override_keys(), ckpt, finished_ok=unrecorded(resume))
        # the model's own tokenizer: text is read with the ids it was trained on, never refitted
        tokenizer = DataFacts.from_state(facts_state(ckpt)).tokenizer
        del ckpt  # Lightning loads it again for the weights, optimizer and loops
        init = None  # a run started from other weights continues from its own
    elif init is not None:  # the pretrained model's tokenizer: the ids its embeddings were trained on
        from modforge.data.base import DataFacts

        tokenizer = DataFacts.from_state(facts_state(init)).tokenizer
    out_dir.mkdir(parents=True, exist_ok=True)
    if in_place and not follower:
        trim_metrics_csv(out_dir / "logs" / "metrics.csv", ckpt_step)
        for stale in ("status.json", "metrics.json"):  # a failure being retried; a finished run trained further
            with contextlib.suppress(FileNotFoundError):
                (out_dir / stale).unlink()
    plain = to_plain(cfg)
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(plain))  # every DDP rank writes it
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(devices.matmul_precision(cfg.get("matmul_precision"),
                                                                devices.accelerator_of(cfg.trainer)))

    clock = _Phases(t_start)
    clock.mark("setup")  # registry, checks, the directory's state, a checkpoint read to resume
    dm = registry.build("data", cfg.data)
    facts = dm.prepare(tokenizer)
    clock.mark("data")
    check_positions(facts.positions, cfg.model.max_len, f"data={cfg.data.name}")
    entry, task_cfg = registry.make_config("task", cfg.task)
    task = entry.cls(task_cfg, plain, facts)
    initialised = None
    if init is not None:
        initialised = {"checkpoint": str(find_checkpoint("init_from", cfg.init_from)), **load_matching(task.model, init)}
        del init
        if not follower:
            say_init(initialised)
    if cfg.get("compile"):
        task.model.compile()  # nn.Module.compile: in place, so state-dict keys (checkpoints) stay the same
    n_params = sum(p.numel() for p in task.model.parameters())
    # Kaplan et al.'s N: without token and learned position embeddings (a tied output head counts once, there)
    n_embedding = sum(p.numel() for p in {p for m in task.model.modules() if isinstance(m, nn.Embedding)
                                           for p in m.parameters()})
    clock.mark("model")

    record = RunRecord(started=t_start)
    divergence = DivergenceStop(cfg.divergence_patience)
    ckpt_cb = Checkpoints(divergence, dirpath=out_dir / "checkpoints", filename="best", monitor="val/loss",
                          mode="min", save_top_k=1, save_last=True, auto_insert_metric_name=False)
    callbacks = [ckpt_cb, LearningRateMonitor(logging_interval="step"), record, divergence]
    settings = OmegaConf.to_container(cfg.trainer, resolve=True)
    chosen = plain.get("callbacks") or {}
    progress = chosen.get("progress", "auto")
    if progress == "none":
        settings["enable_progress_bar"] = False
    elif settings.get("enable_progress_bar") is not False:  # Lightning: None means on
        callbacks += progress_callbacks(progress, int(chosen.get("progress_every", 50)), sys.stdout.isatty())
    callbacks += configured_callbacks(chosen)
    if os.environ.get(FAULT_ENV):
        callbacks.append(FaultInjector())
    if (preempt := SaveOnPreemption.signal_of_submitit()) is not None:  # after the fault injector: same step
        callbacks.append(SaveOnPreemption(preempt, out_dir / "checkpoints" / "last.ckpt", divergence))
    with _quiet_about_existing_records(in_place):
        trainer = L.Trainer(**settings, default_root_dir=str(out_dir),
                            logger=[AppendingCSVLogger(str(out_dir), name="logs", version=""),
                                    *configured_loggers(plain.get("logger"), out_dir, *run_names(out_dir))],
                            callbacks=callbacks,
                            plugins=[AtomicCheckpointIO()])
    clock.mark("trainer")

    # DDP ranks (Lightning starts them at the first validate or fit) follow this process's decision
    os.environ[FOLLOW_ENV] = json.dumps({"resume": resume, "in_place": in_place})
    try:
        if cfg.eval_at_start and not resume:
            record.val_loss_at_start = _val_metrics(trainer.validate(task, datamodule=dm, verbose=False)).get(
                "val/loss")
        clock.mark("eval_at_start")
        record.fit_started()
        train_before = record.train_before
        with _quiet_about_existing_records(in_place):
            trainer.fit(task, datamodule=dm, ckpt_path=resume, weights_only=True)
        clock.mark("fit")
        clock.split("fit", "train_steps", record.train_seconds - train_before)  # the rest: validations, checkpoints
    finally:
        os.environ.pop(FOLLOW_ENV, None)
    fit_seconds = record.fit_seconds
    tokens = task.tokens_seen * trainer.world_size  # every rank sees its own shard

    metrics: dict = {"status": "finished"}
    if divergence.diverged_at is not None:  # stopped: the last finite values, no evaluation of NaN weights
        last_val = dict(divergence.last_val or {})
        metrics.update(status="diverged", diverged_at_step=divergence.diverged_at,
                       val_step=last_val.pop("step", None), val=last_val,
                       last_finite_train=divergence.last_train)
    else:
        # fit validated these very weights at its last step, in this session: no second pass
        last_val = dict(divergence.last_val or {})
        reuse = (last_val.pop("step", None) == trainer.global_step and bool(last_val)
                 and divergence.val_weights == weights_fingerprint(task))
        if trainer.world_size > 1:  # every rank takes the same branch, or one would validate alone and wait
            reuse = trainer.strategy.reduce_boolean_decision(reuse, all=True)
        if reuse:
            metrics["val"] = last_val
        else:
            metrics["val"] = _val_metrics(trainer.validate(task, datamodule=dm, verbose=False))
        if not all(math.isfinite(v) for v in metrics["val"].values()):
            metrics["status"] = "diverged"  # a non-finite validation metric (written null)
        if cfg.get("eval_block_sizes") and metrics["status"] == "finished":
            eval_at_lengths(cfg, trainer, task, facts.tokenizer, metrics)
    clock.mark("final_eval")
    metrics.update({
        "val_loss_at_start": record.val_loss_at_start,
        **{k: v for k, v in facts.stats.items() if k == "unigram_val_loss"},
        "params": n_params,
        "params_non_embedding": n_params - n_embedding,
        "ffn_hidden": next((m.hidden for m in task.model.modules() if hasattr(m, "hidden")), None),
        "steps": trainer.global_step,
        "tokens_seen": tokens,
        "fit_seconds": round(fit_seconds, 2),
        "train_seconds": round(record.train_seconds, 2),
        "tokens_per_sec": round(tokens / record.train_seconds, 1) if record.train_seconds > 0 else None,
        "resumed_at_steps": record.resumed_at,
        **({"init_from": initialised} if initialised else {}),
        "checkpoint": str(last) if (last := out_dir / "checkpoints" / "last.ckpt").exists() else None,
        "config": {g: plain[g].get("name") for g in registry.group_kinds() if g in plain},
        "devices": devices.devices_record(trainer),
    })
    if cfg.sample and trainer.is_global_zero and metrics["status"] == "finished":
        try:
            metrics["sample"] = task.summary_sample()
        except Exception as e:  # noqa: BLE001 - the sample is a courtesy: a failure there loses no result
            metrics["sample_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    clock.mark("sample")
    metrics["wall_seconds"] = round(record.wall_seconds, 2)
    metrics["session_seconds"] = {"before_run": round(t_start - _IMPORTED, 2), **clock.rounded()}
    if record.first_step_clock is not None:  # start-up: the command's start to its first training batch
        metrics["seconds_to_first_step"] = round(record.first_step_clock - _IMPORTED, 3)
    if trainer.is_global_zero:
        write_json(out_dir / "metrics.json", metrics, indent=2)
        print_summary(metrics, out_dir)
    finish_loggers(trainer.loggers)
    return metrics


def run_names(out_dir: Path) -> tuple[str, str]:
    """(run name, group) for loggers that show runs by name: the job's overrides, and the same without the seed
    (the runs of one configuration); outside Hydra, the directory's name."""
    from hydra.core.hydra_config import HydraConfig

    from modforge.runs import CONTROL_KEYS

    if not HydraConfig.initialized():
        return out_dir.name, out_dir.name
    overrides = [o for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") not in CONTROL_KEYS]
    name = ",".join(overrides) or "defaults"
    group = ",".join(o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "seed") or "defaults"
    return name, group


class _Phases:
    """Where this session's wall time went (``metrics.json``'s ``session_seconds``): each phase from the end
    of the one before. ``before_run`` is the command's own work before training starts (Hydra, pre-flight)."""

    def __init__(self, t0: float):
        self.last, self.seconds = t0, {}

    def mark(self, name: str) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now
        return self.seconds[name]

    def split(self, whole: str, part: str, seconds: float) -> None:
        """Report ``part`` of phase ``whole`` on its own (``whole`` keeps the rest)."""
        part_s = max(0.0, min(seconds, self.seconds.get(whole, 0.0)))
        self.seconds[whole] -= part_s
        self.seconds[part] = part_s
        self.seconds[f"{whole}_other"] = self.seconds.pop(whole)

    def rounded(self) -> dict:
        return {k: round(v, 2) for k, v in self.seconds.items()}


@contextlib.contextmanager
def _quiet_about_existing_records(in_place: bool):
    """A run continued in place finds its own logs and checkpoints: Lightning's warnings about a non-empty
    directory are about exactly those."""
    import warnings

    with warnings.catch_warnings():
        if in_place:
            warnings.filterwarnings("ignore", message=r".*(exists and is not empty|Checkpoint directory).*")
        yield


def eval_at_lengths(cfg: DictConfig, trainer: Any, task: Any, tokenizer: Any, metrics: dict) -> None:
    """``eval_block_sizes``: validate the trained model again on the same val text cut into windows of each
    length (metrics ``val@N/loss`` ...), its positional scheme extended where it can be; a length it cannot
    run (a learned table) is recorded under ``not_applicable`` with the reason, not as a failure."""
    from modforge.components.positions import LengthNotSupported

    loggers, trainer.loggers = trainer.loggers, []  # these are not points of the training curves
    try:
        for n in cfg.eval_block_sizes:
            try:
                task.model.extend_positions(int(n))
            except LengthNotSupported as e:
                metrics.setdefault("not_applicable", {})[f"val@{n}"] = str(e)
                continue
            dm = registry.build("data", OmegaConf.merge(cfg.data, {"block_size": int(n)}))
            dm.prepare(tokenizer)
            got = _val_metrics(trainer.validate(task, datamodule=dm, verbose=False))
            metrics["val"].update({k.replace("val/", f"val@{n}/", 1): v for k, v in got.items()})
    finally:
        trainer.loggers = loggers


def _val_metrics(results: list) -> dict:
    out: dict = {}
    for r in results or []:
        out.update({k: float(v) for k, v in r.items()})
    return out


def say_init(r: dict) -> None:
    """What ``init_from=`` loaded, exactly: loaded are all the model's tensors not listed as new."""
    total = len(r["loaded"]) + len(r["new"])
    say(f"[modforge] init_from={r['checkpoint']}: loaded {len(r['loaded'])} of the model's {total} tensors "
        "(same name and shape in the checkpoint)")
    say(f"  new, initialised by their components: {', '.join(r['new']) or 'none'}")
    say(f"  dropped, in the checkpoint only: {', '.join(r['dropped']) or 'none'}")
    if r["reshaped"]:
        say(f"  of those, another shape here: {', '.join(r['reshaped'])}")


def print_summary(m: dict, out_dir: Path) -> None:
    names = " ".join(f"{k}={v}" for k, v in m["config"].items())
    lines = ["", f"== modforge run: {names}"]
    val = "  ".join(f"{k}={v:.4f}" for k, v in sorted(m["val"].items()))
    if m.get("diverged_at_step") is not None:
        last = m.get("last_finite_train") or {}
        lines.append(f"   DIVERGED   at step {m['diverged_at_step']}: the training loss was not finite "
                 f"(last finite: {last.get('train/loss', float('nan')):.4f} at step {last.get('step', '-')}); stopped")
        lines.append(f"   last finite validation (step {m.get('val_step', '-')}): {val or 'none'}")
    else:
        lines.append(f"   {m['status']:<10} {val}")
    for what, why in (m.get("not_applicable") or {}).items():
        lines.append(f"   {what}: not applicable: {why}")
    if m.get("val_loss_at_start") is not None:
        extra = f" (unigram model: {m['unigram_val_loss']:.4f})" if "unigram_val_loss" in m else ""
        lines.append(f"   at start   val/loss={m['val_loss_at_start']:.4f}{extra}")
    tps = m["tokens_per_sec"]
    resumed = f", resumed at step {', '.join(map(str, m['resumed_at_steps']))}" if m.get("resumed_at_steps") else ""
    lines.append(f"   {m['params']:,} parameters (FFN hidden width {m['ffn_hidden']}), {m['steps']} steps, {m['tokens_seen']:,} tokens, "
          f"{m['train_seconds']:.1f} s training ({tps or 0:,.0f} tokens/s), {m['wall_seconds']:.1f} s wall{resumed}")
    if m.get("sample"):
        lines.append("   sample:\n" + "\n".join("   | " + line for line in m["sample"].splitlines()))
    lines.append(f"   outputs: {out_dir}")
    say("\n".join(lines))


@contextlib.contextmanager
def sweep_job():
    """Let a multirun job use DDP: Lightning's relaunch must run this job only, and the next job start clean.

    Lightning starts ranks 1..N-1 as ``python -m modforge.train <sys.argv[1:]>
    hydra.run.dir=<HydraConfig run.dir>`` (Lightning issues #11300, #2727).
    Inside a multirun, sys.argv still holds ``-m`` and the whole sweep and
    ``run.dir`` is not the job's directory, so each rank would start the sweep
    over elsewhere: here sys.argv becomes this job's command line (``job_argv``)
    and ``run.dir`` its directory. Afterwards the environment variables Lightning set
    (LOCAL_RANK, WORLD_SIZE, MASTER_PORT ...) are removed (the run has left its
    process group); otherwise the next job would believe its ranks already exist.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        yield
        return
    argv, env = list(sys.argv), dict(os.environ)
    sys.argv = job_argv(argv, hc)
    with read_write(hc.run):
        hc.run.dir = hc.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(env)


@contextlib.contextmanager
def failure_recorded(out_dir: Path):
    """A run that raises leaves ``status.json`` beside its other records: ``failed`` with the one-line error (and
    the traceback, for anything but a configuration error), or ``interrupted`` (Ctrl-C, SIGTERM: Lightning
    turns both into SystemExit); the report and a re-run of the sweep read it. The exception then goes on."""
    try:
        yield
    except RunDirTaken:
        raise  # the directory is another run's: nothing is written there
    except BaseException as e:
        import traceback

        from modforge.io import write_json

        record = {"status": "failed" if isinstance(e, Exception) else "interrupted",
                  "error": (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]}
        if isinstance(e, Exception) and not isinstance(e, registry.ModforgeError):
            record["traceback"] = "".join(traceback.format_exception(e))
        with contextlib.suppress(OSError):
            if out_dir.is_dir():
                write_json(out_dir / "status.json", record)
        raise


def sweep_job_outcome(cfg: DictConfig, out_dir: Path) -> Optional[dict]:
    """One job of a sweep: its failure is recorded and reported in one line, and the sweep goes on (Hydra's
    launchers stop at a SystemExit, Hydra #2551); an interruption (Ctrl-C, SIGTERM) stops the sweep too."""
    from hydra.core.hydra_config import HydraConfig

    try:
        with failure_recorded(out_dir):
            return run(cfg, out_dir)
    except Exception as e:  # noqa: BLE001 - recorded in the job's status.json, counted in the sweep's summary
        where = "" if isinstance(e, registry.ModforgeError) else f" (traceback in {out_dir / 'status.json'})"
        first = (str(e).splitlines() or [""])[0]
        print(f"[modforge] job #{HydraConfig.get().job.num} failed: {type(e).__name__}: {first}{where}",
              file=sys.stderr)
        return None


_HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc",
                     "--version")


def preflight(argv: list, multirun: bool) -> int:
    """Check the command line, then compose and validate every job it runs (each of a sweep's) before the
    first one starts; all invalid jobs are named at once. Returns the number of jobs."""
    from modforge.config import compose_job, check_output_dir, hydra_loader, job_overrides

    from modforge.launchers import check_launcher_installed

    check_launcher_installed(argv)  # hydra/launcher=slurm without its extra: one line naming the extra
    elsewhere = multirun and runs_elsewhere(argv)  # its jobs' devices are checked where they run
    words, rest = [], iter(argv)
    for a in rest:
        if a in _HYDRA_VALUE_FLAGS:
            next(rest, None)
        elif not a.startswith("-") and "=" not in a and not a.startswith("~"):
            words.append(a)
    if words:
        raise registry.ConfigError(f"'{words[0]}': expected key=value (e.g. norm=rms) or a flag such as -m")
    if any(a.split("=")[0] in _HYDRA_VALUE_FLAGS for a in argv):
        # your own config directory or primary config: Hydra composes it; the registry's checks still apply
        check_overrides([a for a in argv if a.split("=")[0].lstrip("+~").split(".")[0] in registry.group_kinds()])
        return 0
    with hydra_loader() as loader:
        check_overrides(argv, loader)
        jobs = job_overrides(argv, multirun, loader)
        bad, slots = [], None
        for i, job in enumerate(jobs):
            try:
                cfg = compose_job(job, hydra=(i == 0))
            except registry.ConfigError as e:
                bad.append((i, job, e))
                continue
            if i == 0:  # the run (or sweep) directory is the command's, not a job's: it fails at once
                key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
                check_output_dir(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir), key)
                slots = slot_count(cfg.hydra.launcher) if multirun else None  # hydra/launcher=gpus: its devices
            try:
                if slots is not None:
                    check_slots(cfg.trainer.get("devices", 1), slots)
                cfg, _ = with_init_from(cfg, user_override_keys(job))
                validate(cfg, here=not elsewhere)
                resume = resume_path(cfg.get("resume"))
                if resume:
                    resumed_config(cfg, resume, user_override_keys(job), finished_ok=unrecorded(resume))
            except registry.ConfigError as e:
                bad.append((i, job, e))
    if len(jobs) == 1 and bad:
        raise bad[0][2]
    if bad:
        from modforge import sweep

        varying = {o.split("=")[0] for j in jobs for o in j} - {o.split("=")[0] for o in set.intersection(*map(set, jobs))}
        described = "; ".join(f"#{i} ({' '.join(o for o in job if o.split('=')[0] in varying)}): {e}" for i, job, e in bad)
        if not _flag(argv, "skip_invalid") or len(bad) == len(jobs):
            hint = "" if len(bad) == len(jobs) else " (skip_invalid=true runs the others)"
            raise registry.ConfigError(f"{len(bad)} of {len(jobs)} jobs are invalid, so the sweep does not start: "
                                       f"{described}{hint}")
        print(f"[modforge] skipping {len(bad)} invalid of {len(jobs)} jobs (skip_invalid=true): {described}",
              file=sys.stderr)
        sweep.INVALID.update({sweep.job_key(job): str(e) for _, job, e in bad})
    return len(jobs)


def _flag(argv: list, key: str) -> bool:
    """Whether the command line sets the boolean root key ``key`` to true."""
    return any(a.split("=", 1)[0].lstrip("+") == key and a.split("=", 1)[1].strip().lower() in ("true", "yes", "1")
               for a in argv if "=" in a)


def continue_where_recorded(argv: list, multirun: bool) -> list:
    """``resume=`` rewritten to what it means. With ``-m`` and a sweep directory: the sweep's recorded command
    again, in that directory (finished jobs skipped, interrupted ones resumed in place); only the sweep's own
    switches (retry_failed, skip_invalid, dry_run) and hydra.* settings may be added. For a single run's
    directory: ``hydra.run.dir`` becomes that directory, and Hydra's record of this command goes to
    ``.hydra/resume-N`` (the run's original command stays in ``.hydra``)."""
    from modforge import sweep

    given = [a for a in argv if a.split("=", 1)[0] == "resume"]
    if not given:
        return argv
    value = given[-1].split("=", 1)[1]
    target = Path(value).expanduser()
    if multirun and (target / "multirun.yaml").is_file():
        task, hydra_overrides = sweep.sweep_command(target)
        extra = [a for a in argv if a not in given and a not in ("-m", "--multirun")]
        for a in extra:
            key = a.split("=", 1)[0].lstrip("+~")
            if "=" in a and key not in sweep.SWEEP_KEYS and not key.startswith("hydra"):
                raise registry.ConfigError(
                    f"{a}: resume={value} continues the sweep recorded there as it was started; {key} would change "
                    f"its jobs. Start a new sweep for that (only {', '.join(sweep.SWEEP_KEYS)} and hydra.* may be "
                    "added)")
        mine = {a.split("=", 1)[0] for a in extra}
        kept = [o for o in hydra_overrides if o.split("=", 1)[0] not in mine]
        return ["-m", *task, *kept, *extra, f"hydra.sweep.dir={hydra_value(str(target))}"]
    if multirun or any(a.split("=", 1)[0] == "hydra.run.dir" for a in argv):
        return argv  # a sweep of runs that each start from the checkpoint, or a directory of the user's choice
    run_dir = target if target.is_dir() else target.parent.parent
    if not ((run_dir / "config.yaml").is_file() and
            (target.is_dir() or target.name == "last.ckpt" and target.parent.name == "checkpoints")):
        return argv  # another checkpoint file (best.ckpt, someone else's): a new run starts from it
    n = 1 + sum(1 for p in (run_dir / ".hydra").glob("resume-*"))
    return [*argv, f"hydra.run.dir={hydra_value(str(run_dir))}", f"hydra.output_subdir=.hydra/resume-{n}"]





def main(argv: Optional[list] = None) -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from modforge import sweep

    argv = sys.argv[1:] if argv is None else argv
    multirun = any(a in ("-m", "--multirun") for a in argv)
    from modforge import runs

    runs._CLAIMED.clear()  # a second command in one process (a notebook) gets its own new directory
    info = any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in argv)
    with one_line_errors():
        from modforge import frontdoor, manifest

        cached = manifest.read() if info else None
        if frontdoor.answer(argv, cached):  # --help, -sc install=bash: answered here, without Hydra
            return
        if cached is not None:  # Tab completion, --cfg: the registry as data, no torch, no Lightning
            manifest.install(cached)
        else:
            load_all()
            manifest.write()  # for the next --help / Tab
        relaunched_rank = os.environ.get("LOCAL_RANK", "0") != "0"  # a DDP rank Lightning started: rank 0 checked
        if not relaunched_rank and not info:
            argv = continue_where_recorded(argv, multirun)
            multirun = any(a in ("-m", "--multirun") for a in argv)
        if launched_rank()[1] is not None and not multirun and not info and \
                not any(a.split("=", 1)[0] == "hydra.run.dir" for a in argv):
            raise registry.ConfigError("this process is one of several DDP ranks started by srun or torchrun: give "
                                       "hydra.run.dir=<dir> (every rank must train in the same directory)")
        if not relaunched_rank and not info:
            preflight(argv, multirun)
            if not multirun and _flag(argv, "dry_run"):
                from modforge.config import compose_job

                cfg = compose_job([a for a in argv if "=" in a and not a.startswith("-")], hydra=True)
                print(f"[modforge] dry run, nothing is trained: 1 job ({' '.join(argv) or 'defaults'})\n"
                      f"       {cfg.hydra.run.dir}")
                return

    @hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
    def _app(cfg: DictConfig) -> Optional[float]:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            with sweep_job():
                m = sweep_job_outcome(cfg, out_dir)
        else:
            with one_line_errors(), failure_recorded(out_dir):
                m = run(cfg, out_dir)
        loss = (m or {}).get("val", {}).get("val/loss")
        return loss if loss is not None and math.isfinite(loss) else None  # for Hydra sweepers

    sys.argv = [sys.argv[0]] + argv
    sweep.OUTCOME.clear()
    _app()
    if sweep.OUTCOME.get("summary"):
        print(sweep.OUTCOME["summary"], file=sys.stderr if sweep.OUTCOME["exit"] else sys.stdout)
    if sweep.OUTCOME.get("exit"):
        sys.exit(sweep.OUTCOME["exit"])


if __name__ == "__main__":
    main()
