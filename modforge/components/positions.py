"""Positional schemes (kind ``pos``): ``sinusoidal``, ``learned``, ``rope``, ``none``.

A scheme can act at three places, and implements only the hooks it needs; the
model calls all three and never asks which scheme it has:

* ``embed(x, offset)``   -- added to the token embeddings (sinusoidal, learned);
* ``rotate(t, offset)``  -- applied to queries and keys of self-attention (RoPE): t is
                           (B, H, T, d_head), or both stacked (2, B, H, T, d_head), so act on
                           the last two dimensions;
* ``attn_bias(tq, tk, offset)`` -- an additive (H, tq, tk) attention bias (ALiBi-style).

``offset`` is the position of the first token of ``x``/``t``: non-zero when
decoding with a KV cache. One scheme instance is shared by all layers of a stack.

``extend(n)`` lets a trained model run sequences longer than ``model.max_len``
(evaluation at another length, ``eval_block_sizes``): a scheme that is a
function of position rebuilds its tables; one that learned a row per position
cannot, and says why (:class:`LengthNotSupported`).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from modforge.registry import ConfigError, ModforgeError, declare, register


class LengthNotSupported(ModforgeError):
    """A positional scheme cannot run sequences longer than those it was built (and trained) for."""


class PositionalScheme(nn.Module):
    """Base class of kind ``pos``: built as ``cls(cfg, d_model, n_heads, max_len)``; every hook is the identity."""

    def __init__(self, cfg, d_model: int, n_heads: int, max_len: int):
        super().__init__()
        self.d_model, self.n_heads, self.max_len = d_model, n_heads, max_len

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x

    def rotate(self, t: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return t

    def attn_bias(self, tq: int, tk: int, offset: int = 0) -> Optional[torch.Tensor]:
        return None

    def check_length(self, end: int) -> None:
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds model.max_len={self.max_len}")

    def extend(self, n: int) -> None:
        """Run sequences of up to ``n`` positions from now on (no change when ``n <= max_len``); a scheme with
        tables rebuilds them in :meth:`build`, one that cannot raises :class:`LengthNotSupported`."""
        if n > self.max_len:
            self.build(n)
            self.max_len = n

    def build(self, n: int) -> None:
        """(Re)build what the scheme holds for ``n`` positions (nothing, here)."""


declare("pos", "positional scheme (embedding, rotation or attention bias)", base=PositionalScheme,
        default="learned", part=True)


@register("pos", "none")
class NoPositions(PositionalScheme):
    """No positional information (NoPE; a causal mask still breaks symmetry)."""


def sinusoid_table(n: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv[: d // 2])
    return pe.float()


@register("pos", "sinusoidal")
class Sinusoidal(PositionalScheme):
    """Fixed sinusoidal table added to the embeddings (Vaswani et al. 2017)."""

    @dataclass
    class Config:
        base: float = 10000.0

    def __init__(self, cfg: Config, d_model: int, n_heads: int, max_len: int):
        super().__init__(cfg, d_model, n_heads, max_len)
        self.base = cfg.base
        self.build(max_len)

    def build(self, n: int) -> None:
        old = getattr(self, "pe", None)
        pe = sinusoid_table(n, self.d_model, self.base)
        self.register_buffer("pe", pe if old is None else pe.to(old), persistent=False)  # old's device, dtype

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        self.check_length(offset + x.shape[1])
        return x + self.pe[offset : offset + x.shape[1]].to(x.dtype)


@register("pos", "learned")
class Learned(PositionalScheme):
    """A trained embedding per position (BERT, GPT-2)."""

    def __init__(self, cfg, d_model: int, n_heads: int, max_len: int):
        super().__init__(cfg, d_model, n_heads, max_len)
        self.table = nn.Embedding(max_len, d_model)

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        self.check_length(offset + x.shape[1])
        return x + self.table.weight[offset : offset + x.shape[1]]

    def build(self, n: int) -> None:
        raise LengthNotSupported(f"pos=learned has a trained row for each of its {self.max_len} positions "
                                 f"(model.max_len) and none for positions {self.max_len}..{n - 1}")


@register("pos", "rope")
class RoPE(PositionalScheme):
    """Rotary embeddings (Su et al. 2021): rotate q and k by angle pos * theta_i, theta_i = base^(-2i/d_head).

    ``pairing`` picks which dimensions form a rotated pair: ``interleaved``
    pairs (2k, 2k+1) as the paper, GPT-J and the reference 004 do;
    ``half`` pairs (k, k + d/2), the "rotate half" layout of GPT-NeoX and Llama
    checkpoints. The two are the same map up to a fixed permutation of head
    dimensions (see :func:`interleaved_to_half`).
    """

    @dataclass
    class Config:
        base: float = 10000.0
        pairing: str = "interleaved"  # interleaved | half

        def __post_init__(self):
            if self.pairing not in ("interleaved", "half"):
                raise ConfigError(f"pos.pairing={self.pairing!r}: allowed values are 'interleaved' and 'half'")

    def __init__(self, cfg: Config, d_model: int, n_heads: int, max_len: int):
        super().__init__(cfg, d_model, n_heads, max_len)
        hd = d_model // n_heads
        if hd % 2:
            raise ConfigError(f"pos=rope needs an even head dimension; got d_model/n_heads = {hd}")
        self.interleaved, self.base, self.head_dim = cfg.pairing == "interleaved", cfg.base, hd
        self.build(max_len)

    def build(self, n: int) -> None:
        hd, old = self.head_dim, getattr(self, "cos", None)
        inv = self.base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv  # (n, hd/2)
        cos, sin = ang.cos(), ang.sin()
        # laid out per head dimension, sin signed, so that rotate is t * cos + swap(t) * sin: each
        # pair (a, b) -> (a cos - b sin, b cos + a sin), the same numbers as the pairwise formula, fewer ops
        if self.interleaved:
            cos, sin = cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2)
        else:
            cos, sin = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        cos, sin = cos.float(), sin.float()
        if old is not None:  # rebuilt longer: on the model's device, in its dtype
            cos, sin = cos.to(old), sin.to(old)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotate(self, t: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """t: (..., T, hd): queries or keys (B, H, T, hd), or both stacked."""
        T = t.shape[-2]
        self.check_length(offset + T)
        cos, sin = self.cos[offset : offset + T], self.sin[offset : offset + T]
        if cos.dtype != t.dtype:
            cos, sin = cos.to(t.dtype), sin.to(t.dtype)
        if self.interleaved:  # (a, b) -> (b, a) within each pair
            swapped = t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        else:  # (first half, second half) -> (second half, first half)
            x1, x2 = t.chunk(2, dim=-1)
            swapped = torch.cat((x2, x1), dim=-1)
        return t * cos + swapped * sin


def interleaved_to_half(hd: int) -> torch.Tensor:
    """Permutation p with rope_half(x[..., p]) == rope_interleaved(x)[..., p]: evens first, then odds."""
    return torch.cat((torch.arange(0, hd, 2), torch.arange(1, hd, 2)))


