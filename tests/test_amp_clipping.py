"""Gradient clipping with a fused optimizer under mixed precision (what ``trainer=gpu`` and ``trainer=gpu_fp16``
train with on CUDA): Lightning refuses it, modforge's task unscales and clips first. The first GPU check found
every ``trainer=gpu`` run failing at its first step with clipping on (the default recipes clip at 1.0)."""
import json
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from conftest import run_in_process, tiny_overrides
from modforge.tasks.base import Task


class _Clipper(L.LightningModule):
    configure_gradient_clipping = Task.configure_gradient_clipping

    def __init__(self, plugin):
        super().__init__()
        self.stub = SimpleNamespace(precision_plugin=plugin)

    @property
    def trainer(self):
        return self.stub


def _step(fused: bool, clip: float, hook: bool) -> torch.Tensor:
    """One fp16-scaled SGD step on fixed gradients: through the task's hook (``hook``), or as torch's AMP recipe
    writes it by hand (unscale, clip, step) with an unfused optimizer."""
    w = torch.nn.Parameter(torch.arange(1.0, 7.0))
    opt = torch.optim.SGD([w], lr=0.1, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((w ** 2).sum()).backward()  # gradient 2w, norm ~19, scaled by 1024
    if hook:
        _Clipper(MixedPrecision("16-mixed", "cpu", scaler)).configure_gradient_clipping(opt, clip, "norm")
    else:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([w], clip)
    scaler.step(opt)
    scaler.update()
    return w.detach()


def test_a_fused_optimizer_is_unscaled_then_clipped_as_torchs_recipe_does():
    want = _step(fused=False, clip=1.0, hook=False)
    got = _step(fused=True, clip=1.0, hook=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    unclipped = _step(fused=False, clip=1e9, hook=False)
    assert (got - unclipped).abs().max() > 0.5  # the clip acted (a step of lr * 2w without it)


def test_lightning_alone_refuses_what_the_hook_allows():
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1, fused=True)
    plugin = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        plugin.clip_gradients(opt, 1.0)


def _val_loss(tmp_path, name: str, *extra: str) -> float:
    d = tmp_path / name
    r = run_in_process("modforge.train", tmp_path, *tiny_overrides(d, steps=3), "trainer.precision=bf16-mixed",
                       "sample=false", "eval_at_start=false", "optim.lr=0.01", "scheduler.warmup_steps=0", *extra)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads((d / "metrics.json").read_text())["val"]["val/loss"]


def test_a_bf16_run_with_a_fused_adamw_clips_like_the_unfused_one(tmp_path):
    fused = _val_loss(tmp_path, "fused", "optim.fused=true", "trainer.gradient_clip_val=0.01")
    unfused = _val_loss(tmp_path, "unfused", "optim.fused=false", "trainer.gradient_clip_val=0.01")
    unclipped = _val_loss(tmp_path, "unclipped", "optim.fused=true", "trainer.gradient_clip_val=0")
    assert fused == pytest.approx(unfused, abs=2e-3)
    assert abs(fused - unclipped) > 10 * abs(fused - unfused)
