"""The contract of kind ``data``, and the facts a datamodule learns about its data.

A datamodule is built as ``cls(cfg)`` from its typed config. Its
:meth:`DataModule.prepare` reads the data, fits (or receives) the tokenizer and
returns :class:`DataFacts`: everything the task must know about the data
(the tokenizer, the longest sequence, tokens per character, class labels).
The facts are passed to the task explicitly and saved in every checkpoint, so a
reloaded model reports the same metrics as the run that trained it.
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import lightning as L

from torch.utils.data import DataLoader

from modforge.data.loading import ResumableLoader, eval_loader, train_loader
from modforge.data.tokenizers import Tokenizer, load_tokenizer


@dataclass
class DataFacts:
    """What :meth:`DataModule.prepare` learns, and the task needs."""

    tokenizer: Tokenizer
    positions: int  # the longest sequence a batch holds (the model needs this many positions)
    tokens_per_char: Optional[float] = None  # of the validation text: nats/token -> bits/char (None: not text)
    labels: Optional[list] = None  # class names, in label-id order (classification data)
    stats: dict = field(default_factory=dict)  # figures for metrics.json: sizes, a unigram baseline, ...
    eod_id: Optional[int] = None  # the id that parts documents in the token stream (None: no document marks)
    eod_policy: str = "end"  # end: that id closes each document (nanoGPT); start: it opens each (llm.c)
    tokens_per_byte: Optional[float] = None  # of the validation text's UTF-8: nats/token -> bits/byte (None: unknown)

    def state(self) -> dict:
        """Plain containers only (what a checkpoint stores)."""
        return {"tokenizer": self.tokenizer.state(), "positions": int(self.positions),
                "tokens_per_char": self.tokens_per_char, "labels": list(self.labels) if self.labels else None,
                "stats": dict(self.stats), "eod_id": self.eod_id, "eod_policy": self.eod_policy,
                "tokens_per_byte": self.tokens_per_byte}

    @classmethod
    def from_state(cls, state: dict) -> "DataFacts":
        return cls(load_tokenizer(state["tokenizer"]), int(state["positions"]), state.get("tokens_per_char"),
                   state.get("labels"), dict(state.get("stats") or {}), state.get("eod_id"),
                   state.get("eod_policy", "end"), state.get("tokens_per_byte"))


TOKENS = "a token stream"  # batches (x, y): windows of one token sequence
PAIRS = "source/target pairs"  # batches {src, src_mask, tgt_in, tgt_out, tgt_mask}
LABELS = "labelled examples"  # batches {src, src_mask, label}


class DataModule(L.LightningDataModule):
    """Base class of kind ``data``: built as ``cls(cfg)``; :meth:`prepare` -> :class:`DataFacts`, then the
    Lightning dataloaders (``train_dataloader``, ``val_dataloader``).

    ``provides`` says what its batches are (:data:`TOKENS`, :data:`PAIRS`,
    :data:`LABELS`, or a new word a plugin's task asks for), so a task can
    refuse data it cannot train on before any work. Subclasses implement
    :meth:`prepare_facts`; :meth:`prepare` runs it once and keeps the result in ``self.facts``.
    """

    provides: str = ""

    def __init__(self, cfg: Any):
        super().__init__()
        self.cfg = cfg
        self.facts: Optional[DataFacts] = None
        self.data_seed: Optional[int] = None  # the run's data-order seed (set by the run; None: the global RNG)

    def passes(self, tokens_seen: int) -> Optional[float]:
        """Passes over the training data that ``tokens_seen`` training tokens make, for data whose
        batches are windows cut at any position of one token stream (an epoch of its loader visits
        every start position: ``block_size`` passes over the tokens). None (the default): each loader
        example is distinct, and an epoch is one pass of the loader."""
        return None

    @classmethod
    def max_positions(cls, cfg: Any) -> Optional[int]:
        """The longest sequence a batch will hold, known from the config alone, so that a too short
        ``model.max_len`` fails before any work; None when only :meth:`prepare` can tell.
        Default: the config's ``positions`` property, if it has one."""
        return getattr(cfg, "positions", None)

    @classmethod
    def check_files(cls, cfg: Any) -> None:
        """Check, before any work, that the files the config names exist (each of a sweep's jobs is checked
        before the first trains); reading them is :meth:`prepare`'s. Default: nothing to check."""

    def prepare(self, tokenizer: Optional[Tokenizer] = None) -> DataFacts:
        """Read the data, fit the tokenizer (or use ``tokenizer``), and return what was learnt (once)."""
        if self.facts is None:
            self.facts = self.prepare_facts(tokenizer)
        return self.facts

    def prepare_facts(self, tokenizer: Optional[Tokenizer]) -> DataFacts:
        raise NotImplementedError(f"{type(self).__name__} must implement prepare_facts()")

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        return self.facts.tokenizer if self.facts is not None else None

    def setup(self, stage: Optional[str] = None) -> None:
        self.prepare()

    def train_loader(self, dataset: Any, **kwargs: Any) -> ResumableLoader:
        """The training loader to return from ``train_dataloader``: shuffled and resumable mid-epoch, so a
        killed run continues with the very batches the uninterrupted run would have drawn
        (:func:`modforge.data.loading.train_loader`; ``shuffle=False`` for a fixed order)."""
        kwargs.setdefault("pin_memory", on_cuda(self.trainer))
        trainer = self.trainer
        return train_loader(dataset, consumed=self._batches_trained, complete=self._epoch_complete,
                            seed=self.data_seed, first_epoch=int(trainer.current_epoch) if trainer is not None else 0,
                            **kwargs)

    def _epoch_complete(self) -> bool:
        """Whether the epoch in progress has trained all its batches (a checkpoint then resumes at the next)."""
        trainer = self.trainer
        if trainer is None:
            return False
        return trainer.fit_loop.epoch_loop.batch_progress.current.processed >= trainer.num_training_batches

    def val_loader(self, dataset: Any, *, batch_size: int, **kwargs: Any) -> DataLoader:
        """The validation loader to return from ``val_dataloader``: in order; under DDP each rank validates its
        own part of exactly the items one process would (:func:`modforge.data.loading.eval_loader`), so the
        metrics reduced over the ranks are one process's."""
        trainer = self.trainer
        kwargs.setdefault("pin_memory", on_cuda(trainer))
        if trainer is None or trainer.world_size <= 1:
            return eval_loader(dataset, batch_size=batch_size, **kwargs)
        return eval_loader(dataset, batch_size=batch_size, world_size=trainer.world_size, rank=trainer.global_rank,
                           limit=trainer.limit_val_batches, **kwargs)

    def _batches_trained(self) -> Optional[int]:
        """Batches of the current epoch the Trainer has trained on (it fetches one ahead of that)."""
        trainer = self.trainer  # set by Lightning while this datamodule is in use
        if trainer is None:
            return None
        # a whole epoch: the next one starts afresh
        return 0 if self._epoch_complete() else trainer.fit_loop.epoch_loop.batch_progress.current.processed


def on_cuda(trainer: Any) -> bool:
    """Whether batches go to a CUDA device (then loaders pin their memory, for asynchronous copies)."""
    return trainer is not None and type(getattr(trainer, "accelerator", None)).__name__ == "CUDAAccelerator"


