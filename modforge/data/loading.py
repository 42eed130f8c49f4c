"""Training batches that resume exactly where a run stopped.

Lightning saves the ``state_dict()`` of every training dataloader that has one
in each checkpoint, and hands it back through ``load_state_dict()`` before the
resumed run draws its first batch (its "stateful dataloader" interface). Two
pieces make the order of batches part of that state:

* :class:`ResumableRandomSampler` is torch's ``RandomSampler`` whose permutation
  for epoch ``e`` comes from its own generator, seeded from the run's data seed
  and ``e`` alone (:mod:`modforge.utils.seeds`): never from the global generator,
  whose state depends on how many random numbers building the model took. Two
  runs with one ``seed`` see the same batches whatever their components;
* :class:`ResumableLoader` is a ``DataLoader`` whose state is the number of
  batches the run has trained on in the epoch (and the epoch); on load it skips
  those batches (as index lists: no data is read for them).

The number of batches trained on is asked of the Trainer (``consumed``): the
loader itself cannot know it, because Lightning fetches one batch ahead.
The global RNG states (dropout) are the callback
:class:`~modforge.run.callbacks.CarriedState`'s part of the checkpoint; a task's own
data generator (masking) is the task's.
"""
import itertools
import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader, RandomSampler


class ResumableRandomSampler(RandomSampler):
    """``RandomSampler`` whose order in epoch ``e`` is a function of ``seed`` and ``e`` only.

    ``seed``: the run's data seed (:func:`modforge.utils.seeds.derive` of its ``seed``); the epoch is counted by
    the sampler itself, from ``first_epoch`` (the Trainer's epoch when the loader is made), and set by
    :meth:`resume_at` from a checkpoint. With ``seed=None`` each epoch's seed is drawn from the global generator,
    as ``RandomSampler`` does (a loader made outside a datamodule); ``resume_with`` then hands over the seed a
    checkpoint recorded for its epoch in progress (also that of a checkpoint from before common random numbers).
    """

    def __init__(self, *args: Any, seed: Optional[int] = None, first_epoch: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seed, self.started = seed, int(first_epoch)  # started: the index of the next epoch to draw
        self.epoch_seed: Optional[int] = None
        self._pending: Optional[int] = None

    def resume_with(self, seed: Optional[int]) -> None:
        self._pending = seed

    def resume_at(self, epoch: int) -> None:
        self.started = int(epoch)

    def next_epoch_seed(self) -> int:
        if self._pending is not None:
            seed, self._pending = self._pending, None
            return seed
        if self.seed is None:  # exactly RandomSampler's draw
            return int(torch.empty((), dtype=torch.int64).random_().item())
        from modforge.utils.seeds import derive

        return derive(self.seed, f"epoch/{self.started}")

    def __iter__(self) -> Iterator[int]:
        seed = self.next_epoch_seed()
        self.started += 1
        self.epoch_seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        try:
            yield from super().__iter__()
        finally:
            self.generator = None


class _Skipping:
    """A batch sampler whose first ``skip`` batches are dropped; its length stays the epoch's, as Lightning
    counts the batches already trained on itself."""

    def __init__(self, batches: Any, skip: int):
        self.batches, self.skip = batches, skip

    def __iter__(self):  # once: persistent workers iterate the same object again at each later epoch
        skip, self.skip = self.skip, 0
        return itertools.islice(iter(self.batches), skip, None)

    def __len__(self) -> int:
        return len(self.batches)


class ResumableLoader(DataLoader):
    """A ``DataLoader`` with Lightning's ``state_dict`` / ``load_state_dict``: where in its epoch a run is.

    ``consumed()`` says how many batches of the current epoch the run has trained on (None: count the
    batches this loader has handed out). Works with or without workers and under Lightning's
    distributed sampler (which replaces the sampler, not this class).
    """

    def __init__(self, *args: Any, consumed: Optional[Callable[[], Optional[int]]] = None,
                 complete: Optional[Callable[[], bool]] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._consumed, self._complete = consumed, complete
        self._handed_out = 0
        self._skip = 0

    @property
    def _index_sampler(self):  # read once by each new iterator (and at each epoch by persistent workers)
        base = super()._index_sampler
        return _Skipping(base, self._skip) if self._skip else base

    def __iter__(self):
        it = super().__iter__()
        self._skip = 0  # only the epoch being resumed is shortened
        self._handed_out = 0
        return self._counting(it)

    def _counting(self, it: Any) -> Iterator[Any]:
        for batch in it:
            self._handed_out += 1
            yield batch

    def state_dict(self) -> dict:
        done = self._consumed() if self._consumed is not None else None
        done = int(self._handed_out if done is None else done)
        sampler = self.sampler if isinstance(self.sampler, ResumableRandomSampler) else None
        if sampler is not None and sampler.seed is not None:  # the order follows from the data seed and the epoch:
            finished = self._complete() if self._complete is not None else False  # the next one, or this one again
            return {"batches": done, "epoch": sampler.started if finished or not sampler.started else sampler.started - 1}
        # no batch of the epoch trained (or all of them): the next epoch draws its own seed, after the RNG restore
        seed = getattr(self.sampler, "epoch_seed", None) if done else None
        return {"batches": done, "epoch_seed": seed}

    def load_state_dict(self, state: dict) -> None:
        self._skip = int(state.get("batches", 0))
        if isinstance(self.sampler, ResumableRandomSampler):
            if state.get("epoch_seed") is not None or self.sampler.seed is None:  # that seed's epoch, continued
                self.sampler.resume_with(state.get("epoch_seed"))
            if "epoch" in state:
                self.sampler.resume_at(state["epoch"])


def train_loader(dataset: Any, *, batch_size: int, shuffle: bool = True, replacement: bool = False,
                 num_samples: Optional[int] = None, consumed: Optional[Callable[[], Optional[int]]] = None,
                 seed: Optional[int] = None, first_epoch: int = 0, complete: Optional[Callable[[], bool]] = None,
                 **kwargs: Any) -> ResumableLoader:
    """The training loader every built-in datamodule uses: shuffled by :class:`ResumableRandomSampler`
    (``replacement``/``num_samples`` as ``RandomSampler``'s; each epoch's order from ``seed`` and the epoch,
    counted from ``first_epoch``), resumable mid-epoch (``consumed``: batches of the epoch trained;
    ``complete``: whether the epoch in progress has trained all of them)."""
    sampler = ResumableRandomSampler(dataset, replacement=replacement, num_samples=num_samples, seed=seed,
                                     first_epoch=first_epoch) if shuffle else None
    return ResumableLoader(dataset, batch_size=batch_size, sampler=sampler, consumed=consumed, complete=complete,
                           **kwargs)


def evaluated_items(n_items: int, batch_size: int, limit: Any) -> int:
    """How many items one process validates (the first ones, in order) under ``trainer.limit_val_batches=limit``:
    Lightning's rule (an int caps the batches, a fraction scales them), counted in items."""
    batches = math.ceil(n_items / batch_size)
    if isinstance(limit, float) and not isinstance(limit, bool):
        batches = int(batches * limit)
    elif limit is not None:
        batches = min(batches, int(limit))
    return min(n_items, batches * batch_size)


def eval_loader(dataset: Any, *, batch_size: int, world_size: int = 1, rank: int = 0, limit: Any = None,
                **kwargs: Any) -> DataLoader:
    """A validation loader, in order. With ``world_size`` > 1 (DDP) rank ``rank`` gets every world_size-th item
    of exactly the items one process would validate (:func:`evaluated_items`), none repeated: torch's
    ``DistributedSampler``, which Lightning would put here, pads the ranks with repeated items, so a DDP run's
    validation would count some twice and differ from one process's. The ranks' shares differ by one item
    at most, and each rank runs at most ``limit`` batches, so Lightning's own limit cuts nothing more."""
    if world_size <= 1:
        return DataLoader(dataset, batch_size=batch_size, **kwargs)
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
    from torch.utils.data import Subset

    n = evaluated_items(len(dataset), batch_size, limit)
    if 0 < n < world_size:
        from modforge.registry import ConfigError

        raise ConfigError(f"trainer.limit_val_batches={limit}: validation would see {n} items, fewer than the "
                          f"{world_size} DDP ranks (each needs at least one)")
    part = Subset(dataset, range(n))
    sampler = UnrepeatedDistributedSampler(part, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(part, batch_size=batch_size, sampler=sampler, **kwargs)
