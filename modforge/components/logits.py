"""What the head's scores become (kind ``logits``), for the loss, the metrics and sampling alike.

* ``plain``   -- the head's output as it is (every model before Gemma 2);
* ``softcap`` -- cap * tanh(z / cap), each logit held inside (-cap, cap) (Gemma 2's final-logit soft-capping,
  cap 30.0; Gemma Team 2024, §2): a bound on how confident the model can be, against logit drift late in
  training (Wortsman et al. 2023 study z-loss for the same drift; ``task.z_loss``).
"""
from dataclasses import dataclass

import torch
from torch import nn

from modforge.registry import ConfigError, register


class Logits(nn.Module):
    """Base class of kind ``logits``: built as ``cls(cfg)``, called on the head's output (..., V) -> (..., V),
    token by token (a variant that mixes positions would break cached decoding). ``identity``: it returns its
    input unchanged, and the model skips the call."""

    identity = False

    def __init__(self, cfg=None):
        super().__init__()


@register("logits", "plain")
class PlainLogits(Logits):
    """the head's output as it is"""

    identity = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z


@register("logits", "softcap")
class SoftCappedLogits(Logits):
    """cap * tanh(z / cap) (Gemma 2: cap 30.0)"""

    @dataclass
    class Config:
        cap: float = 30.0  # Gemma 2's final_logit_softcapping

        def __post_init__(self):
            if not self.cap > 0:
                raise ConfigError(f"logits.cap={self.cap}: must be > 0 (Gemma 2: 30.0)")

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.cap = cfg.cap

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.cap * torch.tanh(z / self.cap)
