"""Text classification data (``data=classify``): (text, label) examples from CSV or JSONL.

* CSV (``.csv``; ``.tsv`` is read tab-separated): a header row naming the columns;
  ``data.text_field`` and ``data.label_field`` pick them.
* JSONL (``.jsonl``/``.json``/``.ndjson``): one JSON object per line with those keys.

The label vocabulary is the sorted set of the training labels (as strings); it is
returned in the data facts (``DataFacts.labels``), so the task builds its head
from it and every checkpoint carries it. Validation comes from ``data.val_path``,
or, when that is unset, a seeded random ``val_fraction`` of the training file.

Every example becomes ``<bos> + ids`` (the ``<bos>`` doubles as the CLS token),
truncated to ``max_len`` tokens. Batches are dicts: ``src`` (B, T) int64 padded
with <pad>, ``src_mask`` (B, T) True at real tokens, ``label`` (B,) int64.
"""
import csv
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from modforge.data.base import LABELS
from modforge.data.corpus import existing_file, jsonl_objects, open_text, refuse_binary
from modforge.data.examples import ExamplesData, collate_labeled, hold_out
from modforge.data.config import TokenizedDataConfig
from modforge.data.tokenizers import Tokenizer
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


def _read_delimited(path: str, text_field: str, label_field: str, key: str, delimiter: str,
                    encoding: str = "utf-8") -> list[tuple]:
    try:
        return _read_rows(path, text_field, label_field, key, delimiter, encoding)
    except csv.Error as e:
        raise ConfigError(f"{key}={path}: not a readable {'TSV' if delimiter == chr(9) else 'CSV'} file ({e})") from None


def _read_rows(path, text_field, label_field, key, delimiter, encoding) -> list[tuple]:
    with open_text(path, key, encoding, newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        cols = reader.fieldnames or []
        for fld, k in ((text_field, "text_field"), (label_field, "label_field")):
            if fld not in cols:
                raise ConfigError(f"data.{k}={fld}: {key}={path} has no such column "
                                  f"(header: {', '.join(cols) or 'empty'}).")
        out = []
        for row in reader:
            if None in row:  # more fields than the header names: a comma inside an unquoted text, most likely
                raise ConfigError(f"{key}={path}, line {reader.line_num}: {len(cols) + len(row[None])} fields, but "
                                  f"the header names {len(cols)}; quote a text that holds the delimiter "
                                  f"({delimiter!r}), e.g. \"a, b\"")
            text, label = row.get(text_field), row.get(label_field)
            if text is not None:
                refuse_binary(text, path, key)
            if text is None or label is None or label == "":
                raise ConfigError(f"{key}={path}, line {reader.line_num}: missing {text_field!r} or "
                                  f"{label_field!r} value.")
            out.append((text, label.strip(), reader.line_num))
    return out


def read_csv(path, text_field, label_field, key, encoding="utf-8"):
    return _read_delimited(path, text_field, label_field, key, ",", encoding)


def read_tsv(path, text_field, label_field, key, encoding="utf-8"):
    return _read_delimited(path, text_field, label_field, key, "\t", encoding)


def read_jsonl(path: str, text_field: str, label_field: str, key: str, encoding: str = "utf-8") -> list[tuple]:
    out = []
    for n, obj in jsonl_objects(path, key, encoding, f"a JSON object with {text_field!r} and {label_field!r}"):
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
    rows = READERS[fmt](p, cfg.text_field, cfg.label_field, key, cfg.encoding)
    if not rows:
        raise ConfigError(f"{key}={path}: no examples.")
    return rows


@register("data", "classify", config=ClassifyDataConfig)
class ClassifyData(ExamplesData):
    """Labelled text from CSV or JSONL (text, label) for sequence classification (task=classify)."""

    collate = staticmethod(collate_labeled)
    provides = LABELS

    @classmethod
    def check_files(cls, cfg: ClassifyDataConfig) -> None:
        existing_file(cfg.path, "data.path", "a CSV or JSONL file of (text, label) examples")
        if cfg.val_path:
            existing_file(cfg.val_path, "data.val_path", "a CSV or JSONL file of (text, label) examples")

    def read(self) -> tuple[list, list]:
        c = self.cfg
        rows = read_examples(c.path, c, "data.path")
        if c.val_path:
            return rows, read_examples(c.val_path, c, "data.val_path")
        return hold_out(rows, c.val_fraction, c.seed, f"data.path={c.path}")

    def texts(self, rows: list) -> list[str]:
        return [t for t, _, _ in rows]

    def encode(self, train: list, val: list, tok: Tokenizer) -> tuple[list, list, dict]:
        c = self.cfg
        labels = sorted({y for _, y, _ in train})
        if len(labels) < 2:
            raise ConfigError(f"data.path={c.path}: the training examples have {len(labels)} label(s) {labels}; a "
                              f"classifier needs at least two labels (data.label_field={c.label_field})")
        index = {y: i for i, y in enumerate(labels)}
        for _, y, line in val:
            if y not in index:
                key, src = ("data.val_path", c.val_path) if c.val_path else ("data.path", c.path)
                raise ConfigError(f"{key}={src}, line {line}: label {y!r} does not occur in the training "
                                  f"examples (labels: {', '.join(labels)}).")

        def encode(rows):
            return [([tok.bos_id] + tok.encode(t)[: c.max_len - 1], index[y]) for t, y, _ in rows]

        train_set, val_set = encode(train), encode(val)
        counts = torch.bincount(torch.tensor([y for _, y in val_set]), minlength=len(labels))
        stats = {"train_examples": len(train), "val_examples": len(val), "n_labels": len(labels),
                 "majority_val_acc": float(counts.max()) / len(val)}
        return train_set, val_set, {"labels": labels, "stats": stats}
