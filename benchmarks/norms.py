"""Time of each norm alone (per call) and of a whole training step with it (per step), against LayerNorm, in one
process, with the spread over rounds.

    python benchmarks/norms.py [--d 96] [--layers 3] [--tokens 768] [--reps 500] [--steps 50] [--rounds 7]

The norms study (experiments/norms.md) compares quality; this is its speed side. Each norm is built from the
registry as the models build it (``norm=layer``: modforge's LayerNorm on ``F.layer_norm``; ``rms``; ``batch``, the
masked BatchNorm; ``batch_causal``, its prefix-statistics variant), with torch's own ``nn.LayerNorm`` and
``nn.RMSNorm`` as peers for the per-call figure.

* **Per call**: ``--reps`` forward+backward passes on a (1, tokens, d) input that requires grad.
* **Per step**: ``--steps`` AdamW steps of the norms study's largest rung (a Pre-LN decoder, d_model ``--d``,
  ``--layers`` layers, 4 heads, block 64, batch 12, GELU MLP, learned positions, a 100-symbol vocabulary), one
  model per norm.

Each round times every entry in turn (so drift on a noisy machine hits all); round 0 warms up. The report: each
entry's median over rounds, its range over rounds, and its ratio to LayerNorm's: the median of the per-round ratios
(each round's pair ran back to back) with their range, which is the noise to read a ratio against.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from modforge import registry
from modforge.models.blocks import Parts
from modforge.plugins import load_builtins

NORMS = ("layer", "rms", "batch", "batch_causal")
B, T, V = 12, 64, 100


def per_call(a) -> dict:
    torch.manual_seed(0)
    norms = {f"norm={n}": registry.build("norm", n, a.d).train() for n in NORMS}
    norms["torch nn.LayerNorm"] = torch.nn.LayerNorm(a.d)
    norms["torch nn.RMSNorm"] = torch.nn.RMSNorm(a.d, eps=1e-6)
    x = torch.randn(a.tokens // T, T, a.d, requires_grad=True)
    g = torch.randn_like(x)

    def once(n):
        t0 = time.perf_counter()
        for _ in range(a.reps):
            norms[n](x).backward(g)
        return (time.perf_counter() - t0) / a.reps

    return rounds(list(norms), once, a.rounds)


def per_step(a) -> dict:
    cfg = {"name": "decoder_only", "d_model": a.d, "n_heads": 4, "n_layers": a.layers, "max_len": T}
    data = torch.randint(0, V, (16, B, T + 1), generator=torch.Generator().manual_seed(0))
    models, opts, i = {}, {}, {}
    for n in NORMS:
        torch.manual_seed(0)
        models[n] = registry.build("model", cfg, Parts(norm=n, residual="pre", ffn="gelu", pos="learned"), V).train()
        opts[n] = torch.optim.AdamW(models[n].parameters(), lr=1e-3)
        i[n] = 0

    def once(n):
        m, opt = models[n], opts[n]
        t0 = time.perf_counter()
        for _ in range(a.steps):
            x = data[i[n] % len(data)]
            i[n] += 1
            loss = F.cross_entropy(m(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / a.steps

    return rounds([f"norm={n}" for n in NORMS], lambda name: once(name.split("=", 1)[1]), a.rounds)


def rounds(names: list, once, n: int) -> dict:
    times = {k: [] for k in names}
    for r in range(n + 1):
        for k in names:
            t = once(k)
            if r:  # round 0 warms up
                times[k].append(t)
    return times


def show(title: str, times: dict, unit: float, label: str) -> None:
    base = times["norm=layer"]
    print(title)
    for k, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        print(f"  {k:<20} {statistics.median(ts) * unit:9.1f} {label}  (rounds {min(ts) * unit:.1f}-{max(ts) * unit:.1f})"
              f"   {statistics.median(ratios):.2f}x norm=layer (rounds {min(ratios):.2f}-{max(ratios):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=B * T)  # batch 12 x block 64, the studies' batch
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    load_builtins()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d={a.d}, {a.tokens} tokens, "
          f"{a.rounds} rounds (medians; ranges over rounds)")
    show(f"per call: {a.reps} forward+backward of the norm alone", per_call(a), 1e6, "us/call")
    show(f"per step: {a.steps} AdamW steps of a {a.layers}-layer d{a.d} Pre-LN decoder (2 norms a block + the final)",
         per_step(a), 1e3, "ms/step")


if __name__ == "__main__":
    main()
