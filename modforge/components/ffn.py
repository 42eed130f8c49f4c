"""Position-wise feed-forward blocks (kind ``ffn``).

Ungated (Vaswani et al. 2017): act(x W1 + b1) W2 + b2 -- options ``relu``,
``gelu`` and ``mlp`` (any activation, ``ffn.activation=``).

Gated, the GLU family (Shazeer 2020, "GLU Variants Improve Transformer"):
(act(x W) * (x V)) W2 with no biases -- ``glu`` (sigmoid), ``reglu`` (relu),
``swiglu`` (silu), ``geglu`` (gelu). A gated FFN has three matrices instead of
two, so with ``match_params: true`` (the default) its hidden width is
round(2/3 * d_ff): the same parameter count as the ungated FFN at d_ff, as in
the paper's comparison. Set ``ffn.match_params=false`` for the unshrunk
(x-transformers style, ~1.5x larger) variant.
"""
import math
from dataclasses import dataclass

import torch
from torch import nn

from modforge.components import linear_flops
from modforge.registry import build, register


class FFN(nn.Module):
    """Base class of kind ``ffn``: built as ``cls(cfg, d_model, d_ff)``, called as ``ffn(x)`` on (B, T, d_model).

    ``hidden`` is the width actually used (a gated FFN may shrink ``d_ff``);
    the run summary prints it. Mark the Linear that writes into the residual
    stream ``residual_out = True`` to give it GPT-2's scaled initialisation.
    """

    hidden: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def flops_per_token(self) -> int:
        """Forward FLOPs per position: 2 * in * out for each of its Linear layers (override for other work)."""
        return linear_flops(self)

    def unit_scale(self) -> float:
        """What makes the hidden activation that its ``residual_out`` matrix reads unit-scaled when every
        pre-activation is a unit Gaussian: 1 / its standard deviation (u-µP's per-op scale, ``param=umup``). An
        FFN that does not give it is refused under ``param=umup`` in one line."""
        raise NotImplementedError


def gaussian_moments(fn) -> tuple[float, float]:
    """(E f(z), E f(z)^2) for z ~ N(0, 1): the trapezoid rule on [-12, 12] in float64 (a kink, as ReLU's, costs
    it nothing; the tails beyond carry less than 1e-30 of the mass)."""
    z = torch.linspace(-12.0, 12.0, 48001, dtype=torch.float64)
    w = torch.exp(-0.5 * z * z) * ((z[1] - z[0]) / math.sqrt(2 * math.pi))
    w[0] *= 0.5
    w[-1] *= 0.5
    with torch.no_grad():
        y = fn(z).to(torch.float64)
    return float((w * y).sum()), float((w * y * y).sum())


@dataclass
class MLPConfig:
    activation: str = "gelu"
    bias: bool = True


@dataclass
class ReLUMLPConfig(MLPConfig):
    activation: str = "relu"


@dataclass
class GatedConfig:
    activation: str = "silu"
    bias: bool = False
    match_params: bool = True  # hidden = round(2/3 d_ff): same parameters as the ungated FFN


@register("ffn", "mlp", config=MLPConfig)
@register("ffn", "gelu", config=MLPConfig)
@register("ffn", "relu", config=ReLUMLPConfig)
class MLP(FFN):
    """act(x W1 + b1) W2 + b2"""

    param_roles = {"w1.weight": "hidden", "w2.weight": "hidden", "*.bias": "vector"}  # (modforge.models.param)

    def __init__(self, cfg: MLPConfig, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=cfg.bias)
        self.act = build("activation", cfg.activation)
        self.w2 = nn.Linear(d_ff, d_model, bias=cfg.bias)
        self.w2.residual_out = True  # writes into the residual stream (scaled init, see models.blocks)
        self.hidden = d_ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)))

    def unit_scale(self) -> float:
        """1 / sd of act(z), z ~ N(0, 1)."""
        mean, square = gaussian_moments(self.act)
        return 1.0 / math.sqrt(square - mean * mean)


def _gated(act: str) -> type:
    return dataclass(type(f"{act.title()}GatedConfig", (GatedConfig,), {"__annotations__": {"activation": str}, "activation": act}))


@register("ffn", "glu", config=_gated("sigmoid"))
@register("ffn", "reglu", config=_gated("relu"))
@register("ffn", "swiglu", config=_gated("silu"))
@register("ffn", "geglu", config=_gated("gelu"))
class GatedFFN(FFN):
    """(act(x W) * (x V)) W2"""

    param_roles = {"w_gate_up.weight": "hidden", "w2.weight": "hidden", "*.bias": "vector"}

    def __init__(self, cfg: GatedConfig, d_model: int, d_ff: int):
        super().__init__()
        hidden = max(1, round(2 * d_ff / 3)) if cfg.match_params else d_ff
        self.w_gate_up = nn.Linear(d_model, 2 * hidden, bias=cfg.bias)  # W and V fused
        self.act = build("activation", cfg.activation)
        self.w2 = nn.Linear(hidden, d_model, bias=cfg.bias)
        self.w2.residual_out = True
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w2(self.act(gate) * up)

    def unit_scale(self) -> float:
        """1 / sd of act(g) * u, g and u independent N(0, 1): 1 / sqrt(E act(g)^2) (the product's mean is 0)."""
        return 1.0 / math.sqrt(gaussian_moments(self.act)[1])
