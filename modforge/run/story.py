"""One run's story, step by step: claim the directory, decide fresh or resume, settle the config, prepare
the data, build the task, build the trainer, fit, measure, record and tell.

:func:`run` reads top to bottom; each step below it is one function. A run directory may already hold
this run: finished, it is left as it is; interrupted (killed, failed, preempted), it continues from its
``checkpoints/last.ckpt`` in place, exactly where it stopped; with no checkpoint it starts again. A
directory holding a run of another configuration is refused. ``resume=`` continues the run it names: in
place when that is ``out_dir``'s own, else in ``out_dir``.
"""
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.checkpoints.files import (facts_of, find_checkpoint, load_matching, read_checkpoint, shapes_of,
                                       weights_mismatch)
from modforge.config.checks import check_positions, validate
from modforge.config.composition import default_config, load, to_plain
from modforge.config.overrides import user_override_keys
from modforge.errors import ConfigError, ModforgeError, RunDirTaken
from modforge.run import measure, ranks
from modforge.run.dirs import (FINAL, claim, clear_records, not_a_file, pause_of, read_state, run_difference,
                                run_lock, trim_metrics_csv)
from modforge.run.resume import resume_path, resumed_config, unrecorded, with_init_from
from modforge.run.summary import print_summary, say_init
from modforge.utils.console import quiet, say
from modforge.utils.files import read_json, write_json, write_text


@dataclass
class Start:
    """Where a run starts, decided from its directory and ``resume=`` (by rank 0; the other ranks follow)."""

    resume: Optional[str] = None  # the checkpoint to continue from; None: step 0
    in_place: bool = False  # continuing the run of this very directory
    clear: bool = False  # the directory holds an unfinished run's records from before its first checkpoint
    done: Optional[dict] = None  # the directory holds this run, finished: its metrics, nothing to do
    step: int = 0  # the checkpoint's step (set when the checkpoint is read)
    shapes: Optional[dict] = None  # its weights' {name: shape} (set then too): checked against the model built


def run(cfg: DictConfig, out_dir: Path, checked: bool = False, started: Optional[float] = None) -> dict:
    """Train one configuration in ``out_dir``: config.yaml, checkpoints, CSV logs, then metrics.json.
    ``checked``: the command's pre-flight has validated this job's config on this machine (else it is
    validated here, once). ``started``: the command's clock (``time.perf_counter()`` at its start)."""
    t_start = time.perf_counter()
    quiet()
    load()
    cfg, init = with_init_from(cfg, user_override_keys())
    resume = resume_path(cfg.get("resume"))  # a missing checkpoint fails here, before any output
    rank, launch = ranks.launched_rank()
    follower = ranks.follows_rank0(rank)
    try:
        if not follower:
            refuse_unusable(out_dir, read_state(out_dir))  # before the lock file is made in it
        with contextlib.nullcontext() if follower else run_lock(out_dir):  # one process trains a run at a time
            if launch is not None and not follower:
                with contextlib.suppress(FileNotFoundError):
                    (out_dir / ranks.DECISION).unlink()  # an earlier launch's: never followed
            try:
                return _story(cfg, out_dir, resume, init, follower, checked,
                              measure.Phases(t_start, started if started is not None else t_start))
            except BaseException as e:
                if launch is not None and not follower and not (out_dir / ranks.DECISION).exists():
                    ranks.announce(out_dir, {"error": (f"{type(e).__name__}: {e}".splitlines() or [""])[0]})
                raise
    finally:
        ranks.leave_process_group()


def _story(cfg: DictConfig, out_dir: Path, resume: Optional[str], init: Optional[dict], follower: bool,
           checked: bool, clock: "measure.Phases") -> dict:
    start = follow_rank0(out_dir) if follower else decide_start(cfg, out_dir, resume)
    if start.done is not None:
        return start.done
    cfg, tokenizer, init = settle_config(cfg, start, init, checked)
    if ranks.launched_rank()[1] is not None and not follower:  # ranks started beside this one wait for it
        ranks.announce(out_dir, {"resume": start.resume, "in_place": start.in_place})
    pause_at = cfg.get("pause_at")
    if pause_at is not None and start.resume and start.step >= pause_at:  # paused there before: nothing to train
        return paused(out_dir, start.step, not follower, kept=True)
    plain = prepare_directory(cfg, out_dir, start, follower)
    clock.mark("setup")  # registry, checks, the directory's state, a checkpoint read to resume
    dm, facts = prepare_data(cfg, tokenizer)
    clock.mark("data")
    task, initialised = build_task(cfg, plain, facts, init, quiet_init=follower)
    if start.shapes is not None:  # Lightning's strict load would fail mid-restore with a traceback: one line, before
        diff = weights_mismatch(shapes_of(task.state_dict()), start.shapes)
        if diff:
            raise registry.ConfigError(f"resume={start.resume}: its weights do not fit the model its config names "
                                       f"({diff})")
    clock.mark("model")
    trainer, record, divergence = build_trainer(cfg, plain, out_dir, start.in_place, clock.t0)
    clock.mark("trainer")
    fit(trainer, task, dm, start, record, clock, eval_at_start=bool(cfg.eval_at_start))
    if pause_at is not None and trainer.global_step == pause_at and divergence.diverged_at is None:
        return paused(out_dir, trainer.global_step, trainer.is_global_zero,
                      {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    if trainer.global_step == 0 and not start.resume and divergence.diverged_at is None:
        raise ModforgeError(f"the run trained no step: data={cfg.data.name} gave no training batch (is "
                            f"data.batch_size={cfg.data.get('batch_size')} larger than its training split?)")
    metrics = measure.final_metrics(cfg, plain, trainer, task, dm, facts, record, divergence, out_dir, clock,
                                  initialised)
    return finish(metrics, trainer, out_dir)


def follow_rank0(out_dir: Path) -> Start:
    """A DDP rank other than 0 takes rank 0's decision (from its environment, or the run directory's file)."""
    decided = json.loads(os.environ[ranks.FOLLOW_ENV]) if ranks.FOLLOW_ENV in os.environ else \
        ranks.rank0_decision(out_dir)
    if "error" in decided:
        raise RuntimeError(f"rank 0 stopped before training: {decided['error']}")
    if decided.get("done"):
        return Start(done={})
    return Start(resume=decided["resume"], in_place=decided["in_place"])


def decide_start(cfg: DictConfig, out_dir: Path, resume: Optional[str]) -> Start:
    """Fresh, resumed (from which checkpoint, in place or not), or nothing to do, from what ``out_dir`` holds
    and ``resume=``; a directory that is another run's is refused before anything is written."""
    state = read_state(out_dir)
    refuse_unusable(out_dir, state)
    not_a_file(out_dir, "config.yaml", "metrics.json", "status.json", "checkpoints/last.ckpt")  # a run writes them
    if resume:
        in_place = Path(resume).resolve() == (out_dir / "checkpoints" / "last.ckpt").resolve()
        if state.holds_run and not in_place and state.config is not None:
            raise RunDirTaken(f"{out_dir} holds another run ({state.status}); resume it there with "
                              f"resume={out_dir}, or choose an empty hydra.run.dir")
        return claimed(out_dir, Start(resume=resume, in_place=in_place))
    if state.holds_run and state.config is None and state.checkpoint is None:
        return claimed(out_dir, Start(clear=True))  # failed before it wrote its config (status.json alone)
    if not state.holds_run:
        return claimed(out_dir, Start())
    diff = run_difference(state.config or {}, to_plain(cfg), default_config)
    if diff:
        raise RunDirTaken(f"{out_dir} holds a run of another configuration ({'; '.join(diff)})"
                          "; choose an empty hydra.run.dir (or hydra.sweep.dir)")
    if state.status in FINAL:
        if ranks.launched_rank()[1] is not None:
            ranks.announce(out_dir, {"done": True})
        say(f"[modforge] {out_dir} holds this run, {state.status} already: nothing to do "
            "(delete the directory to train it again)")
        return Start(done=state.metrics)
    if state.checkpoint is not None:
        return claimed(out_dir, Start(resume=str(state.checkpoint), in_place=True))
    return claimed(out_dir, Start(clear=True))  # interrupted before its first checkpoint: from step 0


def refuse_unusable(out_dir: Path, state: Any) -> None:
    """Another tool's directory, or a run whose config.yaml cannot be read: nothing is written there."""
    if state.status == "foreign":
        raise RunDirTaken(f"{out_dir} {state.error}; choose an empty hydra.run.dir")
    if state.damaged:
        raise RunDirTaken(f"{out_dir}: its config.yaml cannot be read ({state.damaged}); a run is never trained "
                          "again over its own records: repair config.yaml, or delete the directory to train it again")


def claimed(out_dir: Path, start: Start) -> Start:
    """The directory is marked as this run's (:func:`modforge.run.dirs.claim`) before anything is written in it."""
    if not claim(out_dir):
        raise RunDirTaken(f"{out_dir} {read_state(out_dir).error}; choose an empty hydra.run.dir")
    return start


def settle_config(cfg: DictConfig, start: Start, init: Optional[dict], checked: bool) -> tuple:
    """-> (the config this run trains with, the tokenizer it must read text with or None, the ``init_from``
    checkpoint or None). A resumed run keeps its saved config and tokenizer (only what the command line may
    change is taken); the config is validated here, once, unless the pre-flight did."""
    tokenizer, cfg_resume = None, cfg.get("resume")
    if start.resume:
        ckpt = read_checkpoint(start.resume, "resume")
        start.step, start.shapes = int(ckpt.get("global_step", 0)), shapes_of(ckpt["state_dict"])
        cfg = resumed_config(cfg, start.resume, user_override_keys(), ckpt, finished_ok=unrecorded(start.resume))
        # the model's own tokenizer: text is read with the ids it was trained on, never refitted
        tokenizer = facts_of(ckpt, f"resume={start.resume}").tokenizer
        init = None  # a run started from other weights continues from its own
    elif init is not None:  # the pretrained model's tokenizer: the ids its embeddings were trained on
        tokenizer = facts_of(init, f"init_from={cfg.get('init_from')}").tokenizer
    if not checked or (start.resume and not cfg_resume):  # a resume found in the directory: the pre-flight
        for note in validate(cfg):                          # validated the command line, not the saved run
            say(f"[modforge] note: {note}")
    return cfg, tokenizer, init


def prepare_directory(cfg: DictConfig, out_dir: Path, start: Start, follower: bool) -> dict:
    """The records a continued run must not repeat are cut back to its checkpoint's step; ``config.yaml`` is
    (re)written by every rank. Then the seeds and the matmul precision. -> the plain config."""
    import lightning as L
    import torch

    from modforge.utils import devices

    if start.clear and not follower:
        clear_records(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if start.in_place and not follower:
        trim_metrics_csv(out_dir / "logs" / "metrics.csv", start.step)
        for stale in ("status.json", "metrics.json"):  # a failure being retried; a finished run trained further
            with contextlib.suppress(FileNotFoundError):
                (out_dir / stale).unlink()
    plain = to_plain(cfg)
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(plain))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(devices.matmul_precision(cfg.get("matmul_precision"),
                                                                devices.accelerator_of(cfg.trainer)))
    return plain


def prepare_data(cfg: DictConfig, tokenizer: Any) -> tuple:
    """-> (the datamodule, the facts its preparation found: tokenizer, vocabulary, longest sequence ...)."""
    from modforge.utils.seeds import derive

    dm = registry.build("data", cfg.data)
    dm.data_seed = derive(cfg.seed, "data")  # the order of batches: the seed's alone, whatever the model
    facts = dm.prepare(tokenizer)
    check_positions(facts.positions, cfg.model.max_len, f"data={cfg.data.name}")
    val_tokens = getattr(dm, "val_tokens", None)
    for n in cfg.get("eval_block_sizes") or []:  # found out now, not after the whole run has trained
        if val_tokens is not None and len(val_tokens) <= int(n):
            raise ConfigError(f"eval_block_sizes={list(cfg.eval_block_sizes)}: the validation split has "
                              f"{len(val_tokens)} tokens, so it holds no window of {n}; give lengths below that")
    return dm, facts


def build_task(cfg: DictConfig, plain: dict, facts: Any, init: Optional[dict], quiet_init: bool) -> tuple:
    """-> (the task, the LightningModule with its model; what ``init_from=`` loaded into it, or None).
    The model is initialised from the seed's ``init`` stream; dropout then draws from its own ``dropout`` stream,
    so that how many numbers the initialisation took (it depends on the shapes) changes nothing after it."""
    import torch

    from modforge.utils.seeds import derive

    entry, task_cfg = registry.make_config("task", cfg.task)
    torch.manual_seed(derive(cfg.seed, "init"))
    task = entry.cls(task_cfg, plain, facts)
    torch.manual_seed(derive(cfg.seed, "dropout"))  # a resumed run's states are set again at its first step
    initialised = None
    if init is not None:
        initialised = {"checkpoint": str(find_checkpoint("init_from", cfg.init_from)), **load_matching(task.model, init)}
        if not initialised["loaded"]:
            shaped = f", {len(initialised['reshaped'])} of them by name but in another shape" \
                if initialised["reshaped"] else ""
            raise registry.ConfigError(f"init_from={cfg.init_from}: none of the model's {len(initialised['new'])} "
                                       f"tensors is in the checkpoint{shaped}, so nothing would be loaded; drop "
                                       "the overrides that change the model's shapes, or train without init_from")
        if not quiet_init:
            say_init(initialised)
    task.sizes = measure.parameter_counts(task.model)  # before any strategy shards the parameters
    if cfg.get("compile"):
        task.model.compile()  # nn.Module.compile: in place, so state-dict keys (checkpoints) stay the same
    return task, initialised


def build_trainer(cfg: DictConfig, plain: dict, out_dir: Path, in_place: bool, started: float) -> tuple:
    """-> (the Lightning Trainer with every callback and logger a run has; the run record; the divergence stop)."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor

    from modforge.run.callbacks import (FAULT_ENV, AtomicCheckpointIO, Checkpoints, DivergenceStop, FaultInjector,
                                        CarriedState, PauseAt, SaveOnPreemption)
    from modforge.run.monitoring import (AppendingCSVLogger, configured_callbacks, configured_loggers,
                                         progress_callbacks)

    record = CarriedState(started=started)
    divergence = DivergenceStop(cfg.divergence_patience)
    ckpt_cb = Checkpoints(divergence, dirpath=out_dir / "checkpoints", filename="best", monitor="val/loss",
                          mode="min", save_top_k=1, save_last=True, auto_insert_metric_name=False,
                          enable_version_counter=False)  # one last.ckpt, also in a run directory that moved
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
    if cfg.get("pause_at") is not None:
        callbacks.append(PauseAt(cfg.pause_at))
    if (preempt := SaveOnPreemption.signal_of_submitit()) is not None:  # after the fault injector: same step
        callbacks.append(SaveOnPreemption(preempt, out_dir / "checkpoints" / "last.ckpt", divergence))
    with measure.quiet_about_existing_records(in_place):
        trainer = L.Trainer(**settings, default_root_dir=str(out_dir),
                            logger=[AppendingCSVLogger(str(out_dir), name="logs", version=""),
                                    *configured_loggers(plain.get("logger"), out_dir, *measure.run_names(out_dir))],
                            callbacks=callbacks,
                            plugins=[AtomicCheckpointIO()])
    return trainer, record, divergence


def fit(trainer: Any, task: Any, dm: Any, start: Start, record: Any, clock: "measure.Phases",
        eval_at_start: bool) -> None:
    """The step-0 evaluation (a fresh run), then ``Trainer.fit`` from step 0 or from the checkpoint. DDP ranks
    that Lightning starts here follow this process's decision, handed over in their environment."""
    os.environ[ranks.FOLLOW_ENV] = json.dumps({"resume": start.resume, "in_place": start.in_place})
    try:
        if eval_at_start and not start.resume:
            record.val_loss_at_start = measure.val_metrics(trainer.validate(task, datamodule=dm, verbose=False)).get(
                "val/loss")
        clock.mark("eval_at_start")
        record.fit_started()
        train_before = record.train_before
        with measure.quiet_about_existing_records(start.in_place):
            try:
                trainer.fit(task, datamodule=dm, ckpt_path=start.resume, weights_only=True)
            except RuntimeError as e:  # a callback's monitored metric that no validation logs
                if "conditioned on metric" not in str(e):
                    raise
                raise ConfigError(f"callbacks: {str(e).splitlines()[0]}") from None
        clock.mark("fit")
        clock.split("fit", "train_steps", record.train_seconds - train_before)  # the rest: validations, checkpoints
        record.fit_ended = record.fit_seconds  # what fit took, before the final evaluations
    finally:
        os.environ.pop(ranks.FOLLOW_ENV, None)


def paused(out_dir: Path, step: int, rank0: bool, val: Optional[dict] = None, kept: bool = False) -> dict:
    """A run stopped by ``pause_at``: recorded as interrupted at that step (a re-run without it continues), with
    its validation there (``paused_at``, ``val``: what successive halving ranks runs by). ``kept``: it paused
    there before, and its record stays as it is."""
    record = {"status": "interrupted", "error": f"paused at step {step} (pause_at); run again without it to continue",
              "paused_at": int(step), "val": val or {}}
    if kept:  # paused there before; a run killed between its checkpoint and this record gets the record now
        had = read_json(out_dir / "status.json")
        if isinstance(had, dict) and pause_of(had, "interrupted") is not None:
            return had
        record["val"] = checkpoint_val(out_dir / "checkpoints" / "last.ckpt", step)
    if rank0:
        write_json(out_dir / "status.json", record)
        say(f"[modforge] paused at step {step} (pause_at): {out_dir} continues from there when run again without it")
    return record


def checkpoint_val(ckpt: Path, step: int) -> dict:
    """The validation a checkpoint's divergence callback kept (``last_val``), when it was made at ``step``."""
    try:
        import torch

        state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
        for key, v in (state.get("callbacks") or {}).items():
            last = v.get("last_val") if "DivergenceStop" in str(key) and isinstance(v, dict) else None
            if isinstance(last, dict) and last.get("step") == step:
                return {k: float(x) for k, x in last.items() if k != "step" and isinstance(x, (int, float))}
    except Exception:  # noqa: BLE001 - no record to read: the pause is recorded without its validation
        pass
    return {}


def finish(metrics: dict, trainer: Any, out_dir: Path) -> dict:
    """``metrics.json`` and the summary (rank 0), then the loggers are closed."""
    from modforge.run.monitoring import finish_loggers

    if trainer.is_global_zero:
        write_json(out_dir / "metrics.json", metrics, indent=2)
        print_summary(metrics, out_dir)
    finish_loggers(trainer.loggers)
    return metrics
