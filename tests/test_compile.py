"""compile=true: torch.compile of the model, with no graph break for any built-in variant but those that declare
one (``graph_breaks``: ffn=moe's routing), and the eager loss."""
import itertools

import pytest
import torch

from conftest import tiny_overrides
from modforge import registry
from modforge.plugins import load_all
from modforge.config import compose
from modforge.config.composition import to_plain
from modforge.models.blocks import Parts

PART_KINDS = ("norm", "residual", "ffn", "pos", "attention", "logits")


def builtin(kind: str) -> list:
    return [e.name for e in registry.registry(kind).entries() if e.provider == registry.BUILTIN]


def covering_combinations() -> list:
    """Combinations of the default task's model in which every built-in variant of every part appears."""
    load_all()
    lists = [builtin(k) for k in PART_KINDS]
    n = max(map(len, lists))
    return [tuple(v[i % len(v)] for v in lists) for i in range(n)]


@pytest.mark.parametrize("combo", covering_combinations(), ids=lambda c: ",".join(c))
def test_the_model_compiles_without_graph_breaks(combo):
    overrides = [f"{k}={v}" for k, v in zip(PART_KINDS, combo)] + tiny_overrides()
    plain = to_plain(compose(overrides))
    model = registry.build("model", plain["model"], Parts.from_config(plain), 70).train()
    x = torch.randint(0, 70, (2, 16))
    explained = torch._dynamo.explain(model)(x)
    declared = [m.graph_breaks for m in model.modules() if getattr(m, "graph_breaks", None)]
    assert explained.graph_break_count == 0 or declared, explained.break_reasons  # (ffn=moe declares its own)
    torch._dynamo.reset()


@pytest.mark.parametrize("options", [
    ["attention.qk_norm=rms", "attention.gate=true", "attention.logit_cap=5"],
    ["attention=gqa", "attention.n_kv_heads=2", "attention.window=3", "attention.global_every=2",
     "attention.qk_norm=rms", "attention.qk_norm_scope=full"],
], ids=["qk_norm,gate,logit_cap", "gqa,window,global_every,qk_norm_full"])
def test_the_attention_options_compile_without_graph_breaks(options):
    plain = to_plain(compose(options + tiny_overrides()))
    model = registry.build("model", plain["model"], Parts.from_config(plain), 70).train()
    explained = torch._dynamo.explain(model)(torch.randint(0, 70, (2, 16)))
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


def test_every_part_variant_is_covered():
    seen = {k: {c[i] for c in covering_combinations()} for i, k in enumerate(PART_KINDS)}
    assert all(seen[k] == set(builtin(k)) for k in PART_KINDS)
    assert len(set(itertools.chain(*seen.values()))) > 10


@pytest.mark.process  # torch.compile's inductor starts its compile workers
@pytest.mark.slow
def test_a_compiled_run_trains_to_the_eager_loss(tmp_path):
    from modforge.run.story import run

    args = tiny_overrides(steps=3) + ["data.max_chars=20000", "sample=false", "eval_at_start=false"]
    eager = run(compose(args), tmp_path / "eager")
    compiled = run(compose(args + ["compile=true"]), tmp_path / "compiled")
    assert compiled["val"]["val/loss"] == pytest.approx(eager["val"]["val/loss"], rel=1e-4)
    a = torch.load(tmp_path / "eager" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "compiled" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys()  # compiled in place: the same parameter names in the checkpoint
