"""Parallel text for encoder-decoder training (``data=parallel``).

Sources and targets come from a TSV file (``data.path``: ``source<TAB>target`` per
line) or from two line-aligned files (``data.src_path`` and ``data.tgt_path``).
Validation comes from ``data.val_path`` (or ``data.val_src_path`` + ``data.val_tgt_path``),
or, when those are unset, a seeded random ``val_fraction`` of the pairs. Blank
lines (in both files, or the whole TSV line) are skipped.

One tokenizer is fitted on both sides of the training pairs (the shared
vocabulary of the original Transformer). Each side is cut to ``max_len`` tokens
(the target to ``max_len - 1``, leaving room for <bos>/<eos>). Batches are the
dicts of :func:`modforge.data.examples.collate_pairs` (``src``, ``src_mask``,
``tgt_in``, ``tgt_out``, ``tgt_mask``: padding masks on both sides), so the
``seq2seq`` task trains on them unchanged.
"""
from dataclasses import dataclass
from typing import Optional

from modforge.data.corpus import existing_file, open_text, refuse_binary
from modforge.data.base import PAIRS
from modforge.data.examples import ExamplesData, collate_pairs, hold_out
from modforge.data.config import TokenizedDataConfig
from modforge.data.tokenizers import Tokenizer
from modforge.registry import ConfigError, register


@dataclass
class ParallelConfig(TokenizedDataConfig):
    path: Optional[str] = None  # TSV: source<TAB>target per line
    src_path: Optional[str] = None  # or: sources, one per line ...
    tgt_path: Optional[str] = None  # ... and their targets, line-aligned
    val_path: Optional[str] = None  # validation TSV (None: hold out val_fraction)
    val_src_path: Optional[str] = None
    val_tgt_path: Optional[str] = None
    max_len: int = 128  # tokens per side (target: max_len - 1, plus <bos>/<eos>)
    batch_size: int = 64
    seed: int = 0  # of the held-out split

    @property
    def positions(self) -> int:
        """Longest sequence a batch holds (a side is cut to max_len tokens; <bos>/<eos> fit within it)."""
        return self.max_len

    def __post_init__(self):
        if bool(self.path) == bool(self.src_path or self.tgt_path):
            raise ConfigError("data=parallel: give either data.path=<file.tsv> (source<TAB>target per line) or "
                              "data.src_path=<file> and data.tgt_path=<file> (line-aligned)"
                              + (", not both" if self.path else ""))
        if not self.path and not (self.src_path and self.tgt_path):
            raise ConfigError("data.src_path and data.tgt_path: give both (line-aligned source and target files)")
        if self.val_path and (self.val_src_path or self.val_tgt_path):
            raise ConfigError("data.val_path and data.val_src_path/val_tgt_path: give one or the other")
        if bool(self.val_src_path) != bool(self.val_tgt_path):
            raise ConfigError("data.val_src_path and data.val_tgt_path: give both, or neither")
        super().__post_init__()
        if self.max_len < 2:
            raise ConfigError(f"data.max_len={self.max_len}: must be >= 2")


def read_tsv_pairs(path: str, key: str, encoding: str = "utf-8") -> list[tuple[str, str]]:
    p = existing_file(path, key, "a TSV file with source<TAB>target per line")
    out = []
    with open_text(p, key, encoding) as fh:
        for n, line in enumerate(fh, 1):
            refuse_binary(line, path, key)
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ConfigError(f"{key}={path}, line {n}: expected source<TAB>target (2 fields), "
                                  f"found {len(parts)} field(s).")
            out.append((parts[0], parts[1]))
    if not out:
        raise ConfigError(f"{key}={path}: no pairs.")
    return out


def read_aligned(src_path: str, tgt_path: str, src_key: str, tgt_key: str,
                 encoding: str = "utf-8") -> list[tuple[str, str]]:
    sp = existing_file(src_path, src_key, "a file of source sentences, one per line")
    tp = existing_file(tgt_path, tgt_key, "a file of target sentences, one per line (aligned with the sources)")
    with open_text(sp, src_key, encoding) as fh:
        src = [line.rstrip("\r\n") for line in fh]
    with open_text(tp, tgt_key, encoding) as fh:
        tgt = [line.rstrip("\r\n") for line in fh]
    for lines, p, k in ((src, src_path, src_key), (tgt, tgt_path, tgt_key)):
        refuse_binary("".join(lines), p, k)
    if len(src) != len(tgt):
        raise ConfigError(f"{src_key}={src_path} has {len(src)} lines but {tgt_key}={tgt_path} has {len(tgt)}; "
                          "the files must be line-aligned.")
    out = []
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        if not s.strip() and not t.strip():
            continue
        if not s.strip() or not t.strip():
            side = src_key if not s.strip() else tgt_key
            raise ConfigError(f"{side}: line {n} is blank but its counterpart is not; the files must be line-aligned.")
        out.append((s, t))
    if not out:
        raise ConfigError(f"{src_key}={src_path}: no pairs.")
    return out


@register("data", "parallel", config=ParallelConfig)
class ParallelData(ExamplesData):
    """Parallel text (TSV, or two aligned files) for encoder-decoder models; padding masks on both sides."""

    collate = staticmethod(collate_pairs)
    provides = PAIRS

    @classmethod
    def check_files(cls, cfg: ParallelConfig) -> None:
        for key in ("path", "src_path", "tgt_path", "val_path", "val_src_path", "val_tgt_path"):
            if getattr(cfg, key):
                existing_file(getattr(cfg, key), f"data.{key}", "a text file of the parallel data")

    def read(self) -> tuple[list, list]:
        c = self.cfg
        e = c.encoding
        pairs = read_tsv_pairs(c.path, "data.path", e) if c.path else \
            read_aligned(c.src_path, c.tgt_path, "data.src_path", "data.tgt_path", e)
        if c.val_path:
            return pairs, read_tsv_pairs(c.val_path, "data.val_path", e)
        if c.val_src_path:
            return pairs, read_aligned(c.val_src_path, c.val_tgt_path, "data.val_src_path", "data.val_tgt_path", e)
        return hold_out(pairs, c.val_fraction, c.seed, "data=parallel", unit="pair")

    def texts(self, rows: list) -> list[str]:
        return [t for pair in rows for t in pair]  # one vocabulary for both sides

    def encode(self, train: list, val: list, tok: Tokenizer) -> tuple[list, list, dict]:
        c = self.cfg

        def encode(pairs):
            return [(tok.encode(s)[: c.max_len], tok.encode(t)[: c.max_len - 1]) for s, t in pairs]

        train_set, val_set = encode(train), encode(val)
        stats = {
            "train_pairs": len(train), "val_pairs": len(val),
            "max_src_tokens": max(len(s) for s, _ in train_set + val_set),
            "max_tgt_tokens": max(len(t) for _, t in train_set + val_set) + 1,
        }
        return train_set, val_set, {"stats": stats}
