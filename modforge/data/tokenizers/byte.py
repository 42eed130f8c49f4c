"""``byte``: one token per UTF-8 byte; covers every text."""
from typing import Sequence

import numpy as np

from modforge.data.tokenizers.base import Tokenizer
from modforge.registry import register


@register("tokenizer", "byte")
class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte (256 symbols); any text, no fitting, no <unk>."""

    name = "byte"
    unknown_id = None  # every text is bytes

    def __init__(self, cfg=None):
        self.cfg = cfg

    @property
    def vocab_size(self) -> int:
        return self.n_special + 256

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + self.n_special

    def decode(self, ids: Sequence[int]) -> str:
        n = self.n_special
        return bytes(i - n for i in ids if n <= i < self.vocab_size).decode("utf-8", errors="replace")
