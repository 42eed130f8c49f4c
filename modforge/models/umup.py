"""u-µP (kind ``param``, ``param=umup``): the unit-scaled maximal update parametrisation (Blake et al. 2024).

u-µP is µP written so that every weight, activation and (in its reference, Graphcore's ``unit-scaling``) gradient
is of unit scale at initialisation, with no base shape: each op carries a fixed scale computed from its own
shape, and the hyperparameters are a few multipliers whose default, 1, is meant to be near their optimum. Its
rules, for AdamW, with L the blocks of a stack and D = 1/sqrt(L) for every parameter inside a block:

* a hidden matrix (fan-in n): unit init, its output x 1/sqrt(n), Adam lr x D/sqrt(n);
* the matrix that reads a nonlinearity or an attention's output: also x that op's unit scale c (the FFN's
  ``unit_scale()``: 1 / the sd of its hidden activation for unit-Gaussian pre-activations; attention's:
  (S / l)^((1 - a) / 2), a = 1 / (1 + 4 d_head / attn_mult^2), l = ln S when causal else 1, S the sequence
  length: the reference's fit);
* an embedding table: unit init, no output scale, Adam lr x 1/sqrt(width);
* the readout: unit init, logits x output_mult / fan-in, Adam lr x 1;
* biases and gains: lr x D; attention scores x attn_mult / d_head;
* residual branches: x -> (x + tau_i f_i(x)) / sqrt(1 + tau_i^2), tau_i from residual_mult and
  residual_attn_ratio; with every branch's input normalised (pre-norm) this is the same function as
  x + (alpha_i / sqrt(L)) f_i(x), alpha_ffn = residual_mult sqrt(2 / (1 + r^2)), alpha_attn = r alpha_ffn
  (the normalisations telescope: prod_{j<i} (1 + tau_j^2) = (L + sum_{j<i} alpha_j^2) / L), which is how it is
  applied here;
* decay: ``param.decay=coupled`` (the default) keeps AdamW's lr_t x wd, divided by each parameter's lr
  multiplier; ``independent`` is the reference's ``independent_weight_decay``: each parameter decays by
  wd x lr_t / lr_peak a step, whatever its lr multiplier and the peak rate (``optim.weight_decay`` is then the
  fraction decayed per step at the peak, 1e-4 to 1e-3 being usual).

**Stored at µP's scale.** A weight W of unit init whose output is scaled by s and whose Adam step is lr x k is,
step for step, the weight s W with init sd s and Adam step lr x s k (Adam's update does not change when its
gradient is scaled, up to eps; abc-symmetry, Yang et al. 2022 §J.2.3). modforge stores every matrix that way
(sd c / sqrt(n), Adam lr x c D / n): checkpoints stay plain matrices that export as any other, activations are
the same as the reference's, and no op needs a hook. What differs: gradients are not unit-scaled (they are
autograd's), so Adam's eps and gradient clipping act on other numbers than the reference's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from modforge.components.attention import Attention
from modforge.components.optim import PER_PEAK
from modforge.components.ffn import FFN
from modforge.models.blocks import Block
from modforge.models.param import Parametrisation, fan_in, in_stack, on_meta, roles, scaled_groups, stacks
from modforge.registry import ConfigError, as_dict, register

WHO = "param=umup"
TIED = ("param=umup: model.tie_embeddings=true, but u-µP's embedding and readout follow different rules (lr x "
        "1/sqrt(width) against x 1, no output scale against 1/width): set model.tie_embeddings=false")


@dataclass
class UMuPConfig:
    residual_mult: float = 1.0  # alpha_res: the branches' weight against the embedding
    residual_attn_ratio: float = 1.0  # r: an attention branch's weight over an FFN branch's
    attn_mult: float = 1.0  # scores x attn_mult / d_head (alpha_attn-softmax)
    output_mult: float = 1.0  # logits x output_mult / d_model (alpha_loss-softmax)
    seq_len: Optional[int] = None  # S of attention's output scale (null: model.max_len)
    decay: str = "coupled"  # coupled: lr_t x wd (AdamW's); independent: wd x lr_t / lr_peak a step (the reference)

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ConfigError(f"param.decay={self.decay!r}: one of {', '.join(DECAYS)} (independent: each "
                              "parameter decays by optim.weight_decay x lr_t / lr_peak a step, as the reference; "
                              "coupled: AdamW's lr_t x weight_decay)")
        for k in ("residual_mult", "residual_attn_ratio", "attn_mult", "output_mult"):
            if not getattr(self, k) > 0:
                raise ConfigError(f"param.{k}={getattr(self, k)}: must be > 0 (u-µP's multipliers default to 1)")
        if self.seq_len is not None and not (isinstance(self.seq_len, int) and self.seq_len >= 2):
            raise ConfigError(f"param.seq_len={self.seq_len}: a whole number >= 2, or null (model.max_len)")

    def check(self, run: dict) -> list:
        """Under independent decay optim.weight_decay is a fraction per step: AdamW's usual 0.1 would take a
        tenth of every weight each step, so a value above MOST_DECAY is refused in one line."""
        wd = (run.get("optim") or {}).get("weight_decay") or 0.0
        if self.decay == "independent" and wd > MOST_DECAY:
            raise ConfigError(f"optim.weight_decay={wd:g} with param=umup: under u-µP's independent decay this is "
                              "the fraction of every weight decayed per step at the peak rate; give at most "
                              f"{MOST_DECAY:g} (1e-4 to 1e-3 are usual), or param.decay=coupled (the default) for "
                              "AdamW's lr x weight_decay")
        return []


DECAYS = ("coupled", "independent")
MOST_DECAY = 0.01  # a fraction per step above this, under independent decay, is AdamW's convention carried over


def attention_scale(d_head: int, seq_len: int, causal: bool, mult: float = 1.0) -> float:
    """u-µP's scale of an attention's output for unit-scaled q, k, v: (S / l)^((1 - a) / 2) with
    a = 1 / (1 + 4 d_head / mult^2), l = ln S causal, else 1 (the reference's log-interpolated fit between
    uniform attention over S / l keys and one-hot attention)."""
    a = 1.0 / (1.0 + 4.0 * d_head / mult ** 2)
    ell = math.log(seq_len) if causal else 1.0
    return (seq_len / ell) ** ((1.0 - a) / 2.0)


@register("param", "umup", config=UMuPConfig)
class UMuP(Parametrisation):
    """u-µP (Blake et al. 2024): unit-scaled init and ops, no base shape; stored at µP's scale"""

    uses_groups = True

    def __init__(self, cfg: UMuPConfig):
        self.cfg = cfg
        self.scales: dict[str, tuple[float, float, float]] = {}  # name -> (lr, eps, weight decay) multipliers
        self.unit: dict[str, float] = {}  # a matrix that reads a nonlinearity or attention -> that op's scale

    def preflight(self, model_cfg: Any, parts: Any) -> None:
        if as_dict(model_cfg).get("tie_embeddings"):
            raise ConfigError(TIED)
        on_meta(model_cfg, parts, self)

    def apply(self, model: nn.Module, make_model: Callable[[dict], nn.Module]) -> None:
        c = self.cfg
        tok = getattr(model, "tok", None)
        if tok is not None and model.head.weight is tok.weight:
            raise ConfigError(TIED)
        role = roles(model, WHO)
        depths = stacks(model)
        seq = c.seq_len or int(model.cfg.max_len)
        self.unit = self._unit_scales(model, seq)
        with torch.no_grad():
            for name, p in model.named_parameters():
                where = in_stack(name, depths)
                deep = 1.0 / math.sqrt(depths[where[0]]) if where else 1.0
                r = role[name]
                if r == "hidden":
                    s = self.unit.get(name, 1.0)
                    target, lr = s / math.sqrt(fan_in(p)), s * deep / fan_in(p)
                elif r == "input":
                    target, lr = 1.0, deep / math.sqrt(p.shape[-1])
                elif r == "output":
                    target, lr = 1.0, deep
                else:
                    target, lr = None, deep
                if target is not None and p.numel() > 1:
                    sd = float(p.float().std())
                    if sd > 0:
                        p.mul_(target / sd)  # the draws kept, at u-µP's sd
                self.scales[name] = (lr, 1.0, 1.0 / lr)
        model.readout_mult = c.output_mult / model.head.in_features
        self._ops(model, depths)

    def _unit_scales(self, model: nn.Module, seq: int) -> dict:
        """{name of a matrix: the unit scale of the op it reads}: each FFN's and attention's ``residual_out``
        matrix."""
        out = {}
        for bname, b in model.named_modules():
            if not isinstance(b, Block):
                continue
            for attr in ("self_attn", "cross_attn", "ffn"):
                m = getattr(b, attr, None)
                if m is None:
                    continue
                where = f"{bname}.{attr}"
                if isinstance(m, Attention):
                    s = attention_scale(m.d_head, seq, causal=b.causal and attr == "self_attn",
                                        mult=self.cfg.attn_mult)
                elif isinstance(m, FFN):
                    try:
                        s = m.unit_scale()
                    except NotImplementedError:
                        raise ConfigError(f"param=umup: {type(m).__name__} ({where}) gives no unit_scale() (1 / the sd "
                                          "of the activation its residual_out matrix reads, for unit-Gaussian "
                                          "pre-activations; docs/mup.md)") from None
                else:
                    continue
                outs = [n for n, sub in m.named_modules() if getattr(sub, "residual_out", False)]
                if len(outs) != 1:
                    raise ConfigError(f"param=umup: {type(m).__name__} ({where}) marks {len(outs)} Linear layers "
                                      "residual_out; u-µP scales the one that writes into the residual stream")
                out[f"{where}.{outs[0]}.weight"] = s
        return out

    def _ops(self, model: nn.Module, depths: dict) -> None:
        """Scores x attn_mult / d_head; each residual branch x alpha / sqrt(L); no width-dependent multiplier
        held anywhere else (an embedding scaled by sqrt(d_model) is refused)."""
        c = self.cfg
        ffn_alpha = c.residual_mult * math.sqrt(2.0 / (1.0 + c.residual_attn_ratio ** 2))
        for name, m in model.named_modules():
            for attr in getattr(m, "held_at_base", ()):
                if getattr(m, attr) != 1.0:
                    raise ConfigError(f"param=umup: {type(m).__name__} ({name or 'the model'}) multiplies by "
                                      f"{attr}={getattr(m, attr):.4g}, which grows with width; u-µP's ops carry "
                                      "no such multiplier (e.g. set model.scale_embeddings=false)")
            if isinstance(m, Attention):
                if not getattr(m, "scales_scores", False):
                    raise ConfigError(f"param=umup: {type(m).__name__} ({name}) does not declare `scales_scores` "
                                      "(passing self.score_scale to SDPA's scale=); u-µP's scores are x "
                                      "attn_mult / d_head")
                m.score_scale = c.attn_mult / m.d_head
            if isinstance(m, Block):
                if getattr(m, "parallel", False):
                    raise ConfigError(f"param=umup: {name} is a parallel block (residual=parallel): one residual "
                                      "carries every branch, but u-µP scales the attention and FFN branches apart "
                                      "(residual_attn_ratio); use residual=pre")
                L = depths[in_stack(name, depths)[0]]
                for attr, alpha in (("r_self", c.residual_attn_ratio * ffn_alpha),
                                    ("r_cross", c.residual_attn_ratio * ffn_alpha), ("r_ffn", ffn_alpha)):
                    r = getattr(m, attr, None)
                    if r is None:
                        continue
                    if not (getattr(r, "pre_norm", False) and getattr(r, "scales_branch", False)):
                        raise ConfigError(f"param=umup: {type(r).__name__} ({name}.{attr}) is not a pre-norm "
                                          "residual that scales its branch (`pre_norm` and `scales_branch`); "
                                          "u-µP's residual rule holds where every branch's input is normalised "
                                          "(residual=pre)")
                    r.branch_mult = alpha / math.sqrt(L)

    def groups(self, root: nn.Module) -> list[dict]:
        out = scaled_groups(root, self.scales, (1.0, 1.0, 1.0), WHO)
        if self.cfg.decay == "independent":
            for g in out:
                g[PER_PEAK] = True  # the optimizer divides the decay by the peak rate (modforge.components.optim)
        return out

    def describe(self) -> str:
        c = self.cfg
        return (f"umup: unit-scaled, no base shape; residual_mult {c.residual_mult:g}, attn ratio "
                f"{c.residual_attn_ratio:g}, attn_mult {c.attn_mult:g}, output_mult {c.output_mult:g}; "
                f"{c.decay} decay")

