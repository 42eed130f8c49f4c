"""The cost of param=mup in step time: the same model under param=standard and under param=mup (base a quarter
of its width and half its depth, so every multiplier is active), one training step each (forward, loss,
backward, AdamW with µP's per-group rates), interleaved in rounds in one process; medians and their ratio.

    python benchmarks/mup_step.py [--d-model 256] [--layers 4] [--rounds 7] [--steps 30] [--compile]
"""
import argparse
import statistics
import time

import torch

from modforge import registry
from modforge.models.blocks import Parts
from modforge.models.param import parametrised
from modforge.plugins import load_all


def build(param, d_model: int, layers: int, vocab: int):
    cfg = {"name": "decoder_only", "d_model": d_model, "n_heads": 4, "n_layers": layers, "max_len": 64}
    parts = Parts()
    torch.manual_seed(0)
    m, p = parametrised(cfg, parts, vocab, param)
    groups = p.groups(m)
    opt = registry.build("optim", {"name": "adamw"}, m.parameters() if groups is None else groups)
    return m, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    load_all()
    vocab, batch, block = 70, 12, 64
    mup = {"name": "mup", "base": {"d_model": a.d_model // 4, "n_layers": max(1, a.layers // 2)}}
    arms = {name: build(param, a.d_model, a.layers, vocab) for name, param in (("standard", "standard"), ("mup", mup))}
    x = torch.randint(0, vocab, (batch, block + 1), generator=torch.Generator().manual_seed(1))

    def steps(model, opt, n):
        fwd = torch.compile(model) if a.compile else model
        for _ in range(n):
            loss = torch.nn.functional.cross_entropy(fwd(x[:, :-1]).reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for m, opt in arms.values():  # warm-up (and compile)
        steps(m, opt, 3)
    rates = {k: [] for k in arms}
    for _ in range(a.rounds):
        for name, (m, opt) in arms.items():
            t = time.perf_counter()
            steps(m, opt, a.steps)
            rates[name].append(a.steps * batch * block / (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; d_model {a.d_model}, {a.layers} layers, "
          f"batch {batch} x {block}; {a.rounds} rounds of {a.steps} steps{' (compiled)' if a.compile else ''}")
    for k, v in med.items():
        print(f"  {k:9s} {v:9.0f} tokens/s (rounds {min(rates[k]):.0f}..{max(rates[k]):.0f})")
    print(f"  mup / standard: {med['mup'] / med['standard']:.3f}")


if __name__ == "__main__":
    main()
