"""Sequence-to-sequence data: synthetic digit tasks (``reverse``, ``sort``), needing no download.

Example i of a split is generated from a seeded RNG, so data are identical on
every machine. Batches are the dicts of padded tensors that
:func:`modforge.data.examples.collate_pairs` makes:

* ``src`` (B, S) and ``src_mask`` (B, S), True at real tokens;
* ``tgt_in`` = <bos> + target and ``tgt_out`` = target + <eos>, (B, T), padded
  with <pad> (the loss ignores it), and ``tgt_mask``.
"""
import random
from dataclasses import dataclass
from typing import Optional

from torch.utils.data import DataLoader, Dataset

from modforge.data.base import PAIRS, DataFacts, DataModule
from modforge.data.config import DataChecks
from modforge.data.examples import collate_pairs, with_ids
from modforge.data.tokenizers import CharTokenizer, Tokenizer
from modforge.registry import ConfigError, register


@dataclass
class SyntheticConfig(DataChecks):
    min_len: int = 3
    max_len: int = 12
    n_train: int = 50_000
    n_val: int = 512
    batch_size: int = 64
    seed: int = 0

    @property
    def positions(self) -> int:
        """Longest sequence a batch holds (the target plus <bos>/<eos>)."""
        return self.max_len + 1

    def __post_init__(self):
        if not 1 <= self.min_len <= self.max_len:
            raise ConfigError(f"data.min_len={self.min_len}, data.max_len={self.max_len}: need 1 <= min_len <= max_len")
        for key in ("n_train", "n_val", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)}: must be >= 1")


class Pairs(Dataset):
    """Example i -> (source ids, target ids), generated from RNG(seed, i)."""

    def __init__(self, n: int, seed: int, make, tokenizer: Tokenizer, min_len: int, max_len: int):
        self.n, self.seed, self.make, self.tok = n, seed, make, tokenizer
        self.min_len, self.max_len = min_len, max_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = random.Random(self.seed * 1_000_003 + i)
        src = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_len, self.max_len)))
        return self.tok.encode(src), self.tok.encode(self.make(src))


class SyntheticSeq2Seq(DataModule):
    """Base for generated digit-string tasks; subclasses define :meth:`target`."""

    provides = PAIRS

    @staticmethod
    def target(src: str) -> str:
        raise NotImplementedError

    def prepare_facts(self, tokenizer: Optional[Tokenizer]) -> DataFacts:
        c = self.cfg
        return DataFacts(tokenizer or CharTokenizer(chars="0123456789"), positions=c.positions,
                         stats={"train_pairs": c.n_train, "val_pairs": c.n_val})

    def _pairs(self, n: int, seed: int) -> "Pairs":
        c = self.cfg
        return Pairs(n, seed, self.target, self.tokenizer, c.min_len, c.max_len)

    def train_dataloader(self) -> DataLoader:
        c = self.cfg
        return self.train_loader(self._pairs(c.n_train, c.seed), batch_size=c.batch_size,
                                 collate_fn=with_ids(collate_pairs, self.tokenizer),
                                 drop_last=True)

    def val_dataloader(self) -> DataLoader:
        c = self.cfg
        return self.val_loader(self._pairs(c.n_val, c.seed + 1), batch_size=c.batch_size,
                               collate_fn=with_ids(collate_pairs, self.tokenizer))


@register("data", "reverse", config=SyntheticConfig)
class ReverseDigits(SyntheticSeq2Seq):
    """Reverse a random digit string: 0412 -> 2140."""

    @staticmethod
    def target(src: str) -> str:
        return src[::-1]


@register("data", "sort", config=SyntheticConfig)
class SortDigits(SyntheticSeq2Seq):
    """Sort a random digit string: 0412 -> 0124."""

    @staticmethod
    def target(src: str) -> str:
        return "".join(sorted(src))
