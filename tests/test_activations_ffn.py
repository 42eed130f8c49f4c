import math

import pytest
import torch
import torch.nn.functional as F

from modforge.registry import build

X = torch.linspace(-6, 6, 301)

REFERENCES = {
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "tanh": lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "leaky_relu": lambda x: torch.maximum(x, 0.01 * x),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_activation_matches_formula(name):
    torch.testing.assert_close(build("activation", name)(X), REFERENCES[name](X), rtol=1e-5, atol=1e-6)


def test_gelu_exact_and_tanh_differ():
    d = (build("activation", "gelu")(X) - build("activation", "gelu_tanh")(X)).abs().max()
    assert 1e-5 < d < 1e-2


def test_leaky_relu_slope_is_configurable():
    act = build("activation", {"name": "leaky_relu", "negative_slope": 0.2})
    assert act(torch.tensor([-1.0])).item() == pytest.approx(-0.2)


def test_mlp_ffn_formula():
    ffn = build("ffn", "relu", 8, 32)
    x = torch.randn(2, 3, 8)
    want = F.linear(F.relu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), ffn.w2.weight, ffn.w2.bias)
    torch.testing.assert_close(ffn(x), want)
    ffn_any = build("ffn", {"name": "mlp", "activation": "tanh"}, 8, 32)
    want = ffn_any.w2(torch.tanh(ffn_any.w1(x)))
    torch.testing.assert_close(ffn_any(x), want)


@pytest.mark.parametrize("name,act", [("glu", torch.sigmoid), ("reglu", F.relu), ("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_ffn_formula(name, act):
    # Shazeer 2020: FFN(x) = (act(x W) * (x V)) W2, no biases
    ffn = build("ffn", name, 8, 24)
    W, V = ffn.w_gate_up.weight.chunk(2, dim=0)
    x = torch.randn(2, 3, 8)
    want = (act(x @ W.T) * (x @ V.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), want)
    assert ffn.w_gate_up.bias is None and ffn.w2.bias is None


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_gated_ffn_matches_ungated_parameter_count():
    d, d_ff = 64, 256
    ungated = build("ffn", {"name": "relu", "bias": False}, d, d_ff)
    gated = build("ffn", "swiglu", d, d_ff)
    assert gated.hidden == round(2 * d_ff / 3)
    assert abs(n_params(gated) - n_params(ungated)) <= 3 * d  # rounding of 2/3 d_ff only
    big = build("ffn", {"name": "swiglu", "match_params": False}, d, d_ff)
    assert n_params(big) == 3 * d * d_ff


def test_unknown_activation_in_ffn_suggests():
    with pytest.raises(KeyError, match="Did you mean 'gelu'"):
        build("ffn", {"name": "mlp", "activation": "gelux"}, 8, 16)
