"""Generation speed of modforge's KV-cached decoding against Hugging Face ``generate``, same weights, one process.

    pip install -e ".[bench]"
    python benchmarks/generation.py [--size small|medium|all] [--arch gpt|llama|all] [--new 256] [--rounds 3]

One random model per architecture and size is built in modforge (``small``: d
128, 4 layers, 4 heads, vocabulary 70, nanoGPT's character model; ``medium``:
d 384, 6 layers, 6 heads, vocabulary 8192; positions up to 512 in both) and its weights are copied into the
Hugging Face model that computes the same function: ``GPT2LMHeadModel`` for the
GPT-2 layout (learned positions, LayerNorm, tanh-GELU MLP, biases, tied head),
``LlamaForCausalLM`` for Llama's (RMSNorm, SwiGLU, RoPE in the half pairing,
no biases, untied head). Before timing, the script checks that both give the
same logits and that greedy and beam search produce the same tokens.

Timed (``--new`` new tokens after a 16-token prompt, batch 1 and 8, medians of
interleaved rounds, ``torch.inference_mode``):

* greedy: ``decode(Stepper(model, prompt), n)`` against ``generate(do_sample=False)``;
* sampling (temperature 1, no top-k / top-p): ``decode(..., strategy="sample")``
  against ``generate(do_sample=True, top_k=0)``;
* beam search, 4 beams, no <eos> (every hypothesis runs to the length limit):
  ``beam_search`` against ``generate(num_beams=4)``.

Both sides use their KV cache (modforge's preallocated per-layer cache, HF's
``DynamicCache``). Neither model has an <eos>, so both generate exactly
``--new`` tokens per row and nothing masks a logit on either side.
"""
import argparse
import statistics
import time

import torch
from torch import nn

SIZES = {"small": (128, 4, 4, 70), "medium": (384, 6, 6, 8192)}  # d_model, layers, heads, vocabulary
MAXLEN, PROMPT = 512, 16


def build(arch: str, size: str) -> tuple[nn.Module, nn.Module]:
    """A modforge model and the HF model with the same weights (the layouts of ``benchmarks/peers.py``)."""
    from peers import Size, build_modforge, hf_model  # benchmarks/ is on the path of a script run from it

    D, L, H, V = SIZES[size]
    s, llama = Size(D, L, H, MAXLEN, 1, V), arch == "llama"
    hf = hf_model(s, llama)
    torch.manual_seed(0)
    ours = build_modforge(s, llama, init_std=0.1)  # wider than 0.02: peaked next-token distributions, no near-ties
    hf.load_state_dict(hf_weights(ours, llama), strict=True)
    return ours.eval(), hf.eval()


def hf_weights(m, llama: bool) -> dict:
    """modforge GPT-2- or Llama-layout state -> the HF model's state, by the mapping ``format=hf`` exports with."""
    import dataclasses

    from modforge.checkpoints.families import FAMILIES

    ours = {k: v.detach().clone() for k, v in m.state_dict().items()}
    theirs = FAMILIES["llama" if llama else "gpt2"].to_theirs(ours, m.cfg.n_layers, {"model": dataclasses.asdict(m.cfg)})
    theirs.setdefault("lm_head.weight", m.head.weight.detach().clone())  # GPT-2's tied head, a key of its own in HF
    return theirs


def ours_fn(model, how: str, prompt: torch.Tensor, n: int):
    from modforge.models.decoding import Stepper, beam_search, decode

    if how == "beam":
        return lambda: beam_search(Stepper(model, prompt), n, beam_size=4)
    return lambda: decode(Stepper(model, prompt), n, strategy="greedy" if how == "greedy" else "sample")


def hf_fn(model, how: str, prompt: torch.Tensor, n: int):
    # no <eos> anywhere (the configs have none): every row runs to exactly n tokens, no logit masked
    kw = dict(max_new_tokens=n, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    kw.update({"greedy": dict(do_sample=False), "sample": dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0),
               "beam": dict(do_sample=False, num_beams=4, early_stopping=False, length_penalty=1.0)}[how])
    return lambda: model.generate(prompt, **kw)[:, prompt.shape[1]:]


def check(ours, hf, prompt: torch.Tensor, n: int) -> str:
    from modforge.models.decoding import Stepper, beam_search, decode

    with torch.inference_mode():
        diff = (ours(prompt) - hf(input_ids=prompt).logits).abs().max().item()
        g = decode(Stepper(ours, prompt), n)
        g_hf = hf_fn(hf, "greedy", prompt, n)()
        b = beam_search(Stepper(ours, prompt), n, beam_size=4)
        b_hf = hf_fn(hf, "beam", prompt, n)()
    same = lambda x, y: f"{int((x == y).all(1).sum())}/{len(x)} rows identical"  # noqa: E731
    return f"logits max |diff| {diff:.1e}; greedy {same(g, g_hf)}; beam {same(b, b_hf[:, : b.shape[1]])}"


def timed(fn) -> float:
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    return out.numel() / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--arch", choices=["gpt", "llama", "all"], default="all")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from peers import quiet_peers  # benchmarks/ is on the path of a script run from it

    quiet_peers()
    rows = []
    for size, arch in [(s, x) for s in (SIZES if a.size == "all" else [a.size])
                        for x in (("gpt", "llama") if a.arch == "all" else (a.arch,))]:
        ours, hf = build(arch, size)
        g = torch.Generator().manual_seed(1)
        prompts = {bs: torch.randint(1, SIZES[size][3] - 1, (bs, PROMPT), generator=g) for bs in (1, 8)}
        print(f"{size} {arch}: {sum(p.numel() for p in ours.parameters()):,} parameters; check at batch 8: "
              f"{check(ours, hf, prompts[8], 64)}", flush=True)
        for bs, prompt in prompts.items():
            for how in ("greedy", "sample", "beam"):
                fns = {"modforge": ours_fn(ours, how, prompt, a.new), "hf": hf_fn(hf, how, prompt, a.new)}
                for f in fns.values():  # warm-up
                    with torch.inference_mode():
                        f()
                rates = {k: [] for k in fns}
                for _ in range(a.rounds):
                    for k, f in fns.items():
                        rates[k].append(timed(f))
                med = {k: statistics.median(v) for k, v in rates.items()}
                rows.append((size, arch, bs, how, med))
                print(f"  batch {bs} {how:>6}: modforge {med['modforge']:,.0f}, HF generate {med['hf']:,.0f} "
                      f"new tokens/s: {med['modforge'] / med['hf']:.2f}x", flush=True)
    print(f"\nnew tokens/s (all rows, beams not counted), medians of {a.rounds} rounds, {a.new} new tokens; "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| size | arch | batch | strategy | modforge | HF generate | ratio |\n|---|---|---|---|---|---|---|")
    for size, arch, bs, how, med in rows:
        print(f"| {size} | {arch} | {bs} | {how} | {med['modforge']:,.0f} | {med['hf']:,.0f} | **{med['modforge'] / med['hf']:.2f}** |")


if __name__ == "__main__":
    main()
