"""Text classification data (``data=classify``): (text, label) examples from CSV or JSONL.

* CSV (``.csv``; ``.tsv`` is read tab-separated): a header row naming the columns;
  ``data.text_field`` and ``data.label_field`` pick them.
* JSONL (``.jsonl``/``.json``/``.ndjson``): one JSON object per line with those keys.

The label vocabulary is the sorted set of the training labels (as strings); it is
attached to the tokenizer (``tokenizer.meta["labels"]``), so it travels in every
checkpoint with the tokenizer state. Validation comes from ``data.val_path``, or,
when that is unset, a seeded random ``val_fraction`` of the training file.

Every example becomes ``<bos> + ids`` (the ``<bos>`` doubles as the CLS token),
truncated to ``max_len`` tokens. Batches are dicts: ``src`` (B, T) int64 padded
with <pad>, ``src_mask`` (B, T) True at real tokens, ``label`` (B,) int64.
"""
import csv
import json
import os
import random
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from modforge.data.examples import ExamplesData
from modforge.data.cache import cache_root, existing_file, fit_tokenizer, text_sha
from modforge.data.tokenizers import BOS, PAD, TokenizedDataConfig, Tokenizer, make_tokenizer
from modforge.registry import ConfigError, register


@dataclass
class ClassifyDataConfig(TokenizedDataConfig):
    path: Optional[str] = None  # training examples: .csv/.tsv or .jsonl
    val_path: Optional[str] = None  # validation examples (None: hold out val_fraction of path)
    format: str = "auto"  # auto (by file extension) | csv | tsv | jsonl
    text_field: str = "text"
    label_field: str = "label"
    max_len: int = 128  # tokens per example including the leading <bos>; longer texts are cut
    seed: int = 0  # of the held-out split

    @property
    def positions(self) -> int:
        """Longest sequence a batch holds (<bos> included)."""
        return self.max_len

    def __post_init__(self):
        if not self.path:
            raise ConfigError("data.path: required; give a CSV (text,label columns) or JSONL file of examples, "
                              "e.g. data.path=tests/data/sentiment.csv")
        if self.format not in READERS and self.format != "auto":
            raise ConfigError(f"data.format={self.format}: use auto, {', '.join(READERS)}")
        super().__post_init__()
        if self.max_len < 2:
            raise ConfigError(f"data.max_len={self.max_len}: must be >= 2")


def _read_delimited(path: str, text_field: str, label_field: str, key: str, delimiter: str) -> list[tuple]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        cols = reader.fieldnames or []
        for fld, k in ((text_field, "text_field"), (label_field, "label_field")):
            if fld not in cols:
                raise ConfigError(f"data.{k}={fld}: {key}={path} has no such column "
                                  f"(header: {', '.join(cols) or 'empty'}).")
        out = []
        for row in reader:
            text, label = row.get(text_field), row.get(label_field)
            if text is None or label is None or label == "":
                raise ConfigError(f"{key}={path}, line {reader.line_num}: missing {text_field!r} or "
                                  f"{label_field!r} value.")
            out.append((text, label.strip(), reader.line_num))
    return out


def read_csv(path, text_field, label_field, key):
    return _read_delimited(path, text_field, label_field, key, ",")


def read_tsv(path, text_field, label_field, key):
    return _read_delimited(path, text_field, label_field, key, "\t")


def read_jsonl(path: str, text_field: str, label_field: str, key: str) -> list[tuple]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{key}={path}, line {n}: not JSON ({e}).") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{key}={path}, line {n}: expected a JSON object with {text_field!r} "
                                  f"and {label_field!r}.")
            for fld, k in ((text_field, "text_field"), (label_field, "label_field")):
                if fld not in obj:
                    raise ConfigError(f"data.{k}={fld}: {key}={path}, line {n} has no such key "
                                      f"(keys: {', '.join(obj) or 'none'}).")
            text = obj[text_field]
            if not isinstance(text, str):
                raise ConfigError(f"{key}={path}, line {n}: {text_field!r} must be a string, "
                                  f"got {type(text).__name__}.")
            out.append((text, str(obj[label_field]).strip(), n))
    return out


READERS: dict[str, Callable] = {"csv": read_csv, "tsv": read_tsv, "jsonl": read_jsonl}
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def read_examples(path: Optional[str], cfg: ClassifyDataConfig, key: str) -> list[tuple]:
    """-> [(text, label, line)] from a CSV/TSV/JSONL file; every problem is a ConfigError naming ``key``."""
    p = existing_file(path, key, "a CSV or JSONL file of (text, label) examples")
    fmt = cfg.format
    if fmt == "auto":
        fmt = EXTENSIONS.get(os.path.splitext(p)[1].lower())
        if fmt is None:
            raise ConfigError(f"{key}={path}: cannot tell the format from the extension; "
                              f"use .csv/.tsv/.jsonl or set data.format=csv|tsv|jsonl.")
    rows = READERS[fmt](p, cfg.text_field, cfg.label_field, key)
    if not rows:
        raise ConfigError(f"{key}={path}: no examples.")
    return rows


def collate_labeled(batch) -> dict:
    """[(ids, label)] -> {"src", "src_mask", "label"} (padded with <pad>)."""
    T = max(len(ids) for ids, _ in batch)
    src = torch.full((len(batch), T), PAD, dtype=torch.long)
    for i, (ids, _) in enumerate(batch):
        src[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return {"src": src, "src_mask": src != PAD, "label": torch.tensor([y for _, y in batch], dtype=torch.long)}


@register("data", "classify", config=ClassifyDataConfig)
class ClassifyData(ExamplesData):
    """Labelled text from CSV or JSONL (text, label) for sequence classification (task=classify)."""

    collate = staticmethod(collate_labeled)

    def __init__(self, cfg: ClassifyDataConfig):
        super().__init__(cfg)
        self.labels: list[str] = []

    def split(self) -> tuple[list, list, str]:
        c = self.cfg
        rows = read_examples(c.path, c, "data.path")
        if c.val_path:
            return rows, read_examples(c.val_path, c, "data.val_path"), "data.val_path"
        if len(rows) < 2:
            raise ConfigError(f"data.path={c.path}: {len(rows)} example(s); need at least 2 to hold some out.")
        order = list(range(len(rows)))
        random.Random(c.seed).shuffle(order)
        n_val = min(len(rows) - 1, max(1, round(len(rows) * c.val_fraction)))
        val = sorted(order[:n_val])
        train = sorted(order[n_val:])
        return [rows[i] for i in train], [rows[i] for i in val], "data.path"

    def prepare(self, tokenizer: Optional[Tokenizer] = None) -> Tokenizer:
        if self.tokenizer is not None:
            return self.tokenizer
        c = self.cfg
        tok = tokenizer or make_tokenizer(c)  # first: a bad tokenizer key fails before any reading
        train, val, val_key = self.split()
        labels = sorted({y for _, y, _ in train})
        index = {y: i for i, y in enumerate(labels)}
        for _, y, line in val:
            if y not in index:
                src = c.val_path if c.val_path else c.path
                raise ConfigError(f"{val_key}={src}, line {line}: label {y!r} does not occur in the training "
                                  f"examples (labels: {', '.join(labels)}).")
        texts = [t for t, _, _ in train]
        tok = tokenizer or fit_tokenizer(tok, lambda: texts, {"examples": text_sha(texts)}, cache_root(c.cache_dir))
        tok.meta = {**tok.meta, "labels": labels}

        def encode(rows):
            return [([BOS] + tok.encode(t)[: c.max_len - 1], index[y]) for t, y, _ in rows]

        self.train_set, self.val_set, self.labels, self.tokenizer = encode(train), encode(val), labels, tok
        counts = torch.bincount(torch.tensor([y for _, y in self.val_set]), minlength=len(labels))
        self.stats = {
            "train_examples": len(train), "val_examples": len(val), "n_labels": len(labels),
            "majority_val_acc": float(counts.max()) / len(val),
        }
        return tok
