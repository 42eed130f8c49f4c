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


# ----------------------------------------------------------------------------- RoPE options (issue 16)

def hf_inv_freq(rope_type: str, hd: int, max_len: int, seq_len=None, **params):
    """Hugging Face's own RoPE parameter functions, as the reference for every scaling."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(hidden_size=hd * 2, num_attention_heads=2, max_position_embeddings=max_len,
                                   rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params})
    kw = {"seq_len": seq_len} if seq_len is not None else {}
    return ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", **kw)


SCALINGS = [
    ("linear", {"factor": 4.0}, {"factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_len": 64},
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 4.0, "original_max_len": 64}, {"factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 2.0, "original_max_len": 64, "beta_fast": 16.0, "truncate": False},
     {"factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 16.0, "truncate": False}),
]


@pytest.mark.parametrize("scaling,ours,theirs", SCALINGS, ids=[s[0] + str(i) for i, s in enumerate(SCALINGS)])
def test_rope_scalings_match_hugging_faces_formulas(scaling, ours, theirs):
    from modforge.components.positions import ROPE_SCALINGS

    hd = 32
    rope = build("pos", {"name": "rope", "pairing": "half", "scaling": scaling, **ours}, hd * 2, 2, 256)
    for dt, tol in ((torch.float32, 1e-6), (torch.float64, 1e-6)):
        inv, att = ROPE_SCALINGS[scaling](rope.cfg, rope.original, hd, dt, None)
        want, want_att = hf_inv_freq(scaling, hd, 256, **theirs)
        torch.testing.assert_close(inv.float(), want.float(), rtol=tol, atol=0)
        assert att == pytest.approx(want_att)
    # and the rotation uses them: position p at frequency theta_i, cos/sin scaled by the attention factor
    x = torch.randn(1, 1, 5, hd, dtype=torch.float64)
    inv, att = ROPE_SCALINGS[scaling](rope.cfg, rope.original, hd, torch.float64, None)
    ang = torch.arange(3, 8, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1) * att, torch.cat((ang.sin(), ang.sin()), -1) * att
    half = hd // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)  # Llama's rotate_half
    torch.testing.assert_close(rope.double().rotate(x, 3), x * cos + rot * sin, rtol=1e-12, atol=1e-12)


def test_linear_scaling_is_position_interpolation():
    plain = build("pos", {"name": "rope"}, 16, 2, 64)
    linear = build("pos", {"name": "rope", "scaling": "linear", "factor": 4.0}, 16, 2, 64)
    x = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    plain, linear = plain.double(), linear.double()
    torch.testing.assert_close(linear.rotate(x, 40), plain.rotate(x, 10), rtol=1e-12, atol=1e-12)


def test_dynamic_scaling_changes_nothing_within_the_original_length_and_matches_hf_past_it():
    hd = 16
    plain = build("pos", {"name": "rope", "pairing": "half", "angles": "float32"}, hd * 2, 2, 128)
    dyn = build("pos", {"name": "rope", "pairing": "half", "angles": "float32", "scaling": "dynamic",
                        "factor": 2.0, "original_max_len": 32}, hd * 2, 2, 128)
    x = torch.randn(1, 2, 32, hd)
    torch.testing.assert_close(dyn.rotate(x), plain.rotate(x))
    # a call reaching position 79: the base of length 80, for every position of the call (HF's dynamic update)
    x = torch.randn(1, 2, 80, hd)
    inv, _ = hf_inv_freq("dynamic", hd, 32, seq_len=80, factor=2.0)
    ang = torch.arange(80).float()[:, None] * inv
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    want = x * cos + torch.cat((-x[..., hd // 2:], x[..., : hd // 2]), -1) * sin
    torch.testing.assert_close(dyn.rotate(x), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(dyn.rotate(x), plain.rotate(x), atol=1e-3)


def test_partial_rotary_rotates_the_first_dimensions_and_passes_the_rest():
    full = build("pos", {"name": "rope", "pairing": "half"}, 8, 1, 32)  # head dim 8
    part = build("pos", {"name": "rope", "pairing": "half", "fraction": 0.5}, 16, 1, 32)  # head dim 16, 8 rotate
    x = torch.randn(2, 1, 5, 16)
    got = part.rotate(x, 4)
    torch.testing.assert_close(got[..., :8], full.rotate(x[..., :8], 4))  # RoPE of dim 8 on the first 8
    assert torch.equal(got[..., 8:], x[..., 8:])
    with pytest.raises(Exception, match="pos.fraction"):
        build("pos", {"name": "rope", "fraction": 0.1}, 8, 1, 32)


@pytest.mark.parametrize("name", ["rope", "sinusoidal"])
def test_tables_are_exact_in_float64_after_model_double(name):
    pe = build("pos", name, 16, 2, 64).double()
    pos = torch.arange(64, dtype=torch.float64)[:, None]
    if name == "sinusoidal":
        inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
        got = pe.embed(torch.zeros(1, 64, 16, dtype=torch.float64))[0]
        torch.testing.assert_close(got[:, 0::2], torch.sin(pos * inv), rtol=0, atol=1e-15)
    else:
        inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        torch.testing.assert_close(pe.cos[:, 0::2], torch.cos(pos * inv), rtol=0, atol=1e-15)
    assert pe.float().embed(torch.zeros(1, 3, 16)).dtype == torch.float32  # and back


def test_rope_angles_in_float32_are_llamas_own_arithmetic():
    """angles=float32: inverse frequencies, angles and cos/sin computed in float32, as Meta's and HF's Llama."""
    rope = build("pos", {"name": "rope", "pairing": "half", "angles": "float32"}, 16, 2, 64).double()
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    ang = torch.arange(64)[:, None].float() * inv
    assert torch.equal(rope.cos[:, :4], ang.cos().double())


@pytest.mark.parametrize("name", ["rope", "sinusoidal", "learned"])
def test_per_row_positions_select_each_rows_own_table_rows(name):
    pe = build("pos", name, 16, 2, 32)
    positions = torch.tensor([[0, 0, 0, 1, 2], [3, 4, 5, 6, 7]])
    if name == "rope":
        t = torch.randn(2, 2, 5, 8)
        got = pe.rotate(t, positions=positions)
        torch.testing.assert_close(got[1], pe.rotate(t[1:], 3)[0])
        torch.testing.assert_close(got[0, :, 2:], pe.rotate(t[:1, :, 2:], 0)[0])
    else:
        x = torch.randn(2, 5, 16)
        got = pe.embed(x, positions=positions)
        torch.testing.assert_close(got[1], pe.embed(x[1:], 3)[0])
        torch.testing.assert_close(got[0, 2:], pe.embed(x[:1, 2:], 0)[0])
