"""modforge-extras: an example modforge plugin.

Installing this package is all it takes; modforge finds it through the
``modforge.plugins`` entry point and imports this module before Hydra composes
the config. It registers:

* norm ``scale`` -- ScaleNorm (Nguyen & Salazar 2019): g * x / max(||x||, eps);
* norm ``dyt``   -- Dynamic Tanh (Zhu et al. 2025): weight * tanh(alpha * x) + bias;
* ffn  ``relu2`` -- squared ReLU (So et al. 2021, Primer): W2 relu(W1 x)^2;
* pos  ``alibi`` -- ALiBi (Press et al. 2022): a per-head linear attention bias;

and ships YAML (``experiment=extras_small``) through :data:`MODFORGE_CONFIG_DIR`.
Only modforge's public API is used: :func:`modforge.register`,
:class:`modforge.ConfigError` and the base classes of the kinds it extends
(:class:`~modforge.components.norms.Norm`, :class:`~modforge.components.ffn.FFN`,
:class:`~modforge.components.positions.PositionalScheme`).
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge import ConfigError, register
from modforge.components.ffn import FFN
from modforge.components.norms import Norm
from modforge.components.positions import PositionalScheme

__version__ = "0.1.0"

# Hydra search-path entry for this package's YAML (experiment=extras_small, ...).
MODFORGE_CONFIG_DIR = "pkg://modforge_extras.conf"

__all__ = ["ScaleNorm", "DynamicTanh", "SquaredReLUFFN", "ALiBi", "alibi_slopes", "MODFORGE_CONFIG_DIR"]


# --------------------------------------------------------------------------- norms


@register("norm", "scale")
class ScaleNorm(Norm):
    """ScaleNorm (Nguyen & Salazar 2019): g * x / max(||x||_2, eps), one learned scalar g (init sqrt(d))."""

    @dataclass
    class Config:
        eps: float = 1e-5
        g_init: Optional[float] = None  # None: sqrt(d_model), as in the paper

        def __post_init__(self):
            if not self.eps > 0:
                raise ConfigError(f"norm.eps={self.eps}: must be > 0 (the floor of the norm in the denominator)")

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.eps = cfg.eps
        self.g = nn.Parameter(torch.tensor(float(cfg.g_init if cfg.g_init is not None else math.sqrt(d_model))))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        xf = x.float()
        norm = xf.norm(dim=-1, keepdim=True).clamp_min(self.eps)
        return (self.g * xf / norm).type_as(x)


@register("norm", "dyt")
class DynamicTanh(Norm):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): weight * tanh(alpha * x) + bias.

    ``alpha`` is one learned scalar (init ``alpha_init``, 0.5 in the paper's
    default); ``weight`` and ``bias`` are per-channel, init 1 and 0.
    """

    # roles under param=mup (modforge.models.param): alpha is one width-independent scalar
    param_roles = {"alpha": "vector", "weight": "vector", "bias": "vector"}

    @dataclass
    class Config:
        alpha_init: float = 0.5
        bias: bool = True

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(cfg.alpha_init)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if cfg.bias else None

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y + self.bias if self.bias is not None else y


# --------------------------------------------------------------------------- ffn


@register("ffn", "relu2")
class SquaredReLUFFN(FFN):
    """Squared-ReLU FFN (So et al. 2021, Primer): W2 relu(W1 x)^2 (no biases by default)."""

    param_roles = {"w1.weight": "hidden", "w2.weight": "hidden", "*.bias": "vector"}  # (param=mup)

    @dataclass
    class Config:
        bias: bool = False

    def __init__(self, cfg: Config, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=cfg.bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=cfg.bias)
        self.hidden = d_ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.relu(self.w1(x)).square())


# --------------------------------------------------------------------------- positions


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes of ALiBi (Press et al. 2022, and their reference code).

    For a power of two H: the geometric sequence 2^(-8h/H), h = 1..H. Otherwise
    the slopes of the closest smaller power of two P, followed by every other
    slope of 2P (the paper's interpolation), taking the first H - P of those.
    """
    if n_heads < 1:
        raise ConfigError(f"ALiBi needs at least one head; got n_heads={n_heads}")

    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if n_heads & (n_heads - 1) == 0:
        return power_of_2(n_heads)
    p = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: n_heads - p]


@register("pos", "alibi")
class ALiBi(PositionalScheme):
    """ALiBi (Press et al. 2022): no position embedding; each head h adds -slope_h * |i - j| to the
    attention score of query i and key j.

    In causal attention only keys j <= i are seen, where this is the paper's
    -slope_h * (i - j); in bidirectional attention (encoders) it is the
    symmetric -slope_h * |i - j|. Query positions start at ``offset`` (the KV
    cache length), key positions at 0, so cached decoding sees the same bias as
    a full forward pass. Positions are not limited to ``max_len`` (ALiBi
    extrapolates), though a KV cache still is.
    """

    @dataclass
    class Config:
        def check(self, run: dict) -> list:
            """A plugin's own rule against the rest of the run (docs/plugins.md, "Checks"): one-line refusals
            are raised as ConfigError, notes returned. With one head ALiBi is one recency slope, 2^-8."""
            heads = (run.get("model") or {}).get("n_heads")
            if heads == 1:
                return ["pos=alibi with model.n_heads=1: the one head gets the slope 2^-8, the gentlest of ALiBi's "
                        "set (a bias of -0.25 across 64 positions); its heads span near and far only with several "
                        "(the paper used 8 or more)"]
            return []

    def __init__(self, cfg, d_model: int, n_heads: int, max_len: int):
        super().__init__(cfg, d_model, n_heads, max_len)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads), dtype=torch.float32), persistent=False)

    def attn_bias(self, tq: int, tk: int, offset: int = 0) -> torch.Tensor:
        """(H, tq, tk) float32 bias for queries at positions offset..offset+tq-1 and keys at 0..tk-1."""
        dev = self.slopes.device
        q_pos = torch.arange(offset, offset + tq, device=dev, dtype=torch.float32)
        k_pos = torch.arange(tk, device=dev, dtype=torch.float32)
        dist = (q_pos[:, None] - k_pos[None, :]).abs()
        return -self.slopes[:, None, None] * dist
