"""OLMo 2 (``Olmo2ForCausalLM``): Llama's layout with the norm on each sub-layer's output only
(``residual=reordered``) and QK-norm over all heads' features at once (``attention.qk_norm_scope=full``).
Converted in, not exported."""
from typing import Optional

from modforge.checkpoints.families.base import set_override
from modforge.checkpoints.families.llama import Llama


class Olmo2(Llama):
    model_type = "olmo2"
    exportable = False
    NORMS = {"r_self.norm": "post_attention_layernorm", "r_ffn.norm": "post_feedforward_layernorm"}
    QK_NORMS = True

    def overrides(self, c: dict) -> list[str]:
        out = super().overrides(c)
        eps = c.get("rms_norm_eps", 1e-6)
        out = set_override(out, "residual", "reordered")
        return out + [f"attention.qk_norm={{name:rms,eps:{eps}}}", "attention.qk_norm_scope=full"]

    def mismatch(self, run: dict) -> Optional[str]:
        return "modforge exports OLMo 2 models as nothing yet (they convert in)"
