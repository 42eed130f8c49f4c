"""Multi-head latent attention (kind ``attention``, ``mla``; DeepSeek-AI 2024, "DeepSeek-V2", §2.1).

Keys and values come from one low-rank latent per token, which is all a decoding cache keeps:

    c = RMSNorm(x W_dkv)                    (kv_lora_rank wide; with k_R = RoPE(x W_kr), qk_rope_head_dim wide,
                                             one for every head)
    k_h = [c W_uk_h ; k_R],  v_h = c W_uv_h
    q_h = [q_nope_h ; RoPE(q_rope_h)],      q = x W_q, or RMSNorm(x W_dq) W_uq with ``q_lora_rank``
    head_h = softmax(q_h k_h^T / sqrt(qk_nope_head_dim + qk_rope_head_dim)) v_h

Defaults relative to the model's head width d_h (DeepSeek-V2's ratios: d_h^R = d_h / 2, d_c = 4 d_h, no query
compression as in V2-Lite): ``qk_nope_head_dim`` = ``v_head_dim`` = d_h, ``qk_rope_head_dim`` = d_h / 2,
``kv_lora_rank`` = 4 d_h. The positional scheme is built at ``qk_rope_head_dim`` (:meth:`position_head_dim`):
with ``pos=rope`` only the decoupled part rotates (DeepSeek's own pairing is ``pos.pairing=interleaved``);
other schemes embed or bias as usual. The cache holds c and k_R, (kv_lora_rank + qk_rope_head_dim) numbers a
token for all heads, against 2 n_heads d_h for multi-head attention; each step re-expands the keys and values
from it (the paper's absorbed matrices are an inference optimisation left out). As cross-attention (a
convention: DeepSeek's models are decoders) the latent and the unrotated k_R come from the encoder's output.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.components.attention import Attention, KVCache, build_mask, head_width
from modforge.registry import ConfigError, build, register


@register("attention", "mla")
class MultiHeadLatentAttention(Attention):
    """keys and values from one cached low-rank latent per token, a decoupled rotary key (DeepSeek-V2)"""

    masks_documents = True

    param_roles = {"q.weight": "hidden", "q_a.weight": "hidden", "q_b.weight": "hidden", "kv_a.weight": "hidden",
                   "kv_b.weight": "hidden", "out.weight": "hidden", "*.bias": "vector"}
    scales_scores = True

    @dataclass
    class Config:
        bias: bool = False  # on the down-projections and the output (DeepSeek's attention_bias)
        dropout: float = 0.0
        q_lora_rank: Optional[int] = None  # null: q = x W_q (V2-Lite); else queries through a latent this wide
        kv_lora_rank: Optional[int] = None  # null: 4 x the head width
        qk_nope_head_dim: Optional[int] = None  # null: the head width
        qk_rope_head_dim: Optional[int] = None  # null: half the head width
        v_head_dim: Optional[int] = None  # null: the head width

        def __post_init__(self):
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"attention.dropout={self.dropout}: must be in [0, 1)")
            for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                value = getattr(self, key)
                if value is not None and value < 1:
                    raise ConfigError(f"attention.{key}={value}: must be >= 1, or null (its default)")
            if self.qk_rope_head_dim is not None and self.qk_rope_head_dim % 2:
                raise ConfigError(f"attention.qk_rope_head_dim={self.qk_rope_head_dim}: must be even (RoPE rotates "
                                  "pairs)")

    @staticmethod
    def sizes(cfg, d_model: int, n_heads: int, head_dim: Optional[int]) -> tuple:
        dh = head_width(d_model, n_heads, head_dim)
        rope = cfg.qk_rope_head_dim or max(2, dh // 2 // 2 * 2)  # half the head, rounded down to even (pairs)
        return (cfg.qk_nope_head_dim or dh, rope, cfg.v_head_dim or dh, cfg.kv_lora_rank or 4 * dh)

    @classmethod
    def position_head_dim(cls, d_model: int, n_heads: int, head_dim: Optional[int], spec=None) -> int:
        """The width positions rotate: ``qk_rope_head_dim`` (``spec``: the attention's config, or its name)."""
        rope = spec.get("qk_rope_head_dim") if hasattr(spec, "get") else None
        return cls.sizes(cls.Config(qk_rope_head_dim=rope), d_model, n_heads, head_dim)[1]

    def __init__(self, cfg: Config, d_model: int, n_heads: int, *, cross: bool = False,
                 head_dim: Optional[int] = None):
        super().__init__()
        self.n_heads, self.dropout, self.cross = n_heads, cfg.dropout, cross
        self.nope, self.rope, self.dv, self.rank = self.sizes(cfg, d_model, n_heads, head_dim)
        self.d_head = self.nope + self.rope  # the score width (1/sqrt of it scales them)
        qk = n_heads * self.d_head
        if cfg.q_lora_rank:
            self.q_a = nn.Linear(d_model, cfg.q_lora_rank, bias=cfg.bias)
            self.q_norm = build("norm", "rms", cfg.q_lora_rank)
            self.q_b = nn.Linear(cfg.q_lora_rank, qk, bias=False)
        else:
            self.q = nn.Linear(d_model, qk, bias=False)
        self.kv_a = nn.Linear(d_model, self.rank + self.rope, bias=cfg.bias)
        self.kv_norm = build("norm", "rms", self.rank)
        self.kv_b = nn.Linear(self.rank, n_heads * (self.nope + self.dv), bias=False)
        self.out = nn.Linear(n_heads * self.dv, d_model, bias=cfg.bias)
        self.out.residual_out = True

    def flops(self, n_q: int, n_kv: int) -> int:
        """The projections (the latent expanded at every key), then scores over n_heads x (nope + rope) and values
        over n_heads x v_head_dim for the whole n_q x n_kv matrix."""
        H = self.n_heads
        up = sum(2 * m.in_features * m.out_features for m in (getattr(self, "q", None), getattr(self, "q_a", None),
                                                               getattr(self, "q_b", None), self.out) if m is not None)
        kv = 2 * self.kv_a.in_features * self.kv_a.out_features + 2 * self.kv_b.in_features * self.kv_b.out_features
        return n_q * up + n_kv * kv + 2 * n_q * n_kv * H * (self.d_head + self.dv)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(capacity)  # keys: the latent c (B, 1, T, rank); values: the rotated k_R (B, 1, T, rope)

    def forward(self, x: torch.Tensor, *, pos=None, causal: bool = False, key_mask: Optional[torch.Tensor] = None,
                memory: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None,
                positions: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.n_heads
        q = self.q_b(self.q_norm(self.q_a(x))) if hasattr(self, "q_a") else self.q(x)
        q_nope, q_rope = q.view(B, T, H, self.d_head).transpose(1, 2).split([self.nope, self.rope], -1)
        offset, bias = 0, None
        if self.cross and cache is not None and cache.k is not None:
            latent, k_rope = cache.k, cache.v  # the encoder's latents, computed once
        else:
            latent, k_rope = self.kv_a(memory if self.cross else x).split([self.rank, self.rope], -1)
            latent, k_rope = self.kv_norm(latent)[:, None], k_rope[:, None]  # (B, 1, T, ...): one for all heads
            if self.cross and cache is not None:
                cache.set(latent, k_rope)
        if not self.cross:
            offset = cache.length if cache is not None else 0
            if pos is not None:
                at = {} if positions is None else {"positions": positions}
                q_rope, k_rope = pos.rotate(q_rope, offset, **at), pos.rotate(k_rope, offset, **at)
                bias = pos.attn_bias(T, offset + T, offset)
            if cache is not None:
                latent, k_rope, key_mask = cache.append(latent, k_rope, key_mask)
        tk = latent.shape[-2]
        k_nope, v = self.kv_b(latent[:, 0]).view(B, tk, H, self.nope + self.dv).transpose(1, 2).split(
            [self.nope, self.dv], -1)
        k = torch.cat([k_nope, k_rope.expand(B, H, tk, self.rope)], -1)
        q = torch.cat([q_nope, q_rope], -1)
        dropout = self.dropout if self.training else 0.0
        scale = self.score_scale if self.score_scale is not None else self.d_head ** -0.5
        if key_mask is None and bias is None and documents is None and (not causal or offset == 0 or T == 1):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal and T > 1, scale=scale)
        else:
            mask = build_mask(B, T, tk, causal=causal, offset=offset, key_mask=key_mask, bias=bias,
                              device=x.device, dtype=q.dtype, documents=documents)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
        return self.out(y.transpose(1, 2).reshape(B, T, H * self.dv))
