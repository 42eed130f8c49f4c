"""Pretrained checkpoints of Hugging Face families as modforge models, and back (one module each): GPT-2, Llama (with
GQA; Mistral's checkpoints too), BERT, OLMo 2, Qwen3, Gemma 2, Mixtral and GPT-J.

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
* OLMo 2, Qwen3, Gemma 2, Mixtral and GPT-J (in only): Llama's layout (GPT-J's own) with
  QK-norm, reordered and sandwich norms, soft-capping, sliding windows, a mixture of experts, parallel blocks.
"""
from modforge.checkpoints.families.base import (Family, read_hf_dir, read_hf_weights,  # noqa: F401 - public
                                                specials_of)
from modforge.checkpoints.families.bert import Bert
from modforge.checkpoints.families.gpt2 import GPT2
from modforge.checkpoints.families.llama import Llama, Mistral
from modforge.checkpoints.families.gemma2 import Gemma2
from modforge.checkpoints.families.gptj import GPTJ
from modforge.checkpoints.families.mixtral import Mixtral
from modforge.checkpoints.families.olmo2 import Olmo2
from modforge.checkpoints.families.qwen3 import Qwen3
from modforge.errors import ConfigError

FAMILIES = {f.model_type: f for f in (GPT2(), Llama(), Mistral(), Bert(), Olmo2(), Qwen3(), Gemma2(), Mixtral(), GPTJ())}

def family_of(c: dict, where: str) -> Family:
    mt = c.get("model_type")
    if mt not in FAMILIES:
        raise ConfigError(f"{where}: model_type={mt!r} ({', '.join(c.get('architectures') or []) or 'no architectures'}) "
                          f"is not supported; modforge converts {', '.join(FAMILIES)}")
    return FAMILIES[mt]
