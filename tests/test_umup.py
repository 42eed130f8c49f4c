"""param=umup (modforge/models/umup.py): u-µP's coordinate check, its rules as numbers, its storage at µP's scale
against a literal unit-scaled model written here (unit weights, scaled ops, the reference's Adam rules, normalised
residual adds), and what it refuses in one line."""
import math

import pytest
import torch
from torch import nn

from modforge import registry
from modforge.models import coordcheck
from modforge.models.blocks import Parts
from modforge.models.param import parametrised
from modforge.plugins import load_all
from modforge.registry import ConfigError

V = 64
FLAT = 0.3  # a slope above it is growth with width (as test_mup.py)


def make(d_model: int, param="umup", seed: int = 0, parts: Parts = None, **model):
    load_all()
    cfg = {"name": "decoder_only", "d_model": d_model, "n_heads": d_model // 32, "n_layers": 2, "max_len": 64,
           "tie_embeddings": False, **model}
    torch.manual_seed(seed)
    return parametrised(cfg, parts or Parts(pos="learned"), V, param)


def test_coordinate_check_unit_at_init_and_flat_under_umup():
    """Widths 32..256: at init every block's output has the scale of a unit Gaussian (mean |x| ~ 0.8) at every
    width; after 4 steps no layer's change grows with width (the embedding's shrinks: lr x 1/sqrt(width))."""
    load_all()
    widths = (32, 64, 128, 256)
    for w in (32, 256):
        got = coordcheck.coordinates("umup", w, lr=0.5)
        for k in ("attn0", "ffn0", "attn1", "ffn1"):
            assert 0.6 < got[f"init {k}"] < 2.0, (w, k, got[f"init {k}"])
    s = coordcheck.slopes("umup", widths, lr=0.5)
    assert max(s.values()) < FLAT, {k: round(v, 2) for k, v in s.items()}


@pytest.mark.parametrize("scale", ["attention", "activation"])
def test_the_unit_scale_check_catches_an_op_scale_removed(scale, monkeypatch):
    from modforge.models import umup

    if scale == "attention":
        monkeypatch.setattr(umup, "attention_scale", lambda *a, **k: 1.0)
    else:
        from modforge.components.ffn import MLP

        monkeypatch.setattr(MLP, "unit_scale", lambda self: 1.0)
    load_all()
    got = coordcheck.coordinates("umup", 128, lr=0.5)
    k = "init attn0" if scale == "attention" else "init ffn0"
    assert not 0.6 < got[k] < 2.0, got[k]


def test_the_rules_as_numbers():
    """d_model 128, 4 heads of 32, 2 layers, GELU MLP of 512, sequence length 64: each rule by hand."""
    m, p = make(128, n_heads=4)
    lr = {n: s[0] for n, s in p.scales.items()}
    wd = {n: s[2] for n, s in p.scales.items()}
    D = 1 / math.sqrt(2)
    gelu = 1.7009262  # 1 / sd of gelu(z), z ~ N(0, 1) (numerical integration; the reference's fit says 1.767)
    a = 1 / (1 + 4 * 32)
    attn = (64 / math.log(64)) ** ((1 - a) / 2)
    b = "decoder.blocks.1."
    assert lr["tok.weight"] == pytest.approx(1 / math.sqrt(128)) and lr["head.weight"] == pytest.approx(1.0)
    assert lr[b + "self_attn.qkv.weight"] == pytest.approx(D / 128)
    assert lr[b + "self_attn.out.weight"] == pytest.approx(attn * D / 128)
    assert lr[b + "ffn.w2.weight"] == pytest.approx(gelu * D / 512, rel=1e-6)
    assert lr[b + "r_ffn.norm.weight"] == pytest.approx(D) and lr["decoder.final_norm.weight"] == pytest.approx(1.0)
    assert all(wd[n] * lr[n] == pytest.approx(1.0) for n in lr)  # decay per step independent of the lr scale
    params = dict(m.named_parameters())
    assert params["tok.weight"].std().item() == pytest.approx(1.0, rel=1e-5)
    assert params["head.weight"].std().item() == pytest.approx(1.0, rel=1e-5)
    assert params[b + "ffn.w1.weight"].std().item() == pytest.approx(1 / math.sqrt(128), rel=1e-5)
    assert params[b + "ffn.w2.weight"].std().item() == pytest.approx(gelu / math.sqrt(512), rel=1e-5)
    assert params[b + "self_attn.out.weight"].std().item() == pytest.approx(attn / math.sqrt(128), rel=1e-5)
    assert m.readout_mult == pytest.approx(1 / 128)
    assert m.decoder.blocks[0].self_attn.score_scale == pytest.approx(1 / 32)
    assert m.decoder.blocks[0].r_self.branch_mult == pytest.approx(D)


def test_the_op_scales_against_the_reference_s_numbers():
    """ReLU's exact sd; SwiGLU's 2^0.75 and attention's fit as the reference (graphcore-research/unit-scaling)
    states them; GELU is the one that differs (1.7009 here, the reference's interpolation 1.767)."""
    from modforge.components.ffn import GatedFFN, MLP
    from modforge.models.umup import attention_scale

    load_all()
    relu = registry.build("ffn", "relu", 64, 256)
    assert relu.unit_scale() == pytest.approx(math.sqrt(2 / (1 - 1 / math.pi)), rel=1e-6)
    swiglu = registry.build("ffn", "swiglu", 64, 256)
    assert isinstance(swiglu, GatedFFN) and isinstance(relu, MLP)
    assert swiglu.unit_scale() == pytest.approx(2 ** 0.75, rel=5e-3)
    for d_head, S, want in ((64, 256, 6.74), (64, 1024, 12.0), (128, 2048, 16.3)):
        assert attention_scale(d_head, S, causal=True) == pytest.approx(want, rel=5e-3)
    assert attention_scale(64, 256, causal=False) == pytest.approx(256 ** ((1 - 1 / 257) / 2))


def literal(model: nn.Module, stored, lr: float):
    """The model as u-µP writes it: every matrix of unit sd with its op's scale in the forward pass (a hook),
    the residual adds normalised by tau (the reference's schedule), and AdamW at the reference's lrs: hidden
    lr / sqrt(fan-in) x 1 / sqrt(L), embedding lr / sqrt(width), readout lr, gains lr / sqrt(L)."""
    import copy

    from modforge.components.residual import PreNorm

    m = copy.deepcopy(model)
    L = len(m.decoder.blocks)
    groups = []
    with torch.no_grad():
        for b in m.decoder.blocks:
            for lin in [mod for mod in b.modules() if isinstance(mod, nn.Linear)]:
                n = lin.in_features
                s = stored.unit.get(next(k for k, v in m.named_modules() if v is lin) + ".weight", 1.0)
                lin.weight.mul_(math.sqrt(n) / s)  # unit sd
                lin.register_forward_hook(lambda _m, _i, out, c=s / math.sqrt(n): out * c)
                groups.append({"params": [lin.weight], "lr": lr / math.sqrt(n) / math.sqrt(L)})
    groups += [{"params": [m.tok.weight, m.embed.pos.table.weight], "lr": lr / math.sqrt(m.cfg.d_model)},
               {"params": [m.head.weight], "lr": lr}]
    gains = [p for n, p in m.named_parameters() if "norm" in n]
    groups += [{"params": [p for n, p in m.named_parameters() if "norm" in n and "blocks" in n], "lr": lr / math.sqrt(L)},
               {"params": [p for n, p in m.named_parameters() if n.startswith("decoder.final_norm")], "lr": lr}]
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters())) and gains
    # the residual adds: h <- (h + tau_i f_i(h)) / sqrt(1 + tau_i^2), branch i = 0..2L-1, alpha = 1
    taus = [1 / math.sqrt(L + i) for i in range(2 * L)]
    for i, r in enumerate(r for b in m.decoder.blocks for r in (b.r_self, b.r_ffn)):
        r.branch_mult = 1.0

        def forward(x, sublayer, mask=None, r=r, tau=taus[i]):
            return (x + tau * sublayer(r.norm(x, mask))) / math.sqrt(1 + tau * tau)

        assert isinstance(r, PreNorm)
        r.forward = forward
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-14, weight_decay=0.0)
    return m, opt


def test_stored_at_mups_scale_it_trains_as_the_literal_unit_scaled_model():
    """abc-symmetry and the telescoped residual: modforge's umup (matrices stored at sd c / sqrt(n), Adam lr x
    c D / n, branches x 1 / sqrt(L)) and the literal u-µP model above give the same logits at init and after
    5 AdamW steps (eps 1e-14: the symmetry holds up to eps; LayerNorm's eps is what is left)."""
    parts = Parts(pos="learned", ffn={"name": "gelu", "bias": False}, attention={"name": "mha", "bias": False},
                  norm={"name": "layer", "bias": False})
    m, p = make(64, parts=parts, seed=3)
    lit, opt_lit = literal(m, p, lr=0.05)
    groups = p.groups(m)
    opt = registry.build("optim", {"name": "adamw", "lr": 0.05, "betas": [0.9, 0.99], "eps": 1e-14,
                                   "weight_decay": 0.0}, groups)
    x = torch.randint(0, V, (4, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        start = m(x[:, :-1])
        torch.testing.assert_close(lit(x[:, :-1]), start, rtol=1e-4, atol=1e-5)
    for model, o in ((m, opt), (lit, opt_lit)):
        for _ in range(5):
            loss = nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
            o.zero_grad()
            loss.backward()
            o.step()
    with torch.no_grad():
        a, b = m(x[:, :-1]), lit(x[:, :-1])
    assert (a - b).abs().max().item() < 1e-4 * a.abs().max().item(), (a - b).abs().max().item()  # 2.1e-6 of 0.76
    assert (a - start).abs().max() > 100 * (a - b).abs().max()  # (it trained: the steps moved it far more)


def test_what_umup_cannot_take_is_refused_in_one_line():
    from modforge.components.ffn import FFN

    load_all()
    with pytest.raises(ConfigError, match=r"param=umup: model.tie_embeddings=true.*set model.tie_embeddings=false"):
        make(64, tie_embeddings=True)
    with pytest.raises(ConfigError, match=r"PostNorm \(decoder.blocks.0.r_self\) is not a pre-norm residual"):
        make(64, parts=Parts(pos="learned", residual="post"))
    with pytest.raises(ConfigError, match=r"Embedder \(embed\) multiplies by scale=8.*model.scale_embeddings=false"):
        make(64, scale_embeddings=True)
    with pytest.raises(ConfigError, match=r"param.attn_mult=0: must be > 0"):
        make(64, param={"name": "umup", "attn_mult": 0})

    class Plain(FFN):  # a plugin FFN that states no unit scale
        param_roles = {"w.weight": "hidden"}

        def __init__(self, cfg, d_model, d_ff):
            super().__init__()
            self.w = nn.Linear(d_model, d_model, bias=False)
            self.w.residual_out = True

        def forward(self, x):
            return self.w(x)

    m, _ = make(64, param="standard")
    for b in m.decoder.blocks:
        b.ffn = Plain(None, 64, 256)
    with pytest.raises(ConfigError, match=r"Plain \(decoder.blocks.0.ffn\) gives no unit_scale\(\)"):
        registry.build("param", "umup").apply(m, None)


@pytest.mark.parametrize("parts", [{"ffn": "swiglu", "norm": "rms", "pos": "rope"},
                                   {"ffn": "relu", "attention": "gqa", "pos": "sinusoidal"}])
def test_built_in_variants_train_under_umup(parts):
    m, p = make(64, parts=Parts(**parts), n_heads=4)
    opt = registry.build("optim", {"name": "adamw", "lr": 0.5}, p.groups(m))
    x = torch.randint(0, V, (2, 17))
    loss = nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(torch.isfinite(q).all() for q in m.parameters())


@pytest.mark.parametrize("decay", ["independent", "coupled"])
def test_each_parameter_decays_as_the_reference_independently_of_its_rate_and_the_peak(decay):
    """The step's decay of a parameter, lr_group x wd_group in AdamW: independent (the reference's default): wd,
    whatever the parameter's lr multiplier and the peak rate; coupled: lr_peak x wd, whatever the multiplier.
    Decayed groups are the matrices; norms and biases are not decayed. Taking out the division by the peak rate
    (modforge.components.optim) makes the independent case fail."""
    from modforge.components.optim import AdamWConfig, adamw

    m, p = make(128, n_heads=4, param={"name": "umup", "decay": decay})
    lr, wd = 0.25, 0.0005
    opt = adamw(AdamWConfig(lr=lr, weight_decay=wd), p.groups(m))
    steps = [g["lr"] * g["weight_decay"] for g in opt.param_groups if g["weight_decay"] > 0]
    assert len(steps) >= 4 and len({round(g["lr"], 12) for g in opt.param_groups}) >= 4  # several lr multipliers
    assert steps == pytest.approx([wd if decay == "independent" else lr * wd] * len(steps), rel=1e-9)


def test_adamws_usual_decay_under_independent_decay_is_refused_in_one_line_before_any_work():
    """(The test above checks what each rule does to every group.)"""
    from modforge.config.checks import validate
    from modforge.config.composition import compose_job, load

    load()
    base = ["param=umup", "model.tie_embeddings=false"]
    validate(compose_job(base))  # coupled, the default: AdamW's 0.1 means what it always means
    with pytest.raises(ConfigError, match=r"^optim.weight_decay=0.1 with param=umup: under u-µP's independent decay "
                                          r"this is the fraction of every weight decayed per step at the peak rate; "
                                          r"give at most 0.01 .*or param.decay=coupled"):
        validate(compose_job(base + ["param.decay=independent"]))
    validate(compose_job(base + ["param.decay=independent", "optim.weight_decay=0.0005"]))
    with pytest.raises(ConfigError, match=r"param.decay='sideways': one of coupled, independent"):
        validate(compose_job(base + ["param.decay=sideways"]))
