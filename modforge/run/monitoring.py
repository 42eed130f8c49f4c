"""What a run shows and logs while it trains: the progress display, the throughput monitor and the loggers.

* :class:`LogProgress`: a progress display for log files (``callbacks.progress=log``, what ``auto`` picks when
  stdout is not a terminal), and :func:`progress_callbacks`, the choice;
* :func:`configured_callbacks`: the ``callbacks`` config's entries with a ``_target_``, instantiated;
* :class:`TokenThroughput`: Lightning's ``ThroughputMonitor`` for modforge's batches (``callbacks=throughput``);
* :func:`configured_loggers`, :func:`finish_loggers`: the ``logger`` config's loggers, with the run's defaults;
* :class:`AppendingCSVLogger`: Lightning's CSV logger, continuing a resumed run's ``metrics.csv``.
"""
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import ProgressBar, ThroughputMonitor
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from modforge.utils.console import say


# --------------------------------------------------------------------------- progress

class LogProgress(ProgressBar):
    """A progress display for logs that are files: one plain line every ``every`` optimizer steps and one after
    each validation, through Python logging (so also into Hydra's ``train.log``), never ``\\r`` updates."""

    def __init__(self, every: int = 50):
        super().__init__()
        self.every = every
        self._on = True
        self._last = -1
        self._t0 = 0.0
        self._step0 = 0

    def disable(self) -> None:
        self._on = False

    def enable(self) -> None:
        self._on = True

    def on_train_start(self, trainer, pl_module):
        self._t0, self._step0 = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not self._on or step == self._last or step % self.every:
            return
        self._last = step
        loss = trainer.callback_metrics.get("train/loss")
        rate = (step - self._step0) / max(time.perf_counter() - self._t0, 1e-9)
        total = f"/{trainer.max_steps}" if trainer.max_steps > 0 else ""
        say(f"step {step}{total}  train/loss {float(loss):.4f}  {rate:.1f} steps/s" if loss is not None
            else f"step {step}{total}  {rate:.1f} steps/s")

    def on_validation_end(self, trainer, pl_module):
        if not self._on or trainer.sanity_checking:
            return
        val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        what = "validation" if trainer.state.fn == "fit" else "evaluation"  # inside training, or on its own
        say(f"step {trainer.global_step}  {what}  " + "  ".join(f"{k} {v:.4f}" for k, v in sorted(val.items())))




def progress_callbacks(choice: str, every: int, stdout_is_terminal: bool) -> list:
    """The progress display ``callbacks.progress`` asks for: [] means Lightning's default (tqdm) or, for
    "none", no display at all (the caller turns the Trainer's progress bar off)."""
    if choice == "auto":
        choice = "tqdm" if stdout_is_terminal else "log"
    if choice == "log":
        return [LogProgress(every)]
    if choice == "rich":
        from lightning.pytorch.callbacks import RichProgressBar

        return [RichProgressBar()]
    return []


def configured_callbacks(node: Any) -> list:
    """Every entry of the ``callbacks`` config with a ``_target_`` (early stopping, a user's own class ...),
    instantiated by Hydra."""
    from hydra.utils import instantiate

    from modforge.config.untrusted import check_targets

    check_targets({"callbacks": node})  # validated before; checked again where it is built
    return [instantiate(v) for v in (node or {}).values() if isinstance(v, Mapping) and "_target_" in v]


# --------------------------------------------------------------------------- throughput

def batch_samples(batch: Any) -> int:
    """Samples in a batch of any built-in task: (x, y) windows, or a dict of padded sequences."""
    first = batch[0] if isinstance(batch, (list, tuple)) else next(iter(batch.values()))
    return int(first.shape[0])


def batch_tokens(batch: Any) -> int:
    """Input tokens in a batch (positions, padding included: what the model computes on)."""
    if isinstance(batch, (list, tuple)):
        return int(batch[0].numel())
    return int(sum(batch[k].numel() for k in ("src", "tgt_in") if k in batch))


def step_flops(pl_module: Any, batch: Any) -> Optional[int]:
    """FLOPs of one training step (forward and backward) for token-stream batches, counted by torch's
    FlopCounter on a copy of the model on the meta device (nothing is computed); None for other batches."""
    import copy

    from lightning.fabric.utilities.throughput import measure_flops

    if not (isinstance(batch, (list, tuple)) and isinstance(batch[0], torch.Tensor)):
        return None
    with torch.device("meta"):
        model = copy.deepcopy(pl_module.model).to("meta")
    x = torch.zeros(tuple(batch[0].shape), dtype=torch.long, device="meta")
    return int(measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum))


class TokenThroughput(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` for modforge's batches (``callbacks=[default,throughput]``): batches,
    samples and tokens per second, and, when the FLOPs of a step can be counted (:func:`step_flops`, on the
    first batch's shape), FLOPs per second and MFU (the latter where Lightning knows the device's peak: CUDA
    GPUs). Logged to every logger as ``train/device/...`` every ``log_every_n_steps``."""

    def __init__(self, measure_flops: bool = True, **kwargs: Any):
        super().__init__(batch_size_fn=batch_samples, length_fn=batch_tokens, **kwargs)
        self.measure_flops = measure_flops
        self._train_flops: Optional[int] = None
        self._measured = False

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        pl_module.flops_per_batch = None  # Lightning reads the attribute at every stage; train steps set it

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.measure_flops and not self._measured:
            self._measured = True
            try:
                self._train_flops = step_flops(pl_module, batch)
            except Exception as e:  # noqa: BLE001 - an op the FlopCounter cannot run on meta tensors
                say(f"[modforge] FLOPs per step not measured ({type(e).__name__}: {e}); throughput without them")
        pl_module.flops_per_batch = self._train_flops

    def on_validation_start(self, trainer, *args):
        super().on_validation_start(trainer, *args)
        trainer.lightning_module.flops_per_batch = None  # a training step's FLOPs do not describe validation


# --------------------------------------------------------------------------- logging

def configured_loggers(node: Any, out_dir: Path, name: str, group: str) -> list:
    """The loggers ``logger=`` chose (every entry with a ``_target_``), instantiated by Hydra with the run's
    defaults filled in where the config leaves them open: files under the run directory (``save_dir``, an
    MLflow file store), the run's name and, for W&B, its group. CSV is not among them: every run writes
    ``logs/metrics.csv`` (:class:`AppendingCSVLogger`)."""
    import inspect

    from hydra.utils import get_class, instantiate

    from modforge.registry import ConfigError

    from modforge.config.untrusted import check_targets

    check_targets({"logger": node})  # validated before; checked again where it is built
    out = []
    for key, value in (node or {}).items():
        if not isinstance(value, Mapping) or "_target_" not in value:
            continue
        params = inspect.signature(get_class(value["_target_"]).__init__).parameters
        extra: dict = {}
        if "save_dir" in params and value.get("save_dir") is None:
            extra["save_dir"] = str(out_dir)
        if "tracking_uri" in params and value.get("tracking_uri") is None:  # a file store: offline, in the run
            extra["tracking_uri"] = (out_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in
        for field in ("run_name", "name"):
            if field in params and field in value and value.get(field) is None:
                extra[field] = name
        if "group" in value and value.get("group") is None:
            extra["group"] = group
        try:
            out.append(instantiate(dict(value), **extra))
        except Exception as e:  # noqa: BLE001 - the logger's own complaint (a server unreachable, a bad key ...)
            cause = e.__cause__ or e
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise ConfigError(f"logger.{key} could not be created: {type(cause).__name__}: {first}") from None
    return out


def finish_loggers(loggers: list) -> None:
    """End each logger's run now (W&B keeps one run per process open otherwise, so the next job of a sweep
    would log into it: W&B #1314, Lightning #5212)."""
    for logger in loggers:
        experiment = getattr(logger, "_experiment", None)
        if type(logger).__name__ == "WandbLogger" and hasattr(experiment, "finish"):
            experiment.finish()


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer deletes an existing ``metrics.csv``; this one continues it (its columns kept)."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            import csv

            with open(self.metrics_file_path, newline="", encoding="utf-8") as fh:
                self.metrics_keys = sorted(next(csv.reader(fh), []))


class AppendingCSVLogger(CSVLogger):
    """``CSVLogger`` whose ``metrics.csv`` a resumed run appends to (trimmed to its checkpoint's step first,
    by :func:`modforge.run.dirs.trim_metrics_csv`), so the file reads as one uninterrupted run's."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
