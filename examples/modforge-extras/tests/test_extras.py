"""Tests of the modforge-extras components against their papers' formulas.

They need the package installed (``pip install -e examples/modforge-extras``)
so that modforge finds it through its ``modforge.plugins`` entry point.
"""
import math

import pytest
import torch

from modforge import registry
from modforge.plugins import load_all
from modforge.models.architectures import ModelConfig
from modforge.models.blocks import Parts

load_all()
if "scale" not in registry.registry("norm"):
    pytest.skip("modforge-extras is not installed (pip install -e examples/modforge-extras)", allow_module_level=True)

from modforge_extras import alibi_slopes  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_components_come_from_the_plugin_distribution():
    for kind, name in [("norm", "scale"), ("norm", "dyt"), ("ffn", "relu2"), ("pos", "alibi")]:
        entry = registry.get(kind, name)
        assert entry.provider.startswith("modforge-extras "), entry.provider
        assert entry.cls.__module__ == "modforge_extras"
    assert any(p.startswith("modforge-extras ") for p, _ in registry.plugin_config_dirs())


def test_scalenorm_matches_formula():
    d = 16
    norm = registry.build("norm", "scale", d)
    assert norm.g.shape == () and norm.g.item() == pytest.approx(math.sqrt(d))
    x = torch.randn(2, 5, d)
    want = math.sqrt(d) * x / x.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(norm(x, None), want)
    # every output vector has norm g; eps guards the zero vector
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((2, 5), math.sqrt(d)))
    assert torch.equal(norm(torch.zeros(1, 1, d)), torch.zeros(1, 1, d))
    # g is learned and configurable
    norm2 = registry.build("norm", {"name": "scale", "g_init": 2.0, "eps": 1e-3}, d)
    assert norm2.g.requires_grad and norm2.g.item() == 2.0
    small = torch.full((1, 1, d), 1e-6)
    torch.testing.assert_close(norm2(small), 2.0 * small / 1e-3)


def test_dyt_matches_formula():
    d = 8
    dyt = registry.build("norm", "dyt", d)
    assert dyt.alpha.item() == 0.5 and dyt.alpha.shape == ()
    with torch.no_grad():
        dyt.weight.copy_(torch.randn(d))
        dyt.bias.copy_(torch.randn(d))
        dyt.alpha.fill_(1.7)
    x = torch.randn(3, 4, d)
    torch.testing.assert_close(dyt(x, None), dyt.weight * torch.tanh(1.7 * x) + dyt.bias)
    no_bias = registry.build("norm", {"name": "dyt", "bias": False, "alpha_init": 2.0}, d)
    assert no_bias.bias is None
    torch.testing.assert_close(no_bias(x), torch.tanh(2.0 * x))


def test_relu2_matches_formula():
    ffn = registry.build("ffn", "relu2", 8, 32)
    assert ffn.w1.bias is None and ffn.w2.bias is None
    x = torch.randn(2, 3, 8)
    want = torch.relu(x @ ffn.w1.weight.T).pow(2) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), want)
    biased = registry.build("ffn", {"name": "relu2", "bias": True}, 8, 32)
    want = (torch.relu(biased.w1(x)) ** 2) @ biased.w2.weight.T + biased.w2.bias
    torch.testing.assert_close(biased(x), want)


def test_alibi_slopes_follow_the_paper():
    # power of two: 2^(-8h/H)
    assert alibi_slopes(8) == pytest.approx([2 ** -(h) for h in range(1, 9)])
    assert alibi_slopes(4) == pytest.approx([2 ** (-2 * h) for h in range(1, 5)])
    assert alibi_slopes(1) == pytest.approx([2**-8])
    # otherwise: slopes of the closest power of two, then every other slope of the next one
    s8, s16 = alibi_slopes(8), alibi_slopes(16)
    assert alibi_slopes(12) == pytest.approx(s8 + s16[0::2][:4])
    assert alibi_slopes(6) == pytest.approx(alibi_slopes(4) + alibi_slopes(8)[0::2][:2])
    assert alibi_slopes(3) == pytest.approx([2**-4, 2**-8, 2**-2])


def test_alibi_bias_values():
    H, T = 4, 6
    pos = registry.build("pos", "alibi", 32, H, 64)
    bias = pos.attn_bias(T, T, 0)
    assert bias.shape == (H, T, T) and bias.dtype == torch.float32
    slopes = alibi_slopes(H)
    for h in range(H):
        for i in range(T):
            for j in range(T):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * abs(i - j))
    # the other hooks are identities: ALiBi adds no embedding and no rotation
    x = torch.randn(1, T, 32)
    assert torch.equal(pos.embed(x, 3), x) and torch.equal(pos.rotate(x, 3), x)


def test_alibi_is_translation_invariant():
    """The bias depends only on i - j: shifting every position (the cache offset) changes nothing."""
    pos = registry.build("pos", "alibi", 16, 2, 64)
    full = pos.attn_bias(10, 10, 0)
    for offset in (1, 4, 9):
        # queries offset..9 against keys 0..9: the last rows of the full bias
        torch.testing.assert_close(pos.attn_bias(10 - offset, 10, offset), full[:, offset:])
        # the same relative layout, shifted by offset: identical
        shifted = pos.attn_bias(3, offset + 3, offset)[:, :, offset:]
        torch.testing.assert_close(shifted, pos.attn_bias(3, 3, 0))


def _tiny(model: str, **kw):
    parts = Parts(norm="scale", ffn="relu2", pos="alibi")
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=32, **kw)
    return registry.build("model", {"name": model, **cfg.__dict__}, parts, 11).eval()


def test_alibi_cached_decoding_matches_full_forward():
    model = _tiny("decoder_only")
    idx = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :4], cache=cache, offset=0)]  # prompt, then one token at a time
        for t in range(4, 9):
            steps.append(model(idx[:, t : t + 1], cache=cache, offset=t))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_alibi_in_bidirectional_encoder_is_symmetric_and_respects_padding():
    model = _tiny("encoder_only")
    idx = torch.randint(0, 11, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        out = model(idx, mask)
        # a padded row gives its real tokens the same result as the unpadded prefix alone
        alone = model(idx[1:, :5])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1:, :5], alone, atol=1e-5, rtol=1e-5)
    # future tokens matter in an encoder (no causal mask)
    idx2 = idx.clone()
    idx2[0, -1] = (idx2[0, -1] + 1) % 11
    with torch.no_grad():
        assert not torch.allclose(model(idx2, mask)[0, 0], out[0, 0])
