"""Families built on Llama's layout with issue 52's options (converted in; not exported):

* OLMo 2 (``Olmo2ForCausalLM``): the norm on each sub-layer's output only (``residual=reordered``) and QK-norm
  over all heads' features at once (``attention.qk_norm_scope=full``), RMSNorm throughout;
* Qwen3 (``Qwen3ForCausalLM``): Llama with QK-norm over each head's features (``qk_norm_scope=head``), and its
  sliding window where a config turns it on;
* Gemma 2 (``Gemma2ForCausalLM``): a norm before and after each sub-layer (``residual=sandwich``), RMSNorm whose
  checkpoint stores gain - 1, embeddings times sqrt(d_model), tanh-GELU GeGLU, attention soft-capped
  (``attention.logit_cap``) and windowed on every layer but each second (``attention.window``,
  ``global_every=2``), final logits soft-capped (``logits=softcap``);
* Mixtral (``MixtralForCausalLM``): Llama with a sparse mixture of SwiGLU experts (``ffn=moe``);
* GPT-J (``GPTJForCausalLM``): attention and MLP in parallel (``residual=parallel``), partial rotary positions.
"""
from typing import Optional

import torch

from modforge.checkpoints.families.base import Family, Taker, need
from modforge.checkpoints.families.llama import Llama
from modforge.errors import ConfigError


def _set(out: list[str], key: str, value: str) -> list[str]:
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


def gemma2_types(c: dict) -> list[str]:
    """Gemma 2's default (Gemma2Config): sliding, then global, alternating from the first layer."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c["num_hidden_layers"])]


def qwen3_types(c: dict) -> list[str]:
    """Qwen3's default (Qwen3Config): the layers from ``max_window_layers`` on slide, those below are global."""
    first = c.get("max_window_layers", c["num_hidden_layers"])
    return ["sliding_attention" if i >= first else "full_attention" for i in range(c["num_hidden_layers"])]


class Olmo2(Llama):
    model_type = "olmo2"
    exportable = False
    NORMS = {"r_self.norm": "post_attention_layernorm", "r_ffn.norm": "post_feedforward_layernorm"}
    QK_NORMS = True

    def overrides(self, c: dict) -> list[str]:
        out = super().overrides(c)
        eps = c.get("rms_norm_eps", 1e-6)
        out = _set(out, "residual", "reordered")
        return out + [f"attention.qk_norm={{name:rms,eps:{eps}}}", "attention.qk_norm_scope=full"]

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports OLMo 2 models as nothing yet (they convert in)"


class Qwen3(Llama):
    model_type = "qwen3"
    exportable = False
    QK_NORMS = True

    def overrides(self, c: dict) -> list[str]:
        out = super().overrides(c)
        eps = c.get("rms_norm_eps", 1e-6)
        return out + [f"attention.qk_norm={{name:rms,eps:{eps}}}", "attention.qk_norm_scope=head"] + \
            window_overrides(c, "Qwen3 config.json:", qwen3_types)

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports Qwen3 models as nothing yet (they convert in)"


class Gemma2(Llama):
    model_type = "gemma2"
    exportable = False
    NORMS = {"r_self.norm": "input_layernorm", "r_self.post": "post_attention_layernorm",
             "r_ffn.norm": "pre_feedforward_layernorm", "r_ffn.post": "post_feedforward_layernorm"}

    def norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w.float() + 1.0  # Gemma's RMSNorm multiplies by (1 + weight), in float32 (convert casts it once)

    def overrides(self, c: dict) -> list[str]:
        what = "Gemma2 config.json:"
        act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ConfigError(f"{what} hidden_activation={act!r} is not supported (supported: 'gelu_pytorch_tanh')")
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        scalar = c.get("query_pre_attn_scalar", hd)
        if scalar != hd:
            raise ConfigError(f"{what} query_pre_attn_scalar={scalar} is not supported (modforge scales scores by "
                              f"1/sqrt(head_dim); supported: {hd}, the head_dim)")
        out = super().overrides({**c, "hidden_act": "silu", "pretraining_tp": 1})
        out = _set(out, "residual", "sandwich")
        out = _set(out, "ffn", "geglu") + ["ffn.activation=gelu_tanh"]
        out = _set(out, "model.tie_embeddings", "true") + ["model.scale_embeddings=true"]
        if c.get("attn_logit_softcapping") is not None:
            out.append(f"attention.logit_cap={c['attn_logit_softcapping']}")
        if c.get("final_logit_softcapping") is not None:
            out += ["logits=softcap", f"logits.cap={c['final_logit_softcapping']}"]
        return out + window_overrides(c, what, gemma2_types)

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports Gemma 2 models as nothing yet (they convert in)"


class Mixtral(Llama):
    """Mixtral (``MixtralForCausalLM``): Llama with a sparse mixture of SwiGLU experts in every block (``ffn=moe``,
    ``ffn.expert={name:swiglu,match_params:false}``, top-k renormalised, dropless), its sliding window where set.
    Hugging Face computes one balancing loss over every layer's router at once; modforge adds one per layer
    (Switch, ST-MoE, DeepSeekMoE), so ``router_aux_loss_coef`` is divided by the number of layers: the total is
    of the same scale, not equal (the two agree when every layer routes alike).
    Reads the layout of the Hub's checkpoints, ``block_sparse_moe.experts.N.w1 / w3 / w2`` (transformers 5 fuses
    the experts in memory and writes this layout back)."""

    model_type = "mixtral"
    exportable = False

    def overrides(self, c: dict) -> list[str]:
        out = [o for o in super().overrides(c) if not o.startswith(("ffn.match_params=", "ffn.bias="))]
        out = _set(out, "ffn", "moe")
        return out + ["ffn.expert={name:swiglu,match_params:false}", f"ffn.n_experts={c['num_local_experts']}",
                      f"ffn.top_k={c.get('num_experts_per_tok', 2)}",
                      f"ffn.aux_loss_coef={c.get('router_aux_loss_coef', 0.001) / c['num_hidden_layers']:.6g}"] + \
            window_overrides(c, "Mixtral config.json:")

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        theirs = dict(theirs)
        s: dict = {}
        E = c["num_local_experts"]

        def take(key: str) -> torch.Tensor:
            if key not in theirs:
                raise ConfigError(f"the checkpoint has no tensor {key!r}: not a complete Mixtral checkpoint")
            return theirs.pop(key)

        for i in range(n_layers):
            for prefix in ("model.", ""):
                p = f"{prefix}layers.{i}."
                q = f"decoder.blocks.{i}.ffn."
                if p + "block_sparse_moe.gate.weight" in theirs:  # the Hub's layout (save_pretrained writes it too)
                    b = p + "block_sparse_moe."
                    s[q + "router.weight"] = take(b + "gate.weight")
                    for e in range(E):
                        w1, w3 = take(b + f"experts.{e}.w1.weight"), take(b + f"experts.{e}.w3.weight")
                        s[q + f"experts.{e}.w_gate_up.weight"] = torch.cat((w1, w3), 0)
                        s[q + f"experts.{e}.w2.weight"] = take(b + f"experts.{e}.w2.weight")
            if not any(k.startswith(f"decoder.blocks.{i}.ffn.router") for k in s):
                raise ConfigError(f"the checkpoint lacks layer {i}'s mixture of experts (block_sparse_moe)")
        ours, rest = super().to_ours(theirs, c, n_layers)
        return {**ours, **s}, rest

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports Mixtral models as nothing yet (they convert in)"


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
