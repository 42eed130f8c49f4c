"""Mixtral (``MixtralForCausalLM``): Llama with a sparse mixture of SwiGLU experts in every block (``ffn=moe``).
Converted in, not exported."""
from typing import Optional

import torch

from modforge.checkpoints.families.base import set_override, window_overrides
from modforge.checkpoints.families.llama import Llama
from modforge.errors import ConfigError


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
        out = set_override(out, "ffn", "moe")
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
