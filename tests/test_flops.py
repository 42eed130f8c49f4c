"""Training FLOPs (modforge.models.flops) against torch's own counter and a count by hand (issue 26)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from modforge.models.blocks import Parts
from modforge.models.flops import FlopCount
from modforge.registry import build

V, B = 50, 3


def model_of(name: str, **parts):
    cfg = {"name": name, "d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 64}
    return build("model", cfg, Parts(**parts), V).train()


def call(model, name: str, n: int, n_src: int):
    x = torch.randint(4, V, (B, n))
    return model(torch.randint(4, V, (B, n_src)), x) if name == "encoder_decoder" else model(x)


@pytest.mark.parametrize("name,parts", [("decoder_only", {}), ("encoder_only", {"ffn": "swiglu"}),
                                        ("encoder_decoder", {"attention": "gqa"})])
def test_the_count_agrees_with_torchs_flop_counter_on_a_forward_and_backward(name, parts):
    """torch counts every matrix product it runs (forward and backward); ours counts the forward's from the
    shapes and triples it. Sources of 11 and targets of 7 positions: the two sides at their own lengths.
    SDPA's math backend: torch's counter has no formula for the CPU flash kernel, and would miss attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = model_of(name, **parts)
    count = FlopCount(model)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as torch_count:
        call(model, name, 7, 11).float().pow(2).mean().backward()
    assert count.train == torch_count.get_total_flops()  # exactly: both count matrix products only
    if name == "encoder_decoder":  # the encoder runs on the 11 source positions, the decoder on the 7 targets
        assert count.forward == {"encoder": B * model.encoder.flops(11), "decoder": B * model.decoder.flops(7, 11),
                                 "head": B * 7 * 2 * 32 * V}


def test_the_count_of_a_decoder_only_model_by_hand():
    d, ff, n, layers = 32, 128, 10, 2  # 4 heads: the count does not depend on how d is split
    model = model_of("decoder_only", ffn="gelu")  # GELU MLP, d_ff = 4 d
    count = FlopCount(model)
    call(model, "decoder_only", n, 0).sum().backward()
    per_layer = 2 * n * d * 3 * d + 2 * n * d * d + 2 * 2 * n * n * d + 2 * n * (d * ff + ff * d)
    assert count.forward == {"decoder": B * layers * per_layer, "head": B * 2 * n * d * V}
    assert count.train == 3 * (B * layers * per_layer + B * 2 * n * d * V)
    with torch.no_grad():  # an evaluation counts nothing
        model.eval()(torch.randint(4, V, (B, n)))
    assert count.train == 3 * (B * layers * per_layer + B * 2 * n * d * V)


def test_a_tasks_own_head_is_counted_too(tmp_path):
    """classify's linear head is made after the base task: the count is hooked on at setup, so it is in."""
    from pathlib import Path

    from conftest import tiny_overrides
    from modforge.config import compose
    from modforge.run.story import run

    data = Path(__file__).parent / "data" / "sentiment.csv"
    m = run(compose(tiny_overrides(steps=2) + ["model=encoder_only", "task=classify", "data=classify",
                                               f"data.path={data}", "data.batch_size=4", "data.max_len=32",
                                               "sample=false"]), tmp_path)
    assert set(m["forward_flops_by_part"]) == {"encoder", "head"} and m["forward_flops_by_part"]["head"] > 0


def test_the_count_under_torch_compile_is_the_eager_count_and_compiles_once():
    """The hooks run inside the compiled graph. Adding to a Python int there made Dynamo guard on its value and
    recompile at every step (until its limit, then eager: the compiled GPT-2 small ran at 0.67x plain torch on
    the first GPU check). Dynamo alone (backend="eager") is what decides recompiles."""
    import torch._dynamo

    torch.manual_seed(0)
    eager, compiled = model_of("decoder_only"), model_of("decoder_only")
    counts = FlopCount(eager), FlopCount(compiled)
    run = torch.compile(compiled, backend="eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(4):
            call(eager, "decoder_only", 9, 0).sum().backward()
            call(run, "decoder_only", 9, 0).sum().backward()
            assert counts[1].forward == counts[0].forward  # read between steps: what the graph added is in
    assert counts[1].train == counts[0].train > 0
    state = counts[1].state()
    counts[1].load(state)
    assert counts[1].state() == state
