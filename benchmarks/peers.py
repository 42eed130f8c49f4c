"""Training-step speed and memory of modforge against its peers, side by side in one process.

    pip install -e ".[bench]"
    python benchmarks/peers.py [--size small|medium|all] [--arch gpt|llama|all] [--compile]
                               [--steps N] [--rounds R] [--threads N] [--device cpu|cuda] [--no-memory]

The same architecture is built four ways with the same parameter count (each
model's count is printed; x-transformers has no attention and no LayerNorm
biases, so its GPT is smaller by those, and its SwiGLU projection always has a
bias, so its Llama is larger by that):

* ``modforge``  -- ``decoder_only`` from the registry;
* ``plain``     -- a hand-written nanoGPT-style model in plain torch (below):
                   what one writes without any framework, the baseline;
* ``hf``        -- Hugging Face ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` (SDPA attention);
* ``xt``        -- x-transformers' ``TransformerWrapper(Decoder(...))`` with flash (SDPA) attention.

Architectures: ``gpt`` is GPT-2 (learned positions, Pre-LN LayerNorm with
biases, tanh-GELU MLP 4x, biased attention, tied head); ``llama`` is Llama
(RoPE in the half pairing, RMSNorm, SwiGLU of hidden 8/3 d, no biases, untied
head). Sizes: ``small`` is nanoGPT's CPU size (d 128, 4 layers, 4 heads,
block 64, batch 12, vocabulary 70), ``medium`` d 384, 6 layers, 6 heads,
block 256, batch 8, vocabulary 8192.

A step is forward, cross-entropy over every position, backward and AdamW, in
fp32. Each round times ``--steps`` steps of every model in turn (interleaved,
so a noisy machine's drift hits all of them; each round starts with the next
model, so none is always first); the report is each model's
median tokens/second and its ratio to modforge's. Peak memory is what a
training step adds above the built model (gradients, optimizer state,
activations): on CUDA ``torch.cuda.max_memory_allocated``; on CPU the
process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``
after returning freed memory with ``malloc_trim``) over three fresh steps, each
model measured in a fresh process of its own.
``--compile`` compiles every model with ``torch.compile`` (``nn.Module.compile``,
what ``compile=true`` does) before the warm-up.
"""
import argparse
import ctypes
import gc
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Size:
    d: int
    layers: int
    heads: int
    block: int
    batch: int
    vocab: int

    @property
    def ff(self) -> int:  # SwiGLU hidden width with the parameters of a 4x MLP (Llama's 8/3 d)
        return round(8 * self.d / 3)


SIZES = {"small": Size(128, 4, 4, 64, 12, 70), "medium": Size(384, 6, 6, 256, 8, 8192)}
ARCHS = ("gpt", "llama")


# --- plain: the hand-written baseline -------------------------------------------------------------------------
class PlainBlock(nn.Module):
    def __init__(self, s: Size, llama: bool):
        super().__init__()
        self.llama, self.h, self.hd = llama, s.heads, s.d // s.heads
        norm = (lambda: nn.RMSNorm(s.d, eps=1e-6)) if llama else (lambda: nn.LayerNorm(s.d))
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = nn.Linear(s.d, 3 * s.d, bias=not llama)
        self.proj = nn.Linear(s.d, s.d, bias=not llama)
        hidden = s.ff if llama else 4 * s.d
        self.fc = nn.Linear(s.d, 2 * hidden if llama else hidden, bias=not llama)
        self.out = nn.Linear(hidden, s.d, bias=not llama)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        if self.llama:
            q, k = (torch.cat((a * cos - b * sin, a * sin + b * cos), -1) for a, b in (q.chunk(2, -1), k.chunk(2, -1)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.fc(self.ln2(x))
        if self.llama:
            gate, up = h.chunk(2, -1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.out(h)


class Plain(nn.Module):
    def __init__(self, s: Size, llama: bool):
        super().__init__()
        self.llama = llama
        self.tok = nn.Embedding(s.vocab, s.d)
        self.pos = None if llama else nn.Embedding(s.block, s.d)
        self.blocks = nn.ModuleList(PlainBlock(s, llama) for _ in range(s.layers))
        self.ln = nn.RMSNorm(s.d, eps=1e-6) if llama else nn.LayerNorm(s.d)
        self.head = nn.Linear(s.d, s.vocab, bias=False)
        if not llama:
            self.head.weight = self.tok.weight
        hd = s.d // s.heads
        ang = torch.arange(s.block)[:, None] * 10000.0 ** (-torch.arange(0, hd, 2) / hd)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) if self.llama else self.tok(idx) + self.pos.weight[:T]
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T])
        return self.head(self.ln(x))


# --- the peers ----------------------------------------------------------------------------------------------------
def build_modforge(s: Size, llama: bool, **model) -> nn.Module:
    """modforge's ``decoder_only`` in the GPT-2 or the Llama layout (``model``: more model keys)."""
    from modforge import registry
    from modforge.plugins import load_builtins
    from modforge.models.blocks import Parts

    load_builtins()
    cfg = {"name": "decoder_only", "d_model": s.d, "n_heads": s.heads, "n_layers": s.layers, "max_len": s.block,
           **model}
    if llama:
        cfg.update(d_ff=s.ff, tie_embeddings=False)
        parts = Parts(norm="rms", residual="pre", ffn={"name": "swiglu", "match_params": False},
                      pos={"name": "rope", "pairing": "half"}, attention={"name": "mha", "bias": False})
    else:
        parts = Parts(norm="layer", residual="pre", ffn={"name": "mlp", "activation": "gelu_tanh"}, pos="learned")
    return registry.build("model", cfg, parts, s.vocab)


class Logits(nn.Module):
    """Calls a peer the way modforge's model is called: idx -> logits."""

    def __init__(self, inner: nn.Module, hf: bool):
        super().__init__()
        self.inner, self.hf = inner, hf

    def forward(self, idx):
        return self.inner(input_ids=idx).logits if self.hf else self.inner(idx)


def hf_model(s: Size, llama: bool) -> nn.Module:
    """Hugging Face's ``LlamaForCausalLM`` or ``GPT2LMHeadModel`` in the same layout (SDPA attention, no <eos>)."""
    import transformers as tf

    if llama:
        c = tf.LlamaConfig(vocab_size=s.vocab, hidden_size=s.d, intermediate_size=s.ff, num_hidden_layers=s.layers,
                           num_attention_heads=s.heads, num_key_value_heads=s.heads, max_position_embeddings=s.block,
                           rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                           bos_token_id=None, eos_token_id=None, pad_token_id=0)
        model = tf.LlamaForCausalLM(c)
    else:
        c = tf.GPT2Config(vocab_size=s.vocab, n_positions=s.block, n_embd=s.d, n_layer=s.layers, n_head=s.heads,
                          activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          bos_token_id=None, eos_token_id=None, pad_token_id=0)
        model = tf.GPT2LMHeadModel(c)
    model.config._attn_implementation = "sdpa"
    return model


def build_hf(s: Size, llama: bool) -> nn.Module:
    model = hf_model(s, llama)
    model.config.use_cache = False
    return Logits(model, hf=True)


def build_xt(s: Size, llama: bool) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    try:  # x-transformers logs advice through loguru; the benchmark's output stays a table
        import loguru

        loguru.logger.disable("x_transformers")
    except ImportError:
        pass

    if llama:
        layers = Decoder(dim=s.d, depth=s.layers, heads=s.heads, attn_dim_head=s.d // s.heads, attn_flash=True,
                         rotary_pos_emb=True, rotary_emb_dim=s.d // s.heads,  # all of each head, as Llama
                         use_rmsnorm=True, ff_glu=True, ff_swish=True, ff_mult=8 / 3, ff_no_bias=True)
        model = TransformerWrapper(num_tokens=s.vocab, max_seq_len=s.block, attn_layers=layers, use_abs_pos_emb=False)
    else:
        layers = Decoder(dim=s.d, depth=s.layers, heads=s.heads, attn_dim_head=s.d // s.heads, attn_flash=True,
                         ff_custom_activation=nn.GELU(approximate="tanh"))
        model = TransformerWrapper(num_tokens=s.vocab, max_seq_len=s.block, attn_layers=layers, tie_embedding=True)
    return Logits(model, hf=False)


PEERS = {"modforge": build_modforge, "plain": lambda s, llama: Plain(s, llama), "hf": build_hf, "xt": build_xt}


# --- measurement -------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, model: nn.Module, s: Size, device: str):
        self.model, self.s, self.device = model.to(device), s, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        self.data = torch.randint(0, s.vocab, (16, s.batch, s.block + 1), device=device)
        self.i = 0

    def steps(self, n: int) -> float:
        """n training steps -> tokens/s."""
        self.model.train()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            x = self.data[self.i % len(self.data)]
            self.i += 1
            logits = self.model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        sync()
        return n * self.s.batch * self.s.block / (time.perf_counter() - t0)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
    raise KeyError(key)


def peak_mib(bench: Bench) -> float:
    """Memory a training step adds above the built model, in MiB (see the module docstring)."""
    bench.opt = torch.optim.AdamW(bench.model.parameters(), lr=1e-4, fused=bench.device == "cuda")  # fresh state
    for p in bench.model.parameters():
        p.grad = None
    gc.collect()
    if bench.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        bench.steps(3)
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _status_kb("VmRSS")
    bench.steps(3)
    return (_status_kb("VmHWM") - base) / 1024


def compare(size: str, arch: str, a) -> dict:
    s, llama = SIZES[size], arch == "llama"
    torch.manual_seed(0)
    benches = {}
    for name, build in PEERS.items():
        try:
            model = build(s, llama)
        except ImportError as e:
            print(f"  {name}: skipped ({e.name} is not installed: pip install -e '.[bench]')")
            continue
        n = sum(p.numel() for p in model.parameters())
        if a.compile:
            model.compile()
        benches[name] = Bench(model, s, a.device)
        benches[name].steps(a.warmup)  # warm-up (and compilation)
        print(f"  {name:>8}: {n:,} parameters", flush=True)
    rates = {n: [] for n in benches}
    names = list(benches)
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:  # each round starts with another model
            rates[n].append(benches[n].steps(a.steps))
        print(f"  round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    med = {n: statistics.median(v) for n, v in rates.items()}
    import multiprocessing as mp

    mem = {}
    for n in benches if a.memory else ():  # each in a fresh process: memory another model freed cannot hide a peak
        with mp.get_context("spawn").Pool(1) as pool:
            mem[n] = pool.apply(memory_of, (size, arch, n, a.compile, a.device, torch.get_num_threads()))
    return {"med": med, "mem": mem}


def memory_of(size: str, arch: str, name: str, compile: bool, device: str, threads: int) -> float:
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    s = SIZES[size]
    model = PEERS[name](s, arch == "llama")
    if compile:
        model.compile()
    bench = Bench(model, s, device)
    bench.steps(1)  # compilation, lazily built buffers
    return peak_mib(bench)


def quiet_peers() -> None:
    """The peers' warnings and advice (about masks, configs) are not the benchmark's output."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--arch", choices=[*ARCHS, "all"], default="all")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=0, help="steps per round (0: 100 small, 10 medium)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="tokens/s only")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    quiet_peers()
    mode = "compiled" if a.compile else "eager"
    rows = []
    for size in SIZES if a.size == "all" else [a.size]:
        for arch in ARCHS if a.arch == "all" else [a.arch]:
            steps = a.steps or (100 if size == "small" else 10)
            print(f"{size} {arch} ({mode}, {steps} steps x {a.rounds} rounds):", flush=True)
            res = compare(size, arch, argparse.Namespace(**{**vars(a), "steps": steps}))
            rows.append((size, arch, res))
    print(f"\nmedian tokens/s and peak step memory (MiB above the model); ratio = modforge / peer. {mode}, "
          f"{a.device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| size | arch | " + " | ".join(PEERS) + " | modforge / fastest peer |")
    print("|---|---|" + "---|" * (len(PEERS) + 1))
    for size, arch, res in rows:
        med, mem = res["med"], res["mem"]
        cells = [f"{med[n]:,.0f} tok/s" + (f", {mem[n]:,.0f} MiB" if n in mem else "") + ("" if n == "modforge" or "modforge" not in med
                 else f" ({med['modforge'] / med[n]:.2f})") if n in med else "n/a" for n in PEERS]
        peers = [n for n in med if n != "modforge"]
        best = max(peers, key=med.get) if peers and "modforge" in med else None
        ratio = f"**{med['modforge'] / med[best]:.2f}** ({best})" if best else "n/a"
        print(f"| {size} | {arch} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
