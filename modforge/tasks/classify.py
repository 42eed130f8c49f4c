"""Sequence classification (``classify``): an encoder, a pooling step and a linear head.

The encoder is the model's ``encode(idx, mask)`` (``model=encoder_only``; the
encoder of ``encoder_decoder`` works too). Pooling (``task.pooling``):

* ``cls``: the hidden state at position 0, the ``<bos>`` token every example starts with (BERT's [CLS]);
* ``mean``: the average hidden state over real (non-padding) tokens, ``<bos>`` included.

The label names come from the data (``DataFacts.labels``), saved in every
checkpoint, so a checkpoint alone rebuilds the head and names its predictions. Reports
``val/loss`` and ``val/acc`` (accuracy over all validation examples).
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from modforge.data.base import LABELS
from modforge.registry import ConfigError, register
from modforge.tasks.base import Task, TaskConfig

if TYPE_CHECKING:
    from modforge.data.base import DataFacts


def pool_cls(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return h[:, 0]


def pool_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


POOLING: dict[str, Callable] = {"cls": pool_cls, "mean": pool_mean}


@dataclass
class ClassifyConfig(TaskConfig):
    pooling: str = "cls"  # cls | mean
    head_dropout: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.pooling not in POOLING:
            raise ConfigError(f"task.pooling={self.pooling}: use one of {', '.join(POOLING)}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ConfigError(f"task.head_dropout={self.head_dropout}: must be in [0, 1)")


@register("task", "classify", config=ClassifyConfig, defaults={"data": "classify"})
class Classify(Task):
    """Text classification with an encoder and a CLS or mean-pooled linear head; reports accuracy."""
    metric_ranges = {**Task.metric_ranges, "acc": (0.0, 1.0, "max")}

    model_needs = {"has_encoder": True}
    model_role = "a model with an encoder"
    param_roles = {"head.1.weight": "output", "head.1.bias": "vector"}  # a readout (modforge.models.param)
    data_needs = LABELS

    def __init__(self, cfg: ClassifyConfig, run_cfg: dict, facts: "DataFacts"):
        super().__init__(cfg, run_cfg, facts)
        self.labels: list[str] = list(facts.labels or [])
        if len(self.labels) < 1:
            raise ConfigError("task=classify: the data gave no label names; use it with labelled data "
                              "(data=classify data.path=<csv or jsonl>)")
        self.pool = POOLING[cfg.pooling]
        self.head = nn.Sequential(nn.Dropout(cfg.head_dropout), nn.Linear(self.model.cfg.d_model, len(self.labels)))

    def forward(self, src: torch.Tensor, src_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """src (B, T) starting with <bos> -> logits (B, n_labels)."""
        if src_mask is None:
            src_mask = src != self.tokenizer.pad_id
        pooled = self.pool(self.model.encode(src, src_mask), src_mask)
        mult = self.model.readout_mult  # param=mup's readout multiplier (1 under standard)
        return self.head(pooled * mult if mult != 1.0 else pooled)

    def _step(self, b):
        logits = self(b["src"], b["src_mask"])
        acc = (logits.argmax(-1) == b["label"]).float().mean()
        return logits, acc

    def training_step(self, b, batch_idx):
        logits, acc = self._step(b)
        loss = self.xent(logits, b["label"])  # (with task.z_loss and a mixture's balancing loss, as every task)
        self.count_tokens(int(b["src_mask"].sum()))
        B = b["src"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        self.log("train/acc", acc, batch_size=B)
        return loss

    def validation_step(self, b, batch_idx):
        logits, acc = self._step(b)
        loss = F.cross_entropy(logits.float(), b["label"])
        B = b["src"].shape[0]
        self.log_mean("val/loss", loss, B, prog_bar=True)
        self.log_mean("val/acc", acc, B, prog_bar=True)
        return loss

    @torch.no_grad()
    def predict(self, texts: Sequence[str], max_len: Optional[int] = None) -> list[str]:
        """Label names for raw texts (encoded as the data does: <bos> + ids, cut to max_len)."""
        tok = self.tokenizer
        max_len = max_len or self.model.cfg.max_len
        rows = [[tok.bos_id] + tok.encode(t)[: max_len - 1] for t in texts]
        T = max(len(r) for r in rows)
        src = torch.full((len(rows), T), tok.pad_id, dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            src[i, : len(r)] = torch.tensor(r, device=self.device)
        was = self.training
        self.eval()
        out = self(src).argmax(-1).tolist()
        self.train(was)
        return [self.labels[i] for i in out]

    def summary_sample(self):
        """The first validation example, its predicted and its true label."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None:
            return None
        b = next(iter(dm.val_dataloader()))
        n = int(b["src_mask"][0].sum())
        text = self.tokenizer.decode(b["src"][0, 1:n].tolist())
        pred = self.predict([text])[0]
        return f"{text[:80]!r} -> {pred} (true: {self.labels[int(b['label'][0])]})"
