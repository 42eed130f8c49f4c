"""Entry point: ``python -m modforge.train [group=option ...] [key=value ...]``.

Thin on purpose: load the registry (built-ins and plugins), check the command
line, let Hydra compose, then build data, task and Trainer and fit. Any
:class:`~modforge.registry.ModforgeError` is printed as one line, with no traceback.
"""
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.builtins import load_all
from modforge.checkpoints import facts_state, find_checkpoint, read_checkpoint
from modforge.cli import one_line_errors
from modforge.config import CONF_DIR, ROOT_KEYS, check_overrides, check_root_value, check_trainer_key, to_plain


def validate(cfg: DictConfig) -> None:
    """Everything that can be checked before any work: every component group resolved to its typed config
    (values in range), task, model and data fitting together, the root keys' types, the Trainer's values."""
    typed = {g: registry.make_config(g, cfg[g]) for g in registry.group_kinds() if g in cfg}
    check_trainer_keys(cfg.trainer)
    check_trainer_values(cfg.trainer)
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


def check_trainer_values(t: Any) -> None:
    """The Trainer values that Lightning or torch would only reject after data preparation, or never."""
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
                L.Trainer(**settings, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
        finally:
            quiet.setLevel(level)
    except Exception as e:  # noqa: BLE001 - Lightning's MisconfigurationException, ValueError, TypeError ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        named = [k for k in settings if f"{k}=" in first] or [k for k in settings if k in first]
        where = f"trainer.{named[0]}={settings[named[0]]}" if named else "trainer"
        raise registry.ConfigError(f"{where}: {first}") from None


# keys a resumed run may change: where the data is and how it is loaded, what the end-of-run summary shows
RESUME_FREE_KEYS = ("data.path", "data.cache_dir", "data.num_workers", "data.encoding", "task.sample_chars",
                    "task.sample_prompt", "task.sample_temperature", "task.sample_top_k")


def user_override_keys(argv: Optional[list] = None) -> list:
    """The keys the user set on the command line (this job's, in a sweep); [] when unknown (in-process use)."""
    if argv is None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return []
        argv = list(HydraConfig.get().overrides.task)
    return [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")]


def resumed_config(cfg: DictConfig, resume: str, user_keys: list, ckpt: Optional[dict] = None) -> DictConfig:
    """The config a resumed run trains with: every component group (model, data and its tokenizer, task,
    norm, ..., optimizer, schedule) from the checkpoint, the rest (trainer, seed, ...) from the command line.
    A command-line key that would change a component is refused, naming it; so is a run that has finished."""
    from omegaconf import open_dict

    if ckpt is None:  # weights only: a file that would run code is refused, in one line
        ckpt = read_checkpoint(resume, "resume")
    saved = ckpt["hyper_parameters"]["run_cfg"]
    groups = [g for g in registry.group_kinds() if g in saved]
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
    step, max_steps = int(ckpt.get("global_step", 0)), cfg.trainer.max_steps
    if max_steps > 0 and step >= max_steps:
        raise registry.ConfigError(
            f"resume={resume}: that run has finished (step {step} of trainer.max_steps={max_steps}); to train it "
            f"further, raise the limit, e.g. resume={resume} trainer.max_steps={2 * step}")
    free = {k: OmegaConf.select(cfg, k) for k in user_keys if k in RESUME_FREE_KEYS}
    cfg = cfg.copy()
    with open_dict(cfg):
        for g in groups:
            cfg[g] = OmegaConf.create(saved[g])
        for k, v in free.items():  # keys that change how, not what, is trained
            OmegaConf.update(cfg, k, v, merge=False)
    validate(cfg)
    return cfg


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


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Train one configuration; write config.yaml, checkpoints, CSV logs and metrics.json to ``out_dir``."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from modforge.callbacks import AtomicCheckpointIO, TrainTimer
    from torch import nn

    from modforge.io import write_json, write_text

    t_start = time.perf_counter()
    load_all()
    validate(cfg)
    resume = resume_path(cfg.get("resume"))  # a missing checkpoint fails here, before any output
    tokenizer = None
    if resume:
        from modforge.data.base import DataFacts

        ckpt = read_checkpoint(resume, "resume")
        cfg = resumed_config(cfg, resume, user_override_keys(), ckpt)
        # the model's own tokenizer: text is read with the ids it was trained on, never refitted
        tokenizer = DataFacts.from_state(facts_state(ckpt)).tokenizer
        del ckpt  # Lightning loads it again for the weights, optimizer and loops
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = to_plain(cfg)
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(plain))  # every DDP rank writes it
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    dm = registry.build("data", cfg.data)
    facts = dm.prepare(tokenizer)
    check_positions(facts.positions, cfg.model.max_len, f"data={cfg.data.name}")
    entry, task_cfg = registry.make_config("task", cfg.task)
    task = entry.cls(task_cfg, plain, facts)
    n_params = sum(p.numel() for p in task.model.parameters())
    # Kaplan et al.'s N: without token and learned position embeddings (a tied output head counts once, there)
    n_embedding = sum(p.numel() for p in {p for m in task.model.modules() if isinstance(m, nn.Embedding)
                                           for p in m.parameters()})

    timer = TrainTimer()
    ckpt = ModelCheckpoint(dirpath=out_dir / "checkpoints", filename="best", monitor="val/loss", mode="min",
                           save_top_k=1, save_last=True, auto_insert_metric_name=False)
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True), default_root_dir=str(out_dir),
                        logger=CSVLogger(str(out_dir), name="logs", version=""),
                        callbacks=[ckpt, LearningRateMonitor(logging_interval="step"), timer],
                        plugins=[AtomicCheckpointIO()])

    start_loss: Optional[float] = None
    if cfg.eval_at_start and not resume:
        start_loss = _val_metrics(trainer.validate(task, datamodule=dm, verbose=False)).get("val/loss")
    t_fit = time.perf_counter()
    trainer.fit(task, datamodule=dm, ckpt_path=resume, weights_only=True)
    fit_seconds = time.perf_counter() - t_fit
    final = _val_metrics(trainer.validate(task, datamodule=dm, verbose=False))

    diverged = not all(math.isfinite(v) for v in final.values())
    metrics = {
        "status": "diverged" if diverged else "finished",  # diverged: a non-finite validation metric (written null)
        "val": final,
        "val_loss_at_start": start_loss,
        **{k: v for k, v in facts.stats.items() if k == "unigram_val_loss"},
        "params": n_params,
        "params_non_embedding": n_params - n_embedding,
        "ffn_hidden": next((m.hidden for m in task.model.modules() if hasattr(m, "hidden")), None),
        "steps": trainer.global_step,
        "tokens_seen": task.tokens_seen * trainer.world_size,  # every rank sees its own shard
        "fit_seconds": round(fit_seconds, 2),
        "train_seconds": round(timer.train_seconds, 2),
        "tokens_per_sec": (round(task.tokens_seen * trainer.world_size / timer.train_seconds, 1)
                           if timer.train_seconds > 0 else None),
        "wall_seconds": round(time.perf_counter() - t_start, 2),
        "checkpoint": ckpt.last_model_path or None,
        "config": {g: plain[g].get("name") for g in registry.group_kinds() if g in plain},
    }
    if cfg.sample and trainer.is_global_zero:
        metrics["sample"] = task.summary_sample()
    if trainer.is_global_zero:
        write_json(out_dir / "metrics.json", metrics, indent=2)
        print_summary(metrics, out_dir)
    return metrics


def _val_metrics(results: list) -> dict:
    out: dict = {}
    for r in results or []:
        out.update({k: float(v) for k, v in r.items()})
    return out


def print_summary(m: dict, out_dir: Path) -> None:
    names = " ".join(f"{k}={v}" for k, v in m["config"].items())
    print(f"\n== modforge run: {names}")
    val = "  ".join(f"{k}={v:.4f}" for k, v in sorted(m["val"].items()))
    print(f"   final      {val}")
    if m.get("val_loss_at_start") is not None:
        extra = f" (unigram model: {m['unigram_val_loss']:.4f})" if "unigram_val_loss" in m else ""
        print(f"   at start   val/loss={m['val_loss_at_start']:.4f}{extra}")
    tps = m["tokens_per_sec"]
    print(f"   {m['params']:,} parameters (FFN hidden width {m['ffn_hidden']}), {m['steps']} steps, {m['tokens_seen']:,} tokens, "
          f"{m['train_seconds']:.1f} s training ({tps:,.0f} tokens/s), {m['wall_seconds']:.1f} s wall")
    if m.get("sample"):
        print("   sample:\n" + "\n".join("   | " + line for line in m["sample"].splitlines()))
    print(f"   outputs: {out_dir}")


_HYDRA_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
_NOT_FOR_RANKS = ("hydra.sweep.", "hydra.mode=", "hydra.run.dir=", "hydra.job.name=", "hydra.output_subdir=")


def job_argv(argv: list, hc: Any) -> list:
    """The command line of one sweep job: Hydra's config flags and hydra.* overrides kept, the sweep replaced
    by the job's own overrides, ``-m`` and the sweep/run directories dropped (Lightning adds the run dir)."""
    flags, rest = [], iter(argv[1:])
    for a in rest:
        if a in _HYDRA_VALUE_FLAGS:
            flags += [a, next(rest, "")]
        elif a.split("=", 1)[0] in _HYDRA_VALUE_FLAGS:
            flags.append(a)
    hydra_overrides = [o for o in hc.overrides.hydra if not o.lstrip("+~").startswith(_NOT_FOR_RANKS)]
    return [argv[0], *flags, *hydra_overrides, *hc.overrides.task]


@contextlib.contextmanager
def sweep_job():
    """Let a multirun job use DDP: Lightning's relaunch must run this job only, and the next job start clean.

    Lightning starts ranks 1..N-1 as ``python -m modforge.train <sys.argv[1:]>
    hydra.run.dir=<HydraConfig run.dir>`` (Lightning issues #11300, #2727).
    Inside a multirun, sys.argv still holds ``-m`` and the whole sweep and
    ``run.dir`` is not the job's directory, so each rank would start the sweep
    over elsewhere: here sys.argv becomes this job's command line (``job_argv``)
    and ``run.dir`` its directory. Afterwards the process group is destroyed and the
    environment variables Lightning set (LOCAL_RANK, WORLD_SIZE, MASTER_PORT ...)
    are removed; otherwise the next job would believe its ranks already exist.
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
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        sys.argv = argv
        os.environ.clear()
        os.environ.update(env)


@contextlib.contextmanager
def failure_recorded(out_dir: Path):
    """A run that raises leaves ``status.json`` (``failed`` and the one-line error) beside its other records, so
    a sweep's report counts it as failed, not as still running; the exception then goes on as before."""
    try:
        yield
    except BaseException as e:
        from modforge.io import write_json

        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        with contextlib.suppress(OSError):
            write_json(out_dir / "status.json", {"status": reason, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
        raise


_HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc",
                     "--version")


def preflight(argv: list, multirun: bool) -> int:
    """Check the command line, then compose and validate every job it runs (each of a sweep's) before the
    first one starts; all invalid jobs are named at once. Returns the number of jobs."""
    from modforge.config import compose_job, check_output_dir, hydra_loader, job_overrides

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
        bad = []
        for i, job in enumerate(jobs):
            try:
                cfg = compose_job(job, hydra=(i == 0))
            except registry.ConfigError as e:
                bad.append((i, job, e))
                continue
            if i == 0:  # the run (or sweep) directory is the command's, not a job's: it fails at once
                key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
                check_output_dir(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir), key)
            try:
                validate(cfg)
                resume = resume_path(cfg.get("resume"))
                if resume:
                    resumed_config(cfg, resume, user_override_keys(job))
            except registry.ConfigError as e:
                bad.append((i, job, e))
    if len(jobs) == 1 and bad:
        raise bad[0][2]
    if bad:
        varying = {o.split("=")[0] for j in jobs for o in j} - {o.split("=")[0] for o in set.intersection(*map(set, jobs))}
        described = "; ".join(f"#{i} ({' '.join(o for o in job if o.split('=')[0] in varying)}): {e}" for i, job, e in bad)
        raise registry.ConfigError(f"{len(bad)} of {len(jobs)} jobs are invalid, so the sweep does not start: {described}")
    return len(jobs)


def main(argv: Optional[list] = None) -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    argv = sys.argv[1:] if argv is None else argv
    with one_line_errors():
        load_all()
        relaunched_rank = os.environ.get("LOCAL_RANK", "0") != "0"  # a DDP rank Lightning started: rank 0 checked
        if not relaunched_rank and not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in argv):
            preflight(argv, multirun=any(a in ("-m", "--multirun") for a in argv))

    @hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
    def _app(cfg: DictConfig) -> Optional[float]:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        with one_line_errors(), sweep_job(), failure_recorded(out_dir):
            m = run(cfg, out_dir)
        loss = m["val"].get("val/loss")
        return loss if loss is not None and math.isfinite(loss) else None  # for Hydra sweepers

    sys.argv = [sys.argv[0]] + argv
    _app()


if __name__ == "__main__":
    main()
