"""The tokenizer kind: its base class, the five special tokens every modforge tokenizer reserves, and a
tokenizer rebuilt from the state a checkpoint stores."""
import dataclasses
import hashlib
import json
from typing import Iterable, Optional, Sequence

import numpy as np

from modforge.registry import build

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
    def loaded(self) -> bool:
        """Whether it can encode now, without fitting (a tokenizer read from a file: once the file is read)."""
        return True

    @property
    def unknown_id(self) -> Optional[int]:
        """The id text the vocabulary does not cover becomes (None: every text is covered, as bytes are)."""
        return self.unk_id

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_many(self, texts: Sequence[str]) -> list:
        """Each text's ids (one array each): what ``prepare`` encodes documents with; a tokenizer that encodes
        a batch faster than one by one overrides it."""
        return [self.encode_array(t) for t in texts]

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


def load_tokenizer(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.state` (as stored in a checkpoint)."""
    return build("tokenizer", state["name"]).load_state(state)
