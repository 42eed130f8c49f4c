"""``data=tokens``: a directory of pre-tokenized shards (``modforge prepare``'s, nanoGPT's, modded-nanogpt's).

``data.path`` is the directory; ``data.train`` and ``data.val`` are globs in it (default ``*train*`` and
``*val*``: modded-nanogpt's ``fineweb_train_000001.bin``, nanoGPT's ``train.bin``, and prepare's
``train_000000.bin`` all match). Shard layouts: :mod:`modforge.data.shards`.

The vocabulary and the end-of-document id come from the directory's ``meta.json`` (prepare writes it, with
the tokenizer) or from ``data.tokenizer_path`` (a Hugging Face ``tokenizer.json`` whose ids the shards hold,
e.g. GPT-2's for nanoGPT shards); ``data.vocab_size`` may raise the embedding rows above the tokenizer's
(modded-nanogpt pads GPT-2's 50,257 to 50,304), ``data.eod_id`` overrides the end-of-document id.

Before any training each shard is checked (layout, size against its header, largest id against the
vocabulary, at least ``block_size + 1`` tokens); the largest id is read from the sidecar, or scanned once and
cached by the file's path, size and modification time.

Batches are ``(x, y)`` windows as for text data: training windows start anywhere inside a shard (never across
its end), reshuffled every epoch by the run's data-order seed (common random numbers between arms) and resumed
mid-epoch exactly; validation windows are the non-overlapping ones of the val shards, in a fixed shuffled order.
"""
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from modforge.data.base import TOKENS, DataFacts, DataModule
from modforge.data.cache import cache_root, digest
from modforge.data.config import DataChecks
from modforge.data.lm import window_pair, windows_loader
from modforge.data.shards import META, PREPARE_STATE, RAW_DTYPES, Shard, check_meta, find_shards, open_shard
from modforge.data.tokenizers import Tokenizer, load_tokenizer
from modforge.registry import ConfigError, register
from modforge.utils.files import read_json, write_json


class ShardWindows(Dataset):
    """(x, y) windows of ``block`` tokens. Training: every start position of every shard, window ``i`` found by
    the cumulative count of starts (nothing per position is held). Validation: explicit (shard, start) pairs."""

    def __init__(self, shards: list, block: int, pairs: Optional[tuple] = None, score_last: Optional[int] = None):
        self.shards, self.block, self.score_last = shards, block, score_last
        self.pairs = pairs
        if pairs is None:
            self.cum = np.cumsum([max(len(s) - block, 0) for s in shards])

    def __len__(self) -> int:
        return len(self.pairs[0]) if self.pairs is not None else int(self.cum[-1])

    def locate(self, i: int) -> tuple:
        if self.pairs is not None:
            return int(self.pairs[0][i]), int(self.pairs[1][i])
        s = int(np.searchsorted(self.cum, i, side="right"))
        return s, i - (int(self.cum[s - 1]) if s else 0)

    def __getitem__(self, i: int):
        s, start = self.locate(int(i))
        return window_pair(self.shards[s][start : start + self.block + 1], self.block, self.score_last)


@dataclass
class TokensDataConfig(DataChecks):
    path: Optional[str] = None  # the shard directory (prepare's out=, or nanoGPT / modded-nanogpt shards)
    train: str = "*train*"  # glob of the training shards, relative to path
    val: str = "*val*"  # glob of the validation shards, relative to path
    dtype: str = "auto"  # .bin files without a header: uint16 | uint32 (auto: meta.json's, else uint16); llmc: header required
    tokenizer_path: Optional[str] = None  # a tokenizer.json whose ids the shards hold (when there is no meta.json)
    vocab_size: Optional[int] = None  # embedding rows, at least the tokenizer's (None: the tokenizer's)
    eod_id: Optional[int] = None  # the end-of-document id (None: meta.json's, else the tokenizer's end-of-text)
    eod_policy: Optional[str] = None  # end: the id closes each document (nanoGPT); start: opens it (llm.c,
    #                                   modded-nanogpt); None: meta.json's, else end
    block_size: int = 64
    batch_size: int = 12
    val_stride: Optional[int] = None  # sliding-window validation: a window every S tokens, its last S scored
    num_workers: int = 0
    cache_dir: Optional[str] = None  # where scanned shards' largest ids are cached (None: $MODFORGE_CACHE, ...)

    @property
    def positions(self) -> int:
        return self.block_size

    def __post_init__(self):
        if not self.path:
            raise ConfigError("data.path: name the shard directory (data=tokens data.path=<dir>; write one with "
                              "'python -m modforge prepare input=... out=<dir>')")
        if self.dtype not in ("auto", "llmc", *RAW_DTYPES):
            raise ConfigError(f"data.dtype={self.dtype}: allowed values are auto, llmc, {', '.join(RAW_DTYPES)} (the "
                              "width of .bin files without llm.c's header; llmc: every .bin must have the header)")
        for key, low in (("block_size", 1), ("batch_size", 1), ("num_workers", 0)):
            if getattr(self, key) < low:
                raise ConfigError(f"data.{key}={getattr(self, key)}: must be >= {low}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ConfigError(f"data.vocab_size={self.vocab_size}: must be >= 1 (or null: the tokenizer's)")
        if self.eod_id is not None and self.eod_id < 0:
            raise ConfigError(f"data.eod_id={self.eod_id}: must be >= 0 (or null: meta.json's or the tokenizer's)")
        if self.eod_policy is not None and self.eod_policy not in ("end", "start"):
            raise ConfigError(f"data.eod_policy={self.eod_policy}: allowed values are end (the id closes each "
                              "document: nanoGPT) and start (it opens each: llm.c, modded-nanogpt), or null "
                              "(meta.json's, else end)")
        if self.val_stride is not None and not 1 <= self.val_stride <= self.block_size:
            raise ConfigError(f"data.val_stride={self.val_stride}: an integer in [1, data.block_size="
                              f"{self.block_size}], or null for non-overlapping windows")


@register("data", "tokens", config=TokensDataConfig)
class TokensData(DataModule):
    """Pre-tokenized shards (llm.c/modded-nanogpt ``.bin``, nanoGPT raw ``.bin``, ``.npy``), memory-mapped."""

    provides = TOKENS
    marks_documents = True  # its end-of-document id is known: the causal task can mask attention by document

    def __init__(self, cfg: TokensDataConfig):
        super().__init__(cfg)
        self.train_shards: list = []
        self.val_shards: list = []

    @classmethod
    def check_files(cls, cfg: TokensDataConfig) -> None:
        root = cls.root(cfg)
        if (root / PREPARE_STATE).exists() and not (root / META).exists():
            raise ConfigError(f"data.path={cfg.path}: prepare did not finish writing it (no {META} yet); run "
                              "the same prepare command again, it resumes where it stopped")
        find_shards(root, cfg.train, "data.train")
        find_shards(root, cfg.val, "data.val")

    @staticmethod
    def root(cfg: TokensDataConfig) -> Path:
        p = Path(os.path.expanduser(str(cfg.path)))
        if not p.is_dir():
            what = "a file, not a directory" if p.exists() else "no such directory"
            raise ConfigError(f"data.path={cfg.path}: {what} (relative to {os.getcwd()}). Write shards with "
                              f"'python -m modforge prepare input=<text files> out={cfg.path}', or point data.path "
                              "at a directory of nanoGPT/modded-nanogpt .bin shards")
        return p

    def meta(self) -> Optional[dict]:
        root = self.root(self.cfg)
        self.check_files(self.cfg)
        meta = check_meta(read_json(root / META), root)
        if meta is None and (root / META).exists():
            raise ConfigError(f"data.path={self.cfg.path}: its {META} is not readable JSON; it is written last by "
                              "prepare, so re-run the prepare command (it resumes)")
        if meta is not None and not meta.get("complete", False):
            raise ConfigError(f"data.path={self.cfg.path}: prepare did not finish writing it ({META} says "
                              "incomplete); run the same prepare command again, it resumes where it stopped")
        return meta

    def tokenizer_of(self, meta: Optional[dict]) -> Tokenizer:
        c = self.cfg
        if c.tokenizer_path:
            from modforge.data.tokenizers.pretrained import PretrainedConfig, PretrainedTokenizer
            from modforge.data.corpus import existing_file

            existing_file(c.tokenizer_path, "data.tokenizer_path", "the tokenizer.json whose ids the shards hold")
            tok = PretrainedTokenizer(PretrainedConfig(path=c.tokenizer_path))
        elif meta is not None and meta.get("tokenizer"):
            tok = load_tokenizer(meta["tokenizer"])
        else:
            raise ConfigError(f"data.path={c.path}: no {META} names the shards' tokenizer; give "
                              "data.tokenizer_path=<tokenizer.json> (GPT-2's for nanoGPT or modded-nanogpt shards)")
        if c.vocab_size is not None:
            if c.vocab_size < tok.vocab_size:
                raise ConfigError(f"data.vocab_size={c.vocab_size}: below the tokenizer's {tok.vocab_size} ids; give "
                                  f"at least {tok.vocab_size} (or null)")
            if not hasattr(tok, "rows"):
                raise ConfigError(f"data.vocab_size={c.vocab_size}: the tokenizer of {META} ('{tok.name}') has a "
                                  "fixed vocabulary; padding the embedding rows needs data.tokenizer_path=")
            tok.rows = c.vocab_size
        return tok

    def open(self, pattern: str, key: str, meta: Optional[dict]) -> list:
        c = self.cfg
        raw = c.dtype if c.dtype != "auto" else ((meta or {}).get("dtype") or "uint16")
        root = self.root(c)
        return [open_shard(p, raw, key) for p in find_shards(root, pattern, key)]

    def prepare_facts(self, tokenizer: Optional[Tokenizer]) -> DataFacts:
        c = self.cfg
        meta = self.meta()
        self.train_shards = self.open(c.train, "data.train", meta)
        self.val_shards = self.open(c.val, "data.val", meta)
        tok = tokenizer or self.tokenizer_of(meta)
        V = tok.vocab_size
        overlap = {s.path.resolve() for s in self.train_shards} & {s.path.resolve() for s in self.val_shards}
        if overlap:
            raise ConfigError(f"data.train={c.train} and data.val={c.val} both name {sorted(overlap)[0]}: a shard "
                              "would train and validate; give globs that part them")
        known = {e["file"]: e for e in (meta or {}).get("shards", [])}
        root = cache_root(c.cache_dir)
        for key, shards in (("data.train", self.train_shards), ("data.val", self.val_shards)):
            for s in shards:
                if len(s) < c.block_size + 1:
                    raise ConfigError(f"{key}: {s.path} holds {len(s)} tokens, fewer than data.block_size + 1 = "
                                      f"{c.block_size + 1} (a window and its shifted target); lower "
                                      "data.block_size or leave the shard out of the glob")
                top = largest_id(s, known.get(s.path.name), root)
                if top >= V:
                    raise ConfigError(f"{key}: {s.path} holds token id {top}, past the vocabulary of {V} "
                                      f"(tokenizer '{tok.name}'): the shards were written with another tokenizer "
                                      "(or data.dtype is wrong); give the right data.tokenizer_path, or "
                                      "data.vocab_size")
        eod = c.eod_id if c.eod_id is not None else (meta or {}).get("eod_id", tok.eos_id)
        if eod is not None and eod >= V:
            raise ConfigError(f"data.eod_id={eod}: past the vocabulary of {V}")
        policy = c.eod_policy or (meta or {}).get("eod_policy") or "end"
        if policy == "none":  # prepared with eod=none: no document marks, unless data.eod_id names one
            policy, eod = "end", c.eod_id
        n_train = sum(len(s) for s in self.train_shards)
        n_val = sum(len(s) for s in self.val_shards)
        split = (meta or {}).get("splits", {}).get("val", {})
        stats = {"train_tokens": n_train, "val_tokens": n_val, "train_shards": len(self.train_shards),
                 "val_shards": len(self.val_shards), "shard_dir": str(self.root(c))}
        per_char = n_val / split["chars"] if split.get("chars") and split.get("tokens") == n_val else None
        per_byte = n_val / split["bytes"] if split.get("bytes") and split.get("tokens") == n_val else None
        if meta is None:
            print(f"[modforge] note: data.path={c.path} has no {META}: bits per character and per byte are not "
                  "reported (the text the shards came from is unknown)", file=sys.stderr)
        return DataFacts(tok, positions=c.positions, tokens_per_char=per_char, stats=stats, eod_id=eod,
                         eod_policy=policy, tokens_per_byte=per_byte)

    def passes(self, tokens_seen: int) -> Optional[float]:
        n = sum(len(s) for s in self.train_shards)
        return tokens_seen / n if n else None

    def train_dataloader(self) -> DataLoader:
        return windows_loader(self, ShardWindows(self.train_shards, self.cfg.block_size))

    def val_dataloader(self) -> DataLoader:
        b, stride = self.cfg.block_size, self.cfg.val_stride
        shard_ix, starts = [], []
        for i, s in enumerate(self.val_shards):
            st = np.arange(0, len(s) - b, stride or b, dtype=np.int64)
            starts.append(st)
            shard_ix.append(np.full(len(st), i, dtype=np.int64))
        shard_ix, starts = np.concatenate(shard_ix), np.concatenate(starts)
        order = torch.randperm(len(starts), generator=torch.Generator().manual_seed(0)).numpy()
        ds = ShardWindows(self.val_shards, b, (shard_ix[order], starts[order]), stride)
        return self.val_loader(ds, batch_size=self.cfg.batch_size, num_workers=self.cfg.num_workers)


def largest_id(shard: Shard, listed: Optional[dict], root: Path) -> int:
    """A shard's largest token id: from prepare's sidecar entry when it describes this very file, else scanned
    once and cached by the file's path, size and modification time."""
    st = shard.path.stat()
    if listed and listed.get("tokens") == len(shard) and listed.get("bytes") == st.st_size \
            and listed.get("max_id") is not None:
        return int(listed["max_id"])
    key = digest({"shard": str(shard.path.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns,
                  "layout": shard.layout, "dtype": shard.dtype.str})
    path = root / "shards" / f"{key}.json"
    cached = read_json(path)
    if cached and "max_id" in cached:
        return int(cached["max_id"])
    top = shard.max_id()
    write_json(path, {"max_id": top, "file": str(shard.path)})
    return top
