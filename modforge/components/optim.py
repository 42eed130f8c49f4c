"""Optimizers (kind ``optim``) and learning-rate schedules (kind ``scheduler``).

Schedules are multiplicative factors on the optimizer's ``lr``, stepped once
per optimizer step (step counted from 1), and built by
``build("scheduler", cfg, optimizer, d_model=..., total_steps=...)``.

* ``noam``     -- lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
  (Vaswani et al. 2017, the reference 001 formula); use it with ``optim.lr=1``
  so that ``factor`` is the scale (the default ``lr`` of the adam/adamw options
  is overridden by the vanilla_transformer experiment accordingly).
* ``cosine``   -- linear warm-up to lr over ``warmup_steps``, cosine decay to
  ``min_lr_ratio * lr`` at ``total_steps`` (nanoGPT), flat afterwards.
* ``constant`` -- optional linear warm-up, then constant.
* ``wsd``      -- warmup-stable-decay: linear warm-up, constant, then a decay to ``min_lr_ratio * lr`` over
  the last ``decay_steps`` (or ``decay_fraction`` of the run), shaped ``linear``, ``sqrt`` (1 - sqrt(p),
  Hägele et al. 2024's best) or ``cosine`` (Hu et al. 2024, MiniCPM; Hägele et al. 2024). With ``decay_steps``
  set, every budget's run is the same up to its decay, so one run's checkpoints give several budgets.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.optim.lr_scheduler import LambdaLR

from modforge.utils.devices import fused_optimizer
from modforge.registry import ConfigError, register

# Optimizers are functions cfg, params -> torch.optim.Optimizer; schedules are functions
# cfg, optimizer, *, d_model, total_steps -> an LR scheduler stepped once per optimizer step.


@dataclass
class AdamConfig:
    lr: float = 1e-3
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    fused: Optional[bool] = None  # torch's fused kernel; null: when every parameter is on a CUDA device

    def __post_init__(self):
        if not self.lr > 0:
            raise ConfigError(f"optim.lr={self.lr}: must be > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={list(self.betas)}: two numbers in [0, 1), e.g. [0.9, 0.999]")
        if not self.eps > 0 or self.weight_decay < 0:
            raise ConfigError(f"optim.eps={self.eps}, optim.weight_decay={self.weight_decay}: eps > 0, weight_decay >= 0")


@dataclass
class AdamWConfig(AdamConfig):
    betas: list = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 0.1
    decay_norms_and_biases: bool = False  # nanoGPT/GPT-2: only matrices (dim >= 2) are decayed


SCALES = ("lr_scale", "eps_scale", "wd_scale")  # a parametrisation's per-group multipliers (modforge.models.param)
PER_PEAK = "decay_per_peak"  # a group's flag: its decay is also divided by the peak rate (u-µP's independent decay)


def scaled(params) -> list[dict]:
    """Parameters, or a parametrisation's groups ({"params", "lr_scale", "eps_scale", "wd_scale"}), as groups
    that each carry their three multipliers (1 where none is given)."""
    params = list(params)
    if params and isinstance(params[0], dict):  # (a group's other keys, e.g. its own lr, are kept)
        return [{**g, "params": [p for p in g["params"] if p.requires_grad], **{k: float(g.get(k, 1.0)) for k in SCALES}}
                for g in params]
    return [{"params": [p for p in params if p.requires_grad], **{k: 1.0 for k in SCALES}}]


def _hyper(g: dict, cfg: AdamConfig, weight_decay: float) -> dict:
    """A group's own lr, eps and weight decay where its multipliers are not 1 (else the optimizer's defaults)."""
    out = {k: v for k, v in g.items() if k not in SCALES and k != PER_PEAK}
    out["weight_decay"] = out.get("weight_decay", weight_decay) * g["wd_scale"] / (cfg.lr if g.get(PER_PEAK) else 1.0)
    if g["lr_scale"] != 1.0:
        out["lr"] = cfg.lr * g["lr_scale"]
    if g["eps_scale"] != 1.0:
        out["eps"] = cfg.eps * g["eps_scale"]
    return out


def _groups(params, cfg: AdamWConfig):
    """AdamW's groups: matrices decayed, norms, biases and other 1-d parameters not (unless
    decay_norms_and_biases); within each group of a parametrisation's multipliers, in its order."""
    params = list(params)
    out, plain = [], not (params and isinstance(params[0], dict))
    for g in scaled(params):
        if cfg.decay_norms_and_biases or cfg.weight_decay == 0.0:
            out.append(_hyper(g, cfg, cfg.weight_decay))
            continue
        for keep, wd in ((lambda p: p.dim() >= 2, cfg.weight_decay), (lambda p: p.dim() < 2, 0.0)):
            out.append(_hyper({**g, "params": [p for p in g["params"] if keep(p)]}, cfg, wd))
    return out if plain else [g for g in out if g["params"]]  # (plain: both groups, as before groups existed)


def check_group_scales(optimizer: torch.optim.Optimizer, groups: list[dict], cfg) -> None:
    """A parametrisation's per-group learning rates must reach the optimizer: one line naming it when they do
    not (an optimizer from a plugin that reads only its ``params``)."""
    lr_of = {id(p): g.get("lr") for g in optimizer.param_groups for p in g["params"]}
    ref = [(lr_of.get(id(p)), g["lr_scale"]) for g in groups for p in g["params"][:1] if g["params"]]
    if not ref or any(lr is None for lr, _ in ref):
        return
    lr0, s0 = ref[0]
    if not all(math.isclose(lr * s0, lr0 * s, rel_tol=1e-6) for lr, s in ref):
        name = cfg.get("name", cfg) if hasattr(cfg, "get") else cfg
        raise ConfigError(f"optim={name}: it does not apply the parametrisation's per-group learning rates "
                          "(each group's lr_scale, eps_scale, wd_scale); use optim=adamw or adam, or read them "
                          "in the optimizer (docs/mup.md)")


@register("optim", "adam", config=AdamConfig)
def adam(cfg: AdamConfig, params) -> torch.optim.Optimizer:
    """Adam (Kingma & Ba 2015), the paper's optimizer"""
    groups = list(params)
    if groups and isinstance(groups[0], dict):  # groups (a parametrisation's carry its multipliers)
        if cfg.weight_decay > 0 and any(k in g for g in groups for k in SCALES):
            raise ConfigError(f"optim=adam with optim.weight_decay={cfg.weight_decay}: the parametrisation has no "
                              "rule for Adam's L2 decay (it scales decoupled decay); use optim=adamw, or "
                              "weight_decay=0")
        groups = [_hyper(g, cfg, cfg.weight_decay) for g in scaled(groups)]
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                            fused=fused_optimizer(cfg.fused, tensors))


@register("optim", "adamw", config=AdamWConfig)
def adamw(cfg: AdamWConfig, params) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay); norms, biases and 1-d params not decayed by default"""
    groups = _groups(params, cfg)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             fused=fused_optimizer(cfg.fused, [p for g in groups for p in g["params"]]))


@dataclass
class NoamConfig:
    warmup_steps: int = 4000
    factor: float = 1.0

    def __post_init__(self):
        if self.warmup_steps < 1:
            raise ConfigError(f"scheduler.warmup_steps={self.warmup_steps}: noam needs >= 1")
        if not self.factor > 0:
            raise ConfigError(f"scheduler.factor={self.factor}: must be > 0")


def warmup_note(warmup: int, run: dict) -> list:
    """A warm-up that is not shorter than the run never reaches ``optim.lr``: a note (fine for a smoke test)."""
    total = (run.get("trainer") or {}).get("max_steps") or 0
    if total > 0 and warmup >= total:
        return [f"scheduler.warmup_steps={warmup} is not shorter than trainer.max_steps={total}: the learning rate "
                f"never reaches optim.lr={(run.get('optim') or {}).get('lr')} (fine for a smoke test; for a result, "
                f"shorten the warm-up, e.g. scheduler.warmup_steps={total // 10}, or train longer)"]
    return []


@dataclass
class CosineConfig:
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    total_steps: Optional[int] = None  # None: the trainer's max_steps

    def __post_init__(self):
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"scheduler.warmup_steps={self.warmup_steps}, scheduler.min_lr_ratio={self.min_lr_ratio}: "
                              "warm-up >= 0 steps, ratio in [0, 1]")
        if self.total_steps is not None and self.total_steps < 1:
            raise ConfigError(f"scheduler.total_steps={self.total_steps}: must be >= 1 (or null: trainer.max_steps)")

    def check(self, run: dict) -> list:
        return warmup_note(self.warmup_steps, run)


@dataclass
class ConstantConfig:
    warmup_steps: int = 0

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise ConfigError(f"scheduler.warmup_steps={self.warmup_steps}: must be >= 0")

    def check(self, run: dict) -> list:
        return warmup_note(self.warmup_steps, run)


@dataclass
class WSDConfig:
    warmup_steps: int = 100
    decay_steps: Optional[int] = None  # the decay's length in steps; null: decay_fraction of the run
    decay_fraction: float = 0.2  # Hägele et al. 2024: 20% cooldown
    decay_shape: str = "sqrt"  # linear | sqrt (1 - sqrt(p)) | cosine
    min_lr_ratio: float = 0.0
    total_steps: Optional[int] = None  # None: the trainer's max_steps

    def __post_init__(self):
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0 or not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"scheduler.warmup_steps={self.warmup_steps}, scheduler.min_lr_ratio={self.min_lr_ratio}, "
                              f"scheduler.decay_fraction={self.decay_fraction}: warm-up >= 0 steps, ratio in [0, 1], "
                              "fraction in (0, 1]")
        if self.decay_shape not in WSD_SHAPES:
            raise ConfigError(f"scheduler.decay_shape={self.decay_shape!r}: one of {', '.join(WSD_SHAPES)}")
        for key in ("decay_steps", "total_steps"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"scheduler.{key}={getattr(self, key)}: must be >= 1 (or null)")

    def check(self, run: dict) -> list:
        total = self.total_steps or (run.get("trainer") or {}).get("max_steps") or 0
        decay = self.decay_steps or max(1, round(self.decay_fraction * total))
        if total > 0 and self.warmup_steps + decay > total:
            what = (f"scheduler.decay_steps={self.decay_steps}" if self.decay_steps is not None else
                    f"scheduler.decay_fraction={self.decay_fraction} ({decay} steps)")
            raise ConfigError(f"{what}: with scheduler.warmup_steps={self.warmup_steps} longer than the run's "
                              f"{total} steps (the decay would cut the warm-up short); shorten one")
        return warmup_note(self.warmup_steps, run)


WSD_SHAPES = {"linear": lambda p: 1.0 - p, "sqrt": lambda p: 1.0 - math.sqrt(p),
              "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p))}


def wsd_factor(step: int, warmup: int, decay: int, total: int, min_ratio: float, shape: str) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    start = total - decay
    if step < start:
        return 1.0
    p = min(1.0, (step - start) / max(1, decay))
    return min_ratio + (1.0 - min_ratio) * WSD_SHAPES[shape](p)


def noam_factor(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def cosine_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if step >= total:
        return min_ratio
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_ratio)


@register("scheduler", "noam", config=NoamConfig)
def noam(cfg: NoamConfig, optimizer, *, d_model: int, total_steps: Optional[int] = None) -> LambdaLR:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)"""
    # LambdaLR calls the lambda with 0 before the first step: count optimizer steps from 1
    return LambdaLR(optimizer, lambda s: noam_factor(s + 1, d_model, cfg.warmup_steps, cfg.factor))


@register("scheduler", "cosine", config=CosineConfig)
def cosine(cfg: CosineConfig, optimizer, *, d_model: int, total_steps: Optional[int] = None) -> LambdaLR:
    """linear warm-up, cosine decay to min_lr_ratio * lr"""
    total = cfg.total_steps or total_steps
    if not total or total <= 0:
        raise ConfigError("scheduler=cosine needs scheduler.total_steps or a positive trainer.max_steps")
    return LambdaLR(optimizer, lambda s: cosine_factor(s, cfg.warmup_steps, total, cfg.min_lr_ratio))


@register("scheduler", "constant", config=ConstantConfig)
def constant(cfg: ConstantConfig, optimizer, *, d_model: int, total_steps: Optional[int] = None) -> LambdaLR:
    """constant lr after an optional linear warm-up"""
    w = cfg.warmup_steps
    return LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (w + 1)) if w > 0 else 1.0)


@register("scheduler", "wsd", config=WSDConfig)
def wsd(cfg: WSDConfig, optimizer, *, d_model: int, total_steps: Optional[int] = None) -> LambdaLR:
    """warm-up, stable, then decay over the last steps (warmup-stable-decay)"""
    total = cfg.total_steps or total_steps
    if not total or total <= 0:
        raise ConfigError("scheduler=wsd needs scheduler.total_steps or a positive trainer.max_steps")
    decay = cfg.decay_steps or max(1, round(cfg.decay_fraction * total))
    return LambdaLR(optimizer, lambda s: wsd_factor(s, cfg.warmup_steps, decay, total, cfg.min_lr_ratio,
                                                     cfg.decay_shape))
