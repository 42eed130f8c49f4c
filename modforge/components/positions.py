"""Positional schemes (kind ``pos``): ``sinusoidal``, ``learned``, ``rope``, ``none``.

A scheme can act at three places, and implements only the hooks it needs; the
model calls all three and never asks which scheme it has:

* ``embed(x, offset)``   -- added to the token embeddings (sinusoidal, learned);
* ``rotate(t, offset)``  -- applied to queries and keys of self-attention (RoPE): t is
                           (B, H, T, d_head), or both stacked (2, B, H, T, d_head), so act on
                           the last two dimensions;
* ``attn_bias(tq, tk, offset)`` -- an additive (H, tq, tk) attention bias (ALiBi-style).

``offset`` is the position of the first token of ``x``/``t``: non-zero when
decoding with a KV cache. ``positions`` (B, T), when given, is each row's own
positions instead (a left-padded batch: row b's first real token is at 0); the
model passes it only when it has one, so a scheme written for ``offset`` alone
keeps working. A relative bias needs no per-row positions: within a row, the
distance between two tokens is the same whatever that row's padding. One scheme
instance is shared by all layers of a stack.

Tables computed from a formula (sinusoidal, RoPE) are computed in float64 and
rounded once to the model's dtype, again whenever the model moves
(``model.double()`` gives float64 tables, not float32 ones widened).

``extend(n)`` lets a trained model run sequences longer than ``model.max_len``
(evaluation at another length, ``eval_block_sizes``): a scheme that is a
function of position rebuilds its tables; one that learned a row per position
cannot, and says why (:class:`LengthNotSupported`).
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from modforge.registry import ConfigError, ModforgeError, register, suggest


class LengthNotSupported(ModforgeError):
    """A positional scheme cannot run sequences longer than those it was built (and trained) for."""


class PositionalScheme(nn.Module):
    """Base class of kind ``pos``: built as ``cls(cfg, d_model, n_heads, max_len)`` (plus ``head_dim=`` when the
    model sets one apart from d_model / n_heads); every hook is the identity."""

    computed = False  # tables computed from a formula: rebuilt (in float64, rounded once) when the model moves

    def __init__(self, cfg, d_model: int, n_heads: int, max_len: int, head_dim: Optional[int] = None):
        super().__init__()
        self.d_model, self.n_heads, self.max_len = d_model, n_heads, max_len
        self.head_dim = head_dim or d_model // n_heads

    def embed(self, x: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x

    def rotate(self, t: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        return t

    def attn_bias(self, tq: int, tk: int, offset: int = 0) -> Optional[torch.Tensor]:
        return None

    def rows(self, table: torch.Tensor, offset: int, n: int, positions: Optional[torch.Tensor]) -> torch.Tensor:
        """``table``'s rows for ``n`` positions from ``offset`` (n, ...), or for each row's ``positions`` (B, n, ...)."""
        if positions is None:
            self.check_length(offset + n)
            return table[offset : offset + n]
        self.check_length(int(positions.max()) + 1 if positions.numel() else 0)
        return table[positions]

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

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.computed:  # .double(), .to(device): the formula again, in the new dtype, on the new device
            self.build(self.max_len)
        return self


@register("pos", "none")
class NoPositions(PositionalScheme):
    """No positional information (NoPE; a causal mask still breaks symmetry)."""


def check_base(base: float) -> None:
    """The wavelengths grow geometrically with ``base``: above 1, or every dimension turns at the same rate (or the
    angles grow instead of shrinking)."""
    if not base > 1:
        raise ConfigError(f"pos.base={base}: must be > 1 (the wavelengths are base^(2i/d); typical: 10000)")


def sinusoid_table(n: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv[: d // 2])
    return pe


@register("pos", "sinusoidal")
class Sinusoidal(PositionalScheme):
    """Fixed sinusoidal table added to the embeddings (Vaswani et al. 2017)."""

    @dataclass
    class Config:
        base: float = 10000.0

        def __post_init__(self):
            check_base(self.base)

    computed = True

    def __init__(self, cfg: Config, d_model: int, n_heads: int, max_len: int, head_dim: Optional[int] = None):
        super().__init__(cfg, d_model, n_heads, max_len, head_dim)
        self.base = cfg.base
        self.build(max_len)

    def build(self, n: int) -> None:
        old = getattr(self, "pe", None)
        pe = sinusoid_table(n, self.d_model, self.base)  # float64, rounded once to the table's dtype
        self.register_buffer("pe", pe.float() if old is None else pe.to(old), persistent=False)

    def embed(self, x: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x + self.rows(self.pe, offset, x.shape[1], positions).to(x.dtype)


@register("pos", "learned")
class Learned(PositionalScheme):
    """A trained embedding per position (BERT, GPT-2)."""

    param_roles = {"table.weight": "input"}

    def __init__(self, cfg, d_model: int, n_heads: int, max_len: int, head_dim: Optional[int] = None):
        super().__init__(cfg, d_model, n_heads, max_len, head_dim)
        self.table = nn.Embedding(max_len, d_model)

    def embed(self, x: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x + self.rows(self.table.weight, offset, x.shape[1], positions)

    def build(self, n: int) -> None:
        raise LengthNotSupported(f"pos=learned has a trained row for each of its {self.max_len} positions "
                                 f"(model.max_len) and none for positions {self.max_len}..{n - 1}")


# ----------------------------------------------------------------------------- RoPE and its scalings
# Each scaling maps (RoPE's config, the original length L, rotated dims, working dtype, the length of this call)
# to (inverse frequencies, attention factor); the formulas are those of the papers as Hugging Face's ``modeling_rope_utils`` computes them (tests
# compare both). ``seq_len`` matters only to ``dynamic``.


def _plain_inv(c, dim: int, dt: torch.dtype) -> torch.Tensor:
    """theta_i = base^(-2i/dim): Su et al. 2021."""
    return 1.0 / (c.base ** (torch.arange(0, dim, 2, dtype=dt) / dim))


def _none(c, L: int, dim: int, dt: torch.dtype, seq_len: Optional[int]):
    return _plain_inv(c, dim, dt), 1.0


def _linear(c, L: int, dim: int, dt: torch.dtype, seq_len: Optional[int]):
    """Position interpolation (Chen et al. 2023): every position divided by ``factor``."""
    return _plain_inv(c, dim, dt) / c.factor, 1.0


def _dynamic(c, L: int, dim: int, dt: torch.dtype, seq_len: Optional[int]):
    """Dynamic NTK (bloc97, 2023): past the original length L, base' = base (factor n / L - (factor - 1))^(d/(d-2))."""
    n = max(seq_len or 0, L)
    base = c.base * ((c.factor * n / L) - (c.factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=dt) / dim)), 1.0


def _llama3(c, L: int, dim: int, dt: torch.dtype, seq_len: Optional[int]):
    """Llama 3.1: wavelengths longer than L / low_freq_factor divided by ``factor``, shorter than
    L / high_freq_factor kept, a smooth blend between."""
    inv = _plain_inv(c, dim, dt)
    low, high = L / c.low_freq_factor, L / c.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low, inv / c.factor, inv)
    smooth = (L / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor)
    blended = (1 - smooth) * scaled / c.factor + smooth * scaled
    return torch.where(~(wavelen < high) * ~(wavelen > low), blended, scaled), 1.0


def _yarn(c, L: int, dim: int, dt: torch.dtype, seq_len: Optional[int]):
    """YaRN (Peng et al. 2023): interpolate the low frequencies, keep the high ones, a linear ramp between the
    dimensions that turn ``beta_slow`` and ``beta_fast`` times over L; cos and sin scaled by the attention factor
    (default 0.1 ln(factor) + 1)."""
    def corr_dim(rotations):
        return (dim * math.log(L / (rotations * 2 * math.pi))) / (2 * math.log(c.base))

    lo, hi = corr_dim(c.beta_fast), corr_dim(c.beta_slow)
    if c.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(dim // 2, dtype=dt) - lo) / (hi - lo)).clamp(0, 1)
    freqs = c.base ** (torch.arange(0, dim, 2, dtype=dt) / dim)
    keep = 1 - ramp  # 1: extrapolate (unchanged), 0: interpolate (divided by factor)
    inv = (1.0 / (c.factor * freqs)) * (1 - keep) + (1.0 / freqs) * keep
    factor = c.attention_factor if c.attention_factor is not None else (
        0.1 * math.log(c.factor) + 1.0 if c.factor > 1 else 1.0)
    return inv, factor


ROPE_SCALINGS = {"none": _none, "linear": _linear, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn}
_ANGLE_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@register("pos", "rope")
class RoPE(PositionalScheme):
    """Rotary embeddings (Su et al. 2021): rotate q and k by angle pos * theta_i, theta_i = base^(-2i/d_rot).

    ``pairing`` picks which dimensions form a rotated pair: ``interleaved``
    pairs (2k, 2k+1) as the paper, GPT-J and the reference 004 do;
    ``half`` pairs (k, k + d/2), the "rotate half" layout of GPT-NeoX and Llama
    checkpoints. The two are the same map up to a fixed permutation of head
    dimensions (see :func:`interleaved_to_half`).

    ``fraction`` < 1 rotates only the first round(fraction * head_dim) dimensions of each head and passes
    the rest through (partial rotary: GPT-NeoX's ``rotary_pct``, GPT-J's ``rotary_dim``).

    ``scaling`` stretches RoPE past the length it was trained at (``original_max_len``, default
    model.max_len): ``linear`` (position interpolation), ``dynamic`` (NTK-aware base, recomputed from the
    length of each call once it passes the original length), ``llama3`` (Llama 3.1's per-frequency blend),
    ``yarn`` (ramped interpolation and an attention factor on cos and sin); ``none`` is plain RoPE. Each
    is one entry of :data:`ROPE_SCALINGS`.

    ``angles`` is the precision the angles and their cos/sin are computed in: ``float64`` (default; the
    table is then rounded once to the model's dtype, so a float64 model has exact tables) or ``float32``,
    as Meta's Llama code and Hugging Face's ``LlamaRotaryEmbedding`` compute them whatever the model's dtype
    (a converted Llama checkpoint uses this, so that it computes what it was trained with).
    """

    computed = True

    @dataclass
    class Config:
        base: float = 10000.0
        pairing: str = "interleaved"  # interleaved | half
        fraction: float = 1.0  # of each head's dimensions that rotate (partial rotary)
        scaling: str = "none"  # none | linear | dynamic | llama3 | yarn
        factor: float = 1.0  # the scaling's factor (ignored by none)
        original_max_len: Optional[int] = None  # the length trained at, for llama3/yarn/dynamic (None: model.max_len)
        low_freq_factor: float = 1.0  # llama3
        high_freq_factor: float = 4.0  # llama3
        beta_fast: float = 32.0  # yarn
        beta_slow: float = 1.0  # yarn
        truncate: bool = True  # yarn: round the ramp's ends to whole dimensions
        attention_factor: Optional[float] = None  # yarn: scale of cos/sin (None: 0.1 ln(factor) + 1)
        angles: str = "float64"  # float64 | float32

        def __post_init__(self):
            check_base(self.base)
            allowed = {"pairing": ("interleaved", "half"), "scaling": tuple(ROPE_SCALINGS),
                       "angles": tuple(_ANGLE_DTYPES)}
            for key, values in allowed.items():
                if getattr(self, key) not in values:
                    raise ConfigError(f"pos.{key}={getattr(self, key)!r}{suggest(str(getattr(self, key)), values)} "
                                      f"Allowed: {', '.join(values)}.")
            if not 0.0 < self.fraction <= 1.0:
                raise ConfigError(f"pos.fraction={self.fraction}: must be in (0, 1] (the share of each head that rotates)")
            if self.scaling != "none" and not self.factor >= 1.0:
                raise ConfigError(f"pos.factor={self.factor}: pos.scaling={self.scaling} needs a factor >= 1")
            if self.low_freq_factor >= self.high_freq_factor:
                raise ConfigError(f"pos.low_freq_factor={self.low_freq_factor} must be below "
                                  f"pos.high_freq_factor={self.high_freq_factor}")

    def __init__(self, cfg: Config, d_model: int, n_heads: int, max_len: int, head_dim: Optional[int] = None):
        super().__init__(cfg, d_model, n_heads, max_len, head_dim)
        hd = self.head_dim
        rot = int(hd * cfg.fraction)
        rot -= rot % 2
        if rot < 2:
            raise ConfigError(f"pos=rope rotates pairs of dimensions: head dimension {hd} x pos.fraction="
                              f"{cfg.fraction} leaves {int(hd * cfg.fraction)} (need an even number >= 2)")
        self.cfg, self.rot_dim, self.interleaved = cfg, rot, cfg.pairing == "interleaved"
        self.original = cfg.original_max_len or max_len
        self.scale = ROPE_SCALINGS[cfg.scaling]
        self.dynamic = cfg.scaling == "dynamic"
        self.build(max_len)

    def tables(self, pos: torch.Tensor, seq_len: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) at positions ``pos`` (any shape), laid out per rotated dimension, sin signed, so that
        rotate is t * cos + swap(t) * sin: each pair (a, b) -> (a cos - b sin, b cos + a sin)."""
        dt = _ANGLE_DTYPES[self.cfg.angles]
        inv, att = self.scale(self.cfg, self.original, self.rot_dim, dt, seq_len)
        ang = pos.to(dt)[..., None] * inv  # (..., rot/2)
        cos, sin = ang.cos(), ang.sin()
        if att != 1.0:
            cos, sin = cos * att, sin * att
        if self.interleaved:
            return cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2)
        return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)

    def build(self, n: int) -> None:
        old = getattr(self, "cos", None)
        cos, sin = self.tables(torch.arange(n, device="cpu"))
        if old is not None:  # rebuilt (longer, or the model moved): on its device, in its dtype
            cos, sin = cos.to(old), sin.to(old)
        else:
            cos, sin = cos.float(), sin.float()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotate(self, t: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """t: (..., T, hd): queries or keys (B, H, T, hd), or both stacked; ``positions`` (B, T) per row."""
        T = t.shape[-2]
        end = offset + T if positions is None else (int(positions.max()) + 1 if positions.numel() else 0)
        if self.dynamic and end > self.original:  # NTK base of this length: computed for these positions
            self.check_length(end)
            pos = torch.arange(offset, offset + T, device=t.device) if positions is None else positions
            cos, sin = self.tables(pos, end)
        else:
            cos, sin = self.rows(self.cos, offset, T, positions), self.rows(self.sin, offset, T, positions)
        if positions is not None:  # (B, T, rot) -> (B, 1, T, rot): broadcast over heads
            cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
        if cos.dtype != t.dtype or cos.device != t.device:
            cos, sin = cos.to(t), sin.to(t)
        if self.rot_dim < t.shape[-1]:  # partial rotary: the rest of each head passes through
            return torch.cat((self._rotate(t[..., : self.rot_dim], cos, sin), t[..., self.rot_dim :]), -1)
        return self._rotate(t, cos, sin)

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.interleaved:  # (a, b) -> (b, a) within each pair
            swapped = t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        else:  # (first half, second half) -> (second half, first half)
            x1, x2 = t.chunk(2, dim=-1)
            swapped = torch.cat((x2, x1), dim=-1)
        return t * cos + swapped * sin


def interleaved_to_half(hd: int) -> torch.Tensor:
    """Permutation p with rope_half(x[..., p]) == rope_interleaved(x)[..., p]: evens first, then odds."""
    return torch.cat((torch.arange(0, hd, 2), torch.arange(1, hd, 2)))
