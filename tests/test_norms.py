import warnings

import pytest
import torch
from torch import nn

from modforge.registry import build


def test_layer_matches_torch():
    d = 16
    ours = build("norm", {"name": "layer", "eps": 1e-5}, d)
    ref = nn.LayerNorm(d, eps=1e-5)
    with torch.no_grad():
        ref.weight.normal_(); ref.bias.normal_()
        ours.weight.copy_(ref.weight); ours.bias.copy_(ref.bias)
    x = torch.randn(3, 5, d) * 3 + 2
    torch.testing.assert_close(ours(x), ref(x))


def test_layer_without_bias_has_no_bias_param():
    n = build("norm", {"name": "layer", "bias": False}, 8)
    assert n.bias is None and sum(p.numel() for p in n.parameters()) == 8


def test_rms_inside_matches_torch_rmsnorm():
    d = 16
    ours = build("norm", {"name": "rms", "eps": 1e-6, "eps_placement": "inside"}, d)
    ref = nn.RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_(); ours.weight.copy_(ref.weight)
    x = torch.randn(2, 7, d) * 0.01  # small activations: where eps matters
    torch.testing.assert_close(ours(x), ref(x))


def test_rms_inside_gradients_match_torch_rmsnorm():
    # the inside placement has its own backward (faster than autograd's): it must give torch's gradients
    d = 16
    ours = build("norm", {"name": "rms", "eps": 1e-6}, d).double()
    ref = nn.RMSNorm(d, eps=1e-6).double()
    with torch.no_grad():
        ref.weight.normal_(); ours.weight.copy_(ref.weight)
    x = (torch.randn(3, 5, d, dtype=torch.float64) * 0.05).requires_grad_()
    gy = torch.randn(3, 5, d, dtype=torch.float64)
    gx, gw = torch.autograd.grad(ours(x), (x, ours.weight), gy)
    rx, rw = torch.autograd.grad(ref(x), (x, ref.weight), gy)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x, w: ours.__class__.forward(ours, x) * w.sum(), (x, ours.weight))
    with torch.no_grad():  # the inference path gives the same numbers
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError):  # no silently wrong second derivatives
        g, = torch.autograd.grad(ours(x).pow(2).sum(), x, create_graph=True)
        g.sum().backward()
    # low precision in (bf16-mixed: bf16 activations, fp32 weight): F.rms_norm's dtype and rounding, with grad or not
    ours.float()
    xb = x.detach().bfloat16().requires_grad_()
    yb = ours(xb)
    with torch.no_grad():
        yb_eval = ours(xb)
    with warnings.catch_warnings():  # torch: mixed dtypes "cannot dispatch to fused implementation"
        warnings.simplefilter("ignore")
        want = torch.nn.functional.rms_norm(xb, (d,), ours.weight, 1e-6)
    assert yb.dtype == yb_eval.dtype == want.dtype == torch.bfloat16
    assert torch.equal(yb, want) and torch.equal(yb_eval, want)
    assert torch.isfinite(torch.autograd.grad(yb.float().sum(), xb)[0]).all()


def test_rms_outside_matches_reference_formula():
    # reference 000/001: RMSNorm(x) = gamma * x / (RMS(x) + eps), RMS = sqrt(mean(x^2))
    d, eps = 16, 1e-2  # a large eps makes the two conventions clearly different
    ours = build("norm", {"name": "rms", "eps": eps, "eps_placement": "outside"}, d)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, d) * 0.1
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(ours(x), ours.weight * x / (rms + eps))
    inside = build("norm", {"name": "rms", "eps": eps, "eps_placement": "inside"}, d)
    with torch.no_grad():
        inside.weight.copy_(ours.weight)
    assert not torch.allclose(inside(x), ours(x), atol=1e-4)


def test_rms_bad_placement_is_a_clear_error():
    with pytest.raises(ValueError, match="eps_placement.*inside.*outside"):
        build("norm", {"name": "rms", "eps_placement": "middle"}, 8)


def test_batch_matches_batchnorm1d_on_unpadded_tokens():
    d = 8
    ours = build("norm", {"name": "batch", "momentum": 0.1}, d)
    ref = nn.BatchNorm1d(d, momentum=0.1)
    x = torch.randn(4, 6, d) * 2 + 1
    y = ours(x, None)
    y_ref = ref(x.reshape(-1, d)).view_as(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    # the masked path with an all-true mask is the same computation
    ours2 = build("norm", "batch", d)
    torch.testing.assert_close(ours2(x, torch.ones(4, 6, dtype=torch.bool)), y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours2.running_var, ref.running_var)
    # eval uses running statistics, like torch
    ours.eval(); ref.eval()
    torch.testing.assert_close(ours(x), ref(x.reshape(-1, d)).view_as(x))


def test_batch_statistics_ignore_padding():
    d = 8
    x = torch.randn(3, 5, d)
    lengths = torch.tensor([5, 3, 2])
    mask = torch.arange(5)[None] < lengths[:, None]
    real = x[mask]  # (N, d) the real tokens only
    ref = nn.BatchNorm1d(d)
    want = ref(real)
    ours = build("norm", "batch", d)
    padded = x.clone()
    padded[~mask] = 1000.0  # garbage in the padding must not matter
    got = ours(padded, mask)[mask]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)


def test_causal_batch_norm_sees_no_later_token_and_matches_batch_norm_at_the_last_position():
    """In training, norm=batch mixes every position: a change at the last position moves the first one's output.
    norm=batch_causal normalises position t by the batch's real tokens at positions <= t (against a direct prefix
    computation), so it does not; its last position and its running statistics are norm=batch's; eval normalises as
    training does."""
    d, x = 8, torch.randn(3, 6, 8) * 2 + 1
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 4:] = False
    later = x.clone()
    later[:, -1] += 5.0
    leaky, causal = build("norm", "batch", d), build("norm", "batch_causal", d)
    assert not torch.allclose(leaky(x, mask)[:, 0], leaky(later, mask)[:, 0])
    torch.testing.assert_close(causal(x, mask)[:, :-1], causal(later, mask)[:, :-1])
    causal, ref = build("norm", "batch_causal", d), build("norm", "batch", d)
    got, want = causal(x, mask), ref(x, mask)
    for t in range(6):
        real = x[:, : t + 1][mask[:, : t + 1]]
        expect = (x[:, t] - real.mean(0)) / torch.sqrt(real.var(0, unbiased=False) + 1e-5)
        torch.testing.assert_close(got[:, t], expect, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:2, -1], want[:2, -1], rtol=1e-4, atol=1e-4)  # the last position: every token
    torch.testing.assert_close(causal.running_mean, ref.running_mean)
    torch.testing.assert_close(causal.running_var, ref.running_var)
    causal.eval()  # eval normalises as training does (prefix statistics of the batch), and updates nothing
    torch.testing.assert_close(causal(x, mask), got)
    torch.testing.assert_close(causal.running_mean, ref.running_mean)


def test_rms_outside_keeps_float64_in_float64():
    from modforge.registry import build as build_

    norm = build_("norm", {"name": "rms", "eps_placement": "outside", "eps": 1e-6}, 8).double()
    x = torch.randn(3, 8, dtype=torch.float64) * 1e-3
    want = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6)
    assert norm(x).dtype == torch.float64
    torch.testing.assert_close(norm(x), want, rtol=1e-14, atol=1e-17)
