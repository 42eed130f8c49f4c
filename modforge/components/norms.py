"""Normalisation layers (kind ``norm``): ``layer``, ``batch``, ``rms``.

Every norm is called as ``norm(x, mask)`` with ``x`` of shape (B, T, C) and
``mask`` a (B, T) bool tensor, True at real tokens (or None: all real). Only
``batch`` uses the mask; the others are per-token and ignore it.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modforge.registry import ConfigError, register


class Norm(nn.Module):
    """Base class of kind ``norm``: built as ``cls(cfg, d_model)``, called as ``norm(x, mask)``.

    ``x`` is (B, T, C); ``mask`` is (B, T) bool, True at real tokens, or None
    (all real). The output has the shape of ``x``. Per-token norms ignore the mask.
    ``mixes_positions``: a norm whose output at a position depends on other positions at eval (so decoding with a
    KV cache, which runs one position at a time, would change it): decoding then recomputes the prefix.
    ``mixes_batch``: a norm whose output for a sequence depends on the other sequences of its batch at eval (so
    eval results depend on how the batch is made up).
    ``per_token``: its output at a token depends on that token alone, in training too (so it may normalise any
    tensor whose last dimension is its width, such as attention's queries and keys: ``attention.qk_norm``).
    """
    mixes_positions = False
    mixes_batch = False
    per_token = True

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError


def check_eps(eps: float) -> None:
    """A norm's epsilon keeps its denominator away from zero: it must be positive (a negative one can make it
    zero or negative, and the first step NaN)."""
    if not eps > 0:
        raise ConfigError(f"norm.eps={eps}: must be > 0 (it keeps the denominator away from zero; typical: 1e-5)")


@register("norm", "layer")
class LayerNorm(Norm):
    """LayerNorm over the feature dimension: gamma * (x - mean) / sqrt(var + eps) + beta."""

    param_roles = {"weight": "vector", "bias": "vector"}  # gains and shifts along the width (modforge.models.param)

    @dataclass
    class Config:
        eps: float = 1e-5
        bias: bool = True

        def __post_init__(self):
            check_eps(self.eps)

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.eps = cfg.eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if cfg.bias else None

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def _rms_inside(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (w * x * rsqrt(mean(x^2) + eps) in x's dtype, the rsqrt); statistics and the product in >= float32,
    rounded once, as ``F.rms_norm`` does."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()  # (no-op casts still cost a dispatch)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * r * (weight if weight.dtype == xf.dtype else weight.to(xf.dtype))
    return (y if y.dtype == x.dtype else y.to(x.dtype)), r


class _RMSNormInside(torch.autograd.Function):
    """:func:`_rms_inside` with its gradient written out.

    The same numbers as ``F.rms_norm`` (tests compare with ``nn.RMSNorm``), but
    autograd's composite backward of ``F.rms_norm`` costs about 3x this one on
    CPU (d 384, batch 8 x 256: 4.8 ms vs 1.7 ms per norm, forward + backward).
    First derivatives only: a double backward raises instead of being wrong.
    Used in eager mode; under ``torch.compile`` the plain formula is traced and
    inductor derives and fuses the backward itself.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, r = _rms_inside(x, weight, eps)
        ctx.save_for_backward(x, weight, r)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, weight, r = ctx.saved_tensors
        xhat = x.to(r.dtype) * r
        gy = gy.to(r.dtype)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            g = gy * weight.to(r.dtype)
            dx = (r * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (gy * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        return dx, dw, None


@register("norm", "rms")
class RMSNorm(Norm):
    """RMSNorm (Zhang & Sennrich 2019): gamma * x / RMS(x), no centring and no bias.

    ``eps_placement`` pins the convention. ``inside`` (default) is
    x / sqrt(mean(x^2) + eps), as torch.nn.RMSNorm, T5 and Llama compute it (and
    the reference 004); ``outside`` is x / (sqrt(mean(x^2)) + eps), as the
    reference 000 and 001 write it. They differ only for tiny activations.
    """

    param_roles = {"weight": "vector", "bias": "vector"}  # gains and shifts along the width (modforge.models.param)

    @dataclass
    class Config:
        eps: float = 1e-6
        eps_placement: str = "inside"  # inside | outside

        def __post_init__(self):
            check_eps(self.eps)
            if self.eps_placement not in ("inside", "outside"):
                raise ConfigError(
                    f"norm.eps_placement={self.eps_placement!r}: allowed values are 'inside' "
                    "(x / sqrt(mean(x^2) + eps), torch/Llama) and 'outside' (x / (RMS + eps), the references)"
                )

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.eps = cfg.eps
        self.inside = cfg.eps_placement == "inside"
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.inside:
            if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad) \
                    and not torch.compiler.is_compiling():  # compiled, inductor derives and fuses the backward
                return _RMSNormInside.apply(x, self.weight, self.eps)
            return _rms_inside(x, self.weight, self.eps)[0]  # the same formula, without autograd's bookkeeping
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()  # float64 stays float64
        rms = xf.pow(2).mean(-1, keepdim=True).sqrt()
        return (xf / (rms + self.eps)).type_as(x) * self.weight


@register("norm", "batch")
class MaskedBatchNorm(Norm):
    """BatchNorm over all real tokens of the batch (PowerNorm's masked BN, Shen et al. 2020).

    Training: per-feature mean and biased variance over the tokens where
    ``mask`` is True, so padding never shifts the statistics; running
    statistics are updated with ``momentum`` (unbiased variance, as
    nn.BatchNorm1d). Eval: the running statistics.

    Note for causal models: in training, batch statistics mix positions, so a
    token's normalisation depends (weakly) on later tokens of the batch. Eval
    uses running statistics and is strictly causal.
    """

    per_token = False  # training normalises by the batch's statistics

    param_roles = {"weight": "vector", "bias": "vector"}  # gains and shifts along the width (modforge.models.param)

    @dataclass
    class Config:
        eps: float = 1e-5
        momentum: float = 0.1
        affine: bool = True

        def __post_init__(self):
            check_eps(self.eps)
            if not 0.0 <= self.momentum <= 1.0:
                raise ConfigError(f"norm.momentum={self.momentum}: must be in [0, 1] (the weight of each batch in the "
                                  "running statistics)")

    def __init__(self, cfg: Config, d_model: int):
        super().__init__()
        self.eps, self.momentum = cfg.eps, cfg.momentum
        self.weight = nn.Parameter(torch.ones(d_model)) if cfg.affine else None
        self.bias = nn.Parameter(torch.zeros(d_model)) if cfg.affine else None
        self.register_buffer("running_mean", torch.zeros(d_model))
        self.register_buffer("running_var", torch.ones(d_model))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(
                x.reshape(-1, x.shape[-1]), self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            ).view_as(x)
        flat = x.reshape(-1, x.shape[-1])
        if mask is None:
            # all tokens are real: torch's fused kernel (also updates running stats)
            out = F.batch_norm(flat, self.running_mean, self.running_var, self.weight, self.bias, True, self.momentum, self.eps)
            self.num_batches_tracked += 1
            return out.view_as(x)
        real = flat[mask.reshape(-1)]
        n = real.shape[0]
        mean = real.mean(0)
        var = real.var(0, unbiased=False)
        with torch.no_grad():
            unbiased = var * (n / max(n - 1, 1))
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(unbiased.detach(), self.momentum)
            self.num_batches_tracked += 1
        out = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            out = out * self.weight + self.bias
        return out


@register("norm", "batch_causal")
class CausalBatchNorm(MaskedBatchNorm):
    """Masked BatchNorm whose statistics at position t use only the batch's real tokens at positions <= t (prefix
    statistics: cumulative sums over time), so no token's normalisation sees a later token of its own or any other
    sequence. ``norm=batch`` mixes every position of the batch in training: in a causal model that leaks the future
    into the past (weakly, through the mean and variance), a leak eval, on running statistics, does not have.

    Eval computes the same prefix statistics over the batch it is given: training and eval normalise alike. (A
    first version evaluated on ``norm=batch``'s running statistics, those of whole batches: a model trained on
    prefix statistics, which differ by position, evaluated worse than the unigram model while its training loss was
    ``norm=batch``'s: experiments/norms.md.) So a token's output depends on the other sequences of its batch,
    causally; at batch 1 the first position is normalised by one token's statistics (zero variance: the output is
    the bias). The running statistics are still kept, as ``norm=batch`` keeps them. The variance is
    E[x^2] - E[x]^2 over the prefix (biased), computed in float32 and clamped at 0. Expects (batch, time, features).
    """

    mixes_positions = True  # eval uses the prefix statistics too: a KV cache would see one position at a time
    mixes_batch = True  # ... over the batch it is given

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() != 3:
            return super().forward(x, mask)
        xf = x.float()
        m = (torch.ones(x.shape[:2], device=x.device) if mask is None else mask.to(torch.float32)).unsqueeze(-1)
        count = m.sum(0).cumsum(0).clamp_min(1.0)  # (T, 1): real tokens at positions <= t
        mean = (xf * m).sum(0).cumsum(0) / count
        var = ((xf * xf * m).sum(0).cumsum(0) / count - mean * mean).clamp_min(0.0)
        if self.training:
            with torch.no_grad():
                n = count[-1]
                self.running_mean.lerp_(mean[-1], self.momentum)
                self.running_var.lerp_(var[-1] * (n / (n - 1).clamp_min(1.0)), self.momentum)
                self.num_batches_tracked += 1
        out = ((xf - mean) * torch.rsqrt(var + self.eps)).type_as(x)
        if self.weight is not None:
            out = out * self.weight + self.bias
        return out
