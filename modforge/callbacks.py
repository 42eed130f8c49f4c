"""Lightning callbacks of our own (the rest are Lightning's)."""
import time

import lightning as L


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
