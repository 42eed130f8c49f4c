"""Forward + backward time of each norm alone, against LayerNorm, in one process.

    python benchmarks/norms.py [--d 128] [--tokens 768] [--reps 500] [--rounds 7]

The norms study (experiments/norms.md) measures whole training steps, where the norm is a small
part; this isolates the layer. Each norm is built from the registry as the models build it
(``norm=layer``, ``rms``, ``batch``: modforge's LayerNorm on ``F.layer_norm``, RMSNorm, and the
masked BatchNorm), beside torch's own ``nn.LayerNorm`` and ``nn.RMSNorm`` as peers, and called on a (1, tokens, d) batch that requires grad; each round times
``--reps`` forward+backward passes of every norm in turn (so drift on a noisy machine hits all);
the report is each norm's median time per call and its ratio to modforge's LayerNorm's.
"""
import argparse
import statistics
import time

import torch

from modforge import registry
from modforge.plugins import load_builtins


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=768)  # batch 12 x block 64, the studies' batch
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    load_builtins()
    torch.manual_seed(0)
    norms = {f"norm={n}": registry.build("norm", n, a.d).train() for n in ("layer", "rms", "batch")}
    norms["torch nn.LayerNorm"] = torch.nn.LayerNorm(a.d)
    norms["torch nn.RMSNorm"] = torch.nn.RMSNorm(a.d, eps=1e-6)
    names = list(norms)
    x = torch.randn(1, a.tokens, a.d, requires_grad=True)
    g = torch.randn(1, a.tokens, a.d)
    times: dict = {n: [] for n in names}
    for r in range(a.rounds + 1):
        for n in names:
            t0 = time.perf_counter()
            for _ in range(a.reps):
                norms[n](x).backward(g)
            if r:  # round 0 warms up
                times[n].append((time.perf_counter() - t0) / a.reps)
    base = statistics.median(times["norm=layer"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d={a.d}, {a.tokens} tokens, "
          f"{a.rounds} rounds of {a.reps} forward+backward")
    for n in names:
        m = statistics.median(times[n])
        print(f"  {n:<20} {m * 1e6:8.1f} us per call   {m / base:.2f}x norm=layer")


if __name__ == "__main__":
    main()
