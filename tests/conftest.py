import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from modforge.plugins import load_all

load_all()  # built-ins and installed plugins: tests that enumerate the registry cover plugins too


@pytest.fixture(autouse=True, scope="session")
def _modforge_cache(tmp_path_factory):
    """Token and tokenizer caches of every test (and its subprocesses) go to a temporary directory."""
    os.environ["MODFORGE_CACHE"] = str(tmp_path_factory.mktemp("modforge-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_overrides(tmp_path=None, steps: int = 1) -> list[str]:
    """Overrides that make any default run tiny."""
    ov = [
        "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.max_len=64",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2",
    ]
    if tmp_path is not None:
        ov.append(f"hydra.run.dir={tmp_path}")
    return ov


def run_module(module: str, cwd: Path, *args: str, fault: str = "", threads: Optional[int] = 1,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m <module> args`` in ``cwd``, its output captured; ``fault``: a ``MODFORGE_FAULT`` for it (and
    only it); ``threads``: its OMP_NUM_THREADS (None: the machine's)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MODFORGE_FAULT", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if fault:
        env["MODFORGE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
