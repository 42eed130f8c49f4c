"""Language-modelling data: a text corpus, tokenized once into a memory-mapped cache, cut into windows.

Corpora (kind ``data``):

* ``stdlib`` (the default for ``decoder_only`` and ``encoder_only``): the Python
  standard library's own top-level ``*.py`` sources, present wherever Python
  runs, so the default run needs no download. The exact text depends on the
  Python version, so compare numbers only within one Python.
* ``tinyshakespeare``: Karpathy's char-rnn corpus (nanoGPT's ``shakespeare_char``),
  downloaded once into the cache directory, or read from ``data.path``.
* ``text``: local files or globs (``data.path``).
* ``hf``: a Hugging Face ``datasets`` dataset (optional extra ``modforge[hf]``).

Files are read in order and joined with a newline. The split is by characters,
as nanoGPT's ``shakespeare_char``: of the first ``max_chars`` characters, the
first ``1 - val_fraction`` train and the rest validate (the cut may fall inside
a line). The corpus is streamed: first once to count and hash it (cached by the
files' paths, sizes and mtimes), then, on a cache miss, chunk by chunk through
the tokenizer into ``<cache>/tokens/<key>/{train,val}.bin`` (see
:mod:`modforge.data.cache`). Training reads windows from the memory map, so a
corpus larger than RAM trains with flat memory.

Batches are ``(x, y)`` with ``y`` = ``x`` shifted by one: (B, block_size) int64.
Training windows start anywhere (reshuffled every epoch; for more than
:data:`SHUFFLE_LIMIT` start positions, drawn with replacement instead, so that
no permutation of all positions is held in memory); validation windows are the
non-overlapping ones, in a fixed shuffled order so that ``trainer.limit_val_batches``
takes a representative subset. With ``val_stride`` S (sliding-window evaluation), a
validation window starts every S tokens and only its last S targets are scored (the
others are :data:`~modforge.utils.targets.IGNORE`): every scored token is predicted
from at least ``block_size - S`` tokens of context, where non-overlapping windows
score their first tokens from almost none (Press et al. 2022, appendix B).
"""
import glob
import hashlib
import os
import sys
import sysconfig
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from modforge.data.base import TOKENS, DataFacts, DataModule
from modforge.data.cache import cache_root, corpus_info, fit_tokenizer, token_cache
from modforge.data.corpus import CHUNK_CHARS, Corpus, FilesCorpus, IterCorpus, expand_paths, window
from modforge.data.config import TokenizedDataConfig, make_tokenizer
from modforge.data.text import rechunk
from modforge.data.tokenizers import Tokenizer
from modforge.utils.files import atomic_file
from modforge.utils.targets import IGNORE
from modforge.registry import ConfigError, register

SHUFFLE_LIMIT = 1 << 24  # above this many training windows, sample starts with replacement
UNKNOWN_NOTE = 0.01  # a note when more of the training tokens than this are the unknown token


class Windows(Dataset):
    """(x, y) windows of ``block`` tokens from a 1-d token array, starting at ``starts``.

    ``tokens`` is a :class:`~modforge.data.cache.TokenArray` (memory-mapped), a numpy
    array or a tensor; each window is copied out as int64.
    """

    def __init__(self, tokens: Any, block: int, starts: Sequence[int], score_last: Optional[int] = None):
        self.tokens, self.block, self.starts, self.score_last = tokens, block, starts, score_last

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int):
        s = int(self.starts[i])
        w = self.tokens[s : s + self.block + 1]
        return window_pair(w, self.block, self.score_last)


def windows_loader(module: DataModule, ds: Dataset) -> DataLoader:
    """The training loader of a dataset of windows: shuffled every epoch, or, past :data:`SHUFFLE_LIMIT` windows,
    starts drawn with replacement (no permutation of every position held in memory)."""
    c, n = module.cfg, len(ds)
    kw = dict(batch_size=c.batch_size, drop_last=True, num_workers=c.num_workers,
              persistent_workers=c.num_workers > 0)
    if n <= SHUFFLE_LIMIT:
        return module.train_loader(ds, **kw)
    return module.train_loader(ds, replacement=True, num_samples=n, **kw)


def window_pair(w: Any, block: int, score_last: Optional[int] = None) -> tuple:
    """``block + 1`` token ids -> (x, y) int64, y the ids after x; with ``score_last`` only y's last
    ``score_last`` targets are scored (the others :data:`~modforge.utils.targets.IGNORE`)."""
    if not isinstance(w, torch.Tensor):
        w = torch.from_numpy(np.array(w, dtype=np.int64))
    x, y = w[:-1], w[1:]
    if score_last is not None and score_last < block:
        y = y.clone()
        y[: block - score_last] = IGNORE
    return x, y


@dataclass
class TextDataConfig(TokenizedDataConfig):
    block_size: int = 64
    batch_size: int = 12
    max_chars: Optional[int] = 2_000_000  # use the first N characters of the corpus (None: all)
    val_stride: Optional[int] = None  # sliding-window validation: a window every S tokens, its last S scored

    @property
    def positions(self) -> int:
        """Longest sequence a batch holds (the model needs this many positions)."""
        return self.block_size

    def __post_init__(self):
        super().__post_init__()
        if self.block_size < 1:
            raise ConfigError(f"data.block_size={self.block_size}: must be >= 1")
        if self.max_chars is not None and self.max_chars < 1:
            raise ConfigError(f"data.max_chars={self.max_chars}: must be >= 1 (or null for the whole corpus)")
        if self.val_stride is not None and not 1 <= self.val_stride <= self.block_size:
            raise ConfigError(f"data.val_stride={self.val_stride}: an integer in [1, data.block_size={self.block_size}] "
                              "(validation windows every S tokens, each scoring its last S), or null for "
                              "non-overlapping windows")


class TextLMData(DataModule):
    """Base for corpora of plain text; subclasses implement :meth:`corpus` (a stream, for large
    corpora) or just :meth:`read_text` (the whole text as one string)."""

    provides = TOKENS

    def __init__(self, cfg: TextDataConfig):
        super().__init__(cfg)
        self.train_tokens = self.val_tokens = None

    def corpus(self) -> Corpus:
        if type(self).read_text is TextLMData.read_text:
            raise NotImplementedError(f"{type(self).__name__} must implement corpus() or read_text()")
        return IterCorpus(self.read_text, None, type(self).__name__)

    def read_text(self) -> str:
        return "".join(self.corpus().pieces())

    def prepare_facts(self, tokenizer: Optional[Tokenizer]) -> DataFacts:
        """Count and split the corpus, fit the tokenizer on the training split (unless given one; a fitted
        tokenizer is cached) and tokenize both splits into the memory-mapped cache (once)."""
        c = self.cfg
        tok = tokenizer or make_tokenizer(c)  # first: a bad tokenizer key fails before the corpus is read
        root = cache_root(c.cache_dir)
        corpus = self.corpus()
        info = corpus_info(corpus, c.max_chars, root)
        if info.n_chars == 0:
            raise ConfigError(f"{corpus.describe()}: the corpus is empty")
        cut = int(info.n_chars * (1 - c.val_fraction))
        tok = tokenizer or fit_tokenizer(
            tok, lambda: rechunk(window(corpus.pieces(), 0, cut), CHUNK_CHARS),
            {"sha": info.sha, "n_chars": info.n_chars, "cut": cut}, root,
        )
        cache = token_cache(corpus, info, cut, tok, root)
        need = c.block_size + 1
        if len(cache.train) < need or len(cache.val) < need:
            raise ConfigError(
                f"data.block_size={c.block_size}: the corpus splits into {len(cache.train)} train and "
                f"{len(cache.val)} val tokens; each needs more than block_size"
            )
        self.train_tokens, self.val_tokens = cache.train, cache.val
        unknown = cache.stats.get("train_unknown_fraction", 0.0)  # (caches built before it was counted: not known)
        if unknown > UNKNOWN_NOTE:
            print(f"[modforge] note: {unknown:.1%} of the training tokens are the tokenizer's unknown token "
                  f"(data.tokenizer={c.tokenizer}"
                  + (f", data.tokenizer_path={c.tokenizer_path}" if getattr(c, "tokenizer_path", None) else "")
                  + "): its vocabulary does not cover this text, and a model learns little from <unk>",
                  file=sys.stderr)
        stats = {**cache.stats, "token_cache": str(cache.directory)}
        return DataFacts(tok, positions=c.positions, tokens_per_char=stats["val_tokens_per_char"], stats=stats)

    def passes(self, tokens_seen: int) -> Optional[float]:
        return tokens_seen / len(self.train_tokens) if self.train_tokens is not None else None

    def train_dataloader(self) -> DataLoader:
        b = self.cfg.block_size
        return windows_loader(self, Windows(self.train_tokens, b, range(len(self.train_tokens) - b)))

    def val_dataloader(self) -> DataLoader:
        b, stride = self.cfg.block_size, self.cfg.val_stride
        starts = torch.arange(0, len(self.val_tokens) - b, stride or b)
        starts = starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(0))]
        return self.val_loader(Windows(self.val_tokens, b, starts, stride), batch_size=self.cfg.batch_size,
                               num_workers=self.cfg.num_workers)


# --------------------------------------------------------------------------- stdlib

def stdlib_sources() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    return sorted(glob.glob(os.path.join(root, "*.py")))


@register("data", "stdlib", config=TextDataConfig)
class StdlibData(TextLMData):
    """The Python standard library's top-level *.py sources (offline, always present)."""

    def corpus(self) -> Corpus:
        files = stdlib_sources()
        if not files:
            raise ConfigError(f"data=stdlib: no *.py files under {sysconfig.get_paths()['stdlib']}")
        return FilesCorpus(files, encoding=self.cfg.encoding, key="data=stdlib")


# --------------------------------------------------------------------------- tinyshakespeare

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@dataclass
class TinyShakespeareConfig(TextDataConfig):
    path: Optional[str] = None  # a local input.txt; None: <cache_dir>/tinyshakespeare/input.txt, downloaded if missing
    url: str = TINYSHAKESPEARE_URL
    max_chars: Optional[int] = None  # the whole corpus (1,115,394 characters)


def download(url: str, dest: Path, sha256: Optional[str] = None, timeout: float = 60.0) -> Path:
    """Fetch ``url`` into ``dest`` (atomically), checking its sha256 when given."""
    h = hashlib.sha256()
    with atomic_file(dest) as out, urllib.request.urlopen(url, timeout=timeout) as resp:
        while True:
            block = resp.read(1 << 20)
            if not block:
                break
            h.update(block)
            out.write(block)
        if sha256 and h.hexdigest() != sha256:
            raise ValueError(f"sha256 {h.hexdigest()} differs from the expected {sha256}")
    return dest


@register("data", "tinyshakespeare", config=TinyShakespeareConfig)
class TinyShakespeareData(TextLMData):
    """Tiny Shakespeare (40k lines of plays, 1.1M characters): the character-level benchmark; 90/10 split."""

    @classmethod
    def check_files(cls, cfg: TinyShakespeareConfig) -> None:
        if cfg.path:
            cls(cfg).local_path()

    def local_path(self) -> Path:
        c = self.cfg
        if c.path:
            p = Path(os.path.expanduser(c.path))
            if not p.is_file():
                raise ConfigError(f"data.path={c.path}: no such file (relative to {os.getcwd()}). Point it at a copy "
                                  f"of tinyshakespeare's input.txt, or leave it unset to download {c.url} into "
                                  f"{cache_root(c.cache_dir) / 'tinyshakespeare'}.")
            return p
        dest = cache_root(c.cache_dir) / "tinyshakespeare" / "input.txt"
        if dest.is_file():
            return dest
        expected = TINYSHAKESPEARE_SHA256 if c.url == TINYSHAKESPEARE_URL else None
        try:
            return download(c.url, dest, expected)
        except Exception as e:  # noqa: BLE001 - any network/HTTP/checksum failure gets the same advice
            raise ConfigError(
                f"data=tinyshakespeare: {dest} is missing and downloading it from {c.url} failed "
                f"({type(e).__name__}: {e}). Without network access, fetch input.txt from that URL elsewhere and "
                f"put it at {dest}, or pass data.path=/path/to/input.txt."
            ) from None

    def corpus(self) -> Corpus:
        return FilesCorpus([str(self.local_path())], encoding=self.cfg.encoding)


# --------------------------------------------------------------------------- text files

@dataclass
class TextFilesConfig(TextDataConfig):
    path: Any = None  # a file, a glob ('corpus/**/*.txt') or a list of them ('[a.txt,b/*.txt]'), read in order
    max_chars: Optional[int] = None  # the whole corpus

    def __post_init__(self):
        super().__post_init__()
        if not self.path:
            raise ConfigError("data.path: name the text files to read (a path, a glob such as 'corpus/**/*.txt', "
                              "or a list: data.path='[a.txt,b/*.txt]')")


@register("data", "text", config=TextFilesConfig)
class TextFilesData(TextLMData):
    """Local text files (paths or globs), joined in order; the first 1 - val_fraction of the characters train."""

    @classmethod
    def check_files(cls, cfg: TextFilesConfig) -> None:
        expand_paths(cfg.path, "data.path")

    def corpus(self) -> Corpus:
        return FilesCorpus(expand_paths(self.cfg.path, "data.path"), encoding=self.cfg.encoding)


# --------------------------------------------------------------------------- Hugging Face datasets

@dataclass
class HFDataConfig(TextDataConfig):
    dataset: Optional[str] = None  # a dataset on the Hugging Face Hub (or a local one), e.g. roneneldan/TinyStories
    subset: Optional[str] = None  # its configuration, e.g. wikitext-2-raw-v1 for wikitext
    split: str = "train"  # which split to read; val is carved from it (val_fraction)
    text_field: str = "text"
    hf_cache_dir: Optional[str] = None  # None: the datasets library's default (HF_DATASETS_CACHE)
    max_chars: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        if not self.dataset:
            raise ConfigError("data.dataset: name a Hugging Face dataset, e.g. data=hf data.dataset=wikitext "
                              "data.subset=wikitext-2-raw-v1")


HF_INSTALL = "pip install 'modforge[hf]'  (or: pip install 'datasets>=2.14')"


@register("data", "hf", config=HFDataConfig)
class HFData(TextLMData):
    """A Hugging Face ``datasets`` text dataset (optional extra); rows joined by newlines.

    Uses the library's own download cache; with ``HF_DATASETS_OFFLINE=1`` (or no
    network) only what is already cached is read.
    """

    def load(self):
        c = self.cfg
        try:
            import datasets
        except ImportError:
            raise ConfigError(f"data=hf needs the optional 'datasets' package: {HF_INSTALL}") from None
        try:
            ds = datasets.load_dataset(c.dataset, c.subset, split=c.split, cache_dir=c.hf_cache_dir)
        except Exception as e:  # noqa: BLE001 - the library raises many types; one clear message for all
            offline = os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")
            raise ConfigError(
                f"data.dataset={c.dataset} (data.subset={c.subset}, data.split={c.split}) could not be loaded: "
                f"{type(e).__name__}: {e}. Check the name, subset and split on the Hub; "
                + ("offline mode is on, so it must already be in the datasets cache." if offline else
                   "without network access it must already be in the datasets cache (then set HF_DATASETS_OFFLINE=1).")
            ) from None
        cols = list(getattr(ds, "column_names", []) or [])
        if c.text_field not in cols:
            raise ConfigError(f"data.text_field={c.text_field}: not a column of {c.dataset} "
                              f"(columns: {', '.join(cols) or 'none'}).")
        return ds

    def corpus(self) -> Corpus:
        c = self.cfg
        ds = self.load()
        fp = getattr(ds, "_fingerprint", None)
        ident = {"hf": c.dataset, "subset": c.subset, "split": c.split, "field": c.text_field, "fingerprint": fp} \
            if fp else None

        def rows():
            first = True
            if hasattr(ds, "iter"):
                batches = ds.iter(batch_size=1000)
            else:
                batches = ({c.text_field: [r[c.text_field]]} for r in ds)
            for batch in batches:
                for t in batch[c.text_field]:
                    if t is None:
                        continue
                    if not isinstance(t, str):
                        raise ConfigError(f"data.text_field={c.text_field}: holds {type(t).__name__} values, not text")
                    if not first:
                        yield "\n"
                    first = False
                    yield t

        return IterCorpus(rows, ident, f"{c.dataset}:{c.subset or ''}:{c.split}")

