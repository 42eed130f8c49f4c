"""Lightning callbacks and plugins of our own (the rest are Lightning's)."""
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from modforge.io import atomic_file, remove_stale_temporaries


class TrainTimer(L.Callback):
    """Wall time of training, excluding validation: the denominator of tokens/second.

    Everything between the first and the last training batch counts (data
    loading, forward, backward, optimizer, Lightning's own per-step work);
    validation loops inside that span are subtracted.
    """

    def __init__(self):
        self.train_seconds = 0.0
        self._t0 = None
        self._val_t0 = None

    def on_train_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def on_validation_start(self, trainer, pl_module):
        if self._t0 is not None:
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self._val_t0 is not None:
            self.train_seconds -= time.perf_counter() - self._val_t0
            self._val_t0 = None

    def on_train_end(self, trainer, pl_module):
        if self._t0 is not None:
            self.train_seconds += time.perf_counter() - self._t0
            self._t0 = None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints on local disk written to a temporary file beside the target, fsynced, then renamed.

    Lightning's own save serialises to memory and then writes the target in a
    fsspec transaction whose temporary file lives in the system temp directory;
    when that is another filesystem the final "rename" is a copy, and a crash
    during it leaves a truncated ``last.ckpt``. Here a crash at any point leaves
    the previous checkpoint intact; the temporary file of a killed process is
    removed at the next save. Remote URLs (``s3://`` ...) keep Lightning's path.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        remove_stale_temporaries(Path(path))
        with atomic_file(Path(path), "wb", durable=True) as fh:
            torch.save(checkpoint, fh)
