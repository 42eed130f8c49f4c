import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modforge import registry
from modforge.models.blocks import Block, Parts
from modforge.registry import build

V = 13


def registered(kind):
    """Every name of ``kind`` in the registry when the tests are collected: built-ins, installed plugins'
    variants and test components alike, so none is left out of the tests that enumerate them."""
    return registry.registry(kind).names()


def make(arch, **parts):
    cfg = {"name": arch, "d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "max_len": 32}
    return build("model", cfg, Parts(**parts), V)


def copy_torch_layer(ours, ref):
    """Attention and feed-forward weights of an ``nn.TransformerEncoderLayer`` into our block."""
    ours.self_attn.qkv.weight.copy_(ref.self_attn.in_proj_weight)
    ours.self_attn.qkv.bias.copy_(ref.self_attn.in_proj_bias)
    ours.self_attn.out.weight.copy_(ref.self_attn.out_proj.weight)
    ours.self_attn.out.bias.copy_(ref.self_attn.out_proj.bias)
    ours.ffn.w1.weight.copy_(ref.linear1.weight); ours.ffn.w1.bias.copy_(ref.linear1.bias)
    ours.ffn.w2.weight.copy_(ref.linear2.weight); ours.ffn.w2.bias.copy_(ref.linear2.bias)


@pytest.mark.parametrize("residual,norm_first", [("post", False), ("pre", True)])
def test_block_matches_torch_encoder_layer(residual, norm_first):
    d, h, ff = 16, 4, 32
    ours = Block(Parts(norm="layer", residual=residual, ffn="relu"), d, h, ff, 0.0, causal=False).eval()
    ref = nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    with torch.no_grad():
        copy_torch_layer(ours, ref)
        for mine, theirs in ((ours.r_self.norm, ref.norm1), (ours.r_ffn.norm, ref.norm2)):
            theirs.weight.normal_(); theirs.bias.normal_()
            mine.weight.copy_(theirs.weight); mine.bias.copy_(theirs.bias)
    x = torch.randn(3, 5, d)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, pos=None), ref(x), rtol=1e-4, atol=1e-5)
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1, 3:] = False
        got = ours(x, pos=None, mask=mask)
        want = ref(x, src_key_padding_mask=~mask)
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-4, atol=1e-5)


def test_pre_ln_stack_has_final_norm_and_post_ln_has_none():
    assert make("decoder_only", residual="pre").decoder.final_norm is not None
    assert make("decoder_only", residual="post").decoder.final_norm is None


def test_each_layer_has_its_own_norm():
    m = make("decoder_only", norm="rms")
    norms = [b.r_self.norm for b in m.decoder.blocks] + [b.r_ffn.norm for b in m.decoder.blocks]
    assert len({id(n.weight) for n in norms}) == len(norms)


def test_decoder_only_ties_embeddings():
    m = make("decoder_only")
    assert m.head.weight is m.tok.weight


@pytest.mark.parametrize("pos", registered("pos"))
@pytest.mark.parametrize("norm", registered("norm"))
def test_decoder_is_causal(pos, norm):
    m = make("decoder_only", pos=pos, norm=norm).eval()
    a = torch.randint(5, V, (2, 10))
    b = a.clone()
    t = 4
    b[:, t + 1 :] = torch.randint(5, V, (2, 10 - t - 1))
    with torch.no_grad():
        la, lb = m(a), m(b)
    torch.testing.assert_close(la[:, : t + 1], lb[:, : t + 1])
    assert not torch.allclose(la[:, t + 1 :], lb[:, t + 1 :])


def test_encoder_decoder_decoder_is_causal():
    m = make("encoder_decoder", pos="rope").eval()
    src = torch.randint(5, V, (2, 7))
    a = torch.randint(5, V, (2, 8))
    b = a.clone()
    b[:, 5:] = (b[:, 5:] + 1) % V
    with torch.no_grad():
        torch.testing.assert_close(m(src, a)[:, :5], m(src, b)[:, :5])


@pytest.mark.parametrize("arch", ["encoder_only", "decoder_only"])
@pytest.mark.parametrize("norm", registered("norm"))
@pytest.mark.parametrize("pos", registered("pos"))
def test_padding_does_not_change_real_outputs(arch, norm, pos):
    m = make(arch, norm=norm, pos=pos).eval()
    x = torch.randint(5, V, (1, 6))
    padded = torch.cat([x, torch.zeros(1, 4, dtype=torch.long)], 1)  # right-padded with <pad>=0
    mask = padded != 0
    other = torch.randint(5, V, (1, 10))  # a longer neighbour in the same batch
    batch = torch.cat([padded, other])
    bmask = torch.cat([mask, torch.ones(1, 10, dtype=torch.bool)])
    with torch.no_grad():
        alone = m(x)
        own_padding = m(padded, mask)[:, :6]
        together = m(batch, bmask)[:1, :6]
    torch.testing.assert_close(own_padding, alone, rtol=1e-5, atol=1e-5)
    mixes_batch = any(getattr(mod, "mixes_batch", False) for mod in m.modules())
    if mixes_batch:  # its eval statistics are the batch's by design: a neighbour must change them
        assert not torch.allclose(together, alone, rtol=1e-3, atol=1e-3)
    else:
        torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_encoder_decoder_source_padding_does_not_change_outputs():
    m = make("encoder_decoder", norm="batch").eval()
    src = torch.randint(5, V, (1, 5))
    tgt = torch.randint(5, V, (1, 4))
    src_pad = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(m(src_pad, tgt, src_pad != 0), m(src, tgt), rtol=1e-5, atol=1e-5)


PART_KINDS = registry.part_kinds()
# issue 52's attention options (keys every attention takes), as values of the attention column beside the
# registered attentions, so that each meets every option of every other kind
ATTENTION_OPTIONS = {
    "mha+qk_norm_head+gate": {"name": "mha", "qk_norm": "rms", "gate": True},
    "gqa+qk_norm_full+logit_cap": {"name": "gqa", "n_kv_heads": 1, "qk_norm": "layer", "qk_norm_scope": "full",
                                   "logit_cap": 5.0},
    "mha+window+global_every": {"name": "mha", "window": 3, "global_every": 2},
}


# settings a registered option trains with here: a mixture of two experts, both chosen, and a shared one, so that
# every parameter gets a gradient in one step (with top-2 of 8 some experts see no token of a small batch)
SETTINGS = {"ffn": {"moe": {"name": "moe", "n_experts": 2, "top_k": 2, "n_shared": 1}}, "attention": ATTENTION_OPTIONS}


def column(kind: str) -> list:
    return registered(kind) + (list(ATTENTION_OPTIONS) if kind == "attention" else [])


COMBINATIONS = list(itertools.product(registered("model"), *(column(k) for k in PART_KINDS)))


def pairs_of(row: tuple) -> set:
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}


def pairwise(rows: list) -> list:
    """A covering array of strength 2 drawn from ``rows`` (the full product): every value of every kind together
    with every value of every other kind in at least one chosen row. Greedy (each pick covers the most pairs not
    yet covered, ties to the first), so deterministic; about 1/60 of the product here."""
    left = set().union(*(pairs_of(r) for r in rows))
    chosen = []
    while left:
        best = max(rows, key=lambda r: len(pairs_of(r) & left))
        chosen.append(best)
        left -= pairs_of(best)
    return chosen


PAIRWISE = pairwise(COMBINATIONS)


def test_the_pairwise_combinations_cover_every_pair_of_options():
    """The default run's combinations hold every pair of options of two kinds (architecture included), so a
    part that breaks beside one other part's option fails it; the exhaustive marker trains the full product."""
    assert set().union(*map(pairs_of, PAIRWISE)) == set().union(*map(pairs_of, COMBINATIONS))
    assert len(PAIRWISE) < len(COMBINATIONS) / 10


@pytest.mark.parametrize("arch", registered("model"))
def test_every_pair_of_options_trains_one_step(arch):
    """Every architecture with every pair of registered parts' options (a covering array of strength 2) builds
    and trains one step, with a finite, non-zero gradient on every parameter."""
    train_one_step_each(c for c in PAIRWISE if c[0] == arch)


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", registered("model"))
def test_every_combination_trains_one_step(arch):
    """Every architecture with every combination of every registered part builds and trains one step, with a
    finite, non-zero gradient on every parameter (one model per combination; one test per architecture)."""
    train_one_step_each(c for c in COMBINATIONS if c[0] == arch)


def train_one_step_each(combos) -> None:
    x = torch.randint(5, V, (3, 8))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[2, 6:] = False  # one padded row exercises the padding paths
    for combo in combos:
        arch = combo[0]
        parts = {k: SETTINGS.get(k, {}).get(v, v) for k, v in zip(PART_KINDS, combo[1:])}
        m = make(arch, **parts).train()
        with torch.no_grad():  # biases off their zero init: with zero biases a ReLU FFN is scale-equivariant, so a
            for p in m.parameters():  # scale-invariant norm before it (the plugin's ScaleNorm, Post-LN) gets an
                if not p.any():  # exactly zero gradient; every other parameter keeps its initialisation
                    p.add_(0.01 * torch.randn_like(p))
        if m.needs_source:
            logits = m(x, x[:, :6], mask, mask[:, :6])
            target = x[:, 1:7]
        else:
            logits = m(x, mask)
            target = x
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
        assert torch.isfinite(loss), parts
        loss.backward()
        for name, p in m.named_parameters():
            assert p.grad is not None, f"{parts}: {name} got no gradient"
            assert torch.isfinite(p.grad).all(), f"{parts}: {name}"
            assert p.grad.abs().sum() > 0, f"{parts}: {name} has an all-zero gradient"
        torch.optim.Adam(m.parameters(), lr=1e-3).step()


def test_residual_output_projections_get_scaled_init():
    torch.manual_seed(0)
    m = build("model", {"name": "decoder_only", "d_model": 64, "n_heads": 2, "n_layers": 8, "d_ff": 256},
              Parts(ffn="gelu"), V)
    blk = m.decoder.blocks[0]
    assert abs(blk.self_attn.qkv.weight.std().item() - 0.02) < 0.002
    for lin in (blk.self_attn.out, blk.ffn.w2):
        assert abs(lin.weight.std().item() - 0.02 / 4.0) < 0.001  # 0.02 / sqrt(2 * 8)
    plain = build("model", {"name": "decoder_only", "d_model": 64, "n_heads": 2, "n_layers": 8, "d_ff": 256,
                            "scaled_residual_init": False}, Parts(ffn="gelu"), V)
    assert abs(plain.decoder.blocks[0].ffn.w2.weight.std().item() - 0.02) < 0.002


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_causal_training_reaches_sdpa_with_is_causal_and_no_mask(monkeypatch, pos):
    """A causal training batch without padding goes to SDPA's flash / memory-efficient kernels on CUDA:
    ``is_causal=True`` and no mask tensor (a materialised mask would force the math kernel)."""
    import torch.nn.functional as F

    calls, real = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    m = make("decoder_only", pos=pos).train()
    m(torch.randint(5, V, (2, 10))).sum().backward()
    assert len(calls) == 2 and all(k.get("is_causal") is True and k.get("attn_mask") is None for k in calls)


def test_post_ln_stack_with_final_norm_matches_torch_encoder_with_norm():
    from modforge.models.blocks import Stack

    d, h, ff = 16, 4, 32
    ours = Stack(Parts(norm="layer", residual={"name": "post", "final_norm": True}, ffn="relu"), 2, d, h, ff, 0.0,
                 causal=False).eval()
    layer = nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, batch_first=True)
    ref = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(d), enable_nested_tensor=False).eval()
    with torch.no_grad():
        for mine, theirs in zip(ours.blocks, ref.layers):
            copy_torch_layer(mine, theirs)
        ref.norm.weight.normal_(); ref.norm.bias.normal_()
        ours.final_norm.weight.copy_(ref.norm.weight); ours.final_norm.bias.copy_(ref.norm.bias)
        x = torch.randn(3, 5, d)
        torch.testing.assert_close(ours(x, pos=None), ref(x), rtol=1e-4, atol=1e-5)
    assert Stack(Parts(residual={"name": "pre", "final_norm": False}), 1, d, h, ff, 0.0, causal=True).final_norm is None


def test_embedding_norm_and_token_types_follow_berts_formula():
    from modforge.models.architectures import EncoderOnly, ModelConfig

    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=8, embed_norm=True, type_vocab_size=2,
                      head_transform=True, head_bias=True, tie_embeddings=True)
    m = EncoderOnly(cfg, Parts(norm="layer", residual="post", pos="learned"), 11).eval()
    idx, types = torch.randint(0, 11, (2, 5)), torch.tensor([[0, 0, 1, 1, 1], [0, 1, 0, 1, 0]])
    e = m.embed
    want = F.layer_norm(e.tokens(idx) + e.types(types) + e.pos.table.weight[:5], (16,), e.norm.weight, e.norm.bias)
    torch.testing.assert_close(e(idx, token_types=types), want)
    torch.testing.assert_close(e(idx), e(idx, token_types=torch.zeros_like(idx)))  # no types given: all type 0
    h = m.encode(idx, token_types=types)
    t = m.head_transform
    want = F.layer_norm(F.gelu(t.dense(h)), (16,), t.norm.weight, t.norm.bias) @ m.tok.weight.T + m.head.bias
    torch.testing.assert_close(m(idx, token_types=types), want)
