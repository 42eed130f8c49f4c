"""What every tokenized dataset's config shares, and the tokenizer it asks for (``data.tokenizer`` with the
``data.vocab_size`` / ``data.tokenizer_path`` keys the chosen one accepts; one that takes no such key refuses it)."""
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import modforge.data.tokenizers  # noqa: F401 - the built-in tokenizers, registered
from modforge.data.tokenizers.base import Tokenizer
from modforge.registry import ConfigError, build, get, registry


class DataChecks:
    """What every data config checks against the rest of the run (``check``: one-line refusals, notes)."""

    def check(self, run: dict) -> list:
        sizes = run.get("eval_block_sizes")
        if sizes and not hasattr(self, "block_size"):
            raise ConfigError(f"eval_block_sizes={list(sizes)}: data={run.get('data', {}).get('name')} has no "
                              "block_size (evaluating at other lengths needs language-modelling data cut into "
                              "windows: stdlib, tinyshakespeare, text, hf)")
        return []


@dataclass
class TokenizedDataConfig(DataChecks):
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

    def check(self, run: dict) -> list:
        tok = make_tokenizer(self)  # its keys (vocab_size, tokenizer_path) checked against the tokenizer
        if not tok.fits_on_data and not tok.loaded and not run.get("init_from") and not run.get("resume"):
            raise ConfigError(f"data.tokenizer={self.tokenizer}: it learns nothing from the data, so it needs "
                              "data.tokenizer_path=<a tokenizer.json> (or comes with init_from= or resume= of a "
                              "model that has one)")
        return super().check(run)


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
