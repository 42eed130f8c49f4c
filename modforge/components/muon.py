"""Muon (kind ``optim``, ``muon``): torch's own ``torch.optim.Muon`` on the hidden matrices, AdamW on the rest.

Muon (Jordan et al. 2024) replaces each hidden matrix's momentum update by its nearest semi-orthogonal matrix
(five Newton–Schulz iterations); it is meant for hidden weight matrices only, so the embeddings, the head and
every gain and bias train with AdamW, as in modded-nanogpt and Moonlight (Liu et al. 2025). Which matrices are
hidden comes from the components' own declarations (``param_roles``, the ones µP reads: role ``hidden`` and two
dimensions), never from names; a component that declares no roles is refused in one line.

Conventions chosen (docs/variants.md): ``adjust_lr_fn=match_rms_adamw`` by default (Liu et al. 2025: the update
scaled to AdamW's RMS, 0.2 sqrt(max(rows, cols)), so one ``optim.lr`` and one ``weight_decay`` serve both
optimizers); ``original`` is Jordan's max(1, rows / cols)^0.5. A fused matrix (attention's q, k, v in one
``qkv``; a gated FFN's ``w_gate_up``) is orthogonalised as one matrix, as ``torch.optim.Muon`` does with any
2-D parameter. The schedule scales both optimizers' rates alike. Under ``param=mup`` or ``umup`` Muon is refused:
their per-group rules are Adam's.
"""
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Optional

import torch

from modforge.registry import ConfigError, register


@dataclass
class MuonConfig:
    lr: float = 0.02  # both optimizers' peak rate (with match_rms_adamw: an AdamW-like rate)
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5  # Newton-Schulz iterations
    weight_decay: float = 0.1  # decoupled, on Muon's matrices and AdamW's matrices (not gains and biases)
    adjust_lr_fn: str = "match_rms_adamw"  # or "original" (Jordan: max(1, rows/cols)^0.5)
    adam_lr: Optional[float] = None  # AdamW's own peak rate for embeddings, head, gains, biases; null: lr
    adam_betas: list = field(default_factory=lambda: [0.9, 0.95])
    adam_eps: float = 1e-8

    def __post_init__(self):
        if not self.lr > 0 or (self.adam_lr is not None and not self.adam_lr > 0):
            raise ConfigError(f"optim.lr={self.lr}, optim.adam_lr={self.adam_lr}: must be > 0 (adam_lr may be null)")
        if not 0.0 <= self.momentum < 1.0 or self.ns_steps < 1 or self.weight_decay < 0:
            raise ConfigError(f"optim.momentum={self.momentum}, optim.ns_steps={self.ns_steps}, "
                              f"optim.weight_decay={self.weight_decay}: momentum in [0, 1), ns_steps >= 1, "
                              "weight_decay >= 0")
        if self.adjust_lr_fn not in ("match_rms_adamw", "original"):
            raise ConfigError(f"optim.adjust_lr_fn={self.adjust_lr_fn!r}: match_rms_adamw (Liu et al. 2025) or "
                              "original (Jordan et al. 2024)")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"optim.adam_betas={list(self.adam_betas)}: two numbers in [0, 1)")

    def check(self, run: dict) -> list:
        param = run.get("param") or "standard"
        name = param.get("name") if hasattr(param, "get") else param
        if name != "standard":
            raise ConfigError(f"optim=muon with param={name}: that parametrisation's per-group rules are Adam's "
                              "(Muon's width rule is its adjust_lr_fn); use param=standard, or optim=adamw")
        return []


class _Routed(MutableMapping):
    """Both optimizers' states as one mapping, each parameter's entry read and written in its own optimizer's
    (their states are defaultdicts: a lookup in the wrong one would create an empty entry there)."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw
        self.muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}

    def _of(self, p):
        return (self.muon if id(p) in self.muon_ids else self.adamw).state

    def __getitem__(self, p):
        return self._of(p)[p]

    def __setitem__(self, p, value) -> None:
        self._of(p)[p] = value

    def __delitem__(self, p) -> None:
        del self._of(p)[p]

    def __iter__(self):
        yield from self.muon.state
        yield from self.adamw.state

    def __len__(self) -> int:
        return len(self.muon.state) + len(self.adamw.state)


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer to Lightning and the schedule: ``torch.optim.Muon`` over ``muon_groups``, ``AdamW`` over
    ``adam_groups``; ``param_groups`` is both lists (the very dicts, so a schedule scales both), ``state`` both
    states, and ``state_dict`` both, so a run resumes exactly."""

    def __init__(self, muon_groups: list, adam_groups: list, cfg: MuonConfig):
        self.muon = torch.optim.Muon(muon_groups, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                                     nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, adjust_lr_fn=cfg.adjust_lr_fn)
        self.adamw = torch.optim.AdamW(adam_groups, lr=cfg.adam_lr or cfg.lr, betas=tuple(cfg.adam_betas),
                                       eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        params = [p for g in muon_groups + adam_groups for p in g["params"]]
        super().__init__(params, {"lr": cfg.lr})
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self):
        return _Routed(self.muon, self.adamw)

    @state.setter
    def state(self, value) -> None:  # (Optimizer.__init__ sets an empty one; the two optimizers hold theirs)
        pass

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    # state_dict: torch's own, over both optimizers' groups (Muon's first), which Lightning saves and checks

    def __getstate__(self) -> dict:  # (torch's keeps only defaults, state and groups: the two optimizers are ours)
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def load_state_dict(self, state_dict: dict) -> None:
        n = len(self.muon.param_groups)
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ConfigError(f"optim=muon: the saved optimizer state has {len(groups) if isinstance(groups, list) else 'no'} "
                              f"parameter groups, this one {len(self.param_groups)} (Muon's, then AdamW's): not a state "
                              "of this optimizer and model")
        for inner, part in ((self.muon, groups[:n]), (self.adamw, groups[n:])):
            index = {old: new for new, old in enumerate(i for g in part for i in g["params"])}
            inner.load_state_dict({"state": {index[i]: v for i, v in state_dict["state"].items() if i in index},
                                   "param_groups": [{**g, "params": [index[i] for i in g["params"]]} for g in part]})
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


@register("optim", "muon", config=MuonConfig)
def muon(cfg: MuonConfig, params) -> torch.optim.Optimizer:
    """Muon (torch.optim.Muon) on hidden matrices, AdamW on embeddings, head, gains and biases"""
    groups = list(params)
    if not (groups and isinstance(groups[0], dict) and all("role" in g for g in groups)):
        raise ConfigError("optim=muon needs its parameters by role (the task passes them so); build it with "
                          "groups [{'params': [...], 'role': 'hidden' | 'input' | 'output' | 'vector'}]")
    matrices = [p for g in groups if g["role"] == "hidden" for p in g["params"] if p.dim() == 2 and p.requires_grad]
    chosen = {id(p) for p in matrices}
    rest = [p for g in groups for p in g["params"] if id(p) not in chosen and p.requires_grad]
    if not matrices:
        raise ConfigError("optim=muon: the model declares no hidden matrix (param_roles) for Muon to train")
    adam = [{"params": [p for p in rest if p.dim() >= 2]},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    return MuonWithAdamW([{"params": matrices}], [g for g in adam if g["params"]], cfg)


muon.by_role = True  # the task passes {"params", "role"} groups (modforge.tasks.base.Task.configure_optimizers)
