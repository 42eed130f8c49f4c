"""A plain-PyTorch peer for experiment=shakespeare_char: same model, same recipe, no modforge, no Lightning.

    python experiments/shakespeare_char_peer.py ../shared/data/tinyshakespeare/input.txt [--seed 1337]

The model is benchmarks/train_step.py's peer (torch.nn.TransformerEncoder with
norm_first=True, a causal mask, learned positions, final LayerNorm, tied head;
no biases) with GPT-2 initialisation (N(0, 0.02), residual projections
0.02/sqrt(2 * layers)), trained by a hand-written loop in nanoGPT's style:
random windows drawn with replacement, AdamW (lr 1e-3, betas 0.9/0.99, weight
decay 0.1 on matrices), 100 warm-up steps then cosine to 1e-4, gradient
clipping 1.0, 2000 steps. The vocabulary is the corpus's characters (no special
tokens), the split the first 90% / last 10% of characters, as nanoGPT's
prepare.py. It prints the validation loss two ways: over every non-overlapping
window of the validation split (what modforge reports) and nanoGPT's
estimator (mean over 20 random batches of 12 windows).
"""
import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import train_step  # noqa: E402  (the peer model, shared with the speed benchmark)

T, B, STEPS, WARMUP, LR, MIN_LR = 64, 12, 2000, 100, 1e-3, 1e-4


def gpt2_init(model: nn.Module, n_layers: int) -> None:
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        scaled = name.endswith("out_proj.weight") or name.endswith("linear2.weight")
        nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers) if scaled else 0.02)


def lr_at(it: int) -> float:
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * min(ratio, 1.0))) * (LR - MIN_LR)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    text = Path(a.path).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    cut = int(len(data) * 0.9)
    train, val = data[:cut], data[cut:]

    train_step.V = len(chars)
    torch.manual_seed(a.seed)
    model = train_step.Peer()
    for layer in model.blocks.layers:  # no biases, as nanoGPT's bias=False
        for mod in (layer.linear1, layer.linear2, layer.self_attn.out_proj):
            mod.bias = None
        layer.self_attn.in_proj_bias = None
        for ln in (layer.norm1, layer.norm2):
            ln.bias = None
    model.ln.bias = None
    gpt2_init(model, len(model.blocks.layers))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.99))
    t0 = time.perf_counter()
    for it in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        ix = torch.randint(len(train) - T, (B,))
        x = torch.stack([train[i : i + T] for i in ix])
        y = torch.stack([train[i + 1 : i + T + 1] for i in ix])
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        starts = torch.arange(0, len(val) - T, T)
        total, n = 0.0, 0
        for k in range(0, len(starts), 64):
            s = starts[k : k + 64]
            x = torch.stack([val[i : i + T] for i in s])
            y = torch.stack([val[i + 1 : i + T + 1] for i in s])
            total += F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1), reduction="sum").item()
            n += y.numel()
        g = torch.Generator().manual_seed(0)
        est = []
        for _ in range(20):
            ix = torch.randint(len(val) - T, (B,), generator=g)
            x = torch.stack([val[i : i + T] for i in ix])
            y = torch.stack([val[i + 1 : i + T + 1] for i in ix])
            est.append(F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1)).item())
    print(f"seed {a.seed}: val loss over the whole split {total / n:.4f}; nanoGPT-style 20-batch estimate "
          f"{sum(est) / len(est):.4f}; {STEPS} steps in {train_s:.1f} s ({STEPS * B * T / train_s:,.0f} tokens/s)")


if __name__ == "__main__":
    main()
