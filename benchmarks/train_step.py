"""Training-step throughput of modforge's model against a plain-torch peer, in one process.

    python benchmarks/train_step.py [--steps 200] [--rounds 5] [--threads N] [--compile]

Both models are the nanoGPT CPU size (d_model 128, 4 layers, 4 heads, block 64,
batch 12, character vocabulary 70) and the same architecture: token + learned
position embeddings, Pre-LN blocks with a GELU MLP (4x), causal attention, a
final LayerNorm and a tied output head, trained with AdamW. The peer is
``torch.nn.TransformerEncoder`` with ``norm_first=True`` and a causal mask,
i.e. what one would write by hand without modforge. Each round times
``--steps`` forward/backward/optimizer steps of one model, then of the other
(alternating, so drift on a noisy machine hits both); the report is the
median tokens/second of each and their ratio. Lightning's own per-step work is
not included here: ``metrics.json`` of a real run reports that end-to-end figure.
``--compile`` runs both models through ``torch.compile`` (``nn.Module.compile``,
what modforge's ``compile=true`` does); compilation happens in the warm-up.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from modforge import registry
from modforge.plugins import load_builtins
from modforge.models.blocks import Parts

D, L, H, T, B, V = 128, 4, 4, 64, 12, 70


class Peer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(T))

    def forward(self, idx):
        x = self.tok(idx) + self.pos.weight[: idx.shape[1]]
        return self.head(self.ln(self.blocks(x, mask=self.mask, is_causal=True)))


def ours() -> nn.Module:
    load_builtins()
    cfg = {"name": "decoder_only", "d_model": D, "n_heads": H, "n_layers": L, "max_len": T}
    return registry.build("model", cfg, Parts(norm="layer", residual="pre", ffn="gelu", pos="learned"), V)


def run(model: nn.Module, steps: int, data: torch.Tensor) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    t0 = time.perf_counter()
    for i in range(steps):
        x = data[i % len(data)]
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * B * T / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    data = torch.randint(0, V, (64, B, T + 1))
    models = {"modforge": ours(), "torch nn.TransformerEncoder": Peer()}
    for name, m in models.items():
        print(f"{name}: {sum(p.numel() for p in m.parameters()):,} parameters")
        if a.compile:
            m.compile()
        run(m, 20, data)  # warm-up (and compilation)
    rates = {n: [] for n in models}
    for _ in range(a.rounds):
        for n, m in models.items():
            rates[n].append(run(m, a.steps, data))
    med = {n: statistics.median(r) for n, r in rates.items()}
    for n, r in rates.items():
        print(f"{n:>28}: median {med[n]:,.0f} tokens/s  (rounds: {', '.join(f'{x:,.0f}' for x in r)})")
    a_, b_ = med["modforge"], med["torch nn.TransformerEncoder"]
    mode = "compiled" if a.compile else "eager"
    print(f"modforge / peer throughput ratio ({mode}): {a_ / b_:.3f}  ({torch.get_num_threads()} threads, "
          f"torch {torch.__version__})")


if __name__ == "__main__":
    main()
