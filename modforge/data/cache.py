"""On-disk caches: fitted tokenizers and memory-mapped token arrays (numpy only; no torch).

Everything lives under one root: ``data.cache_dir`` if set, else ``$MODFORGE_CACHE``,
else ``~/.cache/modforge``::

    <root>/corpora/<key>.json           a corpus's length and content hash, keyed by its files'
                                        paths, sizes and mtimes (so unchanged files are not re-read)
    <root>/tokenizers/<name>-<key>.json a fitted tokenizer's state, keyed by the hash of the text it
                                        was fitted on and its configuration (e.g. BPE vocab size)
    <root>/tokens/<key>/{train,val}.bin token ids (uint16 where the vocabulary fits, else uint32),
                       meta.json        keyed by the corpus content hash, its length (max_chars),
                                        the split point and the fitted tokenizer's hash

Every file is written to a temporary name and renamed into place (``os.replace``),
``meta.json`` last, so a crashed or concurrent build never leaves a cache that
looks complete. Text is streamed and tokenized in chunks of about
:data:`CHUNK_CHARS` characters cut at safe positions (:func:`~modforge.data.tokenizers.safe_cut`),
so memory stays flat however large the corpus is. Nothing is ever deleted:
remove the directory to reclaim space.
"""
import contextlib
import hashlib
import json
import math
import os
import secrets
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from modforge.data.tokenizers import Tokenizer, rechunk
from modforge.registry import ConfigError

CACHE_ENV = "MODFORGE_CACHE"
DEFAULT_ROOT = "~/.cache/modforge"
CHUNK_CHARS = 1 << 20  # ~1M characters of text tokenized at a time (faster and leaner than larger chunks)
FORMAT = 1  # bump to invalidate every token cache


def cache_root(cache_dir: Optional[str] = None) -> Path:
    """``cache_dir`` if given, else ``$MODFORGE_CACHE``, else ``~/.cache/modforge``; created if missing."""
    raw = cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_ROOT
    root = Path(os.path.expanduser(str(raw)))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"data.cache_dir={raw}: cannot create the cache directory ({e}). Set data.cache_dir= "
                          f"(or the {CACHE_ENV} environment variable) to a writable directory.") from None
    return root


def digest(obj: Any, n: int = 24) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", durable: bool = False):
    """Open a temporary file beside ``path``; on success rename it to ``path`` (atomic), else delete it.

    Readers see the old file or the whole new one, never a part. ``durable``
    also fsyncs the data before the rename and the directory after it, so the
    new file survives a power cut too (checkpoints use it; caches, which can be
    rebuilt, don't pay for it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable and hasattr(os, "O_DIRECTORY"):
            with contextlib.suppress(OSError):  # some network / FUSE file systems refuse; the file is saved anyway
                fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def remove_stale_temporaries(path: Path) -> None:
    """Delete temporary files that ``atomic_file`` left beside ``path`` in processes that no longer run (killed)."""
    path = Path(path)
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but not ours (EPERM)
        return True
    return True


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (readers, and other DDP ranks writing the same file, see whole files)."""
    with atomic_file(path, "w") as fh:
        fh.write(text)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj))


def read_json(path: Path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- corpora

class Corpus:
    """A text stream. :meth:`pieces` yields it in order (any piece sizes); :meth:`identity` is a cheap
    JSON-able value that changes whenever the text may have (``None``: the content is hashed every time)."""

    def identity(self) -> Optional[Any]:
        return None

    def pieces(self) -> Iterator[str]:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class FilesCorpus(Corpus):
    """Files read in order as UTF-8 (undecodable bytes replaced, newlines normalised), joined by ``separator``."""

    def __init__(self, paths: Iterable[str], separator: str = "\n", read_size: Optional[int] = None):
        self.paths = [os.path.abspath(p) for p in paths]
        self.separator = separator
        self.read_size = read_size

    def identity(self):
        files = []
        for p in self.paths:
            st = os.stat(p)
            files.append([p, st.st_size, st.st_mtime_ns])
        return {"files": files, "separator": self.separator}

    def pieces(self) -> Iterator[str]:
        size = self.read_size or CHUNK_CHARS
        for i, p in enumerate(self.paths):
            if i and self.separator:
                yield self.separator
            with open(p, encoding="utf-8", errors="replace") as fh:
                while True:
                    chunk = fh.read(size)
                    if not chunk:
                        break
                    yield chunk

    def describe(self) -> str:
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files ({self.paths[0]}, ...)"


class IterCorpus(Corpus):
    """A corpus from a function returning an iterable of text pieces (or one string)."""

    def __init__(self, make: Callable[[], Any], identity: Optional[Any] = None, description: str = "text"):
        self.make, self._identity, self.description = make, identity, description

    def identity(self):
        return self._identity

    def pieces(self) -> Iterator[str]:
        out = self.make()
        if isinstance(out, str):
            yield out
        else:
            yield from out

    def describe(self) -> str:
        return self.description


def window(pieces: Iterable[str], start: int, stop: int) -> Iterator[str]:
    """Characters ``[start, stop)`` of a stream of pieces."""
    pos = 0
    for p in pieces:
        end = pos + len(p)
        if end > start:
            a, b = max(start - pos, 0), min(stop - pos, len(p))
            if b > a:
                yield p if (a == 0 and b == len(p)) else p[a:b]
        pos = end
        if pos >= stop:
            return


@dataclass
class CorpusInfo:
    n_chars: int  # after the max_chars limit
    sha: str  # sha256 of that text (UTF-8)


def corpus_info(corpus: Corpus, max_chars: Optional[int], root: Path) -> CorpusInfo:
    """Length and content hash of (the first ``max_chars`` characters of) a corpus, cached by identity."""
    ident = corpus.identity()
    path = None
    if ident is not None:
        path = root / "corpora" / f"{digest({'id': ident, 'max_chars': max_chars, 'format': FORMAT})}.json"
        known = read_json(path)
        if known and {"n_chars", "sha"} <= set(known):
            return CorpusInfo(int(known["n_chars"]), str(known["sha"]))
    h, n = hashlib.sha256(), 0
    for p in window(corpus.pieces(), 0, max_chars or sys.maxsize):
        h.update(p.encode("utf-8", "surrogatepass"))
        n += len(p)
    info = CorpusInfo(n, h.hexdigest())
    if path is not None:
        write_json(path, {**asdict(info), "identity": ident, "max_chars": max_chars})
    return info


def text_sha(texts: Iterable[str]) -> str:
    """Content hash of a list of texts (for small in-memory data sets)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


# --------------------------------------------------------------------------- tokenizers

def fit_tokenizer(tokenizer: Tokenizer, texts: Callable[[], Iterable[str]], text_key: Any, root: Path) -> Tokenizer:
    """Fit ``tokenizer`` on ``texts()``, or load the state fitted earlier on the same text with the same
    configuration. Tokenizers that do not fit on data (byte, a BPE loaded from a file) are returned as is."""
    if not tokenizer.fits_on_data:
        return tokenizer
    path = root / "tokenizers" / f"{tokenizer.name}-{digest({'text': text_key, 'tokenizer': tokenizer.fit_key()})}.json"
    state = read_json(path)
    if state and state.get("name") == tokenizer.name:
        try:
            return tokenizer.load_state(state)
        except Exception:  # noqa: BLE001 - an unreadable cache entry is refitted, not fatal
            pass
    tokenizer.fit(texts())
    write_json(path, tokenizer.state())
    return tokenizer


# --------------------------------------------------------------------------- token arrays

class TokenArray:
    """A 1-d array of token ids in a file, memory-mapped (read-only) on first use in each process.

    Pickles as (path, dtype, length), so DataLoader workers map the file themselves
    rather than receiving a copy of the data.
    """

    def __init__(self, path: Path, dtype: Any, n: int):
        self.path, self.dtype, self.n = Path(path), np.dtype(dtype), int(n)
        self._mm = None

    @property
    def array(self) -> np.ndarray:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n,)) if self.n else \
                np.zeros(0, dtype=self.dtype)
        return self._mm

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key):
        return self.array[key]

    def __getstate__(self):
        return {"path": self.path, "dtype": self.dtype, "n": self.n, "_mm": None}

    def __repr__(self) -> str:
        return f"TokenArray({str(self.path)!r}, {self.dtype}, n={self.n})"


@dataclass
class TokenCache:
    train: TokenArray
    val: TokenArray
    stats: dict
    directory: Path
    built: bool = False  # True when this call tokenized the corpus (False: read from the cache)
    meta: dict = field(default_factory=dict)


def _valid(d: Path, meta: Optional[dict]) -> bool:
    if not meta or meta.get("format") != FORMAT:
        return False
    item = np.dtype(meta["dtype"]).itemsize
    for split in ("train", "val"):
        f = d / f"{split}.bin"
        if not f.is_file() or f.stat().st_size != item * int(meta[split]):
            return False
    return True


def token_cache(corpus: Corpus, info: CorpusInfo, cut: int, tokenizer: Tokenizer, root: Path,
                chunk_chars: Optional[int] = None) -> TokenCache:
    """Characters [0, cut) of the corpus as the train split and [cut, n_chars) as val, tokenized once
    (chunk by chunk, streamed to disk) and memory-mapped from then on.

    Keyed by the corpus content hash and length, the split point and the fitted
    tokenizer's hash: a changed corpus, ``max_chars``, ``val_fraction`` or tokenizer
    gives a new key and a rebuild. Stats (token counts, the add-one unigram
    cross-entropy of val under train's distribution) are computed in the same pass.
    """
    key = digest({"format": FORMAT, "sha": info.sha, "n_chars": info.n_chars, "cut": cut,
                  "tokenizer": tokenizer.digest()})
    d = root / "tokens" / key
    meta = read_json(d / "meta.json")
    built = False
    if not _valid(d, meta):
        meta = _build(corpus, info, cut, tokenizer, d, chunk_chars or CHUNK_CHARS)
        built = True
    dtype = np.dtype(meta["dtype"])
    return TokenCache(TokenArray(d / "train.bin", dtype, meta["train"]), TokenArray(d / "val.bin", dtype, meta["val"]),
                      dict(meta["stats"]), d, built, meta)


def _build(corpus: Corpus, info: CorpusInfo, cut: int, tokenizer: Tokenizer, d: Path, chunk_chars: int) -> dict:
    V, dtype = tokenizer.vocab_size, tokenizer.token_dtype
    counts, lengths = {}, {}
    for split, (a, b) in (("train", (0, cut)), ("val", (cut, info.n_chars))):
        c = np.zeros(V, dtype=np.int64)
        n = 0
        with atomic_file(d / f"{split}.bin") as fh:
            for chunk in rechunk(window(corpus.pieces(), a, b), chunk_chars):
                ids = tokenizer.encode_array(chunk)
                if len(ids):
                    bc = np.bincount(ids, minlength=V)
                    if len(bc) > V:
                        raise ValueError(f"tokenizer '{tokenizer.name}' produced id {int(ids.max())} >= vocab_size {V}")
                    c += bc
                    ids.astype(dtype, copy=False).tofile(fh)
                    n += len(ids)
        counts[split], lengths[split] = c, n
    logp = np.log((counts["train"] + 1.0) / (counts["train"].sum() + V))
    unigram = float(-(counts["val"] * logp).sum() / max(1, lengths["val"]))
    meta = {
        "format": FORMAT, "dtype": dtype.str, "vocab_size": V, "tokenizer": tokenizer.name,
        "train": lengths["train"], "val": lengths["val"], "sha": info.sha, "n_chars": info.n_chars, "cut": cut,
        "stats": {
            "train_chars": cut, "val_chars": info.n_chars - cut,
            "train_tokens": lengths["train"], "val_tokens": lengths["val"],
            "val_tokens_per_char": lengths["val"] / max(1, info.n_chars - cut),
            "unigram_val_loss": unigram if math.isfinite(unigram) else float("nan"),
        },
    }
    write_json(d / "meta.json", meta)
    return meta


# --------------------------------------------------------------------------- paths

def expand_paths(spec: Any, key: str = "data.path") -> list[str]:
    """Files named by ``spec``: a path or glob (``**`` recursive), or a list of them, in the given order
    (each glob's matches sorted, duplicates dropped). Anything that names no file is a ConfigError."""
    import glob

    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec or [])
    if not items:
        raise ConfigError(f"{key}: name the text files to read (a path, a glob such as 'corpus/**/*.txt', "
                          f"or a list: {key}='[a.txt,b/*.txt]')")
    out: list[str] = []
    for item in items:
        pat = os.path.expanduser(str(item))
        if glob.has_magic(pat):
            found = sorted(p for p in glob.glob(pat, recursive=True) if os.path.isfile(p))
            if not found:
                raise ConfigError(f"{key}={item}: the glob matches no file (relative to {os.getcwd()}).")
        elif os.path.isdir(pat):
            raise ConfigError(f"{key}={item}: is a directory; name its files with a glob, e.g. {key}='{item}/*.txt'")
        elif not os.path.isfile(pat):
            raise ConfigError(f"{key}={item}: no such file (relative to {os.getcwd()}).")
        else:
            found = [pat]
        out.extend(os.path.abspath(p) for p in found)
    return list(dict.fromkeys(out))


def existing_file(path: Optional[str], key: str, what: str) -> str:
    """``path`` expanded, or a ConfigError naming ``key`` if it is unset or not a file."""
    if not path:
        raise ConfigError(f"{key}: required; give the path of {what}.")
    p = os.path.expanduser(str(path))
    if not os.path.isfile(p):
        raise ConfigError(f"{key}={path}: no such file (relative to {os.getcwd()}); give the path of {what}.")
    return p
