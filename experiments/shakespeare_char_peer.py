"""A plain-PyTorch mirror of nanoGPT's CPU shakespeare_char run, for experiment=shakespeare_char.

    python experiments/shakespeare_char_peer.py ../shared/data/tinyshakespeare/input.txt [--seed 1337]
        [--eval whole]

No modforge, no Lightning. Written for this study (not copied) to follow
nanoGPT's train.py / model.py as its README's CPU command runs them:

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
      --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
      --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

and, beyond the recipe, in the order it draws random numbers, so that with
``--seed 1337`` (nanoGPT's hard-coded seed) it replays nanoGPT's own run up to
floating-point differences between machines:

* modules are built in nanoGPT's order (wte, wpe, then per block ln_1, c_attn,
  c_proj, ln_2, c_fc, c_proj; ln_f, lm_head), each with torch's default
  initialisation, then re-initialised N(0, 0.02) in ``Module.apply`` order
  (the tied wte/lm_head matrix twice), then every ``c_proj`` N(0, 0.02/sqrt(2L));
* one global generator serves batches and evaluation: the first training batch
  is drawn before the loop, and every 250 steps (step 0 included) the
  evaluation draws 20 training then 20 validation batches of random windows;
* the learning rate at iteration ``it`` is lr*(it+1)/(warmup+1) during warm-up,
  then cosine from 1e-3 to 1e-4 at iteration 2000.

The vocabulary is the corpus's sorted characters (65, no special tokens), the
split the first 90% / last 10% (nanoGPT's prepare.py). It prints nanoGPT's
estimate at every evaluation ("step N: train loss ..., val loss ...") and,
at the end, the loss over every non-overlapping 64-character window of the
validation split, which is what modforge reports.

``--eval whole`` is for timing against modforge (``benchmarks/shakespeare_wall.py``):
every 250 steps, step 0 included, it evaluates the whole validation split in
batches of 12 windows instead of nanoGPT's 40-batch estimate, which is the
evaluation work ``experiment=shakespeare_char`` does, and it prints where its
wall time went. Its random stream then differs from nanoGPT's (the estimates
draw batches).
"""
import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BLOCK, BATCH, LAYERS, HEADS, D = 64, 12, 4, 4, 128
STEPS, WARMUP, LR, MIN_LR, EVAL_EVERY, EVAL_ITERS = 2000, 100, 1e-3, 1e-4, 250, 20


class LayerNorm(nn.Module):  # LayerNorm without a bias (nanoGPT's bias=False)
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D, bias=False)
        self.c_proj = nn.Linear(D, D, bias=False)
        self.resid_dropout = nn.Dropout(0.0)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in self.c_attn(x).split(D, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, D)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(D, 4 * D, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * D, D, bias=False)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = LayerNorm(D), Attention(), LayerNorm(D), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, D), wpe=nn.Embedding(BLOCK, D), drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]), ln_f=LayerNorm(D)))
        self.lm_head = nn.Linear(D, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * LAYERS))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1])))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")


def lr_at(it: int) -> float:
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--eval", choices=["nanogpt", "whole"], default="nanogpt")
    a = ap.parse_args()
    wall0 = time.perf_counter()
    text = Path(a.path).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    cut = int(len(data) * 0.9)
    splits = {"train": data[:cut], "val": data[cut:]}

    def batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - BLOCK, (BATCH,))
        return (torch.stack([d[i : i + BLOCK] for i in ix]), torch.stack([d[i + 1 : i + 1 + BLOCK] for i in ix]))

    torch.manual_seed(a.seed)
    model = GPT(len(chars))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.99))

    @torch.no_grad()
    def whole_val() -> float:
        val = splits["val"]
        starts = torch.arange(0, len(val) - BLOCK, BLOCK)
        total = sum(model(torch.stack([val[i : i + BLOCK] for i in s]),
                          torch.stack([val[i + 1 : i + 1 + BLOCK] for i in s])).sum().item()
                    for s in starts.split(BATCH if a.eval == "whole" else 64))
        return total / (len(starts) * BLOCK)

    @torch.no_grad()
    def estimate():
        model.eval()
        if a.eval == "whole":
            out = {"train": float("nan"), "val": whole_val()}
        else:
            out = {s: sum(model(*batch(s)).mean().item() for _ in range(EVAL_ITERS)) / EVAL_ITERS
                   for s in ("train", "val")}
        model.train()
        return out

    x, y = batch("train")
    setup_s = time.perf_counter() - wall0
    t0, train_s = time.perf_counter(), 0.0
    for it in range(STEPS + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        if it % EVAL_EVERY == 0:
            train_s += time.perf_counter() - t0
            est = estimate()
            print(f"step {it}: train loss {est['train']:.4f}, val loss {est['val']:.4f}" if a.eval == "nanogpt"
                  else f"step {it}: val loss over the whole split {est['val']:.4f}", flush=True)
            t0 = time.perf_counter()
        if it == STEPS:  # nanoGPT takes one more step after this evaluation, which no reported figure sees
            break
        loss = model(x, y).mean()
        x, y = batch("train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.eval()
    whole = est["val"] if a.eval == "whole" else whole_val()  # at step STEPS the whole-split one was just done
    wall = time.perf_counter() - wall0
    estimate = f"nanoGPT estimate at step {STEPS}: val {est['val']:.4f}; " if a.eval == "nanogpt" else ""
    print(f"seed {a.seed}: {estimate}val loss over the whole split "
          f"{whole:.4f}; {STEPS} steps in {train_s:.1f} s ({STEPS * BATCH * BLOCK / train_s:,.0f} tokens/s)")
    print(f"wall {wall:.1f} s from main(): data and model {setup_s:.1f} s, training steps {train_s:.1f} s, "
          f"evaluations {wall - setup_s - train_s:.1f} s")


if __name__ == "__main__":
    main()
