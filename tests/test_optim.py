"""Optimizers and learning-rate schedules against torch and the reference formulas (reference 001, Vaswani et al.)."""
import math

import pytest
import torch
from torch import nn

from modforge.registry import ConfigError, build


def lrs(name: str, steps: int, d_model: int = 512, **cfg) -> list[float]:
    """The learning rate of each optimizer step 1..steps (base lr 1)."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build("scheduler", {"name": name, **cfg}, opt, d_model=d_model, total_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_noam_is_the_papers_formula_counting_steps_from_one():
    got = lrs("noam", 10_000, d_model=512, warmup_steps=4000)
    for step in (1, 2, 100, 3999, 4000, 4001, 10_000):  # lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5)
        assert got[step - 1] == pytest.approx(512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5), rel=1e-12)
    assert max(got) == got[4000 - 1]  # the peak is at the end of the warm-up


def test_cosine_warms_up_linearly_then_decays_to_its_floor():
    got = lrs("cosine", 1000, warmup_steps=100, min_lr_ratio=0.1)
    assert got[0] == pytest.approx(1 / 101) and got[99] == pytest.approx(100 / 101)
    assert got[100] == pytest.approx(1.0)
    mid = 100 + 450  # half-way through the decay: the floor plus half the range
    assert got[mid] == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 0.9)
    assert all(a >= b for a, b in zip(got[100:], got[101:])) and got[-1] > 0.1 - 1e-12


def test_cosine_needs_a_length():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="total_steps"):
        build("scheduler", "cosine", opt, d_model=8, total_steps=None)


def test_constant_after_its_warm_up():
    assert lrs("constant", 5) == [1.0] * 5
    assert lrs("constant", 6, warmup_steps=3)[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_adam_is_torchs_adam_with_the_configured_betas():
    p = nn.Parameter(torch.ones(3))
    opt = build("optim", {"name": "adam", "lr": 0.5, "betas": [0.9, 0.98], "eps": 1e-9}, [p])
    assert isinstance(opt, torch.optim.Adam)
    g = opt.param_groups[0]
    assert (g["lr"], tuple(g["betas"]), g["eps"]) == (0.5, (0.9, 0.98), 1e-9)


def test_adamw_decays_matrices_only_unless_asked():
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = build("optim", {"name": "adamw", "weight_decay": 0.1}, m.parameters())
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(m[0].weight)}  # biases and the norm's gain and bias are not decayed (nanoGPT, GPT-2)
    everything = build("optim", {"name": "adamw", "weight_decay": 0.1, "decay_norms_and_biases": True}, m.parameters())
    assert all(g["weight_decay"] == 0.1 for g in everything.param_groups)
