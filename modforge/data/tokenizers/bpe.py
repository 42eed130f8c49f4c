"""``bpe``: a byte-level BPE trained on the training split with Hugging Face ``tokenizers``, or loaded from a
``tokenizer.json`` (shifted so that modforge's five specials keep ids 0..4)."""
import os
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from modforge.data.text import split_text
from modforge.data.tokenizers.base import SPECIALS, Tokenizer
from modforge.registry import ConfigError, register

BPE_VOCAB = 4096  # a trained BPE's vocabulary when data.vocab_size is not given


@dataclass
class BPEConfig:
    vocab_size: Optional[int] = None  # including the 5 specials and the 256 byte symbols (None: BPE_VOCAB)
    path: Optional[str] = None  # a Hugging Face tokenizer.json to load instead of training one
    min_frequency: int = 2  # a pair must occur this often to be merged

    def __post_init__(self):
        floor = len(SPECIALS) + 256
        if self.path is not None and self.vocab_size is not None:  # the file's vocabulary is the vocabulary
            raise ConfigError(f"data.vocab_size={self.vocab_size} with data.tokenizer_path={self.path}: a loaded "
                              "tokenizer.json has its own vocabulary, so vocab_size would be ignored; leave it unset")
        if self.path is None and self.vocab_size is not None and self.vocab_size < floor:
            raise ConfigError(f"data.vocab_size={self.vocab_size}: a byte-level BPE needs at least {floor} "
                              f"({len(SPECIALS)} special tokens + 256 bytes)")


@register("tokenizer", "bpe", config=BPEConfig)
class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style) from Hugging Face ``tokenizers``, trained on the training split.

    Our five specials are the trainer's special tokens, so they get ids 0..4 in
    order; plain text never produces them (the special-token matcher is off for
    encoding, and the byte-level pre-tokenizer never forms ``<pad>`` and the like
    as one piece). With ``path`` a ``tokenizer.json`` is loaded instead of
    training; one that does not hold our specials at 0..4 (e.g. GPT-2's) is
    shifted up by 5 ids so that it does. The state embeds the tokenizer JSON.
    """

    name = "bpe"

    def __init__(self, cfg: Optional[BPEConfig] = None):
        self.cfg = cfg or BPEConfig()
        self.hf = None
        self.offset = 0
        if self.cfg.path:
            path = os.path.expanduser(self.cfg.path)
            if not os.path.isfile(path):
                raise ConfigError(f"data.tokenizer_path={self.cfg.path}: no such file. Give the path of a Hugging Face "
                                  "tokenizer.json, or leave it unset to train a BPE on the training split.")
            from tokenizers import Tokenizer as HFTokenizer

            try:
                self._set(HFTokenizer.from_file(path))
            except Exception as e:  # noqa: BLE001 - the library's own parse errors
                raise ConfigError(f"data.tokenizer_path={self.cfg.path}: not a readable tokenizer.json ({e})") from None

    @property
    def fits_on_data(self) -> bool:  # type: ignore[override]
        return not self.cfg.path

    @property
    def loaded(self) -> bool:  # type: ignore[override]
        return self.hf is not None

    def _set(self, hf) -> None:
        hf.encode_special_tokens = True  # "<pad>" in the text is text, not the special token
        ours = all(hf.token_to_id(s) == i for i, s in enumerate(SPECIALS))
        self.hf, self.offset = hf, (0 if ours else self.n_special)

    def _need(self):
        if self.hf is None:
            raise RuntimeError("bpe tokenizer used before fit() or load_state()")
        return self.hf

    def fit(self, texts: Iterable[str]) -> "BPETokenizer":
        if not self.fits_on_data:
            return self
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.cfg.vocab_size or BPE_VOCAB, min_frequency=self.cfg.min_frequency,
            special_tokens=list(SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        # short pieces: the trainer holds per-byte alignment data for every piece in flight
        hf.train_from_iterator((p for t in texts for p in split_text(t, 1 << 14)), trainer)
        self._set(hf)
        return self

    @property
    def vocab_size(self) -> int:
        return self._need().get_vocab_size(with_added_tokens=True) + self.offset

    @property
    def unknown_id(self) -> Optional[int]:
        """The file's own unknown token (a word-level or WordPiece model's [UNK]); a byte-level BPE has none."""
        hf = self._need()
        token = getattr(hf.model, "unk_token", None)
        i = hf.token_to_id(token) if token else None
        return None if i is None else i + self.offset

    def encode_array(self, text: str) -> np.ndarray:
        hf = self._need()
        if not text:
            return np.zeros(0, dtype=np.int64)
        # pieces cut where the pre-tokenizer would cut anyway, encoded in parallel: same ids as one encode();
        # a few pieces per call bound the memory of the library's per-token Encoding objects
        pieces = split_text(text, 1 << 14)
        step = max(4, 2 * (os.cpu_count() or 1))
        batch = getattr(hf, "encode_batch_fast", None) or hf.encode_batch  # _fast (no offsets): tokenizers >= 0.20
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for i in range(0, len(pieces), step)
                              for e in batch(pieces[i : i + step], add_special_tokens=False)])
        return ids + self.offset if self.offset else ids

    def encode_many(self, texts: Sequence[str]) -> list:
        """One batch call for many short texts (long ones cut at safe positions, as :meth:`encode_array` does)."""
        hf = self._need()
        pieces, owner = [], []
        for i, t in enumerate(texts):
            for p in (split_text(t, 1 << 14) if t else []):
                pieces.append(p)
                owner.append(i)
        batch = getattr(hf, "encode_batch_fast", None) or hf.encode_batch
        out: list = [[] for _ in texts]
        for i, e in zip(owner, batch(pieces, add_special_tokens=False) if pieces else []):
            out[i].append(np.asarray(e.ids, dtype=np.int64))
        arrays = [np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64) for parts in out]
        return [a + self.offset for a in arrays] if self.offset else arrays

    def decode(self, ids: Sequence[int]) -> str:
        lo, hi, off = self.n_special, self.vocab_size, self.offset
        return self._need().decode([int(i) - off for i in ids if lo <= i < hi], skip_special_tokens=True)

    def own_state(self) -> dict:
        return {"json": self._need().to_str()}

    def load_own_state(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._set(HFTokenizer.from_str(state["json"]))
