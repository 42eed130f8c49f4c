"""Differential attention (kind ``attention``, ``diff``; Ye et al. 2024, "Differential Transformer", ICLR 2025).

Each of the ``n_heads`` heads computes two softmax maps from two query/key halves and subtracts one from the
other, cancelling the attention both give to irrelevant context (their §2.1):

    head = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V,
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    out = concat over heads of RMSNorm(head) * (1 - lambda_init), then the output projection,

with Q1, Q2, K1, K2 of d = d_head / 2 features each and V of d_head (the paper's 2d): the same projection sizes
as multi-head attention with ``n_heads`` heads (their recipe halves the heads of the Transformer it matches; set
``model.n_heads`` accordingly). lambda_init = 0.8 - 0.6 exp(-0.3 l), l the layer's index from 0 as in the
authors' code (``attention.lambda_init`` fixes it); the four lambda vectors start N(0, 0.1); the per-head
RMSNorm has eps 1e-5 and a gain. Positions rotate the d-wide query and key halves: the model builds its
positional scheme at :meth:`DifferentialAttention.position_head_dim` (``d_head / 2``), and ALiBi's per-head bias is
shared by a head's two maps. Decoding caches keys and values (:class:`~modforge.components.attention.KVCache`).
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.components.attention import Attention, KVCache, build_mask, head_width
from modforge.registry import ConfigError, build, register


@register("attention", "diff")
class DifferentialAttention(Attention):
    """(softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)) V per head, RMSNorm'd (Ye et al. 2024)"""

    masks_documents = True

    param_roles = {"q.weight": "hidden", "kv.weight": "hidden", "qkv.weight": "hidden", "out.weight": "hidden",
                   "lambda_*": "vector", "*.bias": "vector"}
    scales_scores = True

    @dataclass
    class Config:
        bias: bool = False  # the paper's projections have none
        dropout: float = 0.0  # on the differential attention map
        lambda_init: Optional[float] = None  # null: 0.8 - 0.6 exp(-0.3 l), l the layer's index from 0

        def __post_init__(self):
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"attention.dropout={self.dropout}: must be in [0, 1)")
            if self.lambda_init is not None and not 0.0 <= self.lambda_init < 1.0:
                raise ConfigError(f"attention.lambda_init={self.lambda_init}: must be in [0, 1) (the paper's "
                                  "schedule gives 0.2 at the first layer to 0.8 deep), or null")

    @staticmethod
    def position_head_dim(d_model: int, n_heads: int, head_dim: Optional[int], spec=None) -> int:
        """The width of the query and key halves that positions rotate: half of a head."""
        return (head_dim or d_model // n_heads) // 2

    def __init__(self, cfg: Config, d_model: int, n_heads: int, *, cross: bool = False,
                 head_dim: Optional[int] = None):
        super().__init__()
        full = head_width(d_model, n_heads, head_dim)
        if full % 2:
            raise ConfigError(f"attention=diff splits each head's queries and keys in two: its head dimension "
                              f"{full} must be even (set model.n_heads or model.head_dim)")
        self.n_heads, self.d_head, self.cross, self.dropout = n_heads, full // 2, cross, cfg.dropout
        width = n_heads * full  # q: 2 halves x n_heads x d_head/2; k likewise; v: n_heads x d_head
        if cross:
            self.q = nn.Linear(d_model, width, bias=cfg.bias)
            self.kv = nn.Linear(d_model, 2 * width, bias=cfg.bias)
        else:
            self.qkv = nn.Linear(d_model, 3 * width, bias=cfg.bias)
        self.out = nn.Linear(width, d_model, bias=cfg.bias)
        self.out.residual_out = True
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.d_head) * 0.1) for _ in range(4))
        self.subln = build("norm", {"name": "rms", "eps": 1e-5}, full)
        self.fixed_lambda_init = cfg.lambda_init

    @property
    def lambda_init(self) -> float:
        if self.fixed_lambda_init is not None:
            return self.fixed_lambda_init
        return 0.8 - 0.6 * math.exp(-0.3 * self.layer_index)

    def flops(self, n_q: int, n_kv: int) -> int:
        d, width = self.out.out_features, self.out.in_features
        proj = 2 * n_q * d * width + 2 * n_kv * d * 2 * width if self.cross else 2 * n_q * d * 3 * width
        return proj + 2 * n_q * width * d + 4 * n_q * n_kv * width  # two maps of width/2, values of width

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(capacity)

    def forward(self, x: torch.Tensor, *, pos=None, causal: bool = False, key_mask: Optional[torch.Tensor] = None,
                memory: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None,
                positions: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, _ = x.shape
        H, d = self.n_heads, self.d_head
        halves = lambda t: t.view(B, -1, 2 * H, d).transpose(1, 2)  # noqa: E731 - (B, 2H, T, d)
        offset, bias = 0, None
        if self.cross:
            q = halves(self.q(x))
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = (halves(t) for t in self.kv(memory).chunk(2, -1))
                if cache is not None:
                    cache.set(k, v)
        else:
            q, k, v = (halves(t) for t in self.qkv(x).chunk(3, -1))  # v as 2H halves of d: cached as keys are
            if cache is not None:
                offset = cache.length
            if pos is not None:
                at = {} if positions is None else {"positions": positions}
                q, k = pos.rotate(q, offset, **at), pos.rotate(k, offset, **at)
                bias = pos.attn_bias(T, offset + T, offset)
                if bias is not None:  # one bias per head, shared by its two maps
                    bias = bias.repeat_interleave(2, dim=-3)
            if cache is not None:
                k, v, key_mask = cache.append(k, v, key_mask)
        tk = k.shape[-2]
        scale = self.score_scale if self.score_scale is not None else d ** -0.5
        scores = (q @ k.transpose(-2, -1)).float() * scale
        mask = build_mask(B, T, tk, causal=causal, offset=offset, key_mask=key_mask, bias=bias, device=x.device,
                          dtype=torch.float32, documents=documents)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        p = F.softmax(scores, dim=-1).view(B, H, 2, T, tk)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum().float())
               - torch.exp((self.lambda_q2 * self.lambda_k2).sum().float()) + self.lambda_init)
        a = (p[:, :, 0] - lam * p[:, :, 1]).to(v.dtype)
        if self.training and self.dropout > 0:
            a = F.dropout(a, self.dropout)
        vv = v.reshape(B, H, 2, tk, d).transpose(2, 3).reshape(B, H, tk, 2 * d)  # (B, H, Tk, d_head)
        y = self.subln(a @ vv) * (1.0 - self.lambda_init)
        return self.out(y.transpose(1, 2).reshape(B, T, H * 2 * d))
