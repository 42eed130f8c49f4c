"""One module per kind of swappable component; what they share is here."""
from torch import nn


def linear_flops(module: nn.Module) -> int:
    """2 * in * out summed over the Linear layers of ``module``: its forward FLOPs per position."""
    return sum(2 * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))
