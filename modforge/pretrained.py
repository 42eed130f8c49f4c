"""Pretrained checkpoints of three families as modforge models, and back: GPT-2, Llama (with GQA; Mistral's
checkpoints too) and BERT.

A :class:`Family` says, for one Hugging Face ``model_type``, how its
``config.json`` reads as modforge overrides (``model.d_model=768``,
``norm=layer`` ...: the very keys a user types, composed by Hydra into a run
config) and how its tensors map onto modforge's parameter names; for GPT-2
and Llama also the way back (``python -m modforge.export format=hf``). Every
architecture or option a family cannot express is refused in one line naming it:
nothing is converted approximately.

The conventions that make the numbers equal, family by family:

* GPT-2: Pre-LN, LayerNorm, learned positions, tanh-GELU MLP (``gelu_new``), biased
  projections (HF's ``Conv1D`` stores them transposed), tied head.
* Llama: Pre-LN, RMSNorm (eps inside the root), RoPE in the half pairing with its
  angles in float32 as Meta's and HF's code compute them (``pos.angles=float32``),
  the ``rope_scaling`` variants, SwiGLU at the checkpoint's own width
  (``ffn.match_params=false``), grouped-query attention (``attention=gqa``) when it has
  fewer key/value heads, ``head_dim`` when it is set apart.
* BERT: Post-LN with LayerNorm (eps 1e-12), LayerNorm on the embeddings, token-type
  embeddings, exact GELU, and the masked-LM head's transform and bias; pooler and
  next-sentence head are not part of a masked LM and are left out (listed).
"""
import json
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from modforge.registry import ConfigError

def read_hf_dir(directory: Any) -> tuple[Path, dict]:
    d = Path(str(directory)).expanduser()
    if not (d / "config.json").is_file():
        raise ConfigError(f"hf={directory}: no config.json there; give a local Hugging Face model directory "
                          "(the one save_pretrained writes: config.json, model.safetensors or pytorch_model.bin, "
                          "tokenizer.json)")
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"hf={directory}: config.json is not JSON ({e})") from None
    return d, cfg


def read_hf_weights(d: Path) -> dict:
    """Every tensor of the directory: model.safetensors (or its shards), else pytorch_model.bin (or its shards)
    loaded with ``weights_only=True`` (a pickle that would run code is refused)."""
    from safetensors.torch import load_file

    for index, single, load in (("model.safetensors.index.json", "model.safetensors", lambda p: load_file(str(p))),
                                ("pytorch_model.bin.index.json", "pytorch_model.bin", _load_bin)):
        if (d / index).is_file():
            files = sorted(set(json.loads((d / index).read_text())["weight_map"].values()))
            state: dict = {}
            for f in files:
                state.update(load(d / f))
            return state
        if (d / single).is_file():
            return load(d / single)
    raise ConfigError(f"hf={d}: no weights (model.safetensors or pytorch_model.bin, or their sharded index)")


def _load_bin(path: Path) -> dict:
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConfigError(f"{path}: refused: it holds pickled Python objects besides tensors (loading it could run "
                          f"code): {str(e).splitlines()[0]}") from None


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


def _need(c: dict, key: str, allowed: Any, what: str) -> None:
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


# ----------------------------------------------------------------------------------------------- GPT-2

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                    "silu": "silu", "tanh": "tanh"}


class GPT2(Family):
    model_type = "gpt2"
    exportable = True

    def overrides(self, c: dict) -> list[str]:
        what = "GPT-2 config.json:"
        for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                           ("reorder_and_upcast_attn", False), ("add_cross_attention", False),
                           ("tie_word_embeddings", True)):
            _need(c, key, value, what)
        _need(c, "activation_function", tuple(GPT2_ACTIVATIONS), what)
        return [
            "model=decoder_only", "residual=pre", "norm=layer", f"norm.eps={c.get('layer_norm_epsilon', 1e-5)}",
            "attention=mha", "attention.bias=true", f"attention.dropout={c.get('attn_pdrop', 0.1)}",
            "ffn=mlp", f"ffn.activation={GPT2_ACTIVATIONS[c.get('activation_function', 'gelu_new')]}", "ffn.bias=true",
            "pos=learned",
            f"model.d_model={c['n_embd']}", f"model.n_heads={c['n_head']}", f"model.n_layers={c['n_layer']}",
            f"model.d_ff={c.get('n_inner') or 4 * c['n_embd']}", f"model.max_len={c['n_positions']}",
            f"model.dropout={c.get('resid_pdrop', 0.1)}", "model.tie_embeddings=true",
            f"model.init_std={c.get('initializer_range', 0.02)}",
        ]

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        t = Taker(theirs, ("transformer.",))
        s = {"tok.weight": t("wte.weight"), "embed.pos.table.weight": t("wpe.weight"),
             "decoder.final_norm.weight": t("ln_f.weight"), "decoder.final_norm.bias": t("ln_f.bias")}
        t.optional("lm_head.weight")  # tied: the token embedding
        for i in range(n_layers):
            p, q = f"h.{i}.", f"decoder.blocks.{i}."
            for hf, ours in (("ln_1", "r_self.norm"), ("ln_2", "r_ffn.norm")):
                s[q + ours + ".weight"], s[q + ours + ".bias"] = t(p + hf + ".weight"), t(p + hf + ".bias")
            for hf, ours in (("attn.c_attn", "self_attn.qkv"), ("attn.c_proj", "self_attn.out"),
                             ("mlp.c_fc", "ffn.w1"), ("mlp.c_proj", "ffn.w2")):
                s[q + ours + ".weight"] = t(p + hf + ".weight").t()  # Conv1D: (in, out)
                s[q + ours + ".bias"] = t(p + hf + ".bias")
        return s, t.rest(lambda k: k.endswith((".attn.bias", ".attn.masked_bias")))  # old causal-mask buffers

    def mismatch(self, run: dict) -> Optional[str]:
        m = run["model"]
        checks = [
            (m.get("name") == "decoder_only", f"model={m.get('name')} (GPT-2 is decoder_only)"),
            (run["residual"]["name"] == "pre" and run["residual"].get("final_norm", True), "residual: GPT-2 is Pre-LN with a final norm"),
            (run["norm"]["name"] == "layer" and run["norm"].get("bias", True), f"norm={run['norm']['name']} (GPT-2 has LayerNorm with a bias)"),
            (run["attention"]["name"] == "mha" and run["attention"].get("bias", True), f"attention={run['attention']['name']} (GPT-2 has biased multi-head attention)"),
            (run["ffn"]["name"] in ("mlp", "gelu", "relu") and run["ffn"].get("bias", True)
             and run["ffn"].get("activation") in {v: k for k, v in GPT2_ACTIVATIONS.items()},
             f"ffn={run['ffn']['name']} (GPT-2 has a two-matrix MLP with biases)"),
            (run["pos"]["name"] == "learned", f"pos={run['pos']['name']} (GPT-2 has learned positions)"),
            (m.get("tie_embeddings", True), "model.tie_embeddings=false (GPT-2's head is tied)"),
        ]
        checks += _plain_model_checks(m)
        return next((why for ok, why in checks if not ok), None)

    def hf_config(self, run: dict, vocab_size: int, specials: dict) -> dict:
        m, back = run["model"], {v: k for k, v in GPT2_ACTIVATIONS.items() if k != "gelu_pytorch_tanh"}
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab_size,
                "n_positions": m["max_len"], "n_embd": m["d_model"], "n_layer": m["n_layers"], "n_head": m["n_heads"],
                "n_inner": m.get("d_ff") or 4 * m["d_model"], "activation_function": back[run["ffn"]["activation"]],
                "resid_pdrop": m.get("dropout", 0.0), "embd_pdrop": m.get("dropout", 0.0),
                "attn_pdrop": run["attention"].get("dropout", 0.0), "layer_norm_epsilon": run["norm"].get("eps", 1e-5),
                "initializer_range": m.get("init_std", 0.02), "tie_word_embeddings": True,
                "bos_token_id": specials.get("bos"), "eos_token_id": specials.get("eos"),
                "pad_token_id": specials.get("pad")}

    def to_theirs(self, ours: dict, n_layers: int, run: dict) -> dict:
        s = {"transformer.wte.weight": ours["tok.weight"], "transformer.wpe.weight": ours["embed.pos.table.weight"],
             "transformer.ln_f.weight": ours["decoder.final_norm.weight"],
             "transformer.ln_f.bias": ours["decoder.final_norm.bias"]}
        for i in range(n_layers):
            p, q = f"transformer.h.{i}.", f"decoder.blocks.{i}."
            for hf, mine in (("ln_1", "r_self.norm"), ("ln_2", "r_ffn.norm")):
                s[p + hf + ".weight"], s[p + hf + ".bias"] = ours[q + mine + ".weight"], ours[q + mine + ".bias"]
            for hf, mine in (("attn.c_attn", "self_attn.qkv"), ("attn.c_proj", "self_attn.out"),
                             ("mlp.c_fc", "ffn.w1"), ("mlp.c_proj", "ffn.w2")):
                s[p + hf + ".weight"] = ours[q + mine + ".weight"].t()
                s[p + hf + ".bias"] = ours[q + mine + ".bias"]
        return s


def _plain_model_checks(m: dict) -> list:
    return [
        (not m.get("scale_embeddings"), "model.scale_embeddings=true (not in GPT-2 or Llama)"),
        (not m.get("embed_norm"), "model.embed_norm=true (not in GPT-2 or Llama)"),
        (not m.get("type_vocab_size"), "model.type_vocab_size (token types are not in GPT-2 or Llama)"),
        (not m.get("head_transform") and not m.get("head_bias"), "a head transform or bias (not in GPT-2 or Llama)"),
    ]


# ----------------------------------------------------------------------------------------------- Llama

class Llama(Family):
    model_type = "llama"
    exportable = True
    SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn")

    def rope(self, c: dict) -> dict:
        """The RoPE parameters of either config layout (transformers 5's ``rope_parameters``, 4's ``rope_theta``
        and ``rope_scaling``)."""
        p = dict(c.get("rope_parameters") or {})
        if not p:
            p = dict(c.get("rope_scaling") or {})
            p["rope_theta"] = c.get("rope_theta", 10000.0)
        p["rope_type"] = p.get("rope_type") or p.get("type") or "default"
        return p

    def overrides(self, c: dict) -> list[str]:
        what = f"{type(self).__name__} config.json:"
        _need(c, "hidden_act", "silu", what)
        _need(c, "pretraining_tp", 1, what)
        rope = self.rope(c)
        _need(rope, "rope_type", self.SCALINGS, what + " rope")
        for key in ("mscale", "mscale_all_dim"):
            if rope.get(key):
                raise ConfigError(f"{what} rope {key}={rope[key]!r} is not supported")
        heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        hd = c.get("head_dim") or c["hidden_size"] // heads
        out = [
            "model=decoder_only", "residual=pre", "norm=rms", f"norm.eps={c.get('rms_norm_eps', 1e-6)}",
            "norm.eps_placement=inside",
            ("attention=mha" if kv == heads else f"attention=gqa attention.n_kv_heads={kv}"),
            f"attention.bias={str(bool(c.get('attention_bias', False))).lower()}",
            f"attention.dropout={c.get('attention_dropout', 0.0)}",
            "ffn=swiglu", "ffn.match_params=false", f"ffn.bias={str(bool(c.get('mlp_bias', False))).lower()}",
            "pos=rope", "pos.pairing=half", "pos.angles=float32", f"pos.base={rope['rope_theta']}",
            f"model.d_model={c['hidden_size']}", f"model.n_heads={heads}", f"model.n_layers={c['num_hidden_layers']}",
            f"model.d_ff={c['intermediate_size']}", f"model.max_len={c['max_position_embeddings']}",
            "model.dropout=0.0", f"model.tie_embeddings={str(bool(c.get('tie_word_embeddings', False))).lower()}",
            f"model.init_std={c.get('initializer_range', 0.02)}",
        ]
        if hd != c["hidden_size"] // heads or c["hidden_size"] % heads:
            out.append(f"model.head_dim={hd}")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError(f"{what} partial_rotary_factor={rope['partial_rotary_factor']} is not supported "
                              "(Llama rotates whole heads)")
        if rope["rope_type"] != "default":
            out += [f"pos.scaling={rope['rope_type']}", f"pos.factor={rope.get('factor', 1.0)}"]
            orig = rope.get("original_max_position_embeddings")
            if rope["rope_type"] == "dynamic":
                orig = c["max_position_embeddings"]
            if orig:
                out.append(f"pos.original_max_len={orig}")
            for hf, ours in (("low_freq_factor", "low_freq_factor"), ("high_freq_factor", "high_freq_factor"),
                             ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"),
                             ("attention_factor", "attention_factor")):
                if rope.get(hf) is not None:
                    out.append(f"pos.{ours}={rope[hf]}")
            if rope.get("truncate") is not None:
                out.append(f"pos.truncate={str(bool(rope['truncate'])).lower()}")
        return [o for line in out for o in line.split(" ")]

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        t = Taker(theirs, ("model.",))
        s = {"tok.weight": t("embed_tokens.weight"), "decoder.final_norm.weight": t("norm.weight")}
        head = t.optional("lm_head.weight")
        if not c.get("tie_word_embeddings", False):
            if head is None:
                raise ConfigError("the checkpoint has no lm_head.weight and its head is not tied")
            s["head.weight"] = head
        for i in range(n_layers):
            p, q = f"layers.{i}.", f"decoder.blocks.{i}."
            s[q + "r_self.norm.weight"] = t(p + "input_layernorm.weight")
            s[q + "r_ffn.norm.weight"] = t(p + "post_attention_layernorm.weight")
            for kind in ("weight", "bias"):
                parts = [t.optional(p + f"self_attn.{n}_proj.{kind}") for n in "qkv"]
                if all(x is not None for x in parts):
                    s[q + f"self_attn.qkv.{kind}"] = torch.cat(parts, 0)
                elif kind == "weight":
                    raise ConfigError(f"the checkpoint lacks layer {i}'s q/k/v projections")
                if (o := t.optional(p + f"self_attn.o_proj.{kind}")) is not None:
                    s[q + f"self_attn.out.{kind}"] = o
                gate, up = t.optional(p + f"mlp.gate_proj.{kind}"), t.optional(p + f"mlp.up_proj.{kind}")
                if gate is not None:
                    s[q + f"ffn.w_gate_up.{kind}"] = torch.cat((gate, up), 0)
                if (down := t.optional(p + f"mlp.down_proj.{kind}")) is not None:
                    s[q + f"ffn.w2.{kind}"] = down
        return s, t.rest(lambda k: k.endswith("rotary_emb.inv_freq"))

    def mismatch(self, run: dict) -> Optional[str]:
        m, pos = run["model"], run["pos"]
        checks = [
            (m.get("name") == "decoder_only", f"model={m.get('name')} (Llama is decoder_only)"),
            (run["residual"]["name"] == "pre" and run["residual"].get("final_norm", True), "residual: Llama is Pre-LN with a final norm"),
            (run["norm"]["name"] == "rms" and run["norm"].get("eps_placement", "inside") == "inside",
             f"norm={run['norm']['name']} (Llama has RMSNorm, eps inside the root)"),
            (run["attention"]["name"] in ("mha", "gqa", "mqa"), f"attention={run['attention']['name']}"),
            (run["ffn"]["name"] in ("swiglu",) and run["ffn"].get("activation", "silu") == "silu",
             f"ffn={run['ffn']['name']} (Llama has SwiGLU)"),
            (pos["name"] == "rope" and pos.get("pairing") == "half" and pos.get("fraction", 1.0) == 1.0,
             f"pos={pos['name']} pairing={pos.get('pairing')} (Llama has RoPE in the half pairing, whole heads)"),
        ]
        checks += _plain_model_checks(m)
        return next((why for ok, why in checks if not ok), None)

    def hf_config(self, run: dict, vocab_size: int, specials: dict, ffn_hidden: int = 0) -> dict:
        m, a, pos = run["model"], run["attention"], run["pos"]
        heads = m["n_heads"]
        kv = a.get("n_kv_heads", heads) if a["name"] == "gqa" else (1 if a["name"] == "mqa" else heads)
        rope: dict = {"rope_type": "default" if pos.get("scaling", "none") == "none" else pos["scaling"]}
        if rope["rope_type"] != "default":
            rope["factor"] = pos.get("factor", 1.0)
            if pos.get("original_max_len"):
                rope["original_max_position_embeddings"] = pos["original_max_len"]
            keys = {"llama3": ("low_freq_factor", "high_freq_factor"),
                    "yarn": ("beta_fast", "beta_slow", "attention_factor", "truncate")}.get(rope["rope_type"], ())
            rope.update({k: pos[k] for k in keys if pos.get(k) is not None})
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
                "hidden_size": m["d_model"], "intermediate_size": ffn_hidden, "num_hidden_layers": m["n_layers"],
                "num_attention_heads": heads, "num_key_value_heads": kv,
                "head_dim": m.get("head_dim") or m["d_model"] // heads,
                "max_position_embeddings": m["max_len"], "rms_norm_eps": run["norm"].get("eps", 1e-6),
                "hidden_act": "silu", "attention_bias": bool(a.get("bias", True)),
                "mlp_bias": bool(run["ffn"].get("bias", False)), "attention_dropout": a.get("dropout", 0.0),
                "rope_theta": pos.get("base", 10000.0), "rope_scaling": None if rope["rope_type"] == "default" else rope,
                "tie_word_embeddings": bool(m.get("tie_embeddings", True)), "initializer_range": m.get("init_std", 0.02),
                "bos_token_id": specials.get("bos"), "eos_token_id": specials.get("eos"),
                "pad_token_id": specials.get("pad")}

    def to_theirs(self, ours: dict, n_layers: int, run: dict) -> dict:
        m = run["model"]
        s = {"model.embed_tokens.weight": ours["tok.weight"], "model.norm.weight": ours["decoder.final_norm.weight"]}
        if "head.weight" in ours and not m.get("tie_embeddings", True):
            s["lm_head.weight"] = ours["head.weight"]
        for i in range(n_layers):
            p, q = f"model.layers.{i}.", f"decoder.blocks.{i}."
            s[p + "input_layernorm.weight"] = ours[q + "r_self.norm.weight"]
            s[p + "post_attention_layernorm.weight"] = ours[q + "r_ffn.norm.weight"]
            w = ours[q + "self_attn.qkv.weight"]
            hd = m.get("head_dim") or m["d_model"] // m["n_heads"]
            qd = m["n_heads"] * hd
            kvd = (w.shape[0] - qd) // 2
            for kind in ("weight", "bias"):
                if (t := ours.get(q + f"self_attn.qkv.{kind}")) is not None:
                    for n, part in zip("qkv", t.split([qd, kvd, kvd], 0)):
                        s[p + f"self_attn.{n}_proj.{kind}"] = part
                if (t := ours.get(q + f"self_attn.out.{kind}")) is not None:
                    s[p + f"self_attn.o_proj.{kind}"] = t
                if (t := ours.get(q + f"ffn.w_gate_up.{kind}")) is not None:
                    s[p + f"mlp.gate_proj.{kind}"], s[p + f"mlp.up_proj.{kind}"] = t.chunk(2, 0)
                if (t := ours.get(q + f"ffn.w2.{kind}")) is not None:
                    s[p + f"mlp.down_proj.{kind}"] = t
        return s


# ----------------------------------------------------------------------------------------------- BERT

class Bert(Family):
    model_type = "bert"

    def overrides(self, c: dict) -> list[str]:
        what = "BERT config.json:"
        _need(c, "position_embedding_type", "absolute", what)
        _need(c, "is_decoder", False, what)
        _need(c, "hidden_act", ("gelu", "relu", "gelu_new", "silu"), what)
        act = GPT2_ACTIVATIONS[c.get("hidden_act", "gelu")]
        eps = c.get("layer_norm_eps", 1e-12)
        return [
            "model=encoder_only", "task=masked_lm", "residual=post", "norm=layer", f"norm.eps={eps}",
            "attention=mha", "attention.bias=true", f"attention.dropout={c.get('attention_probs_dropout_prob', 0.1)}",
            "ffn=mlp", f"ffn.activation={act}", "ffn.bias=true", "pos=learned",
            f"model.d_model={c['hidden_size']}", f"model.n_heads={c['num_attention_heads']}",
            f"model.n_layers={c['num_hidden_layers']}", f"model.d_ff={c['intermediate_size']}",
            f"model.max_len={c['max_position_embeddings']}", f"model.dropout={c.get('hidden_dropout_prob', 0.1)}",
            "model.tie_embeddings=true", "model.embed_norm=true", f"model.type_vocab_size={c.get('type_vocab_size', 2)}",
            "model.head_transform=true", f"model.head_activation={act}", "model.head_bias=true",
            f"model.init_std={c.get('initializer_range', 0.02)}",
        ]

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        t = Taker(theirs, ("bert.",))
        e = "embeddings."
        s = {"tok.weight": t(e + "word_embeddings.weight"), "embed.pos.table.weight": t(e + "position_embeddings.weight"),
             "embed.types.weight": t(e + "token_type_embeddings.weight"),
             "embed.norm.weight": t(e + "LayerNorm.weight"), "embed.norm.bias": t(e + "LayerNorm.bias")}
        if "cls.predictions.transform.dense.weight" not in t.state:
            raise ConfigError("the checkpoint has no masked-LM head (cls.predictions.*): convert a BertForMaskedLM "
                              "(or BertForPreTraining) checkpoint")
        h = "cls.predictions."
        s.update({"head_transform.dense.weight": t(h + "transform.dense.weight"),
                  "head_transform.dense.bias": t(h + "transform.dense.bias"),
                  "head_transform.norm.weight": t(h + "transform.LayerNorm.weight"),
                  "head_transform.norm.bias": t(h + "transform.LayerNorm.bias"), "head.bias": t(h + "bias")})
        t.optional(h + "decoder.weight")  # tied to the word embeddings
        t.optional(h + "decoder.bias")  # the same tensor as cls.predictions.bias
        for i in range(n_layers):
            p, q = f"encoder.layer.{i}.", f"encoder.blocks.{i}."
            for kind in ("weight", "bias"):
                s[q + f"self_attn.qkv.{kind}"] = torch.cat(
                    [t(p + f"attention.self.{n}.{kind}") for n in ("query", "key", "value")], 0)
                s[q + f"self_attn.out.{kind}"] = t(p + f"attention.output.dense.{kind}")
                s[q + f"r_self.norm.{kind}"] = t(p + f"attention.output.LayerNorm.{kind}")
                s[q + f"ffn.w1.{kind}"] = t(p + f"intermediate.dense.{kind}")
                s[q + f"ffn.w2.{kind}"] = t(p + f"output.dense.{kind}")
                s[q + f"r_ffn.norm.{kind}"] = t(p + f"output.LayerNorm.{kind}")
        return s, t.rest(lambda k: k.startswith(("pooler.", "cls.seq_relationship.")) or k.endswith("position_ids"))


class Mistral(Llama):
    """Mistral's checkpoints are Llama's architecture with grouped-query attention, under its own ``model_type``,
    plus sliding-window attention: a window at least as long as the positions (``null``, as in Mistral-7B v0.2
    and later) changes nothing and converts; a shorter one (v0.1's 4096 of 32768) is refused. A converted
    Mistral model exports as Llama, which computes the same function."""

    model_type = "mistral"
    exportable = False

    def overrides(self, c: dict) -> list[str]:
        window, n = c.get("sliding_window"), c["max_position_embeddings"]
        if window is not None and window < n:
            raise ConfigError(f"Mistral config.json: sliding_window={window} is not supported (modforge's attention "
                              f"sees every earlier position; a window of null or >= max_position_embeddings={n} "
                              "converts, as in Mistral-7B v0.2 and later)")
        return super().overrides(c)


FAMILIES = {f.model_type: f for f in (GPT2(), Llama(), Mistral(), Bert())}


def family_of(c: dict, where: str) -> Family:
    mt = c.get("model_type")
    if mt not in FAMILIES:
        raise ConfigError(f"{where}: model_type={mt!r} ({', '.join(c.get('architectures') or []) or 'no architectures'}) "
                          f"is not supported; modforge converts {', '.join(FAMILIES)}")
    return FAMILIES[mt]


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

