"""µP's coordinate check (Yang et al. 2022, App. D.1): does any layer's output grow with width?

For each width, a decoder-only model (its parts as given) is built under a parametrisation, trained a few
AdamW steps on one fixed batch, and the mean absolute entry of each layer's output is measured at init and
its change after the steps. Under µP nothing grows with width (logits and attention scores may shrink at
init: the readout multiplier and 1/d_head); under the standard parametrisation the hidden layers grow.
The summary is a slope per layer: least squares of log(size) against log(width) (0 flat, 1 like the width).

    python benchmarks/mup_coord.py                          # standard and mup, the default parts
    python benchmarks/mup_coord.py ffn=swiglu pos=rope norm=rms --widths 32,64,128,256,512
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F

from modforge import registry
from modforge.models.blocks import Parts
from modforge.models.param import parametrised

VOCAB = 64


def coordinates(param, width: int, parts: Optional[dict] = None, steps: int = 4, lr: float = 1e-2,
                base: int = 32, model: Optional[dict] = None) -> dict:
    """{layer: mean |x_t - x_0|} and {"init <layer>": mean |x_0|} for one width (mup's base d_model ``base``;
    ``model``: keys of the model's config over the check's; umup unties the embeddings, as it must)."""
    cfg = {"name": "decoder_only", "d_model": width, "n_heads": 4, "n_layers": 2, "max_len": 32,
           **({"tie_embeddings": False} if param == "umup" else {}), **(model or {})}
    parts = Parts(**{"pos": "learned", **(parts or {})})
    if param == "mup":
        param = {"name": "mup", "base": {"d_model": base}}
    torch.manual_seed(0)
    m, p = parametrised(cfg, parts, VOCAB, param)
    groups = p.groups(m)
    opt = registry.build("optim", {"name": "adamw", "lr": lr, "weight_decay": 0.0},
                         m.parameters() if groups is None else groups)
    x = torch.randint(0, VOCAB, (8, 17), generator=torch.Generator().manual_seed(1))
    layers = {"embed": m.embed, **{f"{kind}{i}": getattr(b, attr) for i, b in enumerate(m.decoder.blocks)
                                   for kind, attr in (("attn", "self_attn"), ("ffn", "ffn"))}}
    seen = {}
    hooks = [mod.register_forward_hook(lambda _m, _a, out, n=n: seen.__setitem__(n, out.detach()))
             for n, mod in layers.items()]

    def probe() -> dict:
        with torch.no_grad():
            logits = m(x[:, :-1])
        return {**{k: v.clone() for k, v in seen.items()}, "logits": logits}

    a0 = probe()
    for _ in range(steps):
        loss = F.cross_entropy(m(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    a1 = probe()
    for h in hooks:
        h.remove()
    return {**{k: (a1[k] - a0[k]).abs().mean().item() for k in a0},
            **{f"init {k}": a0[k].abs().mean().item() for k in a0}}


def slopes(param, widths, **kw) -> dict:
    """{layer: slope of log(size) against log(width)} over ``widths``."""
    got = {w: coordinates(param, w, **kw) for w in widths}
    xs = [math.log(w) for w in widths]
    mx = sum(xs) / len(xs)
    out = {}
    for k in got[widths[0]]:
        ys = [math.log(got[w][k]) for w in widths]
        my = sum(ys) / len(ys)
        out[k] = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    return out
