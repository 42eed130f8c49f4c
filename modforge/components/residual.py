"""Residual connections (kind ``residual``): where the norm sits around a sub-layer F.

* ``post`` -- x <- N(x + F(x)), the original Transformer (Post-LN); no final norm by
  default (``residual.final_norm=true`` adds one, as ``torch.nn.Transformer`` has).
* ``pre``  -- x <- x + F(N(x)) (Pre-LN, GPT-2 onwards); the stack ends with one
  final norm, because the residual stream itself is never normalised.
* ``sandwich`` -- x <- x + N2(F(N1(x))): a norm before and one after the sub-layer (Ding et al. 2021,
  CogView's Sandwich-LN; Gemma 2's pre- and post-norms; Kim et al. 2025's Peri-LN), and a final norm.
* ``reordered`` -- x <- x + N(F(x)): the norm on the sub-layer's output only (OLMo 2, "reordered norm"; Liu et
  al. 2022, Swin V2's res-post-norm), and a final norm.
* ``parallel`` -- x <- x + Attn(N(x)) + FFN(N(x)): every sub-layer of a block reads one normalised input and adds
  to the stream (Wang & Komatsuzaki 2021, GPT-J; Chowdhery et al. 2022, PaLM §2), and a final norm. In an
  encoder-decoder block the cross-attention is a third parallel branch (a convention: GPT-J and PaLM are
  decoders). The block asks the residual (``parallel``), never its name.

Each style's ``final_norm`` option says whether the stack ends with a norm, and the
stack asks the built residual for it; nothing compares names.
Dropout is applied to F's output before the addition (the paper's residual dropout).
"""
import copy
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from modforge.registry import register


class Residual(nn.Module):
    """Base class of kind ``residual``: built as ``cls(cfg, norm, dropout)``, called as ``r(x, sublayer, mask)``;
    wraps one sub-layer with its norm and residual dropout."""

    final_norm: bool = False  # does a stack of these blocks end with a norm after its last block?
    branch_mult = 1.0  # the sub-layer's output x this before the addition (param=mup's depth rule sets it)
    scales_branch = False  # True: forward applies branch_mult (param=mup needs it to scale with depth)
    pre_norm = False  # True: the sub-layer's input is normalised and the stream is not (param=umup needs it)
    parallel = False  # True: one residual for every sub-layer of a block, called as forward_all (residual=parallel)

    def __init__(self, cfg, norm: nn.Module, dropout: float = 0.0):
        super().__init__()
        self.final_norm = getattr(cfg, "final_norm", type(self).final_norm)
        self.norm = norm
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()  # p=0 would still copy when compiled

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor],
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError


@register("residual", "post")
class PostNorm(Residual):
    """x <- N(x + F(x))"""

    @dataclass
    class Config:
        final_norm: bool = False  # a norm after the last block (torch.nn.Transformer's encoder/decoder norm)

    scales_branch = True

    def forward(self, x, sublayer, mask=None):
        y = sublayer(x)
        return self.norm(x + self.drop(y * self.branch_mult if self.branch_mult != 1.0 else y), mask)


@register("residual", "pre")
class PreNorm(Residual):
    """x <- x + F(N(x)), plus a final norm after the stack"""

    @dataclass
    class Config:
        final_norm: bool = True  # the stream is never normalised inside the stack: off only to study that

    scales_branch = True
    pre_norm = True

    def forward(self, x, sublayer, mask=None):
        y = sublayer(self.norm(x, mask))
        return x + self.drop(y * self.branch_mult if self.branch_mult != 1.0 else y)


@dataclass
class WithFinalNorm:
    final_norm: bool = True  # a norm after the last block: the stream itself is never normalised inside the stack


@register("residual", "sandwich")
class SandwichNorm(Residual):
    """x <- x + N2(F(N1(x))), plus a final norm after the stack"""

    Config = WithFinalNorm

    scales_branch = True
    pre_norm = True

    def __init__(self, cfg, norm: nn.Module, dropout: float = 0.0):
        super().__init__(cfg, norm, dropout)
        self.post = copy.deepcopy(norm)  # a second norm of the same kind and settings, with its own parameters

    def forward(self, x, sublayer, mask=None):
        y = self.post(sublayer(self.norm(x, mask)), mask)
        return x + self.drop(y * self.branch_mult if self.branch_mult != 1.0 else y)


@register("residual", "reordered")
class ReorderedNorm(Residual):
    """x <- x + N(F(x)), plus a final norm after the stack"""

    Config = WithFinalNorm

    scales_branch = True

    def forward(self, x, sublayer, mask=None):
        y = self.norm(sublayer(x), mask)
        return x + self.drop(y * self.branch_mult if self.branch_mult != 1.0 else y)


@register("residual", "parallel")
class ParallelNorm(Residual):
    """x <- x + Attn(N(x)) + FFN(N(x)), plus a final norm after the stack"""

    Config = WithFinalNorm

    scales_branch = True
    pre_norm = True
    parallel = True

    def forward_all(self, x, sublayers, mask=None):
        h = self.norm(x, mask)
        for f in sublayers:
            y = f(h)
            x = x + self.drop(y * self.branch_mult if self.branch_mult != 1.0 else y)
        return x

    def forward(self, x, sublayer, mask=None):
        return self.forward_all(x, [sublayer], mask)
