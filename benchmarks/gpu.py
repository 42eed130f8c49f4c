"""The GPU check: every CUDA path of modforge, run and asserted, and the figures, in one command (~8 min, one H100).

    python benchmarks/gpu.py [--out benchmarks/results] [--quick] [--only NAME ...]
    python benchmarks/gpu.py --smoke --out /tmp/gpu     # on CPU: the measuring code on tiny models, no CUDA checks

Run it first whenever a GPU is available (README, Tests). Each check prints one line, PASS / FAIL / SKIP with
its figure, and the whole is written to OUT/gpu.json and OUT/gpu.md with the device's name, driver, torch and
CUDA versions and the date. On a machine without CUDA it prints this plan, "no GPU: nothing measured" and exits
0 (``--smoke`` runs what can run on CPU instead, to check the script itself). A failing check does not stop the
others; the exit code is 1 when any failed.

What each check asserts (``PLAN``) is what the path claims: bf16 autocast makes bf16 logits and a
``trainer=gpu`` run records ``bf16-mixed``; ``trainer=gpu_fp16`` trains with a finite loss; a CUDA run's float32
matmuls are TF32 (``high``); the AdamW modforge builds for CUDA parameters is fused; modforge's causal
attention runs with only the flash kernel allowed and with only the memory-efficient kernel allowed (SDPA
refuses a call a restricted backend cannot serve, so running is the proof); ``torch.compile`` of the model
gives one graph with no breaks (Dynamo's ``explain``) and the eager model's logits; the training loader pins
its batches; ``hydra/launcher=gpus`` with ``jobs_per_device=2`` puts two jobs on GPU 0 at once and both record
it. Figures: training tokens/s and MFU of modforge's decoder against the hand-written plain-torch GPT of
``benchmarks/peers.py`` (same shape, same process, interleaved rounds), bf16 autocast with fp32 weights (what
``trainer=gpu`` trains with), eager and compiled, at the default model's size and at GPT-2 small (124M, block
1024, vocabulary 50,257), with each step's peak memory (``max_memory_allocated``); greedy generation against
Hugging Face ``generate`` on copied weights (batch 1 and 8; needs the ``bench`` extra); a sweep's throughput
(jobs per hour) with 1, 2 and 4 jobs per GPU. MFU = the training FLOPs modforge counts for the step
(``modforge.models.flops``: matrix products, attention over the full score matrix, 3x forward) / time / the
device's dense bf16 peak from its datasheet (``PEAKS``; none known: no MFU).
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # peers.py, generation.py

PLAN = [
    ("bf16_autocast", "a modforge model under bf16 autocast returns bf16 logits; a trainer=gpu run records bf16-mixed"),
    ("fp16_scaler", "a trainer=gpu_fp16 run (16-mixed, gradient scaling) finishes with a finite loss"),
    ("tf32", "a CUDA run's float32 matmul precision is 'high' (TF32), as modforge decides for CUDA"),
    ("fused_adamw", "the AdamW modforge builds for CUDA parameters is fused"),
    ("sdpa_flash", "modforge's causal attention runs with only SDPA's flash kernel allowed (bf16)"),
    ("sdpa_efficient", "modforge's causal attention runs with only the memory-efficient kernel allowed"),
    ("compile", "torch.compile of the model: one graph, no graph breaks, the eager logits"),
    ("pinned_memory", "the training loader of a CUDA run pins its batches"),
    ("throughput", "training tokens/s, MFU and peak memory per step, modforge / plain torch, eager and compiled, "
                   "default size and GPT-2 small, bf16"),
    ("generation", "greedy new tokens/s against HF generate on copied weights, batch 1 and 8"),
    ("sweep_packed", "hydra/launcher=gpus jobs_per_device=2: two jobs on GPU 0 at once, both metrics.json record it"),
    ("packing", "a sweep's jobs per hour with 1, 2 and 4 jobs per GPU (4 runs of the default model)"),
]
# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s
PEAKS = [("H200", 989.4, "H200 datasheet (SXM)"), ("H100 PCIe", 756.0, "H100 datasheet (PCIe)"),
         ("H100", 989.4, "H100 datasheet (SXM)"), ("A100", 312.0, "A100 datasheet"), ("L40S", 362.05, "L40S datasheet"),
         ("A10G", 70.0, "A10G datasheet"), ("L4", 121.0, "L4 datasheet")]
DEFAULT = dict(d=128, layers=4, heads=4, block=64, batch=12, vocab=70)  # the default run's model and batch
GPT2 = dict(d=768, layers=12, heads=12, block=1024, batch=8, vocab=50257)
TINY_RUN = ["model.d_model=64", "model.n_heads=2", "model.n_layers=2", "trainer.limit_val_batches=2", "sample=false",
            "trainer.enable_progress_bar=false", "eval_at_start=false"]


class Skip(Exception):
    """A check that cannot run here (no CUDA, an extra not installed): SKIP with the reason."""


# --------------------------------------------------------------------------- the device

def device_record(device: str) -> dict:
    import torch

    rec = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "date": date.today().isoformat(), "host_cpus": os.cpu_count()}
    if device != "cuda":
        return {**rec, "name": "cpu (smoke run: no CUDA checks)", "driver": None, "peak_bf16_tflops": None}
    p = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = None
    peak = next(((t, src) for key, t, src in PEAKS if key in p.name), (None, None))
    return {**rec, "name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
            "multiprocessors": p.multi_processor_count, "driver": driver, "cudnn": torch.backends.cudnn.version(),
            "peak_bf16_tflops": peak[0], "peak_source": peak[1]}


# --------------------------------------------------------------------------- helpers

def tiny_model(device: str, **model):
    from peers import Size, build_modforge

    s = Size(64, 2, 2, 128, 4, 70)
    return build_modforge(s, False, **model).to(device), s


def run_modforge(args: list, cwd: Path, timeout: int = 300) -> tuple[int, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "modforge.train", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr)[-3000:]


def metrics(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------- the CUDA paths

def check_bf16(device: str, work: Path) -> tuple[bool, str, dict]:
    import torch

    model, s = tiny_model(device)
    x = torch.randint(0, s.vocab, (2, 32), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = model(x)
    code, tail = run_modforge(["trainer=gpu", "trainer.max_steps=20", *TINY_RUN, f"hydra.run.dir={work / 'bf16'}"], work)
    m = metrics(work / "bf16")
    dev = m.get("devices") or {}
    ok = out.dtype == torch.bfloat16 and code == 0 and dev.get("precision") == "bf16-mixed" and \
        dev.get("accelerator") == "cuda" and m.get("status") == "finished"
    return ok, f"logits {out.dtype}; run: exit {code}, precision {dev.get('precision')}, on {dev.get('gpus')}", \
        {"run_tail": tail if not ok else ""}


def check_fp16(device: str, work: Path) -> tuple[bool, str, dict]:
    code, tail = run_modforge(["trainer=gpu_fp16", "trainer.max_steps=20", *TINY_RUN, f"hydra.run.dir={work / 'fp16'}"],
                              work)
    m = metrics(work / "fp16")
    loss = (m.get("val") or {}).get("val/loss")
    ok = code == 0 and (m.get("devices") or {}).get("precision") == "16-mixed" and isinstance(loss, float)
    return ok, f"exit {code}, precision {(m.get('devices') or {}).get('precision')}, val/loss {loss}", \
        {"run_tail": tail if not ok else ""}


def check_tf32(device: str, work: Path) -> tuple[bool, str, dict]:
    from modforge.utils.devices import matmul_precision

    decided = matmul_precision(None, "cuda")
    recorded = (metrics(work / "bf16").get("devices") or {}).get("float32_matmul_precision")
    return decided == "high" and recorded == "high", f"decided {decided}, the bf16 run recorded {recorded}", {}


def check_fused(device: str, work: Path) -> tuple[bool, str, dict]:
    from modforge import registry

    model, _ = tiny_model(device)
    opt = registry.build("optim", {"name": "adamw"}, model.parameters())
    fused = bool(opt.defaults.get("fused"))
    return fused, f"torch.optim.AdamW fused={opt.defaults.get('fused')}", {}


def check_sdpa(backend: str):
    def check(device: str, work: Path) -> tuple[bool, str, dict]:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        model, s = tiny_model(device)
        x = torch.randint(0, s.vocab, (4, 128), device=device)
        which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
        with torch.autocast(device, dtype=torch.bfloat16), sdpa_kernel([which]):
            out = model(x)  # SDPA raises when the only backend allowed cannot serve the call
            out.float().sum().backward()
        return bool(torch.isfinite(out.float()).all()), f"forward and backward ran with only {which.name}", {}
    return check


def check_compile(device: str, work: Path) -> tuple[bool, str, dict]:
    import torch
    import torch._dynamo

    model, s = tiny_model(device)
    x = torch.randint(0, s.vocab, (2, 64), device=device)
    explained = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    with torch.no_grad():
        diff = (compiled(x) - model(x)).abs().max().item()
    ok = explained.graph_count == 1 and explained.graph_break_count == 0 and diff < 1e-3
    return ok, f"{explained.graph_count} graph, {explained.graph_break_count} breaks; max |compiled - eager| " \
               f"{diff:.1e}", {"break_reasons": [str(r.reason) for r in explained.break_reasons][:5]}


def check_pinned(device: str, work: Path) -> tuple[bool, str, dict]:
    import lightning as L

    from modforge import registry

    dm = registry.build("data", {"name": "stdlib", "max_chars": 20000, "block_size": 32, "batch_size": 4})
    dm.data_seed = 0
    dm.prepare()
    dm.trainer = L.Trainer(accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                           enable_progress_bar=False, enable_model_summary=False)
    batch = next(iter(dm.train_dataloader()))
    tensors = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (list, tuple)) \
        else [batch]
    pinned = all(t.is_pinned() for t in tensors)
    return pinned, f"{len(tensors)} tensors of a training batch pinned: {pinned}", {}


# --------------------------------------------------------------------------- figures

def step_fn(model, opt, x, y, device: str):
    import torch
    import torch.nn.functional as F

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measure_throughput(device: str, shape: dict, compiled: bool, steps: int, rounds: int, peak: float) -> dict:
    """modforge's decoder and the plain-torch GPT (same shape), interleaved rounds: tokens/s, MFU, peak memory."""
    import torch

    from modforge.models.flops import FlopCount
    from peers import Plain, Size, build_modforge

    s = Size(shape["d"], shape["layers"], shape["heads"], shape["block"], shape["batch"], shape["vocab"])
    torch.manual_seed(0)
    models = {"modforge": build_modforge(s, False).to(device),
              "plain": Plain(s, False).to(device)}
    count = FlopCount(models["modforge"])
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, s.vocab, (s.batch, s.block), generator=g).to(device)
    y = torch.randint(0, s.vocab, (s.batch, s.block), generator=g).to(device)
    steps_fn, peak_mib = {}, {}
    for name, m in models.items():
        m.train()
        if compiled:
            m.compile()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device == "cuda")
        steps_fn[name] = step_fn(m, opt, x, y, device)
        for _ in range(3):  # warm-up (and compilation)
            steps_fn[name]()
        sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            steps_fn[name]()
            sync(device)
            peak_mib[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    count.forward.clear()
    steps_fn["modforge"]()
    flops_per_step = count.train
    rates = {k: [] for k in models}
    for r in range(rounds):
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                steps_fn[name]()
            sync(device)
            rates[name].append(steps / (time.perf_counter() - t0))
    out = {"params": sum(p.numel() for p in models["modforge"].parameters()), "flops_per_step": flops_per_step,
           "tokens_per_step": s.batch * s.block}
    for name, r in rates.items():
        sps = statistics.median(r)
        out[name] = {"tokens_per_s": sps * s.batch * s.block, "mfu": flops_per_step * sps / (peak * 1e12) if peak else None,
                     "peak_step_mib": peak_mib.get(name)}
    out["ratio"] = out["modforge"]["tokens_per_s"] / out["plain"]["tokens_per_s"]
    del models, steps_fn
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def check_throughput(device: str, work: Path, quick: bool, peak, smoke: bool) -> tuple[bool, str, dict]:
    import torch._dynamo

    rows = []
    shapes = [("default", DEFAULT), ("gpt2-small", GPT2)] if not smoke else [("tiny", dict(d=64, layers=2, heads=2,
                                                                                        block=32, batch=2, vocab=70))]
    for label, shape in shapes:
        for compiled in ((False,) if quick or smoke else (False, True)):
            steps = 3 if smoke else (20 if label == "gpt2-small" else 50)
            r = measure_throughput(device, shape, compiled, steps, 2 if smoke else 5, peak)
            rows.append({"model": label, "mode": "compiled" if compiled else "eager", **r})
            torch._dynamo.reset()
            mfu = r["modforge"]["mfu"]
            print(f"    {label} {rows[-1]['mode']}: modforge {r['modforge']['tokens_per_s']:,.0f} tok/s"
                  + (f" (MFU {mfu:.2%})" if mfu is not None else "") + f", plain {r['plain']['tokens_per_s']:,.0f}"
                  f" tok/s: {r['ratio']:.2f}x", flush=True)
    worst = min(r["ratio"] for r in rows)
    return True, f"modforge / plain {worst:.2f}x at worst over {len(rows)} rows", {"rows": rows}


def check_generation(device: str, work: Path, smoke: bool) -> tuple[bool, str, dict]:
    import torch

    try:
        import transformers  # noqa: F401
    except ImportError:
        raise Skip("needs the bench extra: pip install -e '.[bench]'") from None
    from generation import build, hf_fn, ours_fn
    from peers import quiet_peers

    quiet_peers()
    ours, hf = build("gpt", "small" if smoke else "medium")
    ours, hf = ours.to(device), hf.to(device)
    new = 16 if smoke else 256
    rows = []
    for bs in (1, 8):
        prompt = torch.randint(1, 60, (bs, 16), generator=torch.Generator().manual_seed(bs)).to(device)
        fns = {"modforge": ours_fn(ours, "greedy", prompt, new), "hf": hf_fn(hf, "greedy", prompt, new)}
        with torch.inference_mode(), full_fp32():
            same, ties = same_or_ties(fns["modforge"](), fns["hf"](), hf, prompt)
        rates = {k: [] for k in fns}
        for _ in range(1 if smoke else 3):
            for k, f in fns.items():
                sync(device)
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = f()
                sync(device)
                rates[k].append(out.numel() / (time.perf_counter() - t0))
        med = {k: statistics.median(v) for k, v in rates.items()}
        rows.append({"batch": bs, "modforge": med["modforge"], "hf": med["hf"], "ratio": med["modforge"] / med["hf"],
                     "same_tokens": same, "divergences": ties})
    ok = all(r["same_tokens"] or all(t["tie"] for t in r["divergences"]) for r in rows)
    notes = [f"batch {r['batch']} row {t['row']} parts at new token {t['at']}, where HF's logits for the two "
             f"tokens are {t['gap']:.1e} apart" + ("" if t["tie"] else " (NOT a tie)")
             for r in rows for t in r["divergences"]]
    return ok, "; ".join(f"batch {r['batch']}: {r['ratio']:.2f}x HF ({r['modforge']:,.0f} new tokens/s)" for r in rows) \
        + ("; same tokens" if not notes else "; " + "; ".join(notes)), {"rows": rows}


TIE = 1e-3  # logits closer than this (fp32, no TF32) are a tie: which one argmax takes is the kernels' rounding


@contextlib.contextmanager
def full_fp32():
    """float32 matmuls without TF32 while tokens are compared (TF32's rounding alone flips near-ties)."""
    import torch

    before = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before[0]
        torch.set_float32_matmul_precision(before[1])


def same_or_ties(ours, theirs, hf, prompt) -> tuple[bool, list]:
    """Whether greedy decoding gave the same tokens; where a row parts, HF's logits for the two tokens at the
    first place they part, given the shared prefix: a tie (within TIE) is rounding, a gap a real difference.
    A random-init model's logits are nearly flat, so over hundreds of tokens a tie somewhere is expected."""
    import torch

    out = []
    for r in range(ours.shape[0]):
        diff = (ours[r] != theirs[r]).nonzero()
        if not len(diff):
            continue
        j = int(diff[0])
        seq = torch.cat([prompt[r], ours[r, :j]])[None]
        logits = hf(input_ids=seq).logits[0, -1].float()
        gap = float((logits[theirs[r, j]] - logits[ours[r, j]]).abs())
        out.append({"row": r, "at": j, "gap": gap, "tie": gap <= TIE})
    return not out, out


def sweep(work: Path, name: str, k: int, jobs: int, steps: int) -> tuple[int, float, str, Path]:
    d = work / name
    args = ["-m", f"seed={','.join(str(i) for i in range(1, jobs + 1))}", "trainer=gpu", f"trainer.max_steps={steps}",
            "trainer.enable_progress_bar=false", "sample=false", "hydra/launcher=gpus", "hydra.launcher.devices=1",
            f"hydra.launcher.jobs_per_device={k}", f"hydra.sweep.dir={d}"]
    t0 = time.perf_counter()
    code, tail = run_modforge(args, work, timeout=600)
    return code, time.perf_counter() - t0, tail, d


def check_sweep_packed(device: str, work: Path) -> tuple[bool, str, dict]:
    code, wall, tail, d = sweep(work, "packed", 2, 2, 200)
    started = [i for i, line in enumerate(tail.splitlines()) if " started on device 0" in line]
    ended = [i for i, line in enumerate(tail.splitlines()) if " ended after " in line]
    records = [metrics(j) for j in sorted(p for p in d.iterdir() if p.is_dir())]
    devs = [(r.get("devices") or {}) for r in records]
    together = len(started) == 2 and ended and max(started) < min(ended)
    ok = code == 0 and together and len(devs) == 2 and all(v.get("cuda_visible_devices") == "0" and
                                                            v.get("accelerator") == "cuda" for v in devs)
    return ok, f"exit {code}, both started before either ended: {bool(together)}, devices " \
               f"{[v.get('cuda_visible_devices') for v in devs]}, {wall:.0f} s", \
        {"tail": tail if not ok else "", "consoles": {} if ok else consoles(d)}


def consoles(d: Path) -> dict:
    """The end of each job's console.log: why a job failed, as its process printed it."""
    out = {}
    for log in sorted(d.glob("*/console.log")):
        with contextlib.suppress(OSError):
            out[log.parent.name] = log.read_text(errors="replace")[-3000:]
    return out


def check_packing(device: str, work: Path) -> tuple[bool, str, dict]:
    rows = []
    for k in (1, 2, 4):
        code, wall, tail, _ = sweep(work, f"pack{k}", k, 4, 400)
        rows.append({"jobs_per_device": k, "exit": code, "wall_s": wall, "jobs_per_hour": 4 * 3600 / wall})
        print(f"    {k} per GPU: 4 jobs in {wall:.0f} s ({rows[-1]['jobs_per_hour']:.0f} jobs/hour)", flush=True)
    ok = all(r["exit"] == 0 for r in rows)
    return ok, "; ".join(f"k={r['jobs_per_device']}: {r['jobs_per_hour']:.0f} jobs/h" for r in rows), {"rows": rows}


# --------------------------------------------------------------------------- the record

def to_markdown(rec: dict) -> str:
    d = rec["device"]
    lines = [f"# GPU check: {d['name']}", "",
             f"{d['date']}; driver {d.get('driver')}, torch {d['torch']}, CUDA {d.get('cuda')}, Python {d['python']}"
             + (f"; {d.get('memory_gib')} GiB, compute capability {d.get('capability')}" if d.get("capability") else "")
             + (f"; bf16 dense peak {d['peak_bf16_tflops']} TFLOP/s ({d['peak_source']})" if d.get("peak_bf16_tflops")
                else "; no datasheet peak known for this device: no MFU") + ".", "",
             f"Command: `{rec['command']}`, {rec['seconds']:.0f} s."
             + (f" Partial: {rec['partial']}." if rec.get("partial") else ""), "",
             "| check | result | figure |", "|---|---|---|"]
    for c in rec["checks"]:
        lines.append(f"| {c['name']} | {c['result']} | {c['figure']} |")
    thr = next((c["data"].get("rows") for c in rec["checks"] if c["name"] == "throughput" and c.get("data")), None)
    if thr:
        lines += ["", "Training step, bf16 autocast with fp32 weights, fused AdamW; median of interleaved rounds:", "",
                  "| model | mode | params | tokens/step | modforge tok/s | MFU | peak step MiB | plain tok/s | plain MFU "
                  "| plain peak MiB | modforge / plain |", "|---|---|---|---|---|---|---|---|---|---|---|"]

        def pct(x):
            return f"{x:.2%}" if x is not None else "—"

        def mib(x):
            return f"{x:,.0f}" if x is not None else "—"

        for r in thr:
            m, p = r["modforge"], r["plain"]
            lines.append(f"| {r['model']} | {r['mode']} | {r['params']:,} | {r['tokens_per_step']:,} | "
                         f"{m['tokens_per_s']:,.0f} | {pct(m['mfu'])} | {mib(m['peak_step_mib'])} | "
                         f"{p['tokens_per_s']:,.0f} | {pct(p['mfu'])} | {mib(p['peak_step_mib'])} | **{r['ratio']:.2f}** |")
    gen = next((c["data"].get("rows") for c in rec["checks"] if c["name"] == "generation" and c.get("data")), None)
    if gen:
        lines += ["", "Greedy generation, new tokens/s (GPT-2 layout, d 384, 6 layers, vocabulary 8,192; 256 new tokens):",
                  "", "| batch | modforge | HF generate | ratio | same tokens |", "|---|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['modforge']:,.0f} | {r['hf']:,.0f} | **{r['ratio']:.2f}** | {r['same_tokens']} |"
                  for r in gen]
    pack = next((c["data"].get("rows") for c in rec["checks"] if c["name"] == "packing" and c.get("data")), None)
    if pack:
        lines += ["", "A sweep of 4 runs of the default model (400 steps, trainer=gpu), jobs per GPU:", "",
                  "| jobs per GPU | wall s | jobs per hour |", "|---|---|---|"]
        lines += [f"| {r['jobs_per_device']} | {r['wall_s']:.0f} | {r['jobs_per_hour']:.0f} |" for r in pack]
    return "\n".join(lines) + "\n"


def write_record(rec: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(rec, indent=1) + "\n")
    (out / "gpu.md").write_text(to_markdown(rec))


def run_checks(device: str, a, work: Path, on_check=None) -> list:
    """Run the checks in PLAN's order; ``on_check(checks)`` after each (main writes the record so far, so a run
    stopped at a time limit keeps what it measured)."""
    peak = device_record(device).get("peak_bf16_tflops")
    smoke = device != "cuda"
    table = {
        "bf16_autocast": lambda: check_bf16(device, work), "fp16_scaler": lambda: check_fp16(device, work),
        "tf32": lambda: check_tf32(device, work), "fused_adamw": lambda: check_fused(device, work),
        "sdpa_flash": lambda: check_sdpa("flash")(device, work),
        "sdpa_efficient": lambda: check_sdpa("efficient")(device, work),
        "compile": lambda: check_compile(device, work), "pinned_memory": lambda: check_pinned(device, work),
        "throughput": lambda: check_throughput(device, work, a.quick, peak, smoke),
        "generation": lambda: check_generation(device, work, smoke),
        "sweep_packed": lambda: check_sweep_packed(device, work), "packing": lambda: check_packing(device, work)}
    cpu_runnable = {"throughput", "generation"}
    checks = []
    for name, what in PLAN:
        if a.only and name not in a.only:
            continue
        t0 = time.perf_counter()
        try:
            if smoke and name not in cpu_runnable:
                raise Skip("needs CUDA")
            if a.quick and name == "packing":
                raise Skip("--quick")
            ok, figure, data = table[name]()
            result = "PASS" if ok else "FAIL"
        except Skip as e:
            result, figure, data = "SKIP", str(e), {}
        except Exception as e:  # noqa: BLE001 - one path failing is a finding; the others still run
            result, figure = "FAIL", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            data = {"traceback": traceback.format_exc()[-3000:]}
        checks.append({"name": name, "what": what, "result": result, "figure": figure, "data": data,
                       "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{result:4}  {name:<15} {figure}  ({checks[-1]['seconds']:.0f} s)", flush=True)
        if on_check:
            on_check(checks)
    return checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="where gpu.json and gpu.md go (default benchmarks/results; with "
                                                 "--smoke a temporary directory)")
    ap.add_argument("--quick", action="store_true", help="no compiled throughput, no packing sweep (~3 min)")
    ap.add_argument("--only", nargs="*", default=[], choices=[n for n, _ in PLAN], help="run these checks only")
    ap.add_argument("--smoke", action="store_true", help="without CUDA: run what can run on CPU (tiny), to check "
                                                          "the script")
    a = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    print("GPU check: " + ("CUDA device 0: " + torch.cuda.get_device_name(0) if cuda else "no CUDA device"))
    for name, what in PLAN:
        print(f"  {name:<15} {what}")
    if not cuda and not a.smoke:
        print("no GPU: nothing measured")
        return 0
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as a run on CUDA decides (matmul_precision high)
        torch.set_float32_matmul_precision("high")
    t0 = time.perf_counter()
    out = Path(a.out) if a.out else (Path(tempfile.mkdtemp(prefix="modforge-gpu-smoke-")) if a.smoke else HERE / "results")
    command = " ".join(["python benchmarks/gpu.py", *(argv or sys.argv[1:])])

    def record(checks: list, partial: bool) -> dict:
        rec = {"device": device_record(device), "command": command, "seconds": time.perf_counter() - t0,
               "checks": checks}
        if partial:
            rec["partial"] = f"stopped after {len(checks)} of the checks asked for"
        return rec

    with tempfile.TemporaryDirectory(prefix="modforge-gpu-") as tmp:
        checks = run_checks(device, a, Path(tmp), on_check=lambda cs: write_record(record(cs, True), out))
    write_record(record(checks, False), out)
    failed = [c["name"] for c in checks if c["result"] == "FAIL"]
    print(f"wrote {out / 'gpu.json'} and gpu.md; " + (f"FAILED: {', '.join(failed)}" if failed else "no failure"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
