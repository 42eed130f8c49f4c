import os

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
