"""Gemma 2 (``Gemma2ForCausalLM``): a norm before and after each sub-layer (``residual=sandwich``), RMSNorm whose
checkpoint stores gain - 1, embeddings times sqrt(d_model), tanh-GELU GeGLU, attention soft-capped
(``attention.logit_cap``) and windowed on every layer but each second (``attention.window``, ``global_every=2``),
final logits soft-capped (``logits=softcap``). Converted in, not exported."""
from typing import Optional

import torch

from modforge.checkpoints.families.base import set_override, window_overrides
from modforge.checkpoints.families.llama import Llama
from modforge.errors import ConfigError


def gemma2_types(c: dict) -> list[str]:
    """Gemma 2's default (Gemma2Config): sliding, then global, alternating from the first layer."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c["num_hidden_layers"])]


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
        out = set_override(out, "residual", "sandwich")
        out = set_override(out, "ffn", "geglu") + ["ffn.activation=gelu_tanh"]
        out = set_override(out, "model.tie_embeddings", "true") + ["model.scale_embeddings=true"]
        if c.get("attn_logit_softcapping") is not None:
            out.append(f"attention.logit_cap={c['attn_logit_softcapping']}")
        if c.get("final_logit_softcapping") is not None:
            out += ["logits=softcap", f"logits.cap={c['final_logit_softcapping']}"]
        return out + window_overrides(c, what, gemma2_types)

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports Gemma 2 models as nothing yet (they convert in)"
