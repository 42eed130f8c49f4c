"""Text corpora as streams of pieces, and the paths that name them (no torch).

A :class:`Corpus` yields its text in order, piece by piece, so a corpus larger
than memory is counted, hashed and tokenized with flat memory (see
:mod:`modforge.data.cache`). :func:`expand_paths` and :func:`existing_file` turn
``data.path``-style keys into files, or into one clear error naming the key.
"""
import glob
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from modforge.registry import ConfigError

CHUNK_CHARS = 1 << 20  # ~1M characters of text read and tokenized at a time (faster and leaner than larger chunks)


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


def text_sha(texts: Iterable[str]) -> str:
    """Content hash of a list of texts (for small in-memory data sets)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def expand_paths(spec: Any, key: str = "data.path") -> list[str]:
    """Files named by ``spec``: a path or glob (``**`` recursive), or a list of them, in the given order
    (each glob's matches sorted, duplicates dropped). Anything that names no file is a ConfigError."""
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
