"""param=mup (modforge/models/param.py): µP's coordinate check, its rules as numbers, the base shape computing
what param=standard does, declarations refused in one line, and the paths a run takes (optimizer groups,
compile, resume, export)."""
import math

import pytest
import torch

from conftest import tiny_overrides
from modforge import registry
from modforge.config import compose
from modforge.models import coordcheck
from modforge.models.blocks import Parts
from modforge.models.param import parametrised
from modforge.plugins import load_all
from modforge.registry import ConfigError

V = 64  # vocabulary of the model-level checks


def make(d_model: int, param="standard", parts: Parts = None, seed: int = 0, **model):
    """A tiny decoder (or the given model), built and parametrised the way a task does it."""
    load_all()
    cfg = {"name": "decoder_only", "d_model": d_model, "n_heads": 4, "n_layers": 2, "max_len": 32, **model}
    parts = parts or Parts(pos="learned")
    torch.manual_seed(seed)
    return parametrised(cfg, parts, V, param)


def optimizer(m, p, lr=1e-2, **kw):
    groups = p.groups(m)
    return registry.build("optim", {"name": "adamw", "lr": lr, "weight_decay": 0.0, **kw},
                          m.parameters() if groups is None else groups)


def train_steps(m, opt, steps: int, x: torch.Tensor) -> None:
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def slopes(param, widths) -> dict:
    load_all()
    return coordcheck.slopes(param, widths)


MUP = {"name": "mup", "base": {"d_model": 32}}
FLAT = 0.3  # a slope above it is growth with width


def test_coordinate_check_flat_under_mup_growing_under_standard():
    """Widths 32..256 (8x): under mup no layer's output, at init or after 4 steps, grows with width (logits and
    scores may shrink at init: the readout multiplier and 1/d); under standard the hidden layers grow ~width^2
    (GPT-2's fixed init std and Adam's width-independent step)."""
    widths = (32, 64, 128, 256)
    mup = slopes(MUP, widths)
    assert max(mup.values()) < FLAT, {k: round(v, 2) for k, v in mup.items()}
    standard = slopes("standard", widths)
    assert standard["ffn0"] > 1.0 and standard["attn1"] > 1.0 and standard["logits"] > 0.5, standard


@pytest.mark.parametrize("rule", ["hidden lr", "hidden init", "readout multiplier"])
def test_the_coordinate_check_catches_a_rule_removed(rule, monkeypatch):
    """Each rule taken out of mup makes some layer grow with width: the check above can fail."""
    from modforge.models import param as P

    real = P.MuP.apply

    def without(self, model, make_model):
        real(self, model, make_model)
        role = P.roles(model)
        if rule == "hidden lr":
            self.scales = {n: (1.0, *s[1:]) for n, s in self.scales.items()}
        elif rule == "hidden init":
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if role[n] == "hidden":
                        p.mul_(self.scales[n][0] ** -0.5)  # (lr scale 1/m at the base depth: undo std / sqrt(m))
        else:
            model.readout_mult = 1.0

    monkeypatch.setattr(P.MuP, "apply", without)
    got = slopes(MUP, (32, 256))
    assert max(got.values()) > FLAT + 0.05, {k: round(v, 2) for k, v in got.items()}


def test_the_rules_as_numbers():
    """d_model 128 over 32 (m = 4), 4 layers over 2, CompleteP (alpha = 1) and depth-µP (alpha = 0.5)."""
    for alpha in (1.0, 0.5):
        param = {"name": "mup", "base": {"d_model": 32, "n_layers": 2}, "depth_alpha": alpha, "output_mult": 2.0}
        m, p = make(128, param, n_layers=4)
        s = p.scales
        depth_lr = 2.0 ** (alpha - 1)
        assert s["decoder.blocks.3.ffn.w1.weight"] == pytest.approx((0.25 * depth_lr, 0.25 * 0.5 ** alpha, 4.0))
        assert s["decoder.blocks.0.r_ffn.norm.weight"] == pytest.approx((depth_lr, 0.25 * 0.5 ** alpha, 1.0))
        assert s["tok.weight"] == s["embed.pos.table.weight"] == pytest.approx((1.0, 0.25 * 0.5 ** alpha, 1.0))
        assert s["decoder.final_norm.weight"][0] == 1.0  # outside every block: no depth factor
        assert m.readout_mult == pytest.approx(2.0 / 4)
        blk = m.decoder.blocks[2]
        assert blk.self_attn.score_scale == pytest.approx(math.sqrt(8) / 32)  # attn_mult sqrt(base d_head) / d_head
        assert blk.r_self.branch_mult == blk.r_ffn.branch_mult == pytest.approx(0.5 ** alpha)
    # init: hidden std 0.02 / sqrt(m); GPT-2's residual-output std / sqrt(2 D_base), not / sqrt(2 D)
    m, _ = make(256, {"name": "mup", "base": {"d_model": 32, "n_layers": 2}}, n_layers=8)
    w1 = torch.cat([b.ffn.w1.weight.flatten() for b in m.decoder.blocks])
    w2 = torch.cat([b.ffn.w2.weight.flatten() for b in m.decoder.blocks])
    assert w1.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.02)
    assert w2.std().item() == pytest.approx(0.02 / math.sqrt(2 * 2) / math.sqrt(8), rel=0.02)  # w2: fan_in 1024 over 128
    assert m.tok.weight.std().item() == pytest.approx(0.02, rel=0.02)  # input: unchanged


def test_the_optimizer_receives_each_groups_lr_eps_and_decay():
    m, p = make(128, MUP)
    opt = optimizer(m, p, lr=1e-3, weight_decay=0.1, eps=1e-8)
    group_of = {id(q): g for g in opt.param_groups for q in g["params"]}
    names = dict(m.named_parameters())
    for name, (lr, eps, wd) in p.scales.items():
        g = group_of[id(names[name])]
        decayed = names[name].dim() >= 2
        assert (g["lr"], g["eps"], g["weight_decay"]) == pytest.approx((1e-3 * lr, 1e-8 * eps,
                                                                        0.1 * wd if decayed else 0.0)), name
    assert len(group_of) == len(names)


def test_mup_at_its_base_shape_computes_what_standard_does():
    """Base = the model's own shape (width and depth): bit for bit the standard run, after 3 AdamW steps."""
    x = torch.randint(0, V, (4, 17), generator=torch.Generator().manual_seed(2))
    runs = []
    for param in ("standard", {"name": "mup", "base": {"d_model": 64, "n_layers": 2}}):
        m, p = make(64, param, Parts(pos="rope", ffn="swiglu", attention="gqa"))
        train_steps(m, optimizer(m, p, weight_decay=0.1), 3, x)
        runs.append(m.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_the_attention_score_scale_reaches_sdpa():
    m, _ = make(64, MUP)
    att = m.decoder.blocks[0].self_attn
    assert att.score_scale == pytest.approx(math.sqrt(8) / 16)
    x = torch.randn(2, 5, 64)
    q, k, v = att.qkv(x).view(2, 5, 3, 4, 16).permute(2, 0, 3, 1, 4)
    s = (q @ k.transpose(-1, -2)) * att.score_scale
    s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    want = att.out((s.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 64))
    assert torch.allclose(att(x, causal=True), want, atol=1e-6)


@pytest.mark.parametrize("model,parts", [
    ({"name": "decoder_only", "tie_embeddings": False}, {"norm": "rms", "ffn": "geglu", "pos": "rope"}),
    ({"name": "decoder_only"}, {"norm": "batch", "ffn": "relu", "pos": "sinusoidal", "attention": "mqa"}),
    ({"name": "decoder_only", "scale_embeddings": True}, {"residual": "post", "ffn": "glu", "pos": "none"}),
    ({"name": "encoder_only", "type_vocab_size": 2, "embed_norm": True, "head_transform": True},
     {"ffn": "reglu", "attention": "gqa"}),
    ({"name": "encoder_decoder", "enc_layers": 2, "dec_layers": 3}, {"ffn": "swiglu", "pos": "learned"}),
])
def test_every_built_in_variant_trains_under_mup(model, parts):
    load_all()
    cfg = {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_len": 32, **model}
    p_ = Parts(**parts)
    m = registry.build("model", cfg, p_, V)
    p = registry.build("param", {"name": "mup", "base": {"d_model": 32, "n_layers": 1}})
    p.apply(m, lambda keys: registry.build("model", {**cfg, **keys}, p_, V))
    x = torch.randint(0, V, (2, 9))
    out = m(x, x) if m.needs_source else m(x)
    out.float().pow(2).mean().backward()
    opt = registry.build("optim", {"name": "adamw"}, p.groups(m))
    opt.step()
    assert torch.isfinite(out).all() and m.readout_mult == pytest.approx(0.5)
    if model.get("scale_embeddings"):
        assert m.embed.scale == pytest.approx(math.sqrt(32))  # held at the base's sqrt(d_model)


def test_undeclared_parts_are_refused_in_one_line():
    from torch import nn

    from modforge.components.attention import MultiHeadAttention
    from modforge.components.norms import Norm
    from modforge.components.residual import PreNorm

    load_all()

    class Gain(Norm):  # a plugin norm that declares nothing
        def __init__(self, cfg, d_model):
            super().__init__()
            self.g = nn.Parameter(torch.ones(()))

        def forward(self, x, mask=None):
            return self.g * x

    class Blind(MultiHeadAttention):  # computes its own scale: it cannot honour score_scale
        scales_scores = False

    class Plain(PreNorm):
        scales_branch = False

    def build(part, cls, **model):
        m, p = make(64, dict(MUP, base={"d_model": 32, **model.pop("base", {})}), **model)
        for mod in list(m.modules()):
            for name, child in list(mod.named_children()):
                if isinstance(child, part):
                    new = cls.__new__(cls)
                    new.__dict__.update(child.__dict__)
                    if cls is Gain:
                        nn.Module.__init__(new)
                        new.g = nn.Parameter(torch.ones(()))
                    setattr(mod, name, new)
        cfg = {"name": "decoder_only", "d_model": 64, "n_heads": 4, "n_layers": model.get("n_layers", 2), "max_len": 32}
        p.apply(m, lambda keys: registry.build("model", {**cfg, **keys}, Parts(pos="learned"), V))

    with pytest.raises(ConfigError, match=r"parameter 'decoder\.blocks\.0\.r_self\.norm\.g' .*Gain\) has no declared "
                                          r"role.*`param_roles`"):
        build(Norm, Gain)
    with pytest.raises(ConfigError, match=r"Blind \(decoder\.blocks\.0\.self_attn\) does not declare `scales_scores`"):
        build(MultiHeadAttention, Blind)
    with pytest.raises(ConfigError, match=r"Plain \(decoder\.blocks\.0\.r_self\) does not declare `scales_branch`"):
        build(PreNorm, Plain, n_layers=4, base={"n_layers": 2})
    build(PreNorm, Plain)  # no depth to scale: nothing asked of it


def test_an_optimizer_that_ignores_the_groups_and_adams_l2_decay_are_refused():
    from modforge.components.optim import check_group_scales

    m, p = make(64, MUP)
    groups = p.groups(m)
    blind = torch.optim.AdamW([q for g in groups for q in g["params"]], lr=1e-3)
    with pytest.raises(ConfigError, match=r"optim=mine: it does not apply the parametrisation's per-group"):
        check_group_scales(blind, groups, {"name": "mine"})
    check_group_scales(optimizer(m, p), groups, {"name": "adamw"})
    with pytest.raises(ConfigError, match=r"optim=adam with optim.weight_decay=0.1: .*no rule for Adam's L2 decay"):
        registry.build("optim", {"name": "adam", "weight_decay": 0.1}, groups)
    base, _ = make(32, MUP)  # at the base shape too (every multiplier 1), not only where a width scales the decay
    with pytest.raises(ConfigError, match=r"no rule for Adam's L2 decay"):
        registry.build("optim", {"name": "adam", "weight_decay": 0.1}, _.groups(base))
    registry.build("optim", {"name": "adam"}, groups)


@pytest.mark.process  # torch.compile's inductor starts its compile workers
def test_compiled_mup_model_has_no_graph_break_and_the_eager_logits():
    m, _ = make(64, {"name": "mup", "base": {"d_model": 32, "n_layers": 1}})
    x = torch.randint(0, V, (2, 16))
    explained = torch._dynamo.explain(m)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    assert torch.allclose(torch.compile(m)(x), m(x), atol=1e-5)
    torch._dynamo.reset()


def test_a_mup_run_resumes_bit_for_bit_and_refuses_a_hugging_face_export(tmp_path):
    from modforge.checkpoints.export import export_hf
    from modforge.run.story import run

    args = tiny_overrides(steps=4) + ["data.max_chars=20000", "sample=false", "eval_at_start=false", "param=mup",
                                      "param.base.d_model=16", "param.base.n_layers=1", "trainer.val_check_interval=2"]
    whole = run(compose(args), tmp_path / "whole")
    half = run(compose(tiny_overrides(steps=2) + args[len(tiny_overrides(steps=4)):]), tmp_path / "half")
    resumed = run(compose(args + [f"resume={half['checkpoint']}"]), tmp_path / "resumed")
    assert resumed["val"]["val/loss"] == whole["val"]["val/loss"] and resumed["resumed_at_steps"] == [2]
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match=r"format=hf: the run's parametrisation \(param=mup\) multiplies logits x"):
        export_hf(whole["checkpoint"], tmp_path / "hf")


def test_transfer_mup_carries_the_setting_with_the_smallest_rung_as_base():
    from modforge.studies.tuning import TRANSFER

    small, big = {"model.d_model": 32, "model.n_layers": 2}, {"model.d_model": 128, "model.n_layers": 4}
    got = TRANSFER["mup"]({"optim.lr": 0.003}, small, big, "model.d_model")
    assert got == {"optim.lr": 0.003, "param": "mup", "param.base.d_model": 32, "param.base.n_layers": 2}
    with pytest.raises(ValueError, match="transfer=mup: the smallest rung must set model.d_model"):
        TRANSFER["mup"]({"optim.lr": 0.003}, {}, big, "model.d_model")
    with pytest.raises(ValueError, match="a rung sets model.n_layers, so the smallest rung must set it too"):
        TRANSFER["mup"]({"optim.lr": 0.003}, {"model.d_model": 32}, big, "model.d_model")


def reference_rules(model: torch.nn.Module, base: torch.nn.Module) -> dict:
    """Table 8 of Yang et al. 2022 (µP with a readout multiplier, Adam), written here from the shapes alone, as
    the reference package's `set_base_shapes` / `MuAdam` infer them: a parameter whose two dimensions both differ
    from the base's is matrix-like (hidden): lr / m and weight decay x m, init std / sqrt(m), m its fan-in over
    the base's; any other (one width dimension: embeddings, the readout, gains, biases) is vector-like: lr, decay
    and init unchanged. No declaration of modforge's is read. -> {name: (lr scale, wd scale, init std ratio)}."""
    shapes = {n: p.shape for n, p in base.named_parameters()}
    out = {}
    for n, p in model.named_parameters():
        differs = [a != b for a, b in zip(p.shape, shapes[n])]
        if p.dim() == 2 and all(differs):
            m = p.shape[1] / shapes[n][1]  # fan-in: weights are stored (out, in)
            out[n] = (1 / m, m, 1 / math.sqrt(m))
        else:
            out[n] = (1.0, 1.0, 1.0)
    return out


def test_every_parameter_follows_the_reference_rules_of_mup():
    """d_model 128 over a base of 32 (every width dimension x4, d_ff too), same depth: each parameter's lr and
    weight-decay scale, its init std against the standard parametrisation's at 128 (measured), and the readout
    multiplier match the reference computed from the shapes alone. Adam's epsilon is modforge's addition
    (x 1/m_model, Everett et al. 2024): the reference package leaves it alone."""
    base, _ = make(32)
    m, p = make(128, {"name": "mup", "base": {"d_model": 32}, "output_mult": 1.0}, seed=1)
    sp, _ = make(128, seed=1)
    ref = reference_rules(m, base)
    std = dict(sp.named_parameters())
    checked = 0
    for name, q in m.named_parameters():
        lr, eps, wd = p.scales[name]
        want_lr, want_wd, want_init = ref[name]
        assert (lr, wd) == (pytest.approx(want_lr), pytest.approx(want_wd)), name
        assert eps == pytest.approx(1 / 4), name
        if q.dim() == 2 and q.numel() >= 4096 and std[name].std() > 0:  # init: measured on the tensors
            assert (q.std() / std[name].std()).item() == pytest.approx(want_init, rel=0.05), name
            checked += 1
    assert checked >= 8 and m.readout_mult == pytest.approx(1.0 / 4)  # the readout's multiplier: 1 / width_mult
    try:  # the reference package itself, where it is installed (its own dependencies pull torchvision: not here)
        import mup
    except ImportError:
        return
    mup.set_base_shapes(m, base, rescale_params=False, do_assert=False)  # the readout multiplies itself (above)
    groups = mup.MuAdamW(m.parameters(), lr=1.0, weight_decay=1.0).param_groups
    by_param = {id(q): (g["lr"], g["weight_decay"]) for g in groups for q in g["params"]}
    for name, q in m.named_parameters():
        assert by_param[id(q)] == pytest.approx(ref[name][:2]), name
