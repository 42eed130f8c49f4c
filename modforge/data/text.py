"""Text cut into pieces that tokenize as the whole does: what lets a corpus be tokenized chunk by chunk (the
token cache) and a BPE encode pieces in parallel."""
import re
from typing import Iterable, Iterator

_WS_AFTER_TEXT = re.compile(r"\S(?=\s)")


def safe_cut(text: str, size: int) -> int:
    """A cut position <= ``size`` (and > size/2 where possible) at which tokenizing the two halves
    separately gives the same ids as tokenizing ``text`` whole.

    The position starts a whitespace run that follows a non-space character, ideally a
    newline: byte-level BPE's pre-tokenizer (the GPT-2 pattern) never lets a piece
    run from a non-space into following whitespace, so both halves pre-tokenize as the
    whole does. Character and byte tokenizers are indifferent. Falls back to ``size``
    (a hard cut) only in a window with no whitespace at all.
    """
    if len(text) <= size:
        return len(text)
    lo = max(1, size // 2)
    p = text.rfind("\n", lo, size + 1)
    while p >= lo:
        if not text[p - 1].isspace():
            return p
        p = text.rfind("\n", lo, p)
    last = None
    for m in _WS_AFTER_TEXT.finditer(text, lo - 1, size):
        last = m
    return last.end() if last is not None else size


def split_text(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters, cut at :func:`safe_cut` positions."""
    out = []
    while len(text) > size:
        cut = safe_cut(text, size)
        out.append(text[:cut])
        text = text[cut:]
    if text or not out:
        out.append(text)
    return out


def rechunk(pieces: Iterable[str], size: int) -> Iterator[str]:
    """Re-cut a stream of text pieces into chunks of about ``size`` characters at safe positions."""
    parts: list[str] = []
    n = 0
    for p in pieces:
        if not p:
            continue
        parts.append(p)
        n += len(p)
        if n >= size:
            buf = "".join(parts)
            while len(buf) > size:
                cut = safe_cut(buf, size)
                yield buf[:cut]
                buf = buf[cut:]
            parts, n = [buf], len(buf)
    if n:
        yield "".join(parts)
