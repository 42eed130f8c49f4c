"""Text corpora as streams of pieces, and the paths that name them (no torch).

A :class:`Corpus` yields its text in order, piece by piece, so a corpus larger
than memory is counted, hashed and tokenized with flat memory (see
:mod:`modforge.data.cache`). :func:`expand_paths` and :func:`existing_file` turn
``data.path``-style keys into files, or into one clear error naming the key.
"""
import codecs
import contextlib
import glob
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from modforge.registry import ConfigError
from modforge.utils.readers import regular_file

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
    """Files read in order in ``encoding`` (strict: an undecodable byte or a binary file is an error naming the
    file and the offset; newlines normalised), joined by ``separator``."""

    def __init__(self, paths: Iterable[str], separator: str = "\n", read_size: Optional[int] = None,
                 encoding: str = "utf-8", key: str = "data.path"):
        self.paths = [os.path.abspath(p) for p in paths]
        self.separator = separator
        self.read_size = read_size
        self.encoding, self.key = encoding, key

    def identity(self):
        files = []
        for p in self.paths:
            st = os.stat(p)
            files.append([p, st.st_size, st.st_mtime_ns])
        ident = {"files": files, "separator": self.separator}
        return ident if self.encoding == "utf-8" else {**ident, "encoding": self.encoding}

    def pieces(self) -> Iterator[str]:
        size = self.read_size or CHUNK_CHARS
        for i, p in enumerate(self.paths):
            if i and self.separator:
                yield self.separator
            with open_text(p, self.key, self.encoding) as fh:
                while True:
                    chunk = fh.read(size)
                    if not chunk:
                        break
                    refuse_binary(chunk, p, self.key)
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


@contextlib.contextmanager
def open_text(path: str, key: str, encoding: str = "utf-8", **kw: Any) -> Iterator[Any]:
    """``open(path)`` for text in ``encoding``, strictly: an undecodable byte anywhere while the file is read is
    one ConfigError naming the key, the file, the byte offset and ``data.encoding``."""
    try:
        with open(path, encoding=encoding, **kw) as fh:
            yield fh
    except UnicodeError as e:
        if not isinstance(e, UnicodeDecodeError):  # e.g. utf-16 without its byte-order mark
            raise ConfigError(f"{key}={path}: not valid {encoding} text ({e}); set data.encoding= to the file's "
                              "encoding") from None
        offset, byte = first_bad_byte(path, encoding)
        raise ConfigError(
            f"{key}={path}: not valid {encoding} text at byte {offset} (0x{byte:02x}); if the file is in another "
            f"encoding, say which with data.encoding= (e.g. data.encoding=latin-1)") from None


def jsonl_objects(path: str, key: str, encoding: str = "utf-8",
                  expected: str = "a JSON object") -> Iterator[tuple]:
    """(line number, object) for each non-blank line of a JSONL file, read as :func:`open_text` reads (an
    undecodable byte names its offset); a line that is not JSON, or not ``expected``, is one ConfigError naming
    ``key``, the file and the line. The one JSONL reader of classification data, prepare's documents and the
    evaluation tasks."""
    with open_text(path, key, encoding) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{key}={path}, line {n}: not JSON ({e}).") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{key}={path}, line {n}: expected {expected}.")
            yield n, obj


def first_bad_byte(path: str, encoding: str) -> tuple[int, int]:
    """(offset, value) of the first byte of ``path`` that ``encoding`` cannot decode."""
    dec = codecs.getincrementaldecoder(encoding)(errors="strict")
    done = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 16)
            pending = len(dec.getstate()[0])  # bytes of an unfinished character kept from the last block
            try:
                dec.decode(block, final=not block)
            except UnicodeDecodeError as e:  # e.start counts from the kept bytes, then this block
                return done - pending + e.start, (e.object[e.start] if e.start < len(e.object) else 0)
            if not block:
                return done, 0
            done += len(block)


def refuse_binary(text: str, path: str, key: str) -> None:
    if "\x00" in text:
        raise ConfigError(f"{key}={path}: a binary file (it holds NUL bytes), not text")


def check_encoding(encoding: str) -> None:
    try:
        if not getattr(codecs.lookup(encoding), "_is_text_encoding", True):  # rot13, base64, hex: not text
            raise LookupError(encoding)
    except LookupError:
        raise ConfigError(f"data.encoding={encoding}: not a text encoding Python knows (e.g. utf-8, latin-1, "
                          "cp1252, utf-16)") from None


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
        elif not os.path.lexists(pat):
            raise ConfigError(f"{key}={item}: no such file (relative to {os.getcwd()}).")
        else:
            regular_file(pat, key)  # a FIFO, a device, a link that leads nowhere or in a loop: says which
            found = [pat]
        out.extend(os.path.abspath(p) for p in found)
    seen: dict = {}
    for path in out:  # one file named twice (two spellings, a link, overlapping globs) would be read twice: its
        st = os.stat(path)  # text in training and again in the validation split
        first = seen.setdefault((st.st_dev, st.st_ino), path)
        if first is not path:
            raise ConfigError(f"{key}: {first} is named twice{'' if first == path else f' (also as {path})'}; its "
                              "text would be read twice, into training and validation both: name each file once")
    return out


def existing_file(path: Optional[str], key: str, what: str) -> str:
    """``path`` expanded, or a ConfigError naming ``key`` if it is unset or not a file."""
    if not path:
        raise ConfigError(f"{key}: required; give the path of {what}.")
    p = os.path.expanduser(str(path))
    if not os.path.lexists(p):
        raise ConfigError(f"{key}={path}: no such file (relative to {os.getcwd()}); give the path of {what}.")
    regular_file(p, key)  # a FIFO, a device, a link that leads nowhere or in a loop: says which
    return p
