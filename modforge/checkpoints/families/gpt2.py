"""GPT-2 (``GPT2LMHeadModel``): Pre-LN, LayerNorm, learned positions, tanh-GELU MLP (``gelu_new``), biased
projections (HF's ``Conv1D`` stores them transposed), tied head. Converts in and exports back."""
from typing import Optional

from modforge.checkpoints.families.base import HF_ACTIVATIONS, Family, Taker, need, plain_attention_checks, plain_model_checks


class GPT2(Family):
    model_type = "gpt2"
    exportable = True

    def overrides(self, c: dict) -> list[str]:
        what = "GPT-2 config.json:"
        for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                           ("reorder_and_upcast_attn", False), ("add_cross_attention", False),
                           ("tie_word_embeddings", True)):
            need(c, key, value, what)
        need(c, "activation_function", tuple(HF_ACTIVATIONS), what)
        return [
            "model=decoder_only", "residual=pre", "norm=layer", f"norm.eps={c.get('layer_norm_epsilon', 1e-5)}",
            "attention=mha", "attention.bias=true", f"attention.dropout={c.get('attn_pdrop', 0.1)}",
            "ffn=mlp", f"ffn.activation={HF_ACTIVATIONS[c.get('activation_function', 'gelu_new')]}", "ffn.bias=true",
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
             and run["ffn"].get("activation") in {v: k for k, v in HF_ACTIVATIONS.items()},
             f"ffn={run['ffn']['name']} (GPT-2 has a two-matrix MLP with biases)"),
            (run["pos"]["name"] == "learned", f"pos={run['pos']['name']} (GPT-2 has learned positions)"),
            (m.get("tie_embeddings", True), "model.tie_embeddings=false (GPT-2's head is tied)"),
        ]
        checks += plain_model_checks(m) + plain_attention_checks(run)
        return next((why for ok, why in checks if not ok), None)

    def hf_config(self, run: dict, vocab_size: int, specials: dict) -> dict:
        m, back = run["model"], {v: k for k, v in HF_ACTIVATIONS.items() if k != "gelu_pytorch_tanh"}
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
