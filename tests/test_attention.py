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
