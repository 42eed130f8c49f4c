import math

import torch
import torch.nn.functional as F

from modforge.components.attention import KVCache
from modforge.registry import build


def naive(attn, x, mask=None, causal=False, memory=None):
    """softmax(Q K^T / sqrt(d_head)) V, head by head, from the module's own weights."""
    B, T, C = x.shape
    H, D = attn.n_heads, attn.d_head
    if memory is None:
        q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split(C, -1)
    else:
        q = attn.q(x)
        k, v = attn.kv(memory).split(C, -1)
    split = lambda t: t.view(B, -1, H, D).transpose(1, 2)
    q, k, v = split(q), split(k), split(v)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    y = s.softmax(-1) @ v
    return attn.out(y.transpose(1, 2).reshape(B, T, C))


def test_self_attention_matches_naive():
    attn = build("attention", "mha", 16, 4)
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(attn(x), naive(attn, x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn(x, causal=True), naive(attn, x, causal=True), rtol=1e-5, atol=1e-5)


def test_padding_and_causal_masks_combine():
    attn = build("attention", "mha", 16, 4)
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    got = attn(x, key_mask=mask)
    torch.testing.assert_close(got, naive(attn, x, mask=mask), rtol=1e-5, atol=1e-5)
    got = attn(x, key_mask=mask, causal=True)
    torch.testing.assert_close(got, naive(attn, x, mask=mask, causal=True), rtol=1e-5, atol=1e-5)


def test_cross_attention_matches_naive_with_memory_padding():
    attn = build("attention", "mha", 16, 2, cross=True)
    x, mem = torch.randn(2, 4, 16), torch.randn(2, 9, 16)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    got = attn(x, memory=mem, key_mask=mask)
    torch.testing.assert_close(got, naive(attn, x, mask=mask, memory=mem), rtol=1e-5, atol=1e-5)


def test_kv_cache_step_by_step_equals_full_causal_pass():
    attn = build("attention", "mha", 16, 4).eval()
    rope = build("pos", "rope", 16, 4, 32)
    x = torch.randn(2, 8, 16)
    full = attn(x, causal=True, pos=rope)
    cache = KVCache(32)
    first = attn(x[:, :3], causal=True, pos=rope, cache=cache)  # a prefill of 3, then one at a time
    steps = [first] + [attn(x[:, t : t + 1], causal=True, pos=rope, cache=cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 8
    # a multi-token chunk after a prefix needs the offset causal mask
    cache2 = KVCache(32)
    attn(x[:, :2], causal=True, pos=rope, cache=cache2)
    torch.testing.assert_close(attn(x[:, 2:], causal=True, pos=rope, cache=cache2), full[:, 2:], rtol=1e-5, atol=1e-5)


def naive_grouped(attn, x, mask=None, causal=False):
    """Head by head from the module's own weights: query head h reads key/value head h // (H / H_kv)."""
    B, T, _ = x.shape
    H, Hkv, D = attn.n_heads, attn.n_kv, attn.d_head
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([H * D, Hkv * D, Hkv * D], -1)
    heads = []
    for h in range(H):
        g = h // (H // Hkv)
        s = q[..., h * D:(h + 1) * D] @ k[..., g * D:(g + 1) * D].transpose(-1, -2) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask[:, None, :], float("-inf"))
        heads.append(s.softmax(-1) @ v[..., g * D:(g + 1) * D])
    return attn.out(torch.cat(heads, -1))


def test_grouped_query_attention_matches_per_head_reference():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    x = torch.randn(2, 6, 16)
    for name, kv in (("gqa", 2), ("mqa", 1), ("gqa", 4)):
        attn = build("attention", {"name": name, "n_kv_heads": kv}, 16, 4)
        assert attn.qkv.weight.shape == (16 + 2 * kv * 4, 16)  # H*D + 2*Hkv*D rows
        for causal in (False, True):
            for m in (None, mask):
                torch.testing.assert_close(attn(x, causal=causal, key_mask=m),
                                           naive_grouped(attn, x, mask=m, causal=causal), rtol=1e-5, atol=1e-5)


def test_gqa_with_as_many_kv_heads_as_heads_is_mha():
    mha, gqa = build("attention", "mha", 16, 4), build("attention", {"name": "gqa", "n_kv_heads": 4}, 16, 4)
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True), rtol=1e-6, atol=1e-6)


def test_head_dim_apart_from_d_model_over_heads():
    attn = build("attention", {"name": "gqa", "n_kv_heads": 2}, 16, 4, head_dim=6)  # 4 x 6 = 24 != 16
    assert attn.qkv.weight.shape == (24 + 2 * 12, 16) and attn.out.weight.shape == (16, 24)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(attn(x, causal=True), naive_grouped(attn, x, causal=True), rtol=1e-5, atol=1e-5)


def test_grouped_cache_holds_only_the_kv_heads_and_equals_the_full_forward():
    attn = build("attention", {"name": "gqa", "n_kv_heads": 2}, 16, 4).eval()
    pos = build("pos", "rope", 16, 4, 32)
    x = torch.randn(2, 7, 16)
    full = attn(x, pos=pos, causal=True)
    cache = attn.new_cache(32)
    steps = [attn(x[:, :4], pos=pos, causal=True, cache=cache)]
    steps += [attn(x[:, t:t + 1], pos=pos, causal=True, cache=cache) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.k.shape == (2, 2, 32, 4)  # B, n_kv_heads, capacity, d_head


def test_cache_keeps_the_prompt_padding_mask_for_later_steps():
    """A left-padded row decoded with a cache gives what the row alone gives (positions per row)."""
    attn = build("attention", "mha", 16, 4).eval()
    pos = build("pos", "rope", 16, 4, 32)
    x = torch.randn(1, 6, 16)
    alone = attn(x, pos=pos, causal=True)
    padded = torch.cat([torch.randn(1, 3, 16), x], 1)  # 3 pads on the left
    mask = torch.tensor([[0, 0, 0] + [1] * 6], dtype=torch.bool)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = attn.new_cache(16)
    got = [attn(padded[:, :5], pos=pos, causal=True, cache=cache, key_mask=mask[:, :5], positions=positions[:, :5])]
    for t in range(5, 9):
        got.append(attn(padded[:, t:t + 1], pos=pos, causal=True, cache=cache, positions=positions[:, t:t + 1]))
    got = torch.cat(got, 1)
    assert torch.isfinite(got).all()  # the pads before the first real token attend to themselves
    torch.testing.assert_close(got[:, 3:], alone, rtol=1e-5, atol=1e-5)
    # beam search's reorder carries the mask along
    with torch.no_grad():
        cache.reorder(torch.tensor([0, 0]))
    assert cache.real.shape[0] == 2 and not cache.real[:, :3].any()
