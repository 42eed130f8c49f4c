"""Attention (kind ``attention``): the contract, and multi-head attention on F.scaled_dot_product_attention.

An attention owns its decoding cache: :meth:`Attention.new_cache` returns an
object with ``reorder(index)`` (beam search), and the attention alone reads and
writes it. So a variant with another cache (grouped-query, multi-query, linear
attention) is one class in one file, and models never import a cache type.

``mha`` computes softmax(Q K^T / sqrt(d_head) + bias) V per head (Vaswani et
al. 2017) with one fused QKV projection for self-attention and a fused KV
projection for cross-attention. Masks:

* ``causal``   -- query i sees keys <= i (offset by the cache length when decoding);
* ``key_mask`` -- (B, T) bool, True at real tokens: padding is never attended to. A decoding
  cache keeps the mask of every position it holds, so a left-padded prompt's padding stays
  masked in every later step (which then passes no mask: its tokens are real);
* cross-attention -- keys and values come from ``memory`` (the encoder output).

``positions`` (B, T), when given, are the rows' own positions (a left-padded
batch), passed to the positional scheme; the causal mask is over cache slots,
which left padding does not change. A query whose every key is masked (a causal
pad before its row's first real token) attends to itself alone, so no NaN is
ever produced, even in padding that nothing reads; every other query is
untouched.

``gqa`` (Ainslie et al. 2023) shares each key/value head between n_heads /
n_kv_heads query heads; ``mqa`` (Shazeer 2019) is its one-key/value-head case.
Its cache holds only the n_kv_heads heads it computes (the point of GQA:
n_kv_heads / n_heads of MHA's cache memory). Every variant takes ``head_dim``
apart from d_model / n_heads (Gemma, some Llama-family checkpoints).

With no padding and no bias, the causal case goes to SDPA's ``is_causal`` fast
path (flash / memory-efficient kernels); otherwise one boolean or additive
mask is built.

Options every variant takes (``attention.<key>``, all off by default), the stability fixes and gates of
issue 52:

* ``qk_norm`` -- a registered norm (``rms``, ``layer`` ...) on queries and keys, before positions rotate them
  (Dehghani et al. 2023; Wortsman et al. 2023). ``qk_norm_scope=head`` normalises each head's d_head features
  with one gain shared by the heads (Qwen3, Gemma 3); ``full`` normalises all heads' features at once, one gain
  per feature (OLMo 2);
* ``logit_cap`` -- soft-capping of the scores, cap * tanh(s / cap), after the scale and before the mask
  (Gemma 2: 50.0); the scores are then computed explicitly, as no SDPA kernel caps them;
* ``gate`` -- each head's output multiplied, feature by feature, by sigmoid(x W_g) before the output
  projection (Qiu et al. 2025, "Gated Attention for Large Language Models", their G1 position);
* ``window`` -- sliding-window self-attention: a query sees the ``window`` latest positions, itself included
  (Mistral, Gemma 2), or those with |i - j| < window without a causal mask (Longformer's local attention).
  ``global_every=n`` keeps every n-th layer global (Gemma 2: 2, Gemma 3: 6); the stack numbers the layers
  (:attr:`Attention.layer_index`). A windowed layer decodes with a :class:`WindowKVCache` that holds the
  window - 1 latest positions, bounded whatever the length generated.
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.components import linear_flops
from modforge.registry import ConfigError, build, register


class Attention(nn.Module):
    """Base class of kind ``attention``: built as ``cls(cfg, d_model, n_heads, cross=False)`` (plus ``head_dim=``
    when the model sets one apart from d_model / n_heads).

    Called as ``attn(x, pos=, causal=, key_mask=, memory=, cache=, positions=)`` on (B, T, d_model):
    self-attention (``pos`` is the stack's positional scheme: ``pos.rotate`` for
    queries and keys, ``pos.attn_bias`` as an additive bias), or cross-attention
    over ``memory`` when built with ``cross=True``. ``key_mask`` (B, Tk) is True
    at real keys. ``cache`` is what :meth:`new_cache` returned, or None. ``positions`` (B, T) are per-row
    positions for ``pos`` (None: offset + 0..T-1 in every row); passed only when given. ``documents`` (B, T),
    passed only when given (packed training sequences, no cache), numbers each token's document: a query attends
    to keys of its own document alone. An attention that takes it sets :attr:`masks_documents`.
    """

    masks_documents = False  # True: forward takes documents= (task.document_mask needs it)

    score_scale: Optional[float] = None  # SDPA's scale= (None: its own 1/sqrt(d_head)); set by a parametrisation
    scales_scores = False  # True: forward passes score_scale to SDPA (param=mup needs it to change the scale)
    layer_index = 0  # this layer's place in its stack, counted from 0 (set by the stack; options may depend on it)

    def flops(self, n_q: int, n_kv: int) -> int:
        """Forward multiply-add FLOPs (2 per multiply-add) for one sequence: ``n_q`` queries over ``n_kv`` keys.
        Default: every Linear of the layer on each query (a cross-attention's key/value Linears run on the
        ``n_kv`` memory positions instead: override), plus scores and values over the full n_q x n_kv matrix."""
        return n_q * linear_flops(self) + 4 * n_q * n_kv * _query_width(self)

    def new_cache(self, capacity: int):
        """A fresh decoding cache for this layer, holding up to ``capacity`` positions.

        It must have ``reorder(index)``, which keeps the batch rows ``index`` (beam search)."""
        raise NotImplementedError(f"{type(self).__name__} has no decoding cache")


def head_width(d_model: int, n_heads: int, head_dim: Optional[int]) -> int:
    """A head's width: ``head_dim`` when the model sets one, else d_model / n_heads (which must divide)."""
    if head_dim is None and d_model % n_heads:
        raise ConfigError(f"model.d_model={d_model} must be divisible by model.n_heads={n_heads} "
                          "(or set model.head_dim)")
    return head_dim or d_model // n_heads


def _query_width(attn: nn.Module) -> int:
    return getattr(attn, "n_heads", 1) * getattr(attn, "d_head", 0)


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
        self.real: Optional[torch.Tensor] = None  # (B, capacity) bool, True at real keys; None: all real so far
        self._spare: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # beam search's second buffer

    def append(self, k: torch.Tensor, v: torch.Tensor, real: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Append T positions (k, v: (B, H, T, D); ``real`` (B, T) True at real tokens, None: all real) ->
        every key, value and key mask held so far (the mask None while no padding was ever appended)."""
        B, H, T, D = k.shape
        if self.k is None:  # (values may have their own heads and width: a latent cache's, attention=mla)
            self.k = k.new_empty(B, H, self.capacity, D)
            self.v = v.new_empty(B, v.shape[1], self.capacity, v.shape[-1])
        if self.length + T > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {T} > capacity {self.capacity} (model.max_len)")
        end = self.length + T
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        if real is not None and self.real is None:
            self.real = torch.ones(B, self.capacity, dtype=torch.bool, device=k.device)
        if self.real is not None:
            self.real[:, self.length : end] = True if real is None else real
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end], (self.real[:, :end] if self.real is not None else None)

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
        if self.real is not None:
            self.real = self.real.index_select(0, index)
        n = self.length
        if n == self.k.shape[2]:  # full, or a cross-attention cache: no room to keep
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            self._spare = None
            return
        shapes = ((index.numel(), *self.k.shape[1:]), (index.numel(), *self.v.shape[1:]))  # (a latent cache's
        if self._spare is None or (self._spare[0].shape, self._spare[1].shape) != shapes:  # values: their own shape)
            self._spare = (self.k.new_empty(shapes[0]), self.v.new_empty(shapes[1]))
        k, v = self._spare
        torch.index_select(self.k[:, :, :n], 0, index, out=k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=v[:, :, :n])
        self._spare = (self.k, self.v) if (self.k.shape, self.v.shape) == shapes else None
        self.k, self.v = k, v


def build_mask(
    B: int, tq: int, tk: int, *, causal: bool, offset: int, key_mask: Optional[torch.Tensor],
    bias: Optional[torch.Tensor], device: torch.device, dtype: torch.dtype, window: Optional[int] = None,
    key_pos: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """One SDPA mask combining causal, sliding-window, key-padding, document and additive bias; True/0 = attend.

    ``documents`` (B, T) numbers each token's document (packed training sequences, no cache): a query sees only
    keys of its own document, a block-diagonal mask (each query sees itself, so none is left without a key).

    Queries are at positions offset .. offset + tq - 1; keys at ``key_pos`` (tk,) (None: 0 .. tk - 1, every
    position so far, as a full cache holds them; a window cache holds only its latest)."""
    allowed = None
    q_pos = torch.arange(offset, offset + tq, device=device)[:, None]
    k_pos = (torch.arange(tk, device=device) if key_pos is None else key_pos)[None, :]
    if causal:
        allowed = k_pos <= q_pos
    if window is not None:
        near = (q_pos - k_pos < window) if causal else ((q_pos - k_pos).abs() < window)
        allowed = near if allowed is None else allowed & near
    if allowed is not None:
        allowed = allowed[None, None]  # (1,1,tq,tk)
    if documents is not None:
        if tq != tk or offset:
            raise ValueError("documents= masks a whole packed sequence (no cache, no offset)")
        same = documents[:, None, :, None] == documents[:, None, None, :]  # (B,1,T,T)
        allowed = same if allowed is None else allowed & same
    if key_mask is not None:
        km = key_mask[:, None, None, :tk]  # (B,1,1,tk)
        if allowed is None:
            allowed = km
        else:  # causal and padded: a pad before its row's first real token would see no key at all
            allowed = allowed & km
            own = k_pos == q_pos
            allowed = allowed | (own & ~allowed.any(-1, keepdim=True))  # such a query sees itself (never NaN)
    if bias is None:
        return allowed
    if key_pos is not None:  # the bias's columns are every position so far; keep those of the keys held
        bias = bias.index_select(-1, key_pos)
    bias = bias.to(dtype)[None] if bias.dim() == 3 else bias.to(dtype)
    if allowed is None:
        return bias
    return bias.masked_fill(~allowed, float("-inf"))


def check_qk_norm(spec: Any) -> None:
    """``attention.qk_norm``: a registered norm that works token by token, by name or as a mapping with ``name``."""
    from modforge.registry import registry  # (the norms are registered by the time a config is made)

    norms = registry("norm")
    name = spec.get("name") if hasattr(spec, "get") else spec
    if not isinstance(name, str) or name not in norms.names():
        raise ConfigError(f"attention.qk_norm={spec!r}: not a registered norm (one of {', '.join(norms.names())}), "
                          "by name or as {name: rms, eps: 1e-6}; or null")
    if not getattr(norms.get(name).cls, "per_token", True):
        raise ConfigError(f"attention.qk_norm={name}: a norm of queries and keys must work token by token (this one "
                          "normalises by the batch's statistics); use rms or layer")
    try:  # its own keys, now (a tiny one: its config is checked as it is built)
        build("norm", spec, 2)
    except ConfigError as e:
        raise ConfigError(f"attention.qk_norm={spec!r}: {e}") from None


class WindowKVCache:
    """The decoding cache of a sliding-window layer: the keys and values of the ``window`` - 1 latest positions
    (all a later query can see besides itself), so its memory is bounded whatever the length decoded.

    ``length`` counts every position appended (the next query's position); :meth:`append` returns the keys held
    plus the new ones with their positions (``key_pos``), for the mask, then keeps the latest ``window`` - 1."""

    def __init__(self, window: int, capacity: int):
        self.window, self.capacity = window, capacity
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None
        self.real: Optional[torch.Tensor] = None  # (B, held) bool, True at real keys; None: all real so far
        self.length = 0
        self.pos: Optional[torch.Tensor] = None  # (held,) the positions of the keys held

    def append(self, k: torch.Tensor, v: torch.Tensor, real: Optional[torch.Tensor] = None):
        """k, v (B, H, T, D) at positions length .. length + T - 1 -> (keys, values, key mask or None, key_pos)."""
        B, H, T, D = k.shape
        if self.length + T > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {T} > capacity {self.capacity} (model.max_len)")
        new_pos = torch.arange(self.length, self.length + T, device=k.device)
        if self.k is None:
            self.k, self.v = k.new_empty(B, H, 0, D), v.new_empty(B, v.shape[1], 0, v.shape[-1])
            self.pos = new_pos[:0]
        if real is not None and self.real is None:
            self.real = torch.ones(B, self.k.shape[2], dtype=torch.bool, device=k.device)
        keys, values = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
        key_pos = torch.cat([self.pos, new_pos])
        mask = None
        if self.real is not None:
            mask = torch.cat([self.real, real if real is not None else
                              torch.ones(B, T, dtype=torch.bool, device=k.device)], 1)
        keep = max(self.window - 1, 0)
        start = max(keys.shape[2] - keep, 0)
        self.k, self.v, self.pos = keys[:, :, start:], values[:, :, start:], key_pos[start:]
        self.real = mask[:, start:] if mask is not None else None
        self.length += T
        return keys, values, mask, key_pos

    def reorder(self, index: torch.Tensor) -> None:
        if self.k is None:
            return
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        if self.real is not None:
            self.real = self.real.index_select(0, index)


def soft_capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], *,
                          scale: float, cap: float, dropout: float) -> torch.Tensor:
    """softmax(cap * tanh(q k^T scale / cap) + mask) v, the scores computed explicitly (Gemma 2's order: scale,
    cap, then mask); grouped key/value heads each serve their group of query heads."""
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scores = (q @ k.transpose(-2, -1)).float() * scale
    scores = cap * torch.tanh(scores / cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    p = scores.softmax(-1).to(v.dtype)
    if dropout > 0:
        p = F.dropout(p, dropout)
    return p @ v


@register("attention", "mha")
class MultiHeadAttention(Attention):
    """Multi-head scaled dot-product attention (self or cross), cached in a preallocated :class:`KVCache`.

    Queries, keys and values come from one fused projection (keys and values from one, in cross-attention);
    :meth:`kv_heads` is how many key/value heads it computes (all ``n_heads`` here; fewer in ``gqa``)."""

    masks_documents = True

    param_roles = {"qkv.weight": "hidden", "q.weight": "hidden", "kv.weight": "hidden", "out.weight": "hidden",
                   "gate.weight": "hidden", "*.bias": "vector"}
    scales_scores = True

    @dataclass
    class Config:
        bias: bool = True  # biases on the projections
        dropout: float = 0.0  # on the attention probabilities
        qk_norm: Any = None  # a registered norm on queries and keys, by name or {name: rms, eps: ...}; null: none
        qk_norm_scope: str = "head"  # head: over each head's features, one gain for all heads; full: all heads'
        logit_cap: Optional[float] = None  # scores soft-capped at cap * tanh(s / cap) (Gemma 2: 50.0); null: none
        gate: bool = False  # each head's output x sigmoid(x W_g), feature by feature (Qiu et al. 2025, G1)
        window: Optional[int] = None  # sliding window: the latest `window` positions, itself included; null: all
        global_every: int = 0  # with a window: every n-th layer (n, 2n ...) attends globally (Gemma 2: 2); 0: none

        def __post_init__(self):
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"attention.dropout={self.dropout}: must be in [0, 1)")
            if self.qk_norm_scope not in ("head", "full"):
                raise ConfigError(f"attention.qk_norm_scope={self.qk_norm_scope!r}: must be head (each head's "
                                  "features, one gain shared by the heads) or full (all heads' features at once)")
            if self.logit_cap is not None and not self.logit_cap > 0:
                raise ConfigError(f"attention.logit_cap={self.logit_cap}: must be > 0 (Gemma 2: 50.0), or null")
            if self.window is not None and self.window < 1:
                raise ConfigError(f"attention.window={self.window}: must be >= 1 (positions a query sees, itself "
                                  "included), or null (every position)")
            if self.global_every < 0 or (self.global_every and self.window is None):
                raise ConfigError(f"attention.global_every={self.global_every}: must be >= 0, and > 0 only with "
                                  "attention.window set (it keeps every n-th layer global)")
            if self.qk_norm is not None:
                check_qk_norm(self.qk_norm)

    def __init__(self, cfg: Config, d_model: int, n_heads: int, *, cross: bool = False,
                 head_dim: Optional[int] = None):
        super().__init__()
        self.n_heads, self.d_head, self.cross = n_heads, head_width(d_model, n_heads, head_dim), cross
        self.n_kv = self.kv_heads(cfg, n_heads)
        self.dropout = cfg.dropout
        q_dim, kv_dim = n_heads * self.d_head, self.n_kv * self.d_head
        if cross:
            self.q = nn.Linear(d_model, q_dim, bias=cfg.bias)
            self.kv = nn.Linear(d_model, 2 * kv_dim, bias=cfg.bias)
        else:
            self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=cfg.bias)
        self.out = nn.Linear(q_dim, d_model, bias=cfg.bias)
        self.out.residual_out = True  # writes into the residual stream (scaled init, see models.blocks)
        self.gate = nn.Linear(d_model, q_dim, bias=cfg.bias) if cfg.gate else None
        self.q_norm = self.k_norm = None
        if cfg.qk_norm is not None:
            head = cfg.qk_norm_scope == "head"
            self.q_norm = build("norm", cfg.qk_norm, self.d_head if head else q_dim)
            self.k_norm = build("norm", cfg.qk_norm, self.d_head if head else kv_dim)
        self.qk_norm_full = cfg.qk_norm is not None and cfg.qk_norm_scope == "full"
        self.logit_cap, self.window, self.global_every = cfg.logit_cap, cfg.window, cfg.global_every

    def kv_heads(self, cfg, n_heads: int) -> int:
        return n_heads

    @property
    def windowed(self) -> bool:
        """Does this layer attend within its window (a window is set, it is self-attention, and its place in the
        stack is not one that ``global_every`` keeps global)?"""
        return (self.window is not None and not self.cross
                and not (self.global_every and (self.layer_index + 1) % self.global_every == 0))

    def flops(self, n_q: int, n_kv: int) -> int:
        """Projections at their real lengths (a cross-attention's keys and values: the ``n_kv`` memory
        positions), then q·k and p·v as SDPA computes them: the whole n_q x n_kv matrix per head (causal too;
        grouped key/value heads are shared, so the work is that of n_heads query heads)."""
        d = self.out.out_features
        q_dim, kv_dim = self.n_heads * self.d_head, self.n_kv * self.d_head
        proj = 2 * n_q * d * q_dim + 2 * n_kv * d * 2 * kv_dim if self.cross else 2 * n_q * d * (q_dim + 2 * kv_dim)
        gate = 2 * n_q * d * q_dim if self.gate is not None else 0
        return proj + gate + 2 * n_q * q_dim * d + 4 * n_q * n_kv * q_dim

    def new_cache(self, capacity: int):
        return WindowKVCache(self.window, capacity) if self.windowed else KVCache(capacity)

    def _split(self, t: torch.Tensor, *heads: int) -> list[torch.Tensor]:
        """(B, T, sum(heads) * d_head) -> one (B, h, T, d_head) tensor per entry of ``heads``."""
        B, T, _ = t.shape
        return list(t.view(B, T, -1, self.d_head).transpose(1, 2).split(list(heads), dim=1))

    def forward(
        self,
        x: torch.Tensor,
        *,
        pos=None,
        causal: bool = False,
        key_mask: Optional[torch.Tensor] = None,
        memory: Optional[torch.Tensor] = None,
        cache: Optional[KVCache] = None,
        positions: Optional[torch.Tensor] = None,
        documents: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        H, Hkv = self.n_heads, self.n_kv
        offset = 0
        bias = None
        key_pos = None
        full = self.qk_norm_full
        if self.cross:
            qx = self.q(x)
            q = self._split(self.q_norm(qx) if full else qx, H)[0]
            if self.q_norm is not None and not full:
                q = self.q_norm(q)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v  # (normalised before they were cached)
            else:
                kv = self.kv(memory)
                if full:
                    k_lin, v_lin = kv.chunk(2, -1)
                    kv = torch.cat([self.k_norm(k_lin), v_lin], -1)
                k, v = self._split(kv, Hkv, Hkv)
                if self.k_norm is not None and not full:
                    k = self.k_norm(k)
                if cache is not None:
                    cache.set(k, v)
        else:
            qkv = self.qkv(x)
            if cache is not None:
                offset = cache.length
            if full:
                q_lin, k_lin, v_lin = qkv.split([H * self.d_head, Hkv * self.d_head, Hkv * self.d_head], -1)
                qkv = torch.cat([self.q_norm(q_lin), self.k_norm(k_lin), v_lin], -1)
            plain = H == Hkv and self.q_norm is None
            if plain:  # one view (3, B, H, T, d): queries and keys rotated in one call when no gradient
                qkv = qkv.view(B, T, 3, H, self.d_head).permute(2, 0, 3, 1, 4)
                q, k, v = qkv.unbind(0)
            else:
                q, k, v = self._split(qkv, H, Hkv, Hkv)
                if self.q_norm is not None and not full:
                    q, k = self.q_norm(q), self.k_norm(k)
            if pos is not None:
                at = {} if positions is None else {"positions": positions}
                if plain and not torch.is_grad_enabled():  # (with grad: the backward of a slice zero-fills a copy)
                    q, k = pos.rotate(qkv[:2], offset, **at).unbind(0)
                else:
                    q, k = pos.rotate(q, offset, **at), pos.rotate(k, offset, **at)
                bias = pos.attn_bias(T, offset + T, offset)
            if cache is not None:
                if isinstance(cache, WindowKVCache):
                    k, v, key_mask, key_pos = cache.append(k, v, key_mask)
                else:
                    k, v, key_mask = cache.append(k, v, key_mask)
        tk = k.shape[-2]
        dropout = self.dropout if self.training else 0.0
        gqa = {"enable_gqa": True} if Hkv != H else {}
        window = self.window if self.windowed else None
        if (key_mask is None and bias is None and window is None and self.logit_cap is None and documents is None
                and (not causal or offset == 0 or T == 1)):
            # fast path: SDPA's own causal flag (top-left aligned, exact when offset == 0;
            # a single cached query sees every key, so no mask at all)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal and T > 1,
                                               scale=self.score_scale, **gqa)
        else:
            mask = build_mask(B, T, tk, causal=causal, offset=offset, key_mask=key_mask, bias=bias,
                              device=x.device, dtype=q.dtype, window=window, key_pos=key_pos, documents=documents)
            if self.logit_cap is not None:
                scale = self.score_scale if self.score_scale is not None else self.d_head ** -0.5
                y = soft_capped_attention(q, k, v, mask, scale=scale, cap=self.logit_cap, dropout=dropout)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                   scale=self.score_scale, **gqa)
        y = y.transpose(1, 2).reshape(B, T, H * self.d_head)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))
        return self.out(y)


@dataclass
class GroupedConfig(MultiHeadAttention.Config):
    n_kv_heads: int = 2  # key/value heads, each shared by n_heads / n_kv_heads query heads

    def __post_init__(self):
        super().__post_init__()
        if self.n_kv_heads < 1:
            raise ConfigError(f"attention.n_kv_heads={self.n_kv_heads}: must be >= 1")

    def check(self, run: dict) -> list:
        heads = (run.get("model") or {}).get("n_heads")
        if isinstance(heads, int) and heads % self.n_kv_heads:
            raise ConfigError(f"attention.n_kv_heads={self.n_kv_heads}: must divide model.n_heads={heads} (each "
                              "key/value head is shared by the same number of query heads)")
        return []


@dataclass
class MultiQueryConfig(GroupedConfig):
    n_kv_heads: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.n_kv_heads != 1:
            raise ConfigError(f"attention.n_kv_heads={self.n_kv_heads}: attention=mqa has one key/value head; "
                              "for more, use attention=gqa")


@register("attention", "gqa", config=GroupedConfig)
@register("attention", "mqa", config=MultiQueryConfig)
class GroupedQueryAttention(MultiHeadAttention):
    """Grouped-query attention: ``n_kv_heads`` key/value heads, each serving a group of n_heads / n_kv_heads
    query heads (SDPA's ``enable_gqa``: the shared heads are never copied out). ``mqa``: one key/value head.
    Its cache holds the n_kv_heads heads only. With n_kv_heads == n_heads it computes what ``mha`` does."""

    def kv_heads(self, cfg: GroupedConfig, n_heads: int) -> int:
        if n_heads % cfg.n_kv_heads:
            raise ConfigError(f"attention.n_kv_heads={cfg.n_kv_heads} must divide model.n_heads={n_heads}")
        return cfg.n_kv_heads
