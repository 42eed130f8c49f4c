"""What a run does with its hardware: decisions made from plain values, so that they are tested on CPU.

* :func:`fused_optimizer`: torch's fused Adam/AdamW kernel (one launch for every
  parameter) when every parameter is a floating CUDA tensor; ``optim.fused``
  true/false forces it (``null``, the default: this rule).
* :func:`matmul_precision`: TF32 matmuls (``"high"``) for a run on CUDA, where
  float32 matrix products then use the tensor cores; torch's ``"highest"``
  elsewhere. The root key ``matmul_precision`` overrides it.
* pinned host memory for loaders feeding a CUDA device: :func:`modforge.data.base.on_cuda`.
* :func:`devices_record`: what a run trained on, for ``metrics.json``.
"""
import os
from typing import Any, Iterable, Optional

PRECISIONS = ("highest", "high", "medium")


def fused_optimizer(setting: Optional[bool], params: Iterable[Any]) -> bool:
    """Whether Adam/AdamW use torch's fused kernel: ``setting`` when given, else when every parameter is a
    floating-point CUDA tensor (on CPU the unfused loop keeps the committed numbers bit for bit)."""
    if setting is not None:
        return bool(setting)
    params = list(params)
    return bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)


def matmul_precision(setting: Optional[str], accelerator: str) -> str:
    """torch's float32 matmul precision for a run on ``accelerator`` ("cpu", "cuda"): ``setting`` when given
    (one of highest, high, medium), else "high" (TF32) on CUDA and "highest" elsewhere."""
    if setting is not None:
        return setting
    return "high" if accelerator == "cuda" else "highest"


def accelerator_of(trainer_cfg: Any) -> str:
    """"cuda" or "cpu": where a run with these Trainer settings trains ("auto" means CUDA when one is visible)."""
    acc = str(trainer_cfg.get("accelerator") or "auto")
    if acc in ("gpu", "cuda"):
        return "cuda"
    if acc == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def cpu_name() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``, else :func:`platform.processor`; "" if neither says)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


# The environment that pins torch's CPU kernels to one instruction set whatever the CPU offers: ATen's own kernels
# (ATEN_CPU_CAPABILITY=avx2) and MKL's conditional numerical reproducibility (MKL_CBWR=AVX2), with the other two
# limiting MKL and oneDNN. Set before the process starts. They are meant to make a run re-run to the last digit on
# any x86 CPU with AVX2; shown so far on one machine only (experiments/README.md, "Reproducing a cell").
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def devices_record(trainer: Any) -> dict:
    """What the run trained on (``metrics.json``'s ``devices``): the accelerator, the ranks, the precision, the GPUs
    it could see (``CUDA_VISIBLE_DEVICES``, as a launcher that gives each job its own GPUs sets it) and their names,
    torch's CPU threads (a float reduction split over another number of threads rounds differently: re-running
    a run to the last digit on CPU takes its thread count, e.g. ``OMP_NUM_THREADS=1`` for a job of a 2-job sweep),
    and the CPU with the SIMD kernels torch chose for it (``cpu_capability``, e.g. AVX2 or AVX512: another CPU may
    round differently, and a long run carries a last-digit difference forward), and which of ``KERNEL_ENV`` were
    set (``cpu_kernel_env``), the variables that pin those kernels."""
    import torch

    kind = trainer.strategy.root_device.type
    record = {"accelerator": kind, "world_size": trainer.world_size, "num_nodes": trainer.num_nodes,
              "precision": str(trainer.precision), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "float32_matmul_precision": torch.get_float32_matmul_precision(), "cpu_threads": torch.get_num_threads(),
              "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "cpu_kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}
    if kind == "cuda":
        record["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return record
