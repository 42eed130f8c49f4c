"""Parametrisations (kind ``param``): how initialisation, learning rates and multipliers depend on a model's size.

* ``standard`` (the default) changes nothing: every rule described elsewhere in modforge holds as written.
* ``mup``: µP for Adam and AdamW (Yang et al. 2022, "Tensor Programs V", Table 8: the formulation with a
  readout multiplier, which allows tied embeddings), with depth scaling of residual branches (CompleteP,
  Dey et al. 2025, Table 1; ``depth_alpha=0.5`` is depth-µP, Yang et al. 2023 / Bordelon et al. 2023),
  all relative to a declared **base shape** (``param.base``, model keys). At the base shape ``mup``
  computes exactly what ``standard`` does, so the learning rate tuned there carries over to every wider
  or deeper model.

**Declarations.** A parametrisation never looks at a variant's name. Every module that owns parameters
declares their roles in a class attribute ``param_roles``: ``{glob of the parameter's name relative to the
module: role}``, with the roles of :data:`ROLES`. A parameter's role is the first match walking up from its
own module. Under ``mup`` a parameter with no declared role is refused in one line naming it; ``standard``
reads no declarations. Components also declare, where a rule needs them:

* an attention sets ``scales_scores = True`` when its forward passes ``self.score_scale`` to SDPA's
  ``scale=`` (None: SDPA's own 1/sqrt(d_head)); it must also have ``d_head``;
* a residual sets ``scales_branch = True`` when it multiplies its sub-layer's output by ``self.branch_mult``;
* a module lists in ``held_at_base`` float attributes that are width-dependent multipliers (the embedder's
  sqrt(d_model) scale): under ``mup`` they take their value in the base model.

**The rules of** ``mup`` (m = fan_in / base fan_in of a parameter; D = a stack's depth, D_b its base depth):

=========  ==========================================  ===============  ==================  ===============
role       what                                        init             Adam/AdamW lr       weight decay
=========  ==========================================  ===============  ==================  ===============
input      embedding tables (items x width)            unchanged        x 1                 unchanged
hidden     width -> width matrices, stored (out, in)   std / sqrt(m)    x 1/m               x m (AdamW)
output     readouts (width -> fixed), e.g. the head    unchanged        x 1                 unchanged
vector     biases, gains                               unchanged        x 1                 unchanged
=========  ==========================================  ===============  ==================  ===============

plus: logits x ``output_mult`` / m_model (m_model = d_model / base d_model; Table 8's readout multiplier,
in place of Table 3's 1/fan_in^2 init and 1/fan_in lr, so a tied embedding obeys both of its roles);
attention scores x ``attn_mult`` / d_head instead of 1/sqrt(d_head) (µP §4; ``attn_mult`` defaults to
sqrt(base d_head)); every parameter inside a residual block: lr x (D/D_b)^(alpha-1), its branch x
(D_b/D)^alpha, and GPT-2's residual-output init std / sqrt(2 D_b) instead of std / sqrt(2 D) (CompleteP
Table 1, rescaled to the base); Adam's epsilon x (1/m_model) (D_b/D)^alpha, because every gradient
shrinks that way (Everett et al. 2024 §4.3; CompleteP Table 1). The weight-decay rule keeps lr x wd of
hidden matrices width-independent (decoupled decay, as CompleteP does); Adam's L2 decay has no µP rule
and is refused. The schedule's ``d_model`` (``scheduler=noam``) is the base's.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

import torch
from torch import nn

from modforge.components.attention import Attention
from modforge.components.residual import Residual
from modforge.models.blocks import Stack
from modforge.registry import ConfigError, as_dict, build, register

ROLES = {
    "input": "an embedding table (items x width): init and lr unchanged",
    "hidden": "a width -> width matrix stored (out, in): init std / sqrt(m), lr / m",
    "output": "a readout (width -> a fixed size): init and lr unchanged, its input x output_mult / m",
    "vector": "a bias or gain along the width: init and lr unchanged",
}


class Parametrisation:
    """Base class of kind ``param``: built as ``cls(cfg)``.

    The task calls :meth:`apply` once, right after building the model (its initialisation done), with a
    function that builds the model at other model keys (the base shape); :meth:`groups` when it builds the
    optimizer (None: every parameter alike, as plain ``parameters()``); :meth:`schedule_d_model` for the
    learning-rate schedule's width."""

    uses_groups = False  # True: groups() gives the optimizer parameter groups with multipliers

    def apply(self, model: nn.Module, make_model: Callable[[dict], nn.Module]) -> None:
        return None

    def preflight(self, model_cfg: Any, parts: Any) -> None:
        """Refuse, before any work, what :meth:`apply` would refuse (the pre-flight of every job calls it)."""
        return None

    def groups(self, root: nn.Module) -> Optional[list[dict]]:
        return None

    def schedule_d_model(self, model: nn.Module) -> int:
        return model.cfg.d_model

    def describe(self) -> str:
        return ""


def check_buildable(keys: dict, model_cfg: Any) -> None:
    """A base shape built for real (a part that cannot be built on the meta device) must fit in memory: one
    d_model x d_ff weight in float32 larger than this machine's memory is refused in one line, not allocated."""
    import os

    d = int(keys.get("d_model", getattr(model_cfg, "d_model", 1)) or 1)
    ff = int(keys.get("d_ff", getattr(model_cfg, "d_ff", None) or 4 * d) or 4 * d)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 2 ** 40
    if 4 * d * max(d, ff) > memory:
        raise ConfigError(f"one weight of that base shape ({d} x {max(d, ff)} floats) would not "
                          f"fit in this machine's {memory / 2 ** 30:.0f} GiB; the base shape is the small model µP "
                          "transfers from (docs/mup.md)")


def parametrised(model_cfg: Any, parts: Any, vocab_size: int, param: Any = "standard"
                 ) -> tuple[nn.Module, Parametrisation]:
    """The model built and rescaled by its parametrisation (a config, or a built one), as a task builds it: the
    model first (its initialisation draws what it always drew), then ``param.apply`` against the base shape."""
    cfg = as_dict(model_cfg)
    model = build("model", cfg, parts, vocab_size)
    param = param if isinstance(param, Parametrisation) else build("param", param)
    param.apply(model, lambda keys: build("model", {**cfg, **keys}, parts, vocab_size))
    return model, param


def on_meta(model_cfg: Any, parts: Any, param: Parametrisation) -> None:
    """The model built and parametrised on the meta device (no memory): what ``param.apply`` refuses is refused
    before any work. A part that cannot be built on the meta device is checked when the run builds it."""
    try:
        with torch.device("meta"):
            parametrised(model_cfg, parts, 8, param)
    except (RuntimeError, NotImplementedError):
        return


@register("param", "standard")
class Standard(Parametrisation):
    """the standard parametrisation: init, learning rates and multipliers as every component states them"""

    def __init__(self, cfg: Any = None):
        self.cfg = cfg


@dataclass
class MuPConfig:
    # the base shape, as model keys (null: the model's own value); there mup computes what standard does
    base: dict = field(default_factory=lambda: {"d_model": 128, "n_heads": None, "head_dim": None, "d_ff": None,
                                                "n_layers": None, "enc_layers": None, "dec_layers": None})
    output_mult: float = 1.0  # logits x output_mult * base d_model / d_model (tunable, width-independent)
    attn_mult: Optional[float] = None  # scores x attn_mult / d_head; null: sqrt(base d_head) (standard at base)
    depth_alpha: float = 1.0  # residual branches x (D_base / D)^alpha: 1 CompleteP, 0.5 depth-µP, 0 none
    scale_eps: bool = True  # Adam's eps x (1 / m) (D_base / D)^alpha: it shrinks with the gradients
    scale_weight_decay: bool = True  # hidden matrices' decay x m: lr x wd width-independent (AdamW)
    zero_readout: bool = False  # an untied readout starts at zero (Yang et al. 2022, App. D.2)

    def __post_init__(self):
        if not self.output_mult > 0:
            raise ConfigError(f"param.output_mult={self.output_mult}: must be > 0")
        if self.attn_mult is not None and not self.attn_mult > 0:
            raise ConfigError(f"param.attn_mult={self.attn_mult}: must be > 0 (or null: sqrt(base head dim))")
        if not 0.0 <= self.depth_alpha <= 1.0:
            raise ConfigError(f"param.depth_alpha={self.depth_alpha}: in [0, 1] (1: CompleteP, 0.5: depth-µP, "
                              "0: no depth scaling)")
        for k, v in dict(self.base or {}).items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"param.base.{k}={v}: the base shape's model keys are sizes, integers >= 1")


def roles(root: nn.Module, who: str = "param=mup") -> dict[str, str]:
    """{parameter name: role} for every parameter of ``root`` (a shared one once, under its first name); the
    first undeclared parameter is refused in one line (``who``: the parametrisation that asks)."""
    modules = dict(root.named_modules())
    out = {}
    for name, _ in root.named_parameters():
        parts = name.split(".")
        for i in range(len(parts) - 1, -1, -1):
            decl = getattr(modules[".".join(parts[:i])], "param_roles", None) or {}
            rel = ".".join(parts[i:])
            hit = next((role for pattern, role in decl.items() if fnmatch.fnmatchcase(rel, pattern)), None)
            if hit is not None:
                if hit not in ROLES:
                    raise ConfigError(f"{who}: {type(modules['.'.join(parts[:i])]).__name__}.param_roles gives "
                                      f"'{rel}' the role '{hit}'; roles: {', '.join(ROLES)}")
                out[name] = hit
                break
        else:
            owner = modules[".".join(parts[:-1])]
            raise ConfigError(f"{who}: parameter '{name}' ({type(owner).__module__}.{type(owner).__name__}) has "
                              f"no declared role; a component used under {who} declares each parameter in "
                              "`param_roles` ({'<name>': role}; roles: input, hidden, output, vector; "
                              "docs/mup.md)")
    return out


def stacks(model: nn.Module) -> dict[str, int]:
    """{path of each stack: its depth}."""
    return {n: len(m.blocks) for n, m in model.named_modules() if isinstance(m, Stack)}


def in_stack(name: str, depths: dict[str, int]) -> Optional[tuple[str, int]]:
    """(stack path, block index) when ``name`` lies inside a block of a stack."""
    for s in depths:
        prefix = f"{s}.blocks." if s else "blocks."
        index = name[len(prefix):].split(".")[0] if name.startswith(prefix) else ""
        if index.isdigit():
            return s, int(index)
    return None


def base_name(name: str, depths: dict[str, int], base_depths: dict[str, int]) -> str:
    """The name of ``name``'s counterpart in the base model: block i of a stack is block i mod D_b there."""
    where = in_stack(name, depths)
    if where is None or where[0] not in base_depths:
        return name
    s, i = where
    prefix = f"{s}.blocks." if s else "blocks."
    rest = name[len(prefix):].split(".", 1)
    return prefix + str(i % base_depths[s]) + ("." + rest[1] if len(rest) > 1 else "")


def fan_in(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) if t.dim() > 1 else 1


@register("param", "mup", config=MuPConfig)
class MuP(Parametrisation):
    """µP (Yang et al. 2022, Table 8) with CompleteP's depth rules, relative to the base shape param.base"""

    uses_groups = True

    def __init__(self, cfg: MuPConfig):
        self.cfg = cfg
        self.scales: dict[str, tuple[float, float, float]] = {}  # name -> (lr, eps, weight decay) multipliers
        self.width = 1.0  # d_model / base d_model
        self.base_d_model: Optional[int] = None
        self.depth: dict[str, tuple[int, int]] = {}  # stack -> (D, D_base)
        self.eps = 1.0  # Adam's eps multiplier, the same for every parameter

    def _base(self, model: nn.Module, make_model: Callable[[dict], nn.Module]) -> nn.Module:
        cfg = model.cfg
        known = {f.name for f in fields(cfg)} if hasattr(cfg, "__dataclass_fields__") else set()
        keys = {k: v for k, v in dict(self.cfg.base).items() if v is not None}
        for k in keys:
            if k not in known:
                raise ConfigError(f"param.base.{k}: not a key of the model's config; the base shape takes model "
                                  f"keys: {', '.join(sorted(known))}")
        with torch.random.fork_rng(devices=[]):  # (the base's init draws nothing from the run's streams)
            try:
                try:
                    with torch.device("meta"):  # shapes only, no memory
                        return make_model(keys)
                except (RuntimeError, NotImplementedError):  # a part that builds tables on a device of its own
                    check_buildable(keys, cfg)
                    return make_model(keys)
            except ConfigError as e:
                raise ConfigError(f"param.base={keys}: the base shape is not a valid model: {e}") from None

    def preflight(self, model_cfg: Any, parts: Any) -> None:
        """The model and its base built on the meta device (no memory) and the rules applied: an undeclared
        parameter, an unknown base key or a part that cannot take a multiplier is refused before any work. A
        part that cannot be built on the meta device is checked when the run builds it."""
        if self.cfg.zero_readout and as_dict(model_cfg).get("tie_embeddings"):
            raise ConfigError("param.zero_readout=true: the readout is tied to the token embedding here "
                              "(model.tie_embeddings=true), so there is no separate readout to start at zero; "
                              "set model.tie_embeddings=false, or leave param.zero_readout out")
        on_meta(model_cfg, parts, self)

    def apply(self, model: nn.Module, make_model: Callable[[dict], nn.Module]) -> None:
        base = self._base(model, make_model)
        c = self.cfg
        role = roles(model)
        params, base_params = dict(model.named_parameters()), dict(base.named_parameters())
        depths, base_depths = stacks(model), stacks(base)
        self.depth = {s: (d, base_depths.get(s, d)) for s, d in depths.items()}
        self.width = model.head.in_features / base.head.in_features
        self.base_d_model = base.cfg.d_model
        residual_out = {f"{n}.weight" for n, m in model.named_modules() if getattr(m, "residual_out", False)}
        layers, base_layers = getattr(model, "init_layers", 0), getattr(base, "init_layers", 0)
        global_depth = max(depths.values(), default=1), max(base_depths.values(), default=1)
        eps = (1.0 / self.width) * (global_depth[1] / global_depth[0]) ** c.depth_alpha if c.scale_eps else 1.0
        self.eps = eps
        with torch.no_grad():
            for name, p in params.items():
                counterpart = base_params.get(base_name(name, depths, base_depths))
                if counterpart is None:
                    raise ConfigError(f"param=mup: the base shape (param.base={dict(c.base)}) has no counterpart of "
                                      f"parameter '{name}'")
                r = role[name]
                m = fan_in(p) / fan_in(counterpart) if r == "hidden" else 1.0
                where = in_stack(name, depths)
                d, db = self.depth[where[0]] if where else (1, 1)
                lr = (1.0 / m) * ((d / db) ** (c.depth_alpha - 1.0) if where else 1.0)
                wd = m if (r == "hidden" and c.scale_weight_decay) else 1.0
                self.scales[name] = (lr, eps, wd)
                init = m ** -0.5
                if name in residual_out and layers and c.depth_alpha > 0:
                    init *= (layers / base_layers) ** 0.5  # std / sqrt(2 D_base) in place of std / sqrt(2 D)
                if r == "output" and c.zero_readout:  # (a tied readout is listed once, as the embedding: input)
                    p.zero_()
                elif init != 1.0:
                    p.mul_(init)
        model.readout_mult = c.output_mult / self.width
        self._multipliers(model, base, depths, base_depths)

    def _multipliers(self, model: nn.Module, base: nn.Module, depths: dict, base_depths: dict) -> None:
        c, base_modules = self.cfg, dict(base.named_modules())
        for name, m in model.named_modules():
            twin = base_modules.get(base_name(name, depths, base_depths))
            if twin is None:
                continue
            for attr in getattr(m, "held_at_base", ()):
                setattr(m, attr, getattr(twin, attr))
            if isinstance(m, Attention):
                mult = c.attn_mult if c.attn_mult is not None else twin.d_head ** 0.5
                scale = mult / m.d_head
                if not math.isclose(scale, m.d_head ** -0.5, rel_tol=1e-12):
                    if not getattr(m, "scales_scores", False):
                        raise ConfigError(f"param=mup: {type(m).__name__} ({name}) does not declare "
                                          "`scales_scores` (passing self.score_scale to SDPA's scale=), and its "
                                          f"scores need x {scale:.4g} here")
                    m.score_scale = scale
            if isinstance(m, Residual):
                where = in_stack(name, depths)
                if where is None:
                    continue
                d, db = self.depth[where[0]]
                mult = (db / d) ** c.depth_alpha
                if mult != 1.0:
                    if not getattr(m, "scales_branch", False):
                        raise ConfigError(f"param=mup: {type(m).__name__} ({name}) does not declare "
                                          "`scales_branch` (multiplying its sub-layer by self.branch_mult), and "
                                          f"depth {d} over base {db} needs x {mult:.4g}")
                    m.branch_mult = mult

    def groups(self, root: nn.Module) -> list[dict]:
        """Parameter groups of equal multipliers (:func:`scaled_groups`)."""
        return scaled_groups(root, self.scales, (1.0, self.eps, 1.0), "param=mup")

    def schedule_d_model(self, model: nn.Module) -> int:
        return self.base_d_model or model.cfg.d_model

    def describe(self) -> str:
        deep = ", ".join(f"{s or 'stack'} {d} over {db}" for s, (d, db) in self.depth.items())
        return f"mup: width x{self.width:g} over base d_model {self.base_d_model}; depth {deep}"


def scaled_groups(root: nn.Module, scales: dict, task_own: tuple, who: str) -> list[dict]:
    """Parameter groups of equal multipliers, in the order of ``root.named_parameters()``: each
    {"params", "lr_scale", "eps_scale", "wd_scale"}, from ``scales`` ({name in the model: (lr, eps, wd)}); the
    task's own parameters (a classifier's head) by their declared roles, at ``task_own``."""
    role = roles(root, who)
    out: dict[tuple, list] = {}
    for name, p in root.named_parameters():
        if not p.requires_grad:
            continue
        key = scales.get(name.removeprefix("model."))
        if key is None:  # the task's own (a classifier's head): outside every block, no base counterpart
            if role[name] == "hidden":
                raise ConfigError(f"{who}: the task's own parameter '{name}' is declared hidden, but a task's "
                                  "parameters have no width to scale against (roles there: input, output, vector)")
            key = task_own
        out.setdefault(key, []).append(p)
    return [{"params": ps, "lr_scale": k[0], "eps_scale": k[1], "wd_scale": k[2]} for k, ps in out.items()]


def multipliers(model: nn.Module) -> list[str]:
    """The multipliers a parametrisation set away from what the standard model computes (for an export to a
    format that has no place for them)."""
    out = [f"logits x {model.readout_mult:.4g}"] if getattr(model, "readout_mult", 1.0) != 1.0 else []
    for name, m in model.named_modules():
        if getattr(m, "score_scale", None) is not None:
            out.append(f"{name} scores x {m.score_scale:.4g}")
        if getattr(m, "branch_mult", 1.0) != 1.0:
            out.append(f"{name} branch x {m.branch_mult:.4g}")
    return out
