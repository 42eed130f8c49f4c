"""Tokenizers (kind ``tokenizer``): ``char`` and ``byte``.

Special tokens live here and only here: every tokenizer reserves the same five
ids at the start of its vocabulary, and plain text never encodes to them.
A tokenizer's :meth:`state` is stored in every checkpoint, so a model can be
rebuilt and used from the checkpoint alone.
"""
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from modforge.registry import build, register

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
PAD, UNK, BOS, EOS, MASK = range(len(SPECIALS))


class Tokenizer:
    """Base class. Ids 0..4 are the special tokens; real symbols follow."""

    name = "?"
    pad_id, unk_id, bos_id, eos_id, mask_id = PAD, UNK, BOS, EOS, MASK
    n_special = len(SPECIALS)

    def fit(self, texts: Iterable[str]) -> "Tokenizer":
        return self

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def state(self) -> dict:
        return {"name": self.name}

    def load_state(self, state: dict) -> "Tokenizer":
        return self


@register("tokenizer", "char")
class CharTokenizer(Tokenizer):
    """One token per Unicode character seen in the training text; unseen characters map to <unk>."""

    name = "char"

    def __init__(self, cfg=None, chars: str = ""):
        self.set_chars(chars)

    def set_chars(self, chars: str) -> None:
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i + self.n_special for i, c in enumerate(self.chars)}
        # vectorised lookup over code points (dense table up to the largest one seen)
        top = max((ord(c) for c in self.chars), default=0) + 1
        self._table = np.full(max(top, 1), UNK, dtype=np.int64)
        for c, i in self.stoi.items():
            self._table[ord(c)] = i

    def fit(self, texts: Iterable[str]) -> "CharTokenizer":
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        self.set_chars("".join(seen))
        return self

    @property
    def vocab_size(self) -> int:
        return self.n_special + len(self.chars)

    def encode_array(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        out = np.full(cps.shape, UNK, dtype=np.int64)
        inside = cps < len(self._table)
        out[inside] = self._table[cps[inside]]
        return out

    def decode(self, ids: Sequence[int]) -> str:
        n = self.n_special
        return "".join(self.chars[i - n] for i in ids if n <= i < self.vocab_size)

    def state(self) -> dict:
        return {"name": self.name, "chars": self.chars}

    def load_state(self, state: dict) -> "CharTokenizer":
        self.set_chars(state["chars"])
        return self


@register("tokenizer", "byte")
class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte (256 symbols); any text, no fitting, no <unk>."""

    name = "byte"

    def __init__(self, cfg=None):
        pass

    @property
    def vocab_size(self) -> int:
        return self.n_special + 256

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + self.n_special

    def decode(self, ids: Sequence[int]) -> str:
        n = self.n_special
        return bytes(i - n for i in ids if n <= i < self.vocab_size).decode("utf-8", errors="replace")


def load_tokenizer(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.state` (as stored in a checkpoint)."""
    return build("tokenizer", state["name"]).load_state(state)
