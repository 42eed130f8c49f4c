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
:data:`CHUNK_CHARS` characters cut at safe positions (:func:`~modforge.data.text.safe_cut`),
so memory stays flat however large the corpus is. Nothing is ever deleted:
remove the directory to reclaim space.
"""
import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

from modforge.data.corpus import CHUNK_CHARS, Corpus, CorpusInfo, window
from modforge.data.text import rechunk
from modforge.data.tokenizers import Tokenizer
from modforge.utils.files import CACHE_ENV, atomic_file, read_json, write_json
from modforge.utils.files import cache_dir as io_cache_dir
from modforge.registry import ConfigError

FORMAT = 1  # bump to invalidate every token cache


def cache_root(cache_dir: Optional[str] = None) -> Path:
    """:func:`modforge.utils.files.cache_dir` (``data.cache_dir``, ``$MODFORGE_CACHE``, ``~/.cache/modforge``), created."""
    root = io_cache_dir(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"data.cache_dir: cannot create the cache directory {root} ({e}). Set data.cache_dir= "
                          f"(or the {CACHE_ENV} environment variable) to a writable directory.") from None
    return root


def digest(obj: Any, n: int = 24) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


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

    def __init__(self, path: Path, dtype: Any, n: int, offset: int = 0):
        self.path, self.dtype, self.n, self.offset = Path(path), np.dtype(dtype), int(n), int(offset)
        self._mm = None

    @property
    def array(self) -> np.ndarray:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.n,)) \
                if self.n else np.zeros(0, dtype=self.dtype)
        return self._mm

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key):
        return self.array[key]

    def __getstate__(self):
        return {**self.__dict__, "_mm": None}

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
            # the share of the training tokens that are the tokenizer's unknown token (text it does not cover)
            "train_unknown_fraction": (float(counts["train"][unk] / lengths["train"])
                                       if (unk := tokenizer.unknown_id) is not None and lengths["train"] else 0.0),
        },
    }
    write_json(d / "meta.json", meta)
    return meta
