"""Qwen3 (``Qwen3ForCausalLM``): Llama with QK-norm over each head's features (``qk_norm_scope=head``), and
its sliding window where a config turns it on. Converted in, not exported."""
from typing import Optional

from modforge.checkpoints.families.base import window_overrides
from modforge.checkpoints.families.llama import Llama


def qwen3_types(c: dict) -> list[str]:
    """Qwen3's default (Qwen3Config): the layers from ``max_window_layers`` on slide, those below are global."""
    first = c.get("max_window_layers", c["num_hidden_layers"])
    return ["sliding_attention" if i >= first else "full_attention" for i in range(c["num_hidden_layers"])]


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
