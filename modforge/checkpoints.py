"""Checkpoints: finding one from what a user types, and rebuilding a trained task from it alone.

Every checkpoint carries the resolved run config and the data facts
(tokenizer, positions, tokens per character, labels) as hyper-parameters, so
:func:`load_checkpoint` needs nothing else: no data, no config files.

Loading never executes code: every load is ``torch.load(..., weights_only=True)``,
which unpickles tensors and plain containers only, and what modforge stores in
a checkpoint is exactly that (checked by a test). A file that holds anything
else (a pickled object whose loading would run code) is refused in one line.
"""
import re
from pathlib import Path
from typing import Any

from modforge.registry import ConfigError


def find_checkpoint(key: str, value: Any) -> Path:
    """``key=value`` names a checkpoint: a .ckpt file, or a run directory (its ``checkpoints/last.ckpt``)."""
    path = Path(str(value)).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    if not path.is_file():
        raise ConfigError(
            f"{key}={value}: no checkpoint at {path}; give a .ckpt file or a run directory that has "
            f"checkpoints/last.ckpt (e.g. {key}=outputs/<date>/<time>)"
        )
    return path


def read_checkpoint(path: Any, key: str = "ckpt", map_location: str = "cpu") -> dict:
    """The checkpoint's contents, loaded with ``weights_only=True``; anything else is one ConfigError."""
    import pickle

    import torch

    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if not found:  # not a pickle torch can read at all: a truncated or foreign file
            raise ConfigError(f"{key}={path}: not a readable checkpoint (torch cannot unpickle it)") from None
        raise ConfigError(
            f"{key}={path}: refused: the file holds a pickled Python object ({found.group(1)}) besides tensors and "
            "plain data, and loading it could run code. modforge checkpoints never do; load only files you trust."
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"{key}={path}: not a readable checkpoint ({type(e).__name__}: {first})") from None
    hp = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    if not isinstance(hp, dict) or "run_cfg" not in hp or "state_dict" not in ckpt:
        raise ConfigError(f"{key}={path}: not a modforge checkpoint (it has no run config and state dict)")
    return ckpt


def load_checkpoint(path: str, map_location: str = "cpu", key: str = "ckpt"):
    """Rebuild a task (model, tokenizer, data facts) from a checkpoint file alone, in eval mode."""
    from modforge.builtins import load_all
    from modforge.data.base import DataFacts
    from modforge.registry import make_config

    load_all()  # built-ins and plugins: the checkpoint names its components
    ckpt = read_checkpoint(path, key, map_location)
    hp = ckpt["hyper_parameters"]
    facts = DataFacts.from_state(facts_state(ckpt))
    entry, task_cfg = make_config("task", hp["run_cfg"]["task"])
    task = entry.cls(task_cfg, hp["run_cfg"], facts)
    task.load_state_dict(ckpt["state_dict"])
    task.tokens_seen = int(ckpt.get("tokens_seen", 0))
    return task.eval()


def facts_state(ckpt: dict) -> dict:
    """The data facts a checkpoint carries (rebuilt from the tokenizer state for checkpoints older than them)."""
    hp = ckpt["hyper_parameters"]
    return hp["data_facts"] if "data_facts" in hp else _facts_of_old_checkpoint(hp)


def _facts_of_old_checkpoint(hp: dict) -> dict:
    """Checkpoints written before the data facts existed carry only the tokenizer state (labels in its
    ``meta``); their tokens per character are unknown, so ``val/bpc`` is not reported for them."""
    from modforge.registry import make_config

    state = dict(hp["tokenizer_state"])
    meta = state.pop("meta", None) or {}
    model_len = make_config("model", hp["run_cfg"]["model"])[1].max_len
    try:
        positions = getattr(make_config("data", hp["run_cfg"]["data"])[1], "positions", None) or model_len
    except (ConfigError, KeyError):  # e.g. its data plugin is not installed here
        positions = model_len
    return {"tokenizer": state, "positions": positions, "tokens_per_char": None, "labels": meta.get("labels")}
