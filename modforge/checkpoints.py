"""Checkpoints: finding one from what a user types, and rebuilding a trained task from it alone.

Every checkpoint carries the resolved run config and the data facts
(tokenizer, positions, tokens per character, labels) as hyper-parameters, so
:func:`load_checkpoint` needs nothing else: no data, no config files.
"""
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


def load_checkpoint(path: str, map_location: str = "cpu"):
    """Rebuild a task (model, tokenizer, data facts) from a checkpoint file alone, in eval mode."""
    import torch

    from modforge.builtins import load_all
    from modforge.data.base import DataFacts
    from modforge.registry import make_config

    load_all()  # built-ins and plugins: the checkpoint names its components
    ckpt = torch.load(path, map_location=map_location, weights_only=False)
    hp = ckpt["hyper_parameters"]
    facts = DataFacts.from_state(hp["data_facts"] if "data_facts" in hp else _facts_of_old_checkpoint(hp))
    entry, task_cfg = make_config("task", hp["run_cfg"]["task"])
    task = entry.cls(task_cfg, hp["run_cfg"], facts)
    task.load_state_dict(ckpt["state_dict"])
    task.tokens_seen = int(ckpt.get("tokens_seen", 0))
    return task.eval()


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
