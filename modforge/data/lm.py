"""Language-modelling data: a text corpus, tokenized once, cut into windows.

``stdlib`` (the default for ``decoder_only`` and ``encoder_only``) is the Python
standard library's own top-level ``*.py`` sources: present wherever Python
runs, so the default run needs no download. Files are read in sorted order and
concatenated; the first ``1 - val_fraction`` of the characters train, the rest
validate (the shakespeare_char convention). The exact text depends on the
Python version, so compare numbers only within one Python.

Batches are ``(x, y)`` with ``y`` = ``x`` shifted by one: (B, block_size) int64.
Training windows start anywhere (reshuffled every epoch); validation windows
are the non-overlapping ones, in a fixed shuffled order so that
``trainer.limit_val_batches`` takes a representative subset.
"""
import glob
import math
import os
import sysconfig
from dataclasses import dataclass
from typing import Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from modforge.data.tokenizers import Tokenizer
from modforge.registry import ConfigError, build, register


class Windows(Dataset):
    """(x, y) windows of ``block`` tokens from a 1-d token array, starting at ``starts``."""

    def __init__(self, tokens: torch.Tensor, block: int, starts: torch.Tensor):
        self.tokens, self.block, self.starts = tokens, block, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int):
        s = int(self.starts[i])
        w = self.tokens[s : s + self.block + 1]
        return w[:-1], w[1:]


@dataclass
class TextDataConfig:
    tokenizer: str = "char"
    block_size: int = 64
    batch_size: int = 12
    val_fraction: float = 0.1
    max_chars: Optional[int] = 2_000_000  # use the first N characters of the corpus (None: all)
    num_workers: int = 0

    def __post_init__(self):
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={self.val_fraction}: must be in (0, 1)")
        if self.block_size < 1 or self.batch_size < 1:
            raise ConfigError("data.block_size and data.batch_size must be >= 1")


class TextLMData(L.LightningDataModule):
    """Base for corpora of plain text; subclasses implement :meth:`read_text`."""

    def __init__(self, cfg: TextDataConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenizer: Optional[Tokenizer] = None
        self.train_tokens = self.val_tokens = None
        self.stats: dict = {}

    def read_text(self) -> str:
        raise NotImplementedError

    def prepare(self, tokenizer: Optional[Tokenizer] = None) -> Tokenizer:
        """Read, split, fit the tokenizer on the training split (unless given one) and tokenize."""
        if self.tokenizer is not None:
            return self.tokenizer
        text = self.read_text()
        if self.cfg.max_chars:
            text = text[: self.cfg.max_chars]
        cut = int(len(text) * (1 - self.cfg.val_fraction))
        train, val = text[:cut], text[cut:]
        self.tokenizer = tokenizer or build("tokenizer", self.cfg.tokenizer).fit([train])
        self.train_tokens = torch.from_numpy(self.tokenizer.encode_array(train))
        self.val_tokens = torch.from_numpy(self.tokenizer.encode_array(val))
        need = self.cfg.block_size + 1
        if len(self.train_tokens) < need or len(self.val_tokens) < need:
            raise ConfigError(
                f"data.block_size={self.cfg.block_size}: the corpus splits into {len(self.train_tokens)} train and "
                f"{len(self.val_tokens)} val tokens; each needs more than block_size"
            )
        self.stats = {
            "train_chars": len(train), "val_chars": len(val),
            "train_tokens": len(self.train_tokens), "val_tokens": len(self.val_tokens),
            "val_tokens_per_char": len(self.val_tokens) / max(1, len(val)),
            "unigram_val_loss": unigram_cross_entropy(self.train_tokens, self.val_tokens, self.tokenizer.vocab_size),
        }
        return self.tokenizer

    def setup(self, stage: Optional[str] = None) -> None:
        self.prepare()

    def train_dataloader(self) -> DataLoader:
        b = self.cfg.block_size
        ds = Windows(self.train_tokens, b, torch.arange(len(self.train_tokens) - b))
        return DataLoader(ds, batch_size=self.cfg.batch_size, shuffle=True, drop_last=True,
                          num_workers=self.cfg.num_workers, persistent_workers=self.cfg.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        b = self.cfg.block_size
        starts = torch.arange(0, len(self.val_tokens) - b, b)
        starts = starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(0))]
        return DataLoader(Windows(self.val_tokens, b, starts), batch_size=self.cfg.batch_size,
                          num_workers=self.cfg.num_workers)


def unigram_cross_entropy(train: torch.Tensor, val: torch.Tensor, vocab: int) -> float:
    """Cross-entropy (nats/token) on val of the train split's add-one-smoothed unigram distribution."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[val].mean())


def stdlib_sources() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    return sorted(glob.glob(os.path.join(root, "*.py")))


@register("data", "stdlib", config=TextDataConfig)
class StdlibData(TextLMData):
    """The Python standard library's top-level *.py sources (offline, always present)."""

    def read_text(self) -> str:
        files = stdlib_sources()
        if not files:
            raise ConfigError(f"data=stdlib: no *.py files under {sysconfig.get_paths()['stdlib']}")
        parts = []
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                parts.append(fh.read())
        return "\n".join(parts)


def bits(loss_nats: float) -> float:
    return loss_nats / math.log(2)


