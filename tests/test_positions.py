import math

import pytest
import torch

from modforge.components.positions import interleaved_to_half
from modforge.registry import build


def test_sinusoidal_matches_paper_formula():
    d, n = 16, 50
    pe = build("pos", "sinusoidal", d, 2, n)
    x = torch.zeros(1, n, d)
    got = pe.embed(x)[0]
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert got[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert got[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    # with an offset (KV-cache decoding) the table continues where it left off
    torch.testing.assert_close(pe.embed(torch.zeros(1, 3, d), offset=10)[0], got[10:13])


def test_learned_positions_are_trained_parameters():
    pe = build("pos", "learned", 8, 2, 20)
    assert pe.table.weight.requires_grad and pe.table.weight.shape == (20, 8)
    x = torch.zeros(1, 4, 8)
    torch.testing.assert_close(pe.embed(x, offset=3)[0], pe.table.weight[3:7])


def test_position_past_max_len_is_a_clear_error():
    pe = build("pos", "learned", 8, 2, 10)
    with pytest.raises(ValueError, match="max_len=10"):
        pe.embed(torch.zeros(1, 11, 8))


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_scores_depend_only_on_relative_offset(pairing):
    hd, H = 8, 2
    rope = build("pos", {"name": "rope", "pairing": pairing}, hd * H, H, 64)
    q = torch.randn(1, H, 1, hd)
    k = torch.randn(1, H, 1, hd)

    def score(m, n):
        return (rope.rotate(q, m) * rope.rotate(k, n)).sum(-1)

    torch.testing.assert_close(score(5, 2), score(13, 10), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(score(0, 0), (q * k).sum(-1), rtol=1e-5, atol=1e-6)  # rotation by 0 is identity
    assert not torch.allclose(score(5, 2), score(5, 4), atol=1e-3)  # but the offset does matter
    # rotation preserves the norm
    torch.testing.assert_close(rope.rotate(q, 9).norm(dim=-1), q.norm(dim=-1))


def test_rope_interleaved_matches_reference_code():
    # reference 004's apply_rope: pairs (2k, 2k+1), theta_k = 10000^(-2k/d)
    hd, T = 8, 6
    rope = build("pos", "rope", hd, 1, 16)
    x = torch.randn(1, 1, T, hd)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.arange(T)[:, None].float() * inv
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., ::2], x[..., 1::2]
    want = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape_as(x)
    torch.testing.assert_close(rope.rotate(x), want)


def test_rope_pairings_agree_after_permuting_head_dims():
    hd = 8
    inter = build("pos", {"name": "rope", "pairing": "interleaved"}, hd, 1, 32)
    half = build("pos", {"name": "rope", "pairing": "half"}, hd, 1, 32)
    p = interleaved_to_half(hd)
    x = torch.randn(2, 1, 5, hd)
    torch.testing.assert_close(half.rotate(x[..., p], 3), inter.rotate(x, 3)[..., p])
    assert not torch.allclose(half.rotate(x, 3), inter.rotate(x, 3))


def test_none_is_identity():
    pe = build("pos", "none", 8, 2, 4)
    x = torch.randn(1, 9, 8)  # no length limit either
    assert pe.embed(x) is x


@pytest.mark.parametrize("name", ["sinusoidal", "rope"])
def test_an_extended_table_is_the_table_built_at_that_length(name):
    """extend(n) (evaluation at a longer block) rebuilds the tables a scheme computes from the position."""
    short, long = build("pos", name, 16, 2, 8), build("pos", name, 16, 2, 20)
    short.extend(20)
    assert short.max_len == 20
    for key, buf in long.named_buffers():
        assert torch.equal(dict(short.named_buffers())[key], buf)
    q, x = torch.randn(1, 2, 20, 8), torch.randn(1, 20, 16)  # queries of head dim 8; embeddings of d_model 16
    assert torch.equal(short.rotate(q), long.rotate(q)) and torch.equal(short.embed(x), long.embed(x))


def test_a_learned_table_cannot_be_extended_and_says_why():
    from modforge.components.positions import LengthNotSupported

    pos = build("pos", "learned", 16, 2, 8)
    pos.extend(8)  # not longer: nothing to do
    with pytest.raises(LengthNotSupported, match="trained row for each of its 8 positions .* none for positions 8..11"):
        pos.extend(12)
    assert pos.max_len == 8
