"""What every pretrained family shares: reading a Hugging Face model directory (``config.json`` and its
weights, sharded or not), the :class:`Family` contract (its config as modforge overrides, its tensor names
both ways), the :class:`Taker` that checks every tensor is used exactly once, and the special tokens a
tokenizer's files name."""
import json
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from modforge.errors import ConfigError
from modforge.utils import readers


# Hugging Face's activation names (GPT-2's activation_function, BERT's hidden_act) -> modforge's
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                    "silu": "silu", "tanh": "tanh"}


def read_hf_dir(directory: Any) -> tuple[Path, dict]:
    d = Path(str(directory)).expanduser()
    if not (d / "config.json").exists():
        raise ConfigError(f"hf={directory}: no config.json there; give a local Hugging Face model directory "
                          "(the one save_pretrained writes: config.json, model.safetensors or pytorch_model.bin, "
                          "tokenizer.json)")
    return d, readers.json_file(d / "config.json", "hf")


def weight_files(d: Path) -> list:
    """The files holding the directory's tensors: model.safetensors (or its shards), else pytorch_model.bin (or
    its shards)."""
    for index, single in (("model.safetensors.index.json", "model.safetensors"),
                          ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if (d / index).exists():
            weight_map = readers.json_file(d / index, "hf").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map or \
                    not all(isinstance(f, str) and "/" not in f and f not in ("", ".", "..") for f in weight_map.values()):
                raise ConfigError(f"hf={d / index}: its weight_map must map tensor names to shard files in the "
                                  "same directory")
            return [d / f for f in sorted(set(weight_map.values()))]
        if (d / single).exists():
            return [d / single]
    raise ConfigError(f"hf={d}: no weights (model.safetensors or pytorch_model.bin, or their sharded index)")


def read_hf_weights(d: Path) -> dict:
    """Every tensor of the directory, safetensors read as they are, ``.bin`` files loaded with
    ``weights_only=True`` (a pickle that would run code is refused); a damaged file is one line."""
    state: dict = {}
    for f in weight_files(d):
        part = readers.safetensors_file(f, "hf") if f.name.endswith(".safetensors") else readers.torch_file(f, "hf")
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise ConfigError(f"hf={f}: not a file of named tensors")
        state.update(part)
    return state


class Family:
    """One Hugging Face model family: config and weights in (``overrides``, ``to_ours``) and, where it can hold
    what modforge built, out (``mismatch``, ``hf_config``, ``to_theirs``)."""

    model_type = "?"
    exportable = False

    def overrides(self, c: dict) -> list[str]:
        raise NotImplementedError

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> dict:
        raise NotImplementedError

    def mismatch(self, run: dict) -> Optional[str]:
        return f"modforge does not export to {self.model_type}"

    def hf_config(self, run: dict, vocab_size: int, specials: dict) -> dict:
        raise NotImplementedError

    def to_theirs(self, ours: dict, n_layers: int, run: dict) -> dict:
        raise NotImplementedError

def need(c: dict, key: str, allowed: Any, what: str) -> None:
    """Refuse an option the mapping does not represent, in one line naming it."""
    value = c.get(key, allowed if not isinstance(allowed, tuple) else allowed[0])
    ok = value in allowed if isinstance(allowed, tuple) else value == allowed
    if not ok:
        raise ConfigError(f"{what} {key}={value!r} is not supported (supported: "
                          f"{', '.join(map(repr, allowed)) if isinstance(allowed, tuple) else repr(allowed)})")

class Taker:
    """Takes tensors out of a checkpoint's state by name, so that what is left over can be listed (or refused)."""

    def __init__(self, state: dict, prefixes: tuple = ()):
        self.state = {}
        for k, v in state.items():
            for p in prefixes:
                if k.startswith(p):
                    k = k[len(p):]
                    break
            self.state[k.replace(".gamma", ".weight").replace(".beta", ".bias")] = v  # old BERT names

    def __call__(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise ConfigError(f"the checkpoint has no tensor {key!r}: not a complete checkpoint of this family")
        return self.state.pop(key)

    def optional(self, key: str) -> Optional[torch.Tensor]:
        return self.state.pop(key, None)

    def rest(self, ignorable: Callable[[str], bool]) -> list[str]:
        unknown = [k for k in self.state if not ignorable(k)]
        if unknown:
            raise ConfigError(f"the checkpoint has tensors this conversion does not know: {', '.join(unknown[:3])}"
                              f"{' ...' if len(unknown) > 3 else ''}")
        return sorted(self.state)

def plain_model_checks(m: dict) -> list:
    return [
        (not m.get("scale_embeddings"), "model.scale_embeddings=true (not in GPT-2 or Llama)"),
        (not m.get("embed_norm"), "model.embed_norm=true (not in GPT-2 or Llama)"),
        (not m.get("type_vocab_size"), "model.type_vocab_size (token types are not in GPT-2 or Llama)"),
        (not m.get("head_transform") and not m.get("head_bias"), "a head transform or bias (not in GPT-2 or Llama)"),
    ]

def plain_attention_checks(run: dict) -> list:
    """What GPT-2's and Llama's layouts cannot hold: the attention options and logits of issue 52."""
    a, logits = run.get("attention") or {}, run.get("logits") or {}
    return [
        (a.get("qk_norm") is None, "attention.qk_norm (not in GPT-2 or Llama; OLMo 2 and Qwen3 convert in)"),
        (a.get("logit_cap") is None, "attention.logit_cap (not in GPT-2 or Llama)"),
        (not a.get("gate"), "attention.gate=true (not in GPT-2 or Llama)"),
        (a.get("window") is None, "attention.window (not in GPT-2 or Llama)"),
        (logits.get("name", "plain") == "plain", f"logits={logits.get('name')} (not in GPT-2 or Llama)"),
    ]


def specials_of(c: dict, tok_dir: Path) -> tuple[dict, dict]:
    """(ids, names): the special-token ids config.json gives, and the spellings the tokenizer's own files
    (special_tokens_map.json, tokenizer_config.json) give for pad, unk, mask ..."""
    out = {"bos": c.get("bos_token_id"), "eos": c.get("eos_token_id"), "pad": c.get("pad_token_id")}
    for role in out:
        if isinstance(out[role], list):  # Llama 3: several <eos> ids; the first is the one generation stops at
            out[role] = out[role][0] if out[role] else None
    names = {}
    for f in ("special_tokens_map.json", "tokenizer_config.json"):
        if (tok_dir / f).is_file():
            try:
                d = json.loads((tok_dir / f).read_text(encoding="utf-8"))
            except ValueError:
                continue
            for role in ("bos", "eos", "pad", "unk", "mask"):
                v = d.get(f"{role}_token")
                v = v.get("content") if isinstance(v, dict) else v
                if isinstance(v, str):
                    names.setdefault(role, v)
    return out, names


def set_override(out: list[str], key: str, value: str) -> list[str]:
    """``out`` with ``key=...`` replaced by (or, when absent, extended with) ``key=value``."""
    kept = [o for o in out if not o.startswith(key + "=")]
    return kept + [f"{key}={value}"]


def window_overrides(c: dict, what: str, default_types=None) -> list[str]:
    """A config's sliding window as ``attention.window`` and ``global_every``: ``layer_types`` (or, where the
    config has none, ``default_types(c)``: the family's own default, as Hugging Face fills it in; None: every
    layer windowed) must be sliding everywhere but every n-th layer (n, 2n ...), which is global; a window no
    shorter than the positions is none."""
    window, n = c.get("sliding_window"), c["max_position_embeddings"]
    if window is None or window >= n or not c.get("use_sliding_window", True):
        return []
    L = c["num_hidden_layers"]
    types = c.get("layer_types") or (default_types(c) if default_types else ["sliding_attention"] * L)
    if any(t not in ("sliding_attention", "full_attention") for t in types) or len(types) != L:
        raise ConfigError(f"{what} layer_types={types!r}: only sliding_attention and full_attention layers convert")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == L:
        return []
    every = full[0] + 1 if full else 0
    if full and full != list(range(every - 1, L, every)):
        raise ConfigError(f"{what} layer_types: global layers at {full} are not every n-th layer, the one pattern "
                          "attention.global_every expresses")
    return [f"attention.window={window}"] + ([f"attention.global_every={every}"] if every else [])
