"""Task base class: a LightningModule that builds its model from a run config through the registry.

A task is constructed from the *resolved run config* (a plain dict) and the
tokenizer's state; both are saved as hyper-parameters, so every checkpoint
carries what is needed to rebuild model and tokenizer (:func:`load_checkpoint`).
"""
import math
from dataclasses import dataclass
from typing import Any, Optional

import lightning as L
import torch
import torch.nn.functional as F

from modforge.data.tokenizers import load_tokenizer
from modforge.models.blocks import Parts
from modforge.registry import build, load_all, make_config


@dataclass
class TaskConfig:
    label_smoothing: float = 0.0


class Task(L.LightningModule):
    """Shared plumbing: model, optimizer/scheduler from the registry, token counting, loss."""

    def __init__(self, cfg: Any, run_cfg: dict, tokenizer_state: dict):
        super().__init__()
        self.save_hyperparameters({"run_cfg": run_cfg, "tokenizer_state": tokenizer_state})
        self.cfg = cfg
        self.run_cfg = run_cfg
        self.tokenizer = load_tokenizer(tokenizer_state)
        self.model = build("model", run_cfg["model"], Parts.from_config(run_cfg), self.tokenizer.vocab_size)
        self.tokens_seen = 0
        self.context_len = self._trained_context()

    def _trained_context(self) -> int:
        """Longest context the model was trained on: the data's sequence length, capped by model.max_len."""
        try:
            positions = getattr(make_config("data", self.run_cfg["data"])[1], "positions", None)
        except Exception:  # noqa: BLE001 - e.g. a checkpoint whose data plugin is not installed here
            positions = None
        return min(positions or self.model.cfg.max_len, self.model.cfg.max_len)

    # ----------------------------------------------------------------- optimisation
    def configure_optimizers(self):
        opt = build("optim", self.run_cfg["optim"], self.parameters())
        total = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else None
        sched = build("scheduler", self.run_cfg["scheduler"], opt, d_model=self.model.cfg.d_model, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def xent(self, logits: torch.Tensor, target: torch.Tensor, smoothing: Optional[float] = None) -> torch.Tensor:
        """Mean cross-entropy over non-pad targets (label smoothing as in Szegedy et al. 2016)."""
        ls = self.cfg.label_smoothing if smoothing is None else smoothing
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                               ignore_index=self.tokenizer.pad_id, label_smoothing=ls)

    def count_tokens(self, n: int) -> None:
        self.tokens_seen += int(n)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokens_seen = int(checkpoint.get("tokens_seen", 0))

    # ----------------------------------------------------------------- reporting
    def summary_sample(self) -> Optional[str]:
        """A short human-readable sample for the end-of-run summary (None: nothing to show)."""
        return None


def bits(nats: float) -> float:
    return nats / math.log(2)


def load_checkpoint(path: str, map_location: str = "cpu") -> Task:
    """Rebuild a task (model + tokenizer) from a checkpoint file alone, in eval mode."""
    load_all()  # built-ins and plugins: the checkpoint names its components
    ckpt = torch.load(path, map_location=map_location, weights_only=False)
    hp = ckpt["hyper_parameters"]
    entry, task_cfg = make_config("task", hp["run_cfg"]["task"])
    task = entry.cls(task_cfg, hp["run_cfg"], hp["tokenizer_state"])
    task.load_state_dict(ckpt["state_dict"])
    task.tokens_seen = int(ckpt.get("tokens_seen", 0))
    return task.eval()
