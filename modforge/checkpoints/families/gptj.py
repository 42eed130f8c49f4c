"""GPT-J (``GPTJForCausalLM``): attention and MLP in parallel (``residual=parallel``), partial rotary positions.
Converted in, not exported."""
from typing import Optional

import torch

from modforge.checkpoints.families.base import Family, Taker, need


class GPTJ(Family):
    """GPT-J (``GPTJForCausalLM``): attention and MLP in parallel on one LayerNorm (``residual=parallel``),
    partial rotary positions in the interleaved pairing on the first ``rotary_dim`` dimensions of each head,
    unbiased attention, a biased tanh-GELU MLP, an untied head with a bias."""

    model_type = "gptj"
    exportable = False

    def overrides(self, c: dict) -> list[str]:
        what = "GPT-J config.json:"
        need(c, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), what)
        d, heads = c["n_embd"], c["n_head"]
        hd = d // heads
        rot = c.get("rotary_dim") or hd
        return [
            "model=decoder_only", "residual=parallel", "norm=layer", f"norm.eps={c.get('layer_norm_epsilon', 1e-5)}",
            "attention=mha", "attention.bias=false", "ffn=mlp", "ffn.activation=gelu_tanh", "ffn.bias=true",
            "pos=rope", "pos.pairing=interleaved", f"pos.fraction={rot / hd}", "pos.angles=float32", "pos.base=10000",
            f"model.d_model={d}", f"model.n_heads={heads}", f"model.n_layers={c['n_layer']}",
            f"model.d_ff={c.get('n_inner') or 4 * d}", f"model.max_len={c['n_positions']}", "model.dropout=0.0",
            f"model.tie_embeddings={str(bool(c.get('tie_word_embeddings', False))).lower()}",
            "model.head_bias=true", f"model.init_std={c.get('initializer_range', 0.02)}",
        ]

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        t = Taker(theirs, ("transformer.",))
        s = {"tok.weight": t("wte.weight"), "decoder.final_norm.weight": t("ln_f.weight"),
             "decoder.final_norm.bias": t("ln_f.bias"), "head.weight": t("lm_head.weight"),
             "head.bias": t("lm_head.bias")}
        for i in range(n_layers):
            p, q = f"h.{i}.", f"decoder.blocks.{i}."
            s[q + "r_self.norm.weight"], s[q + "r_self.norm.bias"] = t(p + "ln_1.weight"), t(p + "ln_1.bias")
            s[q + "self_attn.qkv.weight"] = torch.cat([t(p + f"attn.{n}_proj.weight") for n in "qkv"], 0)
            s[q + "self_attn.out.weight"] = t(p + "attn.out_proj.weight")
            for ours, hf in (("w1", "fc_in"), ("w2", "fc_out")):
                s[q + f"ffn.{ours}.weight"], s[q + f"ffn.{ours}.bias"] = t(p + f"mlp.{hf}.weight"), t(p + f"mlp.{hf}.bias")
        return s, t.rest(lambda k: k.endswith(("attn.bias", "attn.masked_bias", "embed_positions")))

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports GPT-J models as nothing yet (they convert in)"
