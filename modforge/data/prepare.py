"""Text into token shards (what ``python -m modforge prepare`` runs): documents in, llm.c-layout shards out.

The documents and which of them validate: :mod:`modforge.data.sources`. The tokenizer is trained on the training
documents (``bpe``, ``char``: on at most ``fit_chars`` characters of them) or loaded (``tokenizer_path``).
Documents are encoded in batches by a pool of worker processes, results taken in order, so the shards are the same
bytes whatever the number of workers. The end-of-document policy puts the tokenizer's end-of-text id after each
document (``end``: nanoGPT's OpenWebText), before it (``start``: llm.c's and modded-nanogpt's FineWeb), or
nowhere (``none``).

A shard holds whole documents and closes once it reaches ``shard_tokens`` (or before its count would pass
the header's int32). It is written under a temporary name and renamed when whole; then ``.prepare.json``
records it and where each split stands, the other split's buffer saved beside it, so a killed prepare resumes
after the last shard either split finished, and no file that looks like a shard is ever partial. ``meta.json`` (:data:`~modforge.data.shards.META`) is written last: a directory without it is not
finished, and ``data=tokens`` refuses it.
"""
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from modforge.data.sources import Documents
from modforge.data.shards import META, META_FORMAT, META_VERSION, PREPARE_STATE, write_shard
from modforge.data.tokenizers import Tokenizer, load_tokenizer
from modforge.registry import ConfigError
from modforge.utils.files import atomic_file, read_json, remove_stale_temporaries, write_json

STATE = PREPARE_STATE
EOD_POLICIES = ("end", "start", "none")
BATCH_DOCS = 256  # documents per task sent to a worker


@dataclass
class PrepareConfig:
    out: str
    input: Optional[str] = None  # comma-separated paths or globs
    dataset: Optional[str] = None  # a Hugging Face dataset in the local cache
    subset: Optional[str] = None
    split: str = "train"
    val_split: Optional[str] = None  # with dataset=: validate on this split's rows (val_fraction unused)
    text_field: str = "text"
    documents: str = "file"
    encoding: str = "utf-8"
    tokenizer: Optional[str] = None  # None: pretrained with tokenizer_path (the file's own ids), else bpe
    vocab_size: Optional[int] = None
    tokenizer_path: Optional[str] = None
    fit_chars: int = 100_000_000
    eod: str = "end"
    val_fraction: float = 0.01
    shard_tokens: int = 100_000_000
    workers: int = 0  # 0: every core
    progress: bool = True

    def identity(self, sources: "Documents") -> dict:
        """What the shards depend on: a resumed prepare must have the same (workers and progress do not count)."""
        keep = {k: v for k, v in asdict(self).items() if k not in ("out", "workers", "progress", "input", "dataset")}
        return {**keep, "sources": sources.identity()}


def make_tokenizer(cfg: PrepareConfig) -> Tokenizer:
    """The tokenizer the options ask for, unfitted (``tokenizer_path`` alone: the file's own ids)."""
    from modforge.data.config import make_tokenizer as from_data_keys

    @dataclass
    class Keys:  # the data-config keys make_tokenizer reads
        tokenizer: str
        vocab_size: Optional[int]
        tokenizer_path: Optional[str]

    name = cfg.tokenizer or ("pretrained" if cfg.tokenizer_path else "bpe")
    if name == "pretrained":
        from modforge.data.corpus import existing_file
        from modforge.data.tokenizers.pretrained import PretrainedConfig, PretrainedTokenizer

        existing_file(cfg.tokenizer_path, "tokenizer_path", "a Hugging Face tokenizer.json (tokenizer=pretrained)")
        return PretrainedTokenizer(PretrainedConfig(path=cfg.tokenizer_path))
    try:
        return from_data_keys(Keys(name, cfg.vocab_size, cfg.tokenizer_path))
    except ConfigError as e:
        raise ConfigError(str(e).replace("data.", "")) from None


# --------------------------------------------------------------------------- workers

_worker_tok: Optional[Tokenizer] = None


def _init_worker(state: dict) -> None:
    global _worker_tok
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _worker_tok = load_tokenizer(state)


def _encode(docs: list) -> list:
    """[(ids, chars, bytes)] for each document (in the worker)."""
    tok = _worker_tok
    dtype = tok.token_dtype  # (ids cross the pipe at 2 or 4 bytes, not 8)
    return [(ids.astype(dtype, copy=False), len(d), len(d.encode("utf-8", "surrogatepass")))
            for d, ids in zip(docs, tok.encode_many(docs))]


def batches(docs: Iterator[str], start: int, n: int = BATCH_DOCS) -> Iterator[tuple]:
    """(index of the first document, [documents]) from document ``start`` on."""
    batch: list = []
    first = start
    for i, d in enumerate(docs):
        if i < start:
            continue
        if not batch:
            first = i
        batch.append(d)
        if len(batch) >= n:
            yield first, batch
            batch = []
    if batch:
        yield first, batch


@contextlib.contextmanager
def encoder(tok: Tokenizer, workers: int) -> Iterator[Callable]:
    """``map(fn, batches)`` in order: a pool of ``workers`` processes (1: this process)."""
    if workers <= 1:
        global _worker_tok
        _worker_tok = tok
        yield lambda it: (_encode(b) for _, b in it)
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "forkserver")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tok.state(),)) as pool:
        yield lambda it: pool.imap(_encode, (b for _, b in it), chunksize=1)


# --------------------------------------------------------------------------- the prepare

MAX_SHARD = 2 ** 31 - 1  # llm.c's header counts a shard's tokens in an int32


@dataclass
class SplitWriter:
    """The shards of one split: documents buffered until ``shard_tokens``, then one shard written whole. What is
    buffered is saved beside the state (:meth:`save_pending`) whenever the other split finishes a shard, so a
    resumed prepare starts from the last shard either split finished, not from the first document."""

    name: str
    out: Path
    dtype: Any
    shard_tokens: int
    shards: list = field(default_factory=list)  # finished: {"file", "tokens", "bytes", "max_id", "docs": [a, b)}
    next_doc: int = 0  # the first document (global index) not in a finished shard
    totals: dict = field(default_factory=lambda: {"docs": 0, "tokens": 0, "chars": 0, "bytes": 0})

    def __post_init__(self):
        self.buf: list = []
        self.buf_tokens = 0
        self.buf_first: Optional[int] = None
        self.seen = self.next_doc  # the first document not yet in a shard or the buffer
        self.pending = {"docs": 0, "tokens": 0, "chars": 0, "bytes": 0}

    def add(self, i: int, ids: np.ndarray, chars: int, nbytes: int) -> bool:
        """Buffer document ``i``; True when a shard was written."""
        if i < self.seen:
            return False  # already in a shard or the saved buffer (a resumed prepare)
        if len(ids) > MAX_SHARD:
            raise ConfigError(f"document {i} is {len(ids):,} tokens, more than a shard holds ({MAX_SHARD:,}: llm.c's "
                              "header counts them in an int32); cut it (documents=line or blank_line)")
        wrote = False
        if self.buf and self.buf_tokens + len(ids) > MAX_SHARD:  # it would overflow the header's count
            self.flush()
            wrote = True
        if self.buf_first is None:
            self.buf_first = i
        self.buf.append(ids)
        self.buf_tokens += len(ids)
        for k, v in (("docs", 1), ("tokens", len(ids)), ("chars", chars), ("bytes", nbytes)):
            self.pending[k] += v
        self.seen = i + 1
        if self.buf_tokens >= self.shard_tokens:
            self.flush()
            return True
        return wrote

    def flush(self) -> None:
        if not self.buf:
            return
        ids = np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0]
        name = f"{self.name}_{len(self.shards):06d}.bin"
        with atomic_file(self.out / name) as fh:
            write_shard(fh, ids, self.dtype)
        self.shards.append({"file": name, "tokens": int(len(ids)), "bytes": (self.out / name).stat().st_size,
                            "max_id": int(ids.max()) if len(ids) else -1, "docs": [self.buf_first, self.seen]})
        for k in self.totals:
            self.totals[k] += self.pending[k]
        self.next_doc = self.seen
        self.buf, self.buf_tokens, self.buf_first = [], 0, None
        self.pending = {k: 0 for k in self.pending}
        (self.out / self.pending_file).unlink(missing_ok=True)

    @property
    def pending_file(self) -> str:
        return f".prepare-{self.name}-pending.npy"

    def save_pending(self) -> None:
        """The buffer, atomically (its documents, counts and first index go in the state)."""
        if self.buf:
            with atomic_file(self.out / self.pending_file) as fh:
                np.save(fh, np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0])
        else:
            (self.out / self.pending_file).unlink(missing_ok=True)

    def state(self) -> dict:
        return {"shards": self.shards, "next_doc": self.next_doc, "totals": self.totals,
                "buffer": {"first": self.buf_first, "seen": self.seen, "counts": self.pending} if self.buf else None}

    def restore(self, st: dict) -> None:
        self.shards, self.next_doc, self.totals = st["shards"], st["next_doc"], st["totals"]
        self.seen = self.next_doc
        buf = st.get("buffer")
        path = self.out / self.pending_file
        if buf and path.is_file():
            arr = np.load(path)
            self.buf, self.buf_tokens = [arr], len(arr)
            self.buf_first, self.seen, self.pending = buf["first"], buf["seen"], dict(buf["counts"])


def prepare(cfg: PrepareConfig, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> dict:
    """Write ``cfg.out``'s shards and ``meta.json``; returns the meta. Resumes a killed prepare of the same
    inputs and settings; a finished one is left as it is."""
    check(cfg)
    out = Path(os.path.expanduser(cfg.out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={cfg.out}: a file, not a directory")
    docs = Documents(cfg)
    ident = cfg.identity(docs)
    meta = read_json(out / META)
    if meta is not None:
        if meta.get("format") == META_FORMAT and meta.get("identity") == json.loads(json.dumps(ident)):
            log(f"[modforge] {out}: already prepared from these inputs and settings; nothing to do")
            return meta
        raise ConfigError(f"out={cfg.out}: holds shards prepared from other inputs or settings; choose another "
                          "out= directory (or remove this one)")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val"):
        for stale in out.glob(f"{name}_*.bin"):
            remove_stale_temporaries(stale)
    state = read_json(out / STATE)
    if state is not None and state.get("identity") != json.loads(json.dumps(ident)):
        raise ConfigError(f"out={cfg.out}: holds an unfinished prepare of other inputs or settings; choose another "
                          "out= directory (or remove this one)")
    if state is not None:
        tok = load_tokenizer(state["tokenizer"])
        log(f"[modforge] resuming the prepare in {out}")
    else:
        tok = make_tokenizer(cfg)
        if tok.fits_on_data:
            t0 = time.perf_counter()
            tok.fit(_fit_texts(docs, cfg))
            log(f"[modforge] {tok.name} tokenizer fitted on the training documents: {tok.vocab_size} ids "
                f"({time.perf_counter() - t0:.1f} s)")
    eod = None if cfg.eod == "none" else tok.eos_id
    if cfg.eod != "none" and eod is None:
        raise ConfigError(f"eod={cfg.eod}: tokenizer '{tok.name}' has no end-of-text token to mark documents with; "
                          "use eod=none, or a tokenizer.json with one (<|endoftext|>, </s>, [SEP])")
    dtype = tok.token_dtype
    writers = {s: SplitWriter(s, out, dtype, cfg.shard_tokens) for s in ("train", "val")}
    if state is not None:
        for s, w in writers.items():
            w.restore(state["splits"][s])

    def save() -> None:  # the buffers first: the state names them
        for w in writers.values():
            w.save_pending()
        write_json(out / STATE, {"identity": ident, "tokenizer": tok.state(),
                                 "splits": {s: w.state() for s, w in writers.items()}})

    save()
    start = min(w.seen for w in writers.values())
    workers = cfg.workers or (os.cpu_count() or 1)
    t0, n_docs = time.perf_counter(), start
    bar = _bar(cfg.progress, start)
    try:
        with encoder(tok, workers) as encode:
            index = start
            for encoded in encode(batches(iter(docs), start)):
                for ids, chars, nbytes in encoded:
                    if not chars:  # an empty document (a dataset's empty row): nothing to mark
                        index += 1
                        continue
                    ids = _with_eod(ids.astype(dtype, copy=False), eod, cfg.eod)
                    w = writers["val" if docs.validates(index) else "train"]
                    if w.add(index, ids, chars, nbytes):
                        save()
                    index += 1
                bar.update(len(encoded))
                n_docs = index
            for w in writers.values():
                w.flush()
    finally:
        bar.close()
    empty = [s for s, w in writers.items() if not w.shards]
    if empty:  # nothing to resume: what this prepare wrote goes, so that the command with other settings runs
        for w in writers.values():
            for e in w.shards:
                (out / e["file"]).unlink(missing_ok=True)
            (out / w.pending_file).unlink(missing_ok=True)
        (out / STATE).unlink(missing_ok=True)
        s = empty[0]
        raise ConfigError(f"val_fraction={cfg.val_fraction}: of {n_docs} documents, none went to {s}; "
                          + ("lower val_fraction, or give more documents" if s == "train" else
                             "raise val_fraction, or give more documents (documents=line or blank_line cuts "
                             "a text file into many)"))
    save()
    meta = {"format": META_FORMAT, "version": META_VERSION, "complete": True, "identity": ident,
            "tokenizer": tok.state(), "vocab_size": tok.vocab_size, "eod_id": eod, "eod_policy": cfg.eod,
            "dtype": np.dtype(dtype).name,
            "splits": {s: w.totals for s, w in writers.items()},
            "shards": [dict(e, split=s) for s, w in writers.items() for e in w.shards],
            "seconds": round(time.perf_counter() - t0, 3)}
    write_json(out / META, meta, indent=1)
    (out / STATE).unlink(missing_ok=True)
    tr, va = meta["splits"]["train"], meta["splits"]["val"]
    log(f"[modforge] {out}: {tr['docs']:,} training documents in {len(writers['train'].shards)} shard(s), "
        f"{tr['tokens']:,} tokens; {va['docs']:,} validation documents, {va['tokens']:,} tokens")
    return meta


def check(cfg: PrepareConfig) -> None:
    """Every option's value, before any reading (one line each)."""
    if cfg.eod not in EOD_POLICIES:
        raise ConfigError(f"eod={cfg.eod}: allowed values are {', '.join(EOD_POLICIES)}")
    if not 0.0 < cfg.val_fraction < 1.0:
        raise ConfigError(f"val_fraction={cfg.val_fraction}: must be in (0, 1)")
    if cfg.shard_tokens < 1 or cfg.shard_tokens >= 2 ** 31:
        raise ConfigError(f"shard_tokens={cfg.shard_tokens}: from 1 to 2^31 - 1 (llm.c's header counts a shard's "
                          "tokens in an int32)")
    if cfg.fit_chars < 1:
        raise ConfigError(f"fit_chars={cfg.fit_chars}: must be >= 1")


def _fit_texts(docs: Documents, cfg: PrepareConfig) -> Iterator[str]:
    budget = cfg.fit_chars
    for i, d in enumerate(docs):
        if budget <= 0:
            return
        if not docs.validates(i):
            yield d[:budget]
            budget -= len(d)


def _with_eod(ids: np.ndarray, eod: Optional[int], policy: str) -> np.ndarray:
    if eod is None:
        return ids
    mark = np.array([eod], dtype=ids.dtype if len(ids) else np.int64)
    return np.concatenate([ids, mark] if policy == "end" else [mark, ids])


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(show: bool, start: int):
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(initial=start, unit=" docs", desc="prepare", file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
