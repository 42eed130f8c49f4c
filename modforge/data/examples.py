"""Datasets held as lists of encoded examples (classification, parallel text): what they share.

* :class:`ExamplesData`: the ``prepare`` sequence (tokenizer first, so a bad
  tokenizer key fails before any reading; read; fit the tokenizer on the
  training texts, cached; encode) and the dataloaders;
* :func:`hold_out`: the seeded validation split when no validation file is given;
* the collate functions that pad examples into batches.
"""
import functools
import inspect
import random
from typing import Callable, Optional, Sequence

import torch
from torch.utils.data import DataLoader

from modforge.data.base import DataFacts, DataModule
from modforge.data.cache import cache_root, fit_tokenizer
from modforge.data.corpus import text_sha
from modforge.data.config import make_tokenizer
from modforge.data.tokenizers import BOS, EOS, PAD, Tokenizer
from modforge.registry import ConfigError


def hold_out(rows: Sequence, fraction: float, seed: int, what: str, unit: str = "example") -> tuple[list, list]:
    """(train, val): a seeded random ``fraction`` of ``rows`` (at least one, never all) held out, order kept."""
    if len(rows) < 2:
        raise ConfigError(f"{what}: {len(rows)} {unit}(s); need at least 2 to hold some out for validation.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_val = min(len(rows) - 1, max(1, round(len(rows) * fraction)))
    return [rows[i] for i in sorted(order[n_val:])], [rows[i] for i in sorted(order[:n_val])]


def collate_pairs(batch, pad: int = PAD, bos: int = BOS, eos: int = EOS) -> dict:
    """[(src_ids, tgt_ids)] -> ``src``, ``src_mask`` (B, S); ``tgt_in`` = <bos> + target, ``tgt_out`` =
    target + <eos>, ``tgt_mask`` (B, T); padded with <pad>, masks True at real tokens (from the lengths, so a
    tokenizer whose <pad> is also its <bos> or <eos>, as GPT-2's, is masked right). The ids are the tokenizer's
    (:func:`with_ids`)."""
    S = max(len(s) for s, _ in batch)
    T = max(len(t) for _, t in batch) + 1
    src = torch.full((len(batch), S), pad, dtype=torch.long)
    tgt_in = torch.full((len(batch), T), pad, dtype=torch.long)
    tgt_out = torch.full((len(batch), T), pad, dtype=torch.long)
    src_len = torch.tensor([len(s) for s, _ in batch])
    tgt_len = torch.tensor([len(t) + 1 for _, t in batch])
    for i, (s, t) in enumerate(batch):
        src[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        tgt_in[i, : len(t) + 1] = torch.tensor([bos] + list(t))
        tgt_out[i, : len(t) + 1] = torch.tensor(list(t) + [eos])
    return {"src": src, "src_mask": torch.arange(S) < src_len[:, None], "tgt_in": tgt_in, "tgt_out": tgt_out,
            "tgt_mask": torch.arange(T) < tgt_len[:, None]}


def collate_labeled(batch, pad: int = PAD) -> dict:
    """[(ids, label)] -> ``src`` (B, T) padded with <pad>, ``src_mask`` True at real tokens, ``label`` (B,)."""
    T = max(len(ids) for ids, _ in batch)
    src = torch.full((len(batch), T), pad, dtype=torch.long)
    for i, (ids, _) in enumerate(batch):
        src[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    lengths = torch.tensor([len(ids) for ids, _ in batch])
    return {"src": src, "src_mask": torch.arange(T) < lengths[:, None],
            "label": torch.tensor([y for _, y in batch], dtype=torch.long)}


def with_ids(collate: Callable, tok: Tokenizer) -> Callable:
    """``collate`` with the special ids it takes (``pad``, ``bos``, ``eos``) set to the tokenizer's: a pretrained
    tokenizer's are its own, not modforge's 0-4."""
    names = [n for n in inspect.signature(collate).parameters if n in ("pad", "bos", "eos")]
    return functools.partial(collate, **{n: getattr(tok, f"{n}_id") for n in names})


class ExamplesData(DataModule):
    """Subclasses implement :meth:`read`, :meth:`texts` and :meth:`encode`, and name their ``collate``."""

    collate: Callable

    def __init__(self, cfg):
        super().__init__(cfg)
        self.train_set: list = []
        self.val_set: list = []

    def read(self) -> tuple[list, list]:
        """(train rows, val rows), raw; every problem a ConfigError naming its key."""
        raise NotImplementedError

    def texts(self, rows: list) -> list[str]:
        """The strings of training rows that the tokenizer is fitted on."""
        raise NotImplementedError

    def encode(self, train: list, val: list, tok: Tokenizer) -> tuple[list, list, dict]:
        """(train examples, val examples, DataFacts fields besides tokenizer and positions: labels, stats)."""
        raise NotImplementedError

    def prepare_facts(self, tokenizer: Optional[Tokenizer]) -> DataFacts:
        c = self.cfg
        tok = tokenizer or make_tokenizer(c)  # first: a bad tokenizer key fails before any reading
        train, val = self.read()
        texts = self.texts(train)
        tok = tokenizer or fit_tokenizer(tok, lambda: texts, {"examples": text_sha(texts)}, cache_root(c.cache_dir))
        self.train_set, self.val_set, extra = self.encode(train, val, tok)
        return DataFacts(tok, positions=c.positions, **extra)

    def train_dataloader(self) -> DataLoader:
        c = self.cfg
        return self.train_loader(self.train_set, batch_size=c.batch_size,
                                 collate_fn=with_ids(type(self).collate, self.tokenizer),
                                 num_workers=c.num_workers, persistent_workers=c.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        c = self.cfg
        return self.val_loader(self.val_set, batch_size=c.batch_size,
                               collate_fn=with_ids(type(self).collate, self.tokenizer),
                               num_workers=c.num_workers)
