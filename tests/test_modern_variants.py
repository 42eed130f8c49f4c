"""Issue 52's stability fixes and attention options, each against a reference: the paper's formula written here
independently of modforge's code, and Hugging Face's OLMo 2, Qwen3, Gemma 2 and Mistral with copied weights
(forward on a left-padded batch and cached decoding step by step)."""
import math

import pytest
import torch
import torch.nn.functional as F

from modforge.components.attention import WindowKVCache
from modforge.config import compose
from modforge.models.blocks import Parts
from modforge.registry import ConfigError, build

transformers = pytest.importorskip("transformers")

from test_pretrained import (TEXTS, bpe_tokenizer, cached_decoding_matches, padded_batch,  # noqa: E402
                             padded_logits_gap, save)

from modforge.checkpoints import load_checkpoint  # noqa: E402
from modforge.convert import convert  # noqa: E402
from modforge.models.decoding import Stepper, decode  # noqa: E402


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(attn, x, *, causal=True, q_norm=None, k_norm=None, cap=None, window=None, gate=None, kv_heads=None):
    """Attention written from the papers, on the module's own weights: projections; QK-norm (``head``: over each
    head's features, ``full``: over all heads' at once); scores q k^T / sqrt(d); soft-cap; causal and window
    masks; softmax; values; the gate sigmoid(x W_g); the output projection."""
    B, T, C = x.shape
    H, D = attn.n_heads, attn.d_head
    Hkv = kv_heads or H
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([H * D, Hkv * D, Hkv * D], -1)
    if q_norm == "full":
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    if q_norm == "head":
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j < window) if causal else ((i - j).abs() < window)
    y = s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    y = y.transpose(1, 2).reshape(B, T, H * D)
    if gate is not None:
        y = y * torch.sigmoid(F.linear(x, attn.gate.weight, attn.gate.bias))
    return attn.out(y)


def randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 and "norm" in repr(p) else 0.0))
    return module


@pytest.mark.parametrize("name,kv", [("mha", None), ("gqa", 2)])
@pytest.mark.parametrize("scope", ["head", "full"])
def test_qk_norm_matches_the_formula_in_both_scopes(name, kv, scope):
    torch.manual_seed(0)
    cfg = {"name": name, "qk_norm": "rms", "qk_norm_scope": scope, **({"n_kv_heads": kv} if kv else {})}
    attn = randomise(build("attention", cfg, 32, 4))
    expected_width = attn.d_head if scope == "head" else 4 * attn.d_head
    assert attn.q_norm.weight.shape == (expected_width,)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x, causal=True), reference(attn, x, q_norm=scope, kv_heads=kv),
                               rtol=1e-5, atol=1e-5)


def test_soft_capped_scores_match_the_formula_and_a_far_cap_is_plain_attention():
    torch.manual_seed(0)
    attn = randomise(build("attention", {"name": "gqa", "n_kv_heads": 2, "logit_cap": 2.0}, 32, 4))
    x = torch.randn(2, 7, 32) * 2
    got = attn(x, causal=True)
    torch.testing.assert_close(got, reference(attn, x, cap=2.0, kv_heads=2), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, reference(attn, x, kv_heads=2), atol=1e-3)  # the cap binds at these scores
    far = build("attention", {"name": "mha", "logit_cap": 1e6}, 32, 4)
    plain = build("attention", "mha", 32, 4)
    plain.load_state_dict(far.state_dict())
    torch.testing.assert_close(far(x, causal=True), plain(x, causal=True), rtol=1e-5, atol=1e-5)


def test_gated_attention_matches_the_formula():
    torch.manual_seed(0)
    attn = randomise(build("attention", {"name": "mha", "gate": True}, 32, 4))
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x, causal=True), reference(attn, x, gate=True), rtol=1e-5, atol=1e-5)
    assert attn.flops(7, 7) - build("attention", "mha", 32, 4).flops(7, 7) == 2 * 7 * 32 * 32  # x W_g counted


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_matches_the_explicit_mask(causal):
    torch.manual_seed(0)
    attn = randomise(build("attention", {"name": "mha", "window": 3}, 32, 4))
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(attn(x, causal=causal), reference(attn, x, causal=causal, window=3),
                               rtol=1e-5, atol=1e-5)


def model(**parts):
    plain = compose([f"{k}={v}" for k, v in parts.items()] + ["model.d_model=32", "model.n_heads=4",
                                                                "model.n_layers=4", "model.max_len=64"])
    from modforge.config.composition import to_plain

    plain = to_plain(plain)
    return build("model", plain["model"], Parts.from_config(plain), 50)


def test_global_every_keeps_every_nth_layer_global_and_windowed_layers_decode_with_a_bounded_cache():
    torch.manual_seed(0)
    m = model(**{"attention.window": 4, "attention.global_every": 2}).eval()
    flags = [b.self_attn.windowed for b in m.decoder.blocks]
    assert flags == [True, False, True, False]  # Gemma 2: layer 0 slides, layer 1 is global ...
    caches = m.new_cache()
    assert [type(c["self"]).__name__ for c in caches] == ["WindowKVCache", "KVCache"] * 2
    idx = torch.randint(5, 50, (2, 6))
    stepper = Stepper(m, idx)
    tokens = decode(stepper, 20)
    held = [c["self"].k.shape[2] for c in stepper.cache if isinstance(c["self"], WindowKVCache)]
    assert held == [3, 3]  # window - 1 positions, after 26 decoded
    plain = decode(Stepper(m, idx, use_cache=False), 20)
    assert torch.equal(tokens, plain)


def test_sandwich_and_reordered_residuals_match_their_formulas():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    f = torch.nn.Linear(16, 16)
    for name, formula in (("sandwich", lambda r: x + r.post(f(r.norm(x)))), ("reordered", lambda r: x + r.norm(f(x)))):
        r = randomise(build("residual", name, build("norm", "rms", 16), 0.0))
        assert r.final_norm
        torch.testing.assert_close(r(x, f), formula(r))
    sandwich = build("residual", "sandwich", build("norm", "rms", 16), 0.0)
    assert sandwich.post is not sandwich.norm and sandwich.post.weight is not sandwich.norm.weight


def test_soft_capped_logits_match_the_formula_and_stay_inside_the_cap():
    torch.manual_seed(0)
    m, plain = model(logits="softcap", **{"logits.cap": 2.0}), model()
    plain.load_state_dict(m.state_dict())
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(20)
        plain.load_state_dict(m.state_dict())
        idx = torch.randint(5, 50, (2, 6))
        z, raw = m(idx), plain(idx)
    torch.testing.assert_close(z, 2.0 * torch.tanh(raw / 2.0))
    assert z.abs().max() <= 2.0 < raw.abs().max()  # (tanh rounds to 1 in float32 far out)


def test_z_loss_adds_the_papers_term_while_training_and_not_to_validation(tmp_path):
    from modforge.tasks.base import Task

    class Cfg:
        label_smoothing, z_loss = 0.0, 1e-2

    task = Task.__new__(Task)
    torch.nn.Module.__init__(task)
    task.cfg, task.model = Cfg(), torch.nn.Linear(1, 1)
    task.log = lambda *a, **k: None
    logits = torch.randn(2, 5, 11) * 3
    target = torch.randint(0, 11, (2, 5))
    target[1, 3:] = -100
    ce = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=-100)
    keep = target.reshape(-1) != -100
    z = torch.logsumexp(logits.reshape(-1, 11)[keep], -1).pow(2).mean()
    task.train()
    torch.testing.assert_close(task.xent(logits, target), ce + 1e-2 * z)
    task.eval()
    torch.testing.assert_close(task.xent(logits, target), ce)


@pytest.mark.parametrize("override,key", [
    ("attention.qk_norm=batch", "attention.qk_norm=batch"),
    ("attention.qk_norm=rmz", "attention.qk_norm='rmz'"),
    ("attention.qk_norm_scope=token", "attention.qk_norm_scope='token'"),
    ("attention.logit_cap=-1", "attention.logit_cap=-1"),
    ("attention.window=0", "attention.window=0"),
    ("attention.global_every=2", "attention.global_every=2"),
    ("logits=softcap logits.cap=0", "logits.cap=0"),
    ("task.z_loss=-0.1", "task.z_loss=-0.1"),
    ("attention.qk_norm={name:rms,foo:1}", "attention.qk_norm"),  # a nested config's own keys, before any work
    ("ffn=moe ffn.expert={name:swiglu,bogus:1}", "ffn.expert"),
    ("scheduler=wsd scheduler.warmup_steps=100 trainer.max_steps=110", "scheduler.decay_fraction=0.2 (22 steps)"),
])
def test_bad_values_are_one_line_naming_the_key(override, key):
    from modforge.cli.preflight import preflight

    with pytest.raises(ConfigError) as e:
        preflight(override.split(), False)
    assert key in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- Hugging Face, weights copied


def hf_models(tmp_path):
    torch.manual_seed(0)
    tok = bpe_tokenizer(["<unk>", "<s>", "</s>"])
    kw = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, initializer_range=0.2)
    gemma = transformers.Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                      attn_logit_softcapping=1.5, final_logit_softcapping=3.0, **kw)
    qwen = transformers.Qwen3Config(head_dim=8, use_sliding_window=True, sliding_window=5, max_window_layers=0,
                                    layer_types=["sliding_attention"] * 4, **kw)
    return tok, {
        "olmo2": transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**kw)),
        "qwen3": transformers.Qwen3ForCausalLM(qwen),
        "gemma2": transformers.Gemma2ForCausalLM(gemma),
        "mistral": transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=4, **kw)),
    }


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("modern")
    tok, models = hf_models(root)
    out = {}
    for name, hf in models.items():
        with torch.no_grad():  # norm gains and biases off their init, so that a gain read wrongly shows
            for n, p in hf.named_parameters():
                if "norm" in n:
                    p.add_(torch.randn_like(p) * 0.3)
        d = save(hf.eval(), tok, root / name)
        out[name] = (convert(d, root / f"{name}.ckpt"), hf)
    return out


@pytest.mark.parametrize("family", ["olmo2", "qwen3", "gemma2", "mistral"])
def test_converted_model_gives_hugging_faces_logits_on_a_left_padded_batch(families, family):
    (path, summary), hf = families[family]
    want_options = {"olmo2": ["residual=reordered", "attention.qk_norm_scope=full"],
                    "qwen3": ["attention.qk_norm_scope=head", "attention.window=5"],
                    "gemma2": ["residual=sandwich", "attention.logit_cap=1.5", "logits=softcap",
                               "attention.window=4", "attention.global_every=2", "model.scale_embeddings=true"],
                    "mistral": ["attention.window=4"]}[family]
    assert set(want_options) <= set(summary["overrides"])
    task = load_checkpoint(str(path))
    assert padded_logits_gap(task, hf) < 1e-5


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_windowed_cached_decoding_equals_hugging_faces_cached_forward(families, family):
    (path, _), hf = families[family]
    task = load_checkpoint(str(path))
    stepper = cached_decoding_matches(hf, task.model, *padded_batch(task.tokenizer, TEXTS[:2]), steps=8)
    windows = [c["self"] for c in stepper.cache if isinstance(c["self"], WindowKVCache)]
    assert windows and all(c.k.shape[2] == c.window - 1 for c in windows)


# --------------------------------------------------------------------------- optimizers and schedules


def test_muon_is_torchs_muon_on_the_blocks_matrices_and_adamw_on_the_rest_and_its_state_restores_exactly():
    import copy

    from modforge.tasks.base import role_groups

    torch.manual_seed(0)
    m = model(residual="sandwich", **{"attention.qk_norm": "rms", "attention.gate": True})
    ref = copy.deepcopy(m)
    x = torch.randint(5, 50, (2, 8))

    def step(net, opt):
        opt.zero_grad()
        net(x).float().logsumexp(-1).mean().backward()
        opt.step()

    ours = build("optim", {"name": "muon", "lr": 0.01, "weight_decay": 0.1}, role_groups(m))
    # the reference, chosen by module type, not by roles: every Linear weight inside the blocks is Muon's
    inside = {id(mod.weight) for name, mod in ref.named_modules()
              if isinstance(mod, torch.nn.Linear) and name.startswith("decoder.blocks.")}
    params = list(ref.parameters())
    muon = torch.optim.Muon([p for p in params if id(p) in inside], lr=0.01, weight_decay=0.1,
                            adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{"params": [p for p in params if id(p) not in inside and p.dim() >= 2]},
                               {"params": [p for p in params if id(p) not in inside and p.dim() < 2],
                                "weight_decay": 0.0}], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    assert len(ours.muon.param_groups[0]["params"]) == len(inside) == 4 * 5  # 4 layers: qkv, out, gate, w1, w2
    for _ in range(3):
        step(m, ours)
        ref.zero_grad()
        ref(x).float().logsumexp(-1).mean().backward()
        muon.step()
        adamw.step()
    for (name, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    saved = copy.deepcopy(ours.state_dict())
    again = copy.deepcopy(m)
    restored = build("optim", {"name": "muon", "lr": 0.01, "weight_decay": 0.1}, role_groups(again))
    restored.load_state_dict(saved)
    step(m, ours)
    step(again, restored)
    for a, b in zip(m.parameters(), again.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_wsd_is_warmup_stable_then_the_papers_cooldown_and_budgets_share_their_run_up_to_the_decay():
    from modforge.components.optim import wsd

    def factors(total, **kw):
        cfg = {"name": "wsd", "warmup_steps": 10, "decay_steps": 20, **kw}
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build("scheduler", cfg, opt, d_model=1, total_steps=total)
        out = []
        for _ in range(total + 2):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    got = factors(100)
    # Hägele et al. 2024: linear warm-up, constant, then 1 - sqrt((n - N_0) / N_decay) over the last N_decay steps
    for n in (0, 9):
        assert got[n] == pytest.approx((n + 1) / 11)
    assert got[10] == got[79] == 1.0
    for n in (80, 85, 90, 99):
        assert got[n] == pytest.approx(1 - math.sqrt((n - 80) / 20))
    assert got[100] == 0.0
    longer = factors(200)
    assert longer[:180] == got[:10] + [1.0] * 170  # a longer budget is the same run until its own decay
    lin = factors(100, decay_shape="linear", min_lr_ratio=0.1)
    assert lin[90] == pytest.approx(0.1 + 0.9 * 0.5)
    assert callable(wsd)


# --------------------------------------------------------------------------- mixture of experts


def mixtral_config(**kw):
    base = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                initializer_range=0.2, router_aux_loss_coef=0.02)
    return transformers.MixtralConfig(**{**base, **kw})


def test_moe_block_equals_mixtrals_sparse_block_and_its_balancing_loss():
    from transformers.models.mixtral import modeling_mixtral as mm

    torch.manual_seed(0)
    hf = mm.MixtralSparseMoeBlock(mixtral_config()).train()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    ours = build("ffn", {"name": "moe", "n_experts": 4, "top_k": 2, "aux_loss_coef": 0.02,
                         "expert": {"name": "swiglu", "match_params": False}}, 32, 48).train()
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        for e, expert in enumerate(ours.experts):
            expert.w_gate_up.weight.copy_(hf.experts.gate_up_proj[e])
            expert.w2.weight.copy_(hf.experts.down_proj[e])
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-6)
    logits = F.linear(x.reshape(-1, 32), hf.gate.weight)
    want = 0.02 * mm.load_balancing_loss_func((logits,), num_experts=4, top_k=2)
    torch.testing.assert_close(ours.aux_loss, want)
    assert ours.flops_per_token() == 2 * 32 * 4 + 2 * ours.experts[0].flops_per_token()  # active FLOPs only


def test_shared_experts_see_every_token_and_the_task_adds_the_balancing_loss_in_training_only():
    from modforge.tasks.base import Task

    torch.manual_seed(0)
    moe = build("ffn", {"name": "moe", "n_experts": 4, "top_k": 1, "n_shared": 1, "renormalize": False}, 16, 32)
    x = torch.randn(2, 3, 16)
    h = x.reshape(-1, 16)
    probs = F.softmax(moe.router(h), -1)
    w, i = probs.max(-1)
    routed = torch.stack([moe.experts[int(e)](h[t:t + 1])[0] * w[t] for t, e in enumerate(i)])
    torch.testing.assert_close(moe(x).reshape(-1, 16), routed + moe.shared[0](h), rtol=1e-5, atol=1e-6)

    task = Task.__new__(Task)
    torch.nn.Module.__init__(task)
    task.model = torch.nn.ModuleDict({"ffn": moe})

    class Cfg:
        label_smoothing, z_loss = 0.0, 0.0

    task.cfg, task.log = Cfg(), (lambda *a, **k: None)
    logits, target = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    ce = F.cross_entropy(logits.reshape(-1, 7), target.reshape(-1))
    task.train()
    moe(x)
    aux = moe.aux_loss
    assert aux is not None and aux > 0
    torch.testing.assert_close(task.xent(logits, target), ce + aux)
    assert moe.aux_loss is None  # taken once
    task.eval()
    moe.eval()
    moe(x)
    torch.testing.assert_close(task.xent(logits, target), ce)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("mixtral")
    tok = bpe_tokenizer(["<unk>", "<s>", "</s>"])
    hf = transformers.MixtralForCausalLM(mixtral_config(vocab_size=tok.get_vocab_size(), bos_token_id=1,
                                                         eos_token_id=2, pad_token_id=0)).eval()
    return convert(save(hf, tok, root / "mixtral"), root / "mixtral.ckpt"), hf


def converted_matches_hf(path, hf) -> None:
    """A converted checkpoint gives HF's logits on a left-padded batch and decodes as HF's cache does."""
    task = load_checkpoint(str(path))
    assert padded_logits_gap(task, hf) < 1e-5
    cached_decoding_matches(hf, task.model, *padded_batch(task.tokenizer, TEXTS))


def test_converted_mixtral_gives_hugging_faces_logits_and_decodes_as_its_cache_does(mixtral):
    (path, summary), hf = mixtral
    assert {"ffn=moe", "ffn.n_experts=4", "ffn.top_k=2"} <= set(summary["overrides"])
    converted_matches_hf(path, hf)


# --------------------------------------------------------------------------- parallel blocks


def test_parallel_block_is_one_norm_feeding_every_branch():
    torch.manual_seed(0)
    m = randomise(model(residual="parallel")).eval()
    block = m.decoder.blocks[0]
    assert block.r_ffn is None and block.r_cross is None
    x = torch.randn(2, 5, 32)
    h = block.r_self.norm(x)
    want = x + block.self_attn(h, causal=True, pos=m.embed.pos) + block.ffn(h)
    torch.testing.assert_close(block(x, pos=m.embed.pos), want)


def test_converted_gptj_gives_hugging_faces_logits_and_decodes_as_its_cache_does(tmp_path):
    torch.manual_seed(0)
    tok = bpe_tokenizer(["<|endoftext|>"])
    cfg = transformers.GPTJConfig(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                  n_positions=64, initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    hf = transformers.GPTJForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "ln" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    path, summary = convert(save(hf, tok, tmp_path / "gptj"), tmp_path / "gptj.ckpt")
    assert {"residual=parallel", "pos.fraction=0.5", "pos.pairing=interleaved"} <= set(summary["overrides"])
    converted_matches_hf(path, hf)


# --------------------------------------------------------------------------- differential attention


def test_differential_attention_matches_the_papers_formula_head_by_head():
    torch.manual_seed(0)
    attn = randomise(build("attention", "diff", 32, 2))  # 2 heads of 16: query/key halves of 8, values of 16
    attn.layer_index = 3
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * 3)
    assert attn.lambda_init == pytest.approx(lam_init)
    x = torch.randn(2, 6, 32)
    q, k, v = F.linear(x, attn.qkv.weight).split(32, -1)
    lam = (torch.exp((attn.lambda_q1 * attn.lambda_k1).sum()) - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
           + lam_init)
    causal = torch.ones(6, 6).tril().bool()
    heads = []
    for h in range(2):  # the paper's §2.1, one head at a time
        qh, kh, vh = q[..., 16 * h:16 * h + 16], k[..., 16 * h:16 * h + 16], v[..., 16 * h:16 * h + 16]
        a1 = (qh[..., :8] @ kh[..., :8].transpose(-1, -2) / math.sqrt(8)).masked_fill(~causal, -math.inf).softmax(-1)
        a2 = (qh[..., 8:] @ kh[..., 8:].transpose(-1, -2) / math.sqrt(8)).masked_fill(~causal, -math.inf).softmax(-1)
        o = (a1 - lam * a2) @ vh
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.subln.weight
        heads.append(o * (1 - lam_init))
    want = attn.out(torch.cat(heads, -1))
    torch.testing.assert_close(attn(x, causal=True), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi", "learned"])
def test_differential_attention_decodes_with_its_cache_as_it_computes_the_whole_sequence(pos):
    torch.manual_seed(0)
    m = model(attention="diff", pos=pos).eval()
    if pos == "rope":
        assert m.embed.pos.head_dim == 4  # d_model 32 / 4 heads = 8, halved: what the halves rotate
    idx = torch.randint(5, 50, (2, 5))
    assert torch.equal(decode(Stepper(m, idx), 12), decode(Stepper(m, idx, use_cache=False), 12))


# --------------------------------------------------------------------------- multi-head latent attention


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_latent_attention_equals_deepseek_v3s_attention_with_copied_weights(q_lora_rank):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                                        q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_rope_head_dim=4,
                                        qk_nope_head_dim=8, v_head_dim=6, max_position_embeddings=64,
                                        rope_interleave=True, attention_bias=False)
    cfg._attn_implementation = "eager"
    hf = ds.DeepseekV3Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    ours = build("attention", {"name": "mla", "q_lora_rank": q_lora_rank, "kv_lora_rank": 16,
                               "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 6}, 32, 4).eval()
    names = {"kv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "out": "o_proj",
             **({"q_a": "q_a_proj", "q_norm": "q_a_layernorm", "q_b": "q_b_proj"} if q_lora_rank else {"q": "q_proj"})}
    with torch.no_grad():
        for mine, theirs in names.items():
            getattr(ours, mine).weight.copy_(getattr(hf, theirs).weight)
    rope = build("pos", {"name": "rope", "pairing": "interleaved", "angles": "float32"}, 32, 4, 64, head_dim=4)
    x = torch.randn(2, 7, 32)
    position_ids = torch.arange(7)[None].expand(2, -1)
    cos, sin = ds.DeepseekV3RotaryEmbedding(cfg)(x, position_ids)
    mask = torch.full((7, 7), -math.inf).triu(1)[None, None]
    with torch.no_grad():
        want = hf(x, position_embeddings=(cos, sin), attention_mask=mask)[0]
        got = ours(x, pos=rope, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_latent_attention_caches_the_latent_only_and_decodes_as_it_computes_the_whole_sequence():
    torch.manual_seed(0)
    m = model(attention="mla", pos="rope").eval()  # head width 8: latent 32, rotary key 4, per token
    assert m.embed.pos.head_dim == 4
    idx = torch.randint(5, 50, (2, 5))
    stepper = Stepper(m, idx)
    tokens = decode(stepper, 10)
    assert torch.equal(tokens, decode(Stepper(m, idx, use_cache=False), 10))
    c = stepper.cache[0]["self"]
    assert c.k.shape[1:] == (1, 64, 32) and c.v.shape[1:] == (1, 64, 4)  # (B, 1, capacity, rank) and (.., rope)


@pytest.mark.parametrize("change,why", [
    ({"attention": {"name": "gqa", "qk_norm": "rms"}}, "attention.qk_norm"),
    ({"attention": {"name": "gqa", "window": 8}}, "attention.window"),
    ({"logits": {"name": "softcap", "cap": 30.0}}, "logits=softcap"),
    ({"residual": {"name": "sandwich", "final_norm": True}}, "residual"),
    ({"attention": {"name": "mla"}}, "attention=mla"),
    ({"ffn": {"name": "moe"}}, "ffn=moe"),
])
def test_exporting_a_model_with_a_new_option_as_llama_is_refused_naming_it(change, why):
    from modforge.checkpoints.families import FAMILIES

    run = {"model": {"name": "decoder_only", "tie_embeddings": False}, "residual": {"name": "pre", "final_norm": True},
           "norm": {"name": "rms", "eps_placement": "inside"}, "attention": {"name": "gqa"},
           "ffn": {"name": "swiglu", "activation": "silu"}, "pos": {"name": "rope", "pairing": "half"},
           "logits": {"name": "plain"}}
    assert FAMILIES["llama"].mismatch(run) is None
    assert why in FAMILIES["llama"].mismatch({**run, **change})


# --------------------------------------------------------------------------- edge cases a review found


@pytest.mark.parametrize("options", [{"attention": "mla"}, {"attention": "diff"}, {"attention.window": 3}],
                         ids=["mla", "diff", "window"])
def test_beam_search_reorders_every_new_cache_as_recomputing_does(options):
    from modforge.models.decoding import beam_search

    torch.manual_seed(0)
    m = model(pos="rope", **options).eval()
    idx = torch.randint(5, 50, (2, 5))
    cached = beam_search(Stepper(m, idx), 6, beam_size=3)
    assert torch.equal(cached, beam_search(Stepper(m, idx, use_cache=False), 6, beam_size=3))


def test_configs_without_layer_types_get_their_familys_own_window_pattern():
    from modforge.checkpoints.families.base import window_overrides
    from modforge.checkpoints.families.gemma2 import gemma2_types
    from modforge.checkpoints.families.qwen3 import qwen3_types

    c = {"sliding_window": 4096, "max_position_embeddings": 8192, "num_hidden_layers": 26}
    assert window_overrides(c, "x", gemma2_types) == ["attention.window=4096", "attention.global_every=2"]
    assert window_overrides({**c, "max_window_layers": 26}, "x", qwen3_types) == []  # every layer global
    assert window_overrides({**c, "max_window_layers": 0}, "x", qwen3_types) == ["attention.window=4096"]
    with pytest.raises(ConfigError, match="not every n-th layer"):
        window_overrides({**c, "max_window_layers": 20}, "Qwen3 config.json:", qwen3_types)


def test_the_muon_optimizer_survives_a_copy_and_refuses_a_foreign_state_in_one_line():
    import copy

    from modforge.tasks.base import role_groups

    m = model()
    opt = build("optim", {"name": "muon", "lr": 0.01}, role_groups(m))
    m(torch.randint(5, 50, (2, 4))).sum().backward()
    opt.step()
    copy.deepcopy(opt).step()
    with pytest.raises(ConfigError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": []}]})
