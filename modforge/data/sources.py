"""The documents a prepare reads (``python -m modforge prepare``), in a fixed order, and which of them validate.

Text files (a document is the whole file, each line, or each blank-line separated block), JSONL files (one object
per line, its ``text_field``) or a Hugging Face dataset already in the local cache (each row; ``val_split``: a
second split's rows validate). Document ``i`` of files validates when ``floor((i + 1) f) > floor(i f)``: exactly
the fraction ``f``, spread evenly, decided by the index alone.
"""
import math
import os
from typing import Any, Iterator

from modforge.data.corpus import expand_paths, jsonl_objects, open_text, refuse_binary
from modforge.registry import ConfigError

DOCUMENTS = ("file", "line", "blank_line")  # how a text file is cut into documents (.jsonl: one per line, always)


class Documents:
    """The documents of a prepare, in order: :meth:`__iter__` yields each as text; :meth:`identity` is what
    changes when they may have."""

    def __init__(self, cfg: Any):  # a PrepareConfig (modforge.data.prepare)
        self.cfg = cfg
        if bool(cfg.input) == bool(cfg.dataset):
            raise ConfigError("input= or dataset=: name the text (input=<files or globs, comma-separated>) or a "
                              "cached Hugging Face dataset (dataset=<name>), one of the two")
        if cfg.documents not in DOCUMENTS:
            raise ConfigError(f"documents={cfg.documents}: allowed values are {', '.join(DOCUMENTS)}")
        if cfg.val_split and not cfg.dataset:
            raise ConfigError(f"val_split={cfg.val_split}: names a split of a dataset (dataset=); text files "
                              "validate on val_fraction of their documents")
        self.paths = expand_paths([p for p in str(cfg.input).split(",") if p], "input") if cfg.input else []
        self.ds = self._load(cfg.split) if cfg.dataset else None
        self.val_ds = self._load(cfg.val_split) if cfg.val_split else None
        n_files = len(self.paths)
        if cfg.input and cfg.documents == "file" and not any(p.endswith(".jsonl") for p in self.paths) and \
                not any(is_val(i, cfg.val_fraction) for i in range(n_files)):
            raise ConfigError(f"val_fraction={cfg.val_fraction}: of {n_files} file(s), each one document "
                              "(documents=file), none would validate; raise val_fraction, give more files, or cut "
                              "them into documents (documents=line or blank_line)")

    def validates(self, i: int) -> bool:
        """Whether document ``i`` goes to validation: the val split's rows (``val_split``), else
        :func:`is_val`."""
        if self.val_ds is not None:
            return i >= len(self.ds)
        return is_val(i, self.cfg.val_fraction)

    def _load(self, split: str):
        from modforge.data.lm import HF_INSTALL

        c = self.cfg
        try:
            import datasets
        except ImportError:
            raise ConfigError(f"dataset={c.dataset} needs the optional 'datasets' package: {HF_INSTALL}") from None
        try:
            ds = datasets.load_dataset(c.dataset, c.subset, split=split)
        except Exception as e:  # noqa: BLE001 - one line for the library's many errors
            raise ConfigError(f"dataset={c.dataset} (subset={c.subset}, split={split}) could not be loaded: "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Without network "
                              "access it must already be in the datasets cache (then set HF_DATASETS_OFFLINE=1)") \
                from None
        if c.text_field not in (getattr(ds, "column_names", None) or []):
            raise ConfigError(f"text_field={c.text_field}: not a column of {c.dataset} (columns: "
                              f"{', '.join(getattr(ds, 'column_names', None) or []) or 'none'})")
        return ds

    def identity(self) -> Any:
        if self.ds is not None:
            return {"dataset": self.cfg.dataset, "subset": self.cfg.subset, "split": self.cfg.split,
                    "fingerprint": getattr(self.ds, "_fingerprint", None),
                    **({"val_split": self.cfg.val_split, "val_fingerprint": getattr(self.val_ds, "_fingerprint", None)}
                       if self.val_ds is not None else {})}
        return [[p, os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in self.paths]

    def __iter__(self) -> Iterator[str]:
        if self.ds is not None:
            for ds in (self.ds, self.val_ds):  # (a row of None is an empty document: indices stay the rows')
                for row in (ds if ds is not None else []):
                    t = row[self.cfg.text_field]
                    if t is not None and not isinstance(t, str):
                        raise ConfigError(f"text_field={self.cfg.text_field}: holds {type(t).__name__} values, "
                                          "not text")
                    yield t or ""
            return
        for p in self.paths:
            if p.endswith(".jsonl"):
                yield from self._jsonl(p)
            else:
                yield from self._text(p)

    def _jsonl(self, path: str) -> Iterator[str]:
        key = self.cfg.text_field
        for n, row in jsonl_objects(path, "input", self.cfg.encoding, f"a JSON object with its text in {key!r}"):
            t = row.get(key)
            if not isinstance(t, str):
                raise ConfigError(f"input={path}: line {n} has no text field '{key}' (text_field=)")
            yield t

    def _text(self, path: str) -> Iterator[str]:
        how = self.cfg.documents
        with open_text(path, "input", self.cfg.encoding) as fh:
            if how == "file":
                text = fh.read()
                refuse_binary(text, path, "input")
                yield text
                return
            block: list = []
            for line in fh:
                refuse_binary(line, path, "input")
                if how == "line":
                    if line.strip():
                        yield line.rstrip("\n")
                elif line.strip():
                    block.append(line)
                elif block:
                    yield "".join(block).rstrip("\n")
                    block = []
            if block:
                yield "".join(block).rstrip("\n")


def is_val(i: int, fraction: float) -> bool:
    """Whether document ``i`` validates: exactly ``fraction`` of the documents, spread evenly."""
    return math.floor((i + 1) * fraction) > math.floor(i * fraction)


