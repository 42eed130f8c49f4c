"""Element-wise activations (kind ``activation``), used by the feed-forward blocks.

Each is a module with no parameters. ``gelu`` is the exact x * Phi(x);
``gelu_tanh`` the tanh approximation (GPT-2, BERT's original code); they differ
by up to ~1e-3 in absolute value.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modforge.registry import register


class Activation(nn.Module):
    """Base class of kind ``activation``: built as ``cls(cfg)``, applied element-wise as ``act(x)``."""

    def __init__(self, cfg=None):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register("activation", "relu")
class ReLU(Activation):
    """max(0, x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


@register("activation", "gelu")
class GELU(Activation):
    """x * Phi(x), exact (erf)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


@register("activation", "gelu_tanh")
class GELUTanh(Activation):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


@register("activation", "silu")
class SiLU(Activation):
    """Swish / SiLU: x * sigmoid(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


@register("activation", "tanh")
class Tanh(Activation):
    """tanh(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


@register("activation", "sigmoid")
class Sigmoid(Activation):
    """1 / (1 + exp(-x))"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


@register("activation", "leaky_relu")
class LeakyReLU(Activation):
    """max(x, negative_slope * x)"""

    @dataclass
    class Config:
        negative_slope: float = 0.01

    def __init__(self, cfg: Config):
        super().__init__()
        self.negative_slope = cfg.negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.negative_slope)
