"""What a run measures at its end, and its clocks: the final validation (reused when fit already validated
these very weights), evaluation at other lengths, parameter counts, where the session's time went."""
import contextlib
import math
import time
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry


class Phases:
    """Where this session's wall time went (``metrics.json``'s ``session_seconds``): each phase from the end
    of the one before. ``before_run`` is the command's own work before the run started (Hydra, pre-flight),
    from ``command_start`` (the command's ``time.perf_counter()`` when it started)."""

    def __init__(self, t0: float, command_start: float):
        self.t0, self.command_start = t0, command_start
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


def epochs_trained(trainer: Any, dm: Any, tokens: int) -> Optional[float]:
    """Passes over the training data: the data's own count where it has one (text cut into windows at
    every position, where an epoch of the loader would be ``block_size`` passes), else loader epochs."""
    passes = dm.passes(tokens) if hasattr(dm, "passes") else None
    if passes is not None:
        return round(passes, 3)
    n = trainer.num_training_batches
    return round(trainer.global_step * trainer.accumulate_grad_batches / n, 3) if n and math.isfinite(n) else None


def steady_rate(record: Any, steps: int, tokens: int) -> Optional[float]:
    """Tokens/s after the first steps of the last session (``CarriedState.warm``); None when it ran no more."""
    if record.warm is None or steps <= record.warm[0]:
        return None
    seconds = record.train_seconds - record.warm[1]
    return round(tokens / steps * (steps - record.warm[0]) / seconds, 1) if seconds > 0 else None


def parameter_counts(model: Any) -> tuple:
    """(all parameters, those in embeddings): Kaplan et al.'s N is the difference, without token and learned
    position embeddings (a tied output head counts once, there)."""
    from torch import nn

    n_params = sum(p.numel() for p in model.parameters())
    n_embedding = sum(p.numel() for p in {p for m in model.modules() if isinstance(m, nn.Embedding)
                                           for p in m.parameters()})
    return n_params, n_embedding


def final_metrics(cfg: DictConfig, plain: dict, trainer: Any, task: Any, dm: Any, facts: Any, record: Any,
                  divergence: Any, out_dir: Path, clock: Phases, initialised: Any = None) -> dict:
    """``metrics.json``: status, the final validation (or, diverged, the last finite values), sizes, steps,
    tokens, times, the sample."""
    from modforge.run.callbacks import weights_fingerprint
    from modforge.utils import devices

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
            metrics["val"] = val_metrics(trainer.validate(task, datamodule=dm, verbose=False))
        if not all(math.isfinite(v) for v in metrics["val"].values()):
            metrics["status"] = "diverged"  # a non-finite validation metric (written null)
        if cfg.get("eval_block_sizes") and metrics["status"] == "finished":
            eval_at_lengths(cfg, trainer, task, facts.tokenizer, metrics)
    clock.mark("final_eval")
    metrics["metric_info"] = type(task).metric_info(metrics.get("val") or {})
    n_params, n_embedding = task.sizes
    metrics.update({
        "val_loss_at_start": record.val_loss_at_start,
        **{k: v for k, v in facts.stats.items() if k == "unigram_val_loss"},
        "params": n_params,
        "params_non_embedding": n_params - n_embedding,
        "ffn_hidden": next((m.hidden for m in task.model.modules() if hasattr(m, "hidden")), None),
        "parametrisation": task.param.describe() or None,  # param=mup: its width and depth over the base
        "steps": trainer.global_step,
        "tokens_seen": tokens,
        # passes over the training data, and the dropout they were trained with (the report warns when a
        # comparison rests on repeated epochs without it)
        "epochs": epochs_trained(trainer, dm, tokens),
        "dropout": plain.get("model", {}).get("dropout"),
        # the matrix products of training at the shapes it ran (modforge.models.flops), every rank's
        **flop_figures(task, trainer.world_size),
        # every training batch (and mask) in order, as rank 0 saw them: equal in two runs that trained on the same
        "data_checksum": "".join(f"{int(v):08x}" for v in task.batch_checksum.tolist())
        if task.counted_from_start else None,
        "fit_seconds": round(getattr(record, "fit_ended", record.fit_seconds), 2),
        "train_seconds": round(record.train_seconds, 2),
        "tokens_per_sec": round(tokens / record.train_seconds, 1) if record.train_seconds > 0 else None,
        "tokens_per_sec_steady": steady_rate(record, trainer.global_step, tokens),
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
    metrics["session_seconds"] = {"before_run": round(clock.t0 - clock.command_start, 2), **clock.rounded()}
    if record.first_step_clock is not None:  # start-up: the command's start to its first training batch
        metrics["seconds_to_first_step"] = round(record.first_step_clock - clock.command_start, 3)
    return metrics


def flop_figures(task: Any, world_size: int) -> dict:
    """The run's training FLOPs (:mod:`modforge.models.flops`), every rank's; None when the run was resumed
    from a checkpoint that predates the count (it would hold only the steps since)."""
    count = task.flop_count
    if count is None or not task.counted_from_start:
        return {"train_flops": None, "train_flops_per_token": None, "forward_flops_by_part": None}
    return {"train_flops": count.train * world_size,
            "train_flops_per_token": round(count.train / task.tokens_seen, 1) if task.tokens_seen else None,
            "forward_flops_by_part": {k: v * world_size for k, v in count.state().items()}}


def eval_at_lengths(cfg: DictConfig, trainer: Any, task: Any, tokenizer: Any, metrics: dict) -> None:
    """``eval_block_sizes``: validate the trained model again on the same val text cut into windows of each
    length (metrics ``val@N/loss`` ...), its positional scheme extended where it can be; a length it cannot
    run (a learned table) is recorded under ``not_applicable`` with the reason, not as a failure.
    ``eval_by_position``: also the mean loss at each position of those windows (``by_position["val@N"]``).
    ``eval_stride`` S: also a sliding-window evaluation at each length, a window every S tokens scoring its last
    S (``slideS@N/loss`` ...: every scored token sees at least N - S tokens of context)."""
    from modforge.components.positions import LengthNotSupported
    from modforge.tasks.lm import PositionLoss

    stride = cfg.get("eval_stride")
    loggers, trainer.loggers = trainer.loggers, []  # these are not points of the training curves
    try:
        for n in cfg.eval_block_sizes:
            try:
                task.model.extend_positions(int(n))
            except LengthNotSupported as e:
                metrics.setdefault("not_applicable", {})[f"val@{n}"] = str(e)
                continue
            tracking = bool(cfg.get("eval_by_position")) and hasattr(task, "position_loss")
            if tracking:
                task.position_loss = PositionLoss(int(n))
            try:
                got = validate_at(cfg, trainer, task, tokenizer, {"block_size": int(n)})
                if tracking:
                    metrics.setdefault("by_position", {})[f"val@{n}"] = task.position_loss.means(trainer.strategy)
            finally:
                if tracking:
                    task.position_loss = None
            metrics["val"].update({k.replace("val/", f"val@{n}/", 1): v for k, v in got.items()})
            if stride:
                got = validate_at(cfg, trainer, task, tokenizer, {"block_size": int(n), "val_stride": int(stride)})
                metrics["val"].update({k.replace("val/", f"slide{stride}@{n}/", 1): v for k, v in got.items()})
    finally:
        trainer.loggers = loggers


def validate_at(cfg: DictConfig, trainer: Any, task: Any, tokenizer: Any, data: dict) -> dict:
    dm = registry.build("data", OmegaConf.merge(cfg.data, data))
    dm.prepare(tokenizer)
    return val_metrics(trainer.validate(task, datamodule=dm, verbose=False))

def val_metrics(results: list) -> dict:
    out: dict = {}
    for r in results or []:
        out.update({k: float(v) for k, v in r.items()})
    return out

def run_names(out_dir: Path) -> tuple[str, str]:
    """(run name, group) for loggers that show runs by name: the job's overrides, and the same without the seed
    (the runs of one configuration); outside Hydra, the directory's name."""
    from hydra.core.hydra_config import HydraConfig

    from modforge.run.dirs import CONTROL_KEYS

    if not HydraConfig.initialized():
        return out_dir.name, out_dir.name
    overrides = [o for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") not in CONTROL_KEYS]
    name = ",".join(overrides) or "defaults"
    group = ",".join(o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "seed") or "defaults"
    return name, group

@contextlib.contextmanager
def quiet_about_existing_records(in_place: bool):
    """A run continued in place finds its own logs and checkpoints: Lightning's warnings about a non-empty
    directory are about exactly those."""
    import warnings

    with warnings.catch_warnings():
        if in_place:
            warnings.filterwarnings("ignore", message=r".*(exists and is not empty|Checkpoint directory).*")
        yield
