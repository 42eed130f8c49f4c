"""``char``: one token per character of the training split."""
from typing import Iterable, Sequence

import numpy as np

from modforge.data.tokenizers.base import UNK, Tokenizer
from modforge.registry import register


@register("tokenizer", "char")
class CharTokenizer(Tokenizer):
    """One token per Unicode character seen in the training text; unseen characters map to <unk>."""

    name = "char"
    fits_on_data = True

    def __init__(self, cfg=None, chars: str = ""):
        self.cfg = cfg
        self.set_chars(chars)

    def set_chars(self, chars: str) -> None:
        self.chars = "".join(sorted(set(chars)))
        self.stoi = {c: i + self.n_special for i, c in enumerate(self.chars)}
        # vectorised lookup over code points: a dense table up to the largest one seen, plus one <unk> slot
        top = max((ord(c) for c in self.chars), default=0) + 1
        self._table = np.full(top + 1, UNK, dtype=np.int64)
        for c, i in self.stoi.items():
            self._table[ord(c)] = i

    def fit(self, texts: Iterable[str]) -> "CharTokenizer":
        seen = np.zeros(0, dtype=bool)  # seen[code point]
        for t in texts:
            cps = np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32)
            if not len(cps):
                continue
            present = np.bincount(cps) > 0
            if len(present) > len(seen):
                seen = np.concatenate([seen, np.zeros(len(present) - len(seen), dtype=bool)])
            seen[: len(present)] |= present
        self.set_chars("".join(map(chr, np.flatnonzero(seen).tolist())))
        return self

    @property
    def vocab_size(self) -> int:
        return self.n_special + len(self.chars)

    def encode_array(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return self._table[np.minimum(cps, len(self._table) - 1)]

    def decode(self, ids: Sequence[int]) -> str:
        n = self.n_special
        return "".join(self.chars[i - n] for i in ids if n <= i < self.vocab_size)

    def own_state(self) -> dict:
        return {"chars": self.chars}

    def load_own_state(self, state: dict) -> None:
        self.set_chars(state["chars"])
