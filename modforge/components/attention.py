"""Attention (kind ``attention``): the contract, and multi-head attention on F.scaled_dot_product_attention.

An attention owns its decoding cache: :meth:`Attention.new_cache` returns an
object with ``reorder(index)`` (beam search), and the attention alone reads and
writes it. So a variant with another cache (grouped-query, multi-query, linear
attention) is one class in one file, and models never import a cache type.

``mha`` computes softmax(Q K^T / sqrt(d_head) + bias) V per head (Vaswani et
al. 2017) with one fused QKV projection for self-attention and a fused KV
projection for cross-attention. Masks:

* ``causal``   -- query i sees keys <= i (offset by the cache length when decoding);
* ``key_mask`` -- (B, Tk) bool, True at real keys: padding is never attended to;
* cross-attention -- keys and values come from ``memory`` (the encoder output).

With no padding and no bias, the causal case goes to SDPA's ``is_causal`` fast
path (flash / memory-efficient kernels); otherwise one boolean or additive
mask is built.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.registry import ConfigError, declare, register


class Attention(nn.Module):
    """Base class of kind ``attention``: built as ``cls(cfg, d_model, n_heads, cross=False)``.

    Called as ``attn(x, pos=, causal=, key_mask=, memory=, cache=)`` on (B, T, d_model):
    self-attention (``pos`` is the stack's positional scheme: ``pos.rotate`` for
    queries and keys, ``pos.attn_bias`` as an additive bias), or cross-attention
    over ``memory`` when built with ``cross=True``. ``key_mask`` (B, Tk) is True
    at real keys. ``cache`` is what :meth:`new_cache` returned, or None.
    """

    def new_cache(self, capacity: int):
        """A fresh decoding cache for this layer, holding up to ``capacity`` positions.

        It must have ``reorder(index)``, which keeps the batch rows ``index`` (beam search)."""
        raise NotImplementedError(f"{type(self).__name__} has no decoding cache")


declare("attention", "attention (self and cross) and its decoding cache", base=Attention, default="mha", part=True)


class KVCache:
    """Keys and values of one attention layer, preallocated to ``capacity`` positions.

    Appending a token writes in place (no re-allocation), so a decoding step
    costs the same whatever the prefix length, up to the attention itself.
    Cross-attention caches hold the encoder's keys and values, computed once.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None
        self.length = 0
        self._spare: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # beam search's second buffer

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, T, D = k.shape
        if self.k is None:
            self.k = k.new_empty(B, H, self.capacity, D)
            self.v = v.new_empty(B, H, self.capacity, D)
        if self.length + T > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {T} > capacity {self.capacity} (model.max_len)")
        self.k[:, :, self.length : self.length + T] = k
        self.v[:, :, self.length : self.length + T] = v
        self.length += T
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def set(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v, self.length = k, v, k.shape[-2]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search).

        Only the filled positions are gathered, straight into a second buffer that
        then becomes the cache: one copy of O(length) per beam step, not O(capacity)
        and not a gather followed by a write-back. The first reorder of a beam
        search (batch -> batch x beams) allocates that buffer at the new size."""
        if self.k is None:
            return
        n = self.length
        if n == self.k.shape[2]:  # full, or a cross-attention cache: no room to keep
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            self._spare = None
            return
        shape = (index.numel(), *self.k.shape[1:])
        if self._spare is None or self._spare[0].shape != shape:
            self._spare = (self.k.new_empty(shape), self.v.new_empty(shape))
        k, v = self._spare
        torch.index_select(self.k[:, :, :n], 0, index, out=k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=v[:, :, :n])
        self._spare = (self.k, self.v) if self.k.shape == shape else None
        self.k, self.v = k, v


def build_mask(
    B: int, tq: int, tk: int, *, causal: bool, offset: int, key_mask: Optional[torch.Tensor],
    bias: Optional[torch.Tensor], device: torch.device, dtype: torch.dtype,
) -> Optional[torch.Tensor]:
    """One SDPA mask combining causal, key-padding and additive bias; True/0 = attend."""
    allowed = None
    if causal:
        q_pos = torch.arange(offset, offset + tq, device=device)[:, None]
        allowed = (torch.arange(tk, device=device)[None, :] <= q_pos)[None, None]  # (1,1,tq,tk)
    if key_mask is not None:
        km = key_mask[:, None, None, :tk]  # (B,1,1,tk)
        allowed = km if allowed is None else allowed & km
    if bias is None:
        return allowed
    bias = bias.to(dtype)[None] if bias.dim() == 3 else bias.to(dtype)
    if allowed is None:
        return bias
    return bias.masked_fill(~allowed, float("-inf"))


@register("attention", "mha")
class MultiHeadAttention(Attention):
    """Multi-head scaled dot-product attention (self or cross), cached in a preallocated :class:`KVCache`."""

    @dataclass
    class Config:
        bias: bool = True  # biases on the projections
        dropout: float = 0.0  # on the attention probabilities

        def __post_init__(self):
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"attention.dropout={self.dropout}: must be in [0, 1)")

    def __init__(self, cfg: Config, d_model: int, n_heads: int, *, cross: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ConfigError(f"model.d_model={d_model} must be divisible by model.n_heads={n_heads}")
        self.n_heads, self.d_head, self.cross = n_heads, d_model // n_heads, cross
        self.dropout = cfg.dropout
        if cross:
            self.q = nn.Linear(d_model, d_model, bias=cfg.bias)
            self.kv = nn.Linear(d_model, 2 * d_model, bias=cfg.bias)
        else:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=cfg.bias)
        self.out = nn.Linear(d_model, d_model, bias=cfg.bias)
        self.out.residual_out = True  # writes into the residual stream (scaled init, see models.blocks)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(capacity)

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = t.shape  # (B, T, n*d) -> n tensors (B, H, T, d_head)
        return t.view(B, T, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)

    def forward(
        self,
        x: torch.Tensor,
        *,
        pos=None,
        causal: bool = False,
        key_mask: Optional[torch.Tensor] = None,
        memory: Optional[torch.Tensor] = None,
        cache: Optional[KVCache] = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        offset = 0
        bias = None
        if self.cross:
            q = self._heads(self.q(x), 1)[0]
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._heads(self.kv(memory), 2)
                if cache is not None:
                    cache.set(k, v)
        else:
            qkv = self._heads(self.qkv(x), 3)
            q, k, v = qkv.unbind(0)
            if cache is not None:
                offset = cache.length
            if pos is not None:
                if torch.is_grad_enabled():  # separate calls: the backward of a slice would zero-fill a copy
                    q, k = pos.rotate(q, offset), pos.rotate(k, offset)
                else:  # queries and keys in one call (a view of both): half the ops of a decoding step
                    q, k = pos.rotate(qkv[:2], offset).unbind(0)
                bias = pos.attn_bias(T, offset + T, offset)
            if cache is not None:
                k, v = cache.append(k, v)
        tk = k.shape[-2]
        dropout = self.dropout if self.training else 0.0
        if key_mask is None and bias is None and (not causal or offset == 0 or T == 1):
            # fast path: SDPA's own causal flag (top-left aligned, exact when offset == 0;
            # a single cached query sees every key, so no mask at all)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal and T > 1)
        else:
            mask = build_mask(B, T, tk, causal=causal, offset=offset, key_mask=key_mask, bias=bias,
                              device=x.device, dtype=q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self.out(y.transpose(1, 2).reshape(B, T, C))
