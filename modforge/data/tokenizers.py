"""Tokenizers (kind ``tokenizer``): ``char``, ``byte`` and ``bpe``.

Special tokens live here and only here: every tokenizer reserves the same five
ids at the start of its vocabulary (``SPECIALS``: <pad> 0, <unk> 1, <bos> 2,
<eos> 3, <mask> 4), and plain text never encodes to them.
A tokenizer's :meth:`~Tokenizer.state` is stored in every checkpoint (inside the
data facts, :class:`modforge.data.base.DataFacts`), so a model can be rebuilt and
used from the checkpoint alone.

Data configs select a tokenizer with ``data.tokenizer=<name>`` and pass
``data.vocab_size`` / ``data.tokenizer_path`` to it (:func:`make_tokenizer`);
a tokenizer that takes no such key rejects it with a clear error.
"""
import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from modforge.registry import ConfigError, build, declare, get, register, registry

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
PAD, UNK, BOS, EOS, MASK = range(len(SPECIALS))


class Tokenizer:
    """Base class. Ids 0..4 are the special tokens; real symbols follow.

    Subclasses implement :attr:`vocab_size`, :meth:`encode_array`, :meth:`decode`,
    and, when they carry learned state, :meth:`own_state` / :meth:`load_own_state`
    (or override :meth:`state` / :meth:`load_state` whole). A tokenizer that is
    fitted on the training split sets :attr:`fits_on_data`.
    """

    name = "?"
    version = 1  # bump when the same state would encode differently (invalidates token caches)
    pad_id, unk_id, bos_id, eos_id, mask_id = PAD, UNK, BOS, EOS, MASK
    n_special = len(SPECIALS)
    fits_on_data = False

    # ------------------------------------------------------------ interface
    def fit(self, texts: Iterable[str]) -> "Tokenizer":
        """Learn the vocabulary from an iterable of training texts (chunks of one stream are fine)."""
        return self

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def unknown_id(self) -> Optional[int]:
        """The id text the vocabulary does not cover becomes (None: every text is covered, as bytes are)."""
        return self.unk_id

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------ state
    def own_state(self) -> dict:
        return {}

    def load_own_state(self, state: dict) -> None:
        pass

    def state(self) -> dict:
        return {"name": self.name, **self.own_state()}

    def load_state(self, state: dict) -> "Tokenizer":
        self.load_own_state(state)
        return self

    def fit_key(self) -> dict:
        """What identifies this tokenizer *before* fitting (name, config): part of the fit-cache key."""
        cfg = getattr(self, "cfg", None)
        params = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}
        return {"name": self.name, "version": self.version, "config": params}

    def digest(self) -> str:
        """A hash of the fitted tokenizer (what token caches are keyed by)."""
        blob = json.dumps({"state": self.state(), "version": self.version}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    @property
    def token_dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id (uint16 where the vocabulary fits)."""
        return np.dtype(np.uint16) if self.vocab_size <= 1 << 16 else np.dtype(np.uint32)


declare("tokenizer", "text <-> token ids", base=Tokenizer, nested_in="data.tokenizer")


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


# --------------------------------------------------------------------------- BPE

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

    def decode(self, ids: Sequence[int]) -> str:
        lo, hi, off = self.n_special, self.vocab_size, self.offset
        return self._need().decode([int(i) - off for i in ids if lo <= i < hi], skip_special_tokens=True)

    def own_state(self) -> dict:
        return {"json": self._need().to_str()}

    def load_own_state(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._set(HFTokenizer.from_str(state["json"]))


@dataclass
class PretrainedConfig:
    path: Optional[str] = None  # the tokenizer.json of a pretrained model (python -m modforge.convert writes one)


@register("tokenizer", "pretrained", config=PretrainedConfig)
class PretrainedTokenizer(BPETokenizer):
    """A pretrained model's Hugging Face ``tokenizer.json``, with the model's own ids and special tokens.

    Unlike ``bpe`` with a path, nothing is shifted: id i is the model's row i, so
    a converted checkpoint (``python -m modforge.convert``) reads text exactly as
    the model was trained to. Its specials are the model's (GPT-2: <|endoftext|>
    is <bos> and <eos>, and pads too, having no pad of its own; BERT: [PAD],
    [CLS], [SEP], [MASK], [UNK]); ``vocab_size`` is the model's embedding rows,
    which may exceed the tokenizer's (Llama checkpoints pad it). Text is
    encoded without the tokenizer's template (no [CLS] ... [SEP] added), and a
    special token's spelling in the text is text.
    """

    name = "pretrained"
    ROLES = ("pad", "unk", "bos", "eos", "mask")

    def __init__(self, cfg: Optional[PretrainedConfig] = None):
        self.specials: dict = {}
        self.rows: Optional[int] = None
        super().__init__(BPEConfig(path=(cfg or PretrainedConfig()).path))  # loads the path, if given
        self.cfg = cfg or PretrainedConfig()

    @property
    def fits_on_data(self) -> bool:  # type: ignore[override]
        return False

    def _set(self, hf) -> None:
        super()._set(hf)
        self.offset, self.n_special = 0, 0
        for role in self.ROLES:  # read from the file where the state does not say (data.tokenizer_path=)
            if role not in self.specials:
                self.specials[role] = next((hf.token_to_id(t) for t in _SPELLINGS[role]
                                            if hf.token_to_id(t) is not None), None)
        self._ids()

    def _ids(self) -> None:
        sp = self.specials
        self.eos_id = sp.get("eos") if sp.get("eos") is not None else sp.get("bos")
        self.bos_id = sp.get("bos") if sp.get("bos") is not None else self.eos_id
        self.pad_id = next((i for i in (sp.get("pad"), self.eos_id, 0) if i is not None))  # GPT-2 pads with <eos>
        self.unk_id = sp.get("unk") if sp.get("unk") is not None else self.pad_id
        self.mask_id = sp.get("mask") if sp.get("mask") is not None else self.unk_id
        if self.bos_id is None:
            self.bos_id = self.pad_id

    @property
    def vocab_size(self) -> int:
        return max(self._need().get_vocab_size(with_added_tokens=True), self.rows or 0)

    def decode(self, ids: Sequence[int]) -> str:
        n = self._need().get_vocab_size(with_added_tokens=True)
        return self._need().decode([int(i) for i in ids if 0 <= i < n], skip_special_tokens=True)

    def own_state(self) -> dict:
        return {"json": self._need().to_str(), "specials": dict(self.specials), "rows": self.rows}

    def load_own_state(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.specials = dict(state.get("specials") or {})
        self.rows = state.get("rows")
        self._set(HFTokenizer.from_str(state["json"]))


# how the families spell each special token, for a tokenizer.json loaded without a model's config
_SPELLINGS = {"pad": ("[PAD]", "<pad>", "<|pad|>"), "unk": ("[UNK]", "<unk>"),
              "bos": ("<s>", "<|begin_of_text|>", "[CLS]", "<|endoftext|>"),
              "eos": ("</s>", "<|end_of_text|>", "[SEP]", "<|endoftext|>"), "mask": ("[MASK]", "<mask>")}


# --------------------------------------------------------------------------- helpers

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


@dataclass
class TokenizedDataConfig:
    """Keys every tokenized dataset shares (subclasses add theirs; all have defaults)."""

    tokenizer: str = "char"  # char | byte | bpe (any registered tokenizer)
    vocab_size: Optional[int] = None  # bpe: vocabulary size incl. specials and bytes (None: 4096)
    tokenizer_path: Optional[str] = None  # bpe: load this tokenizer.json instead of training one
    batch_size: int = 32
    val_fraction: float = 0.1
    num_workers: int = 0
    cache_dir: Optional[str] = None  # None: $MODFORGE_CACHE, else ~/.cache/modforge
    encoding: str = "utf-8"  # of the text files read (strict: an undecodable byte is an error naming the file)

    def __post_init__(self):
        from modforge.data.corpus import check_encoding

        check_encoding(self.encoding)
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={self.val_fraction}: must be in (0, 1)")
        if self.batch_size < 1:
            raise ConfigError(f"data.batch_size={self.batch_size}: must be >= 1")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers={self.num_workers}: must be >= 0 (0: load in the main process)")


# data-config key -> tokenizer-config field it is passed to
TOKENIZER_KEYS = {"vocab_size": "vocab_size", "tokenizer_path": "path"}


def make_tokenizer(data_cfg: Any) -> Tokenizer:
    """Build the (unfitted) tokenizer a data config asks for: ``data.tokenizer`` plus the
    ``data.vocab_size`` / ``data.tokenizer_path`` keys the chosen tokenizer accepts."""
    name = data_cfg.tokenizer
    entry = get("tokenizer", name)
    accepted = {f.name for f in dataclasses.fields(entry.config)}
    params = {}
    for key, field_name in TOKENIZER_KEYS.items():
        value = getattr(data_cfg, key, None)
        if value is None:
            continue
        if field_name not in accepted:
            takers = [e.name for e in registry("tokenizer").entries()
                      if field_name in {f.name for f in dataclasses.fields(e.config)}]
            raise ConfigError(f"data.{key}={value}: tokenizer '{name}' takes no {field_name}. "
                              f"Use it with data.tokenizer={'|'.join(takers) or '?'}, or leave it unset.")
        params[field_name] = value
    return build("tokenizer", {"name": name, **params})


def load_tokenizer(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.state` (as stored in a checkpoint)."""
    return build("tokenizer", state["name"]).load_state(state)
