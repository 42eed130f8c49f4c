"""Llama (``LlamaForCausalLM``), and Mistral's checkpoints as Llama: Pre-LN, RMSNorm (eps inside the root),
RoPE in the half pairing with its angles in float32 as Meta's and HF's code compute them
(``pos.angles=float32``), the ``rope_scaling`` variants, SwiGLU at the checkpoint's own width
(``ffn.match_params=false``), grouped-query attention (``attention=gqa``) when it has fewer key/value heads,
``head_dim`` when it is set apart. Converts in and exports back."""
from typing import Optional

import torch

from modforge.checkpoints.families.base import Family, Taker, need, plain_attention_checks, plain_model_checks
from modforge.errors import ConfigError


class Llama(Family):
    model_type = "llama"
    exportable = True
    SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn")
    # a block's norms, ours <- theirs (a family that places them elsewhere names its own)
    NORMS = {"r_self.norm": "input_layernorm", "r_ffn.norm": "post_attention_layernorm"}
    QK_NORMS = False  # self_attn.q_norm / k_norm tensors (OLMo 2, Qwen3)

    def norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        """A checkpoint's norm gain as modforge's RMSNorm multiplies by it (Gemma stores gain - 1)."""
        return w

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
        need(c, "hidden_act", "silu", what)
        need(c, "pretraining_tp", 1, what)
        rope = self.rope(c)
        need(rope, "rope_type", self.SCALINGS, what + " rope")
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
        s = {"tok.weight": t("embed_tokens.weight"), "decoder.final_norm.weight": self.norm_weight(t("norm.weight"))}
        head = t.optional("lm_head.weight")
        if not c.get("tie_word_embeddings", False):
            if head is None:
                raise ConfigError("the checkpoint has no lm_head.weight and its head is not tied")
            s["head.weight"] = head
        for i in range(n_layers):
            p, q = f"layers.{i}.", f"decoder.blocks.{i}."
            for ours, theirs in self.NORMS.items():
                s[q + ours + ".weight"] = self.norm_weight(t(p + theirs + ".weight"))
            if self.QK_NORMS:
                for n in "qk":
                    s[q + f"self_attn.{n}_norm.weight"] = t(p + f"self_attn.{n}_norm.weight")
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
        checks += plain_model_checks(m) + plain_attention_checks(run)
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

class Mistral(Llama):
    """Mistral's checkpoints are Llama's architecture with grouped-query attention, under its own ``model_type``,
    plus sliding-window attention on every layer (``attention.window``; v0.1's 4096 of 32768): a window at least
    as long as the positions (``null``, as in Mistral-7B v0.2 and later) is none. A converted Mistral model
    without a window exports as Llama, which computes the same function."""

    model_type = "mistral"
    exportable = False

    def overrides(self, c: dict) -> list[str]:
        window, n = c.get("sliding_window"), c["max_position_embeddings"]
        out = super().overrides(c)
        return out + ([f"attention.window={window}"] if window is not None and window < n else [])
