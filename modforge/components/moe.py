"""Mixture of experts (kind ``ffn``, ``moe``): a router sends each token to its top-k experts, each a registered
FFN, and adds their outputs weighted by the router's probabilities; optional shared experts see every token.

* Routing (Shazeer et al. 2017; Fedus et al. 2022, Switch; Jiang et al. 2024, Mixtral): p = softmax(x W_r) over
  the experts in float32, the top ``top_k`` kept and, with ``renormalize`` (Mixtral), divided by their sum.
  Dropless: every token reaches its k experts (no capacity factor), so a token's output never depends on the
  rest of its batch and cached decoding is exact.
* Load balancing (Switch eq. 4–6, as Hugging Face's Mixtral computes it): while training, the forward sets
  ``aux_loss = aux_loss_coef * E * sum_i f_i P_i``, f_i the share of tokens whose top-k holds expert i (the f_i sum
  to k) and P_i the mean router probability of expert i; the task adds it to the loss (``train/aux_loss``).
* Shared experts (Dai et al. 2024, DeepSeekMoE): ``n_shared`` experts every token passes through, added unweighted.
* Each expert is ``expert`` (a registered FFN, by name or mapping: ``{name: swiglu, match_params: false}`` is
  Mixtral's) at ``expert_d_ff`` (null: the model's d_ff, as in Mixtral; a fine-grained MoE sets it smaller).
* FLOPs are the active ones: the router, k experts and the shared ones per token (``flops_per_token``).
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.components.ffn import FFN
from modforge.registry import ConfigError, build, register


@dataclass
class MoEConfig:
    expert: Any = "swiglu"  # each expert: a registered FFN, by name or {name: ..., its keys}
    n_experts: int = 8
    top_k: int = 2
    n_shared: int = 0  # experts every token passes through (DeepSeekMoE)
    expert_d_ff: Optional[int] = None  # each expert's d_ff; null: the model's d_ff
    renormalize: bool = True  # the top-k probabilities divided by their sum (Mixtral); false: as they are
    aux_loss_coef: float = 0.01  # Switch's alpha (Mixtral's config: 0.001 … 0.02); 0: no balancing loss

    def __post_init__(self):
        if self.n_experts < 1 or not 1 <= self.top_k <= self.n_experts or self.n_shared < 0:
            raise ConfigError(f"ffn.n_experts={self.n_experts}, ffn.top_k={self.top_k}, ffn.n_shared={self.n_shared}: "
                              "n_experts >= 1, 1 <= top_k <= n_experts, n_shared >= 0")
        if self.expert_d_ff is not None and self.expert_d_ff < 1:
            raise ConfigError(f"ffn.expert_d_ff={self.expert_d_ff}: must be >= 1 (or null: the model's d_ff)")
        if self.aux_loss_coef < 0:
            raise ConfigError(f"ffn.aux_loss_coef={self.aux_loss_coef}: must be >= 0")
        name = self.expert.get("name") if hasattr(self.expert, "get") else self.expert
        if name == "moe":
            raise ConfigError("ffn.expert=moe: an expert is a plain FFN (swiglu, gelu ...), not another mixture")
        from modforge.registry import registry

        if name not in registry("ffn").names():
            raise ConfigError(f"ffn.expert={self.expert!r}: not a registered FFN (one of "
                              f"{', '.join(n for n in registry('ffn').names() if n != 'moe')})")
        try:  # the expert's own keys, now (a tiny one: its config is checked as it is built)
            build("ffn", self.expert, 2, 4)
        except ConfigError as e:
            raise ConfigError(f"ffn.expert={self.expert!r}: {e}") from None


@register("ffn", "moe", config=MoEConfig)
class MixtureOfExperts(FFN):
    """top-k routed experts (+ shared ones), a load-balancing loss"""

    param_roles = {"router.weight": "output"}  # width -> a fixed number of experts: a readout (modforge.models.param)
    has_aux_loss = True
    # under torch.compile the graph breaks where each expert's tokens are gathered (their number depends on the
    # data); every expert still compiles (tests/test_compile.py accepts a break only where a module says so)
    graph_breaks = "routing: each expert's token count depends on the data"

    def __init__(self, cfg: MoEConfig, d_model: int, d_ff: int):
        super().__init__()
        width = cfg.expert_d_ff or d_ff
        self.router = nn.Linear(d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(build("ffn", cfg.expert, d_model, width) for _ in range(cfg.n_experts))
        self.shared = nn.ModuleList(build("ffn", cfg.expert, d_model, width) for _ in range(cfg.n_shared))
        self.top_k, self.renormalize, self.coef = cfg.top_k, cfg.renormalize, cfg.aux_loss_coef
        self.hidden = self.experts[0].hidden
        self.aux_loss: Optional[torch.Tensor] = None  # set by a training forward, taken by the task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(h).float(), dim=-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                y = expert(h[token]) * weight[token, slot, None].to(h.dtype)
                out.index_add_(0, token, y)
        for expert in self.shared:
            out = out + expert(h)
        if self.training and self.coef > 0:
            E = len(self.experts)
            share = torch.zeros(E, device=h.device).index_add_(0, chosen.reshape(-1),
                                                                torch.ones(chosen.numel(), device=h.device))
            self.aux_loss = self.coef * E * (share / h.shape[0] * probs.mean(0)).sum()
        return out.reshape(shape)

    def flops_per_token(self) -> int:
        """Active FLOPs: the router, ``top_k`` experts and every shared expert."""
        one = self.experts[0].flops_per_token()
        return 2 * self.router.in_features * self.router.out_features + (self.top_k + len(self.shared)) * one
