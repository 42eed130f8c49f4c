"""The contract of kind ``task``: a LightningModule that builds its model from a run config through the registry.

A task is constructed as ``cls(cfg, run_cfg, facts)``: its typed config, the
*resolved run config* (a plain dict) and the :class:`~modforge.data.base.DataFacts`
that the data's ``prepare()`` returned (tokenizer, positions, tokens per
character, labels). The run config and the facts' state are saved as
hyper-parameters, so every checkpoint carries what is needed to rebuild model,
tokenizer and metrics (:func:`modforge.checkpoints.files.load_checkpoint`).
"""
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import Metric

from modforge.models.blocks import Parts
from modforge.models.flops import FlopCount
from modforge.registry import ConfigError, build
from modforge.utils.seeds import derive

from modforge.utils.targets import IGNORE  # noqa: F401 - re-exported: the tasks' import of it

if TYPE_CHECKING:  # only a type here; importing it would declare the data kinds before this one
    from modforge.data.base import DataFacts


@dataclass
class TaskConfig:
    label_smoothing: float = 0.0
    z_loss: float = 0.0  # + z_loss * mean(log Z)^2 over the targets while training (PaLM, OLMo 2: 1e-4); 0: none

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"task.label_smoothing={self.label_smoothing}: must be in [0, 1)")
        if not 0.0 <= self.z_loss < 1.0:
            raise ConfigError(f"task.z_loss={self.z_loss}: must be in [0, 1) (PaLM and OLMo 2: 1e-4; 0: none)")


class Task(L.LightningModule):
    """Base class of kind ``task``: model, optimizer/scheduler from the registry, token counting, loss.

    Subclasses implement Lightning's ``training_step`` and ``validation_step``
    (logging ``val/loss``), and may override :meth:`summary_sample`. They
    declare what they need, as capabilities, never by name: ``model_needs``
    (capability attributes of :class:`~modforge.models.architectures.Model` and
    their required values, described by ``model_role``) and ``data_needs`` (what
    the data's batches are: ``DataModule.provides``). :func:`check_fit` refuses
    a model or data that does not fit before any work.
    """

    model_needs: dict = {}
    model_role: str = "any model"
    data_needs: str = ""
    # what each validation metric is, by its name after "val/": (lowest, highest (None: unbounded), which is
    # better); recorded in metrics.json, where the report reads each metric's range and direction
    metric_ranges: dict = {"loss": (0.0, None, "min")}

    def __init__(self, cfg: Any, run_cfg: dict, facts: "DataFacts"):
        super().__init__()
        self.save_hyperparameters({"run_cfg": run_cfg, "data_facts": facts.state()})
        self.cfg = cfg
        self.run_cfg = run_cfg
        self.facts = facts
        self.tokenizer = facts.tokenizer
        from modforge.models.param import parametrised  # (here: kinds are declared in plugins' order)

        # the parametrisation rescales the fresh model against its base shape (param=standard: nothing)
        self.model, self.param = parametrised(run_cfg["model"], Parts.from_config(run_cfg), self.tokenizer.vocab_size,
                                              run_cfg.get("param", "standard"))
        self.tokens_seen = 0
        # data-side randomness inside the task (masking ...): its own stream, the same for every model
        self.data_generator = torch.Generator().manual_seed(derive(int(run_cfg.get("seed", 0)), "task-data"))
        self.batch_checksum = torch.zeros(2, dtype=torch.int64)  # of every training batch, in order
        self.flop_count: Optional[FlopCount] = None  # training FLOPs, from the shapes each step trains at (setup)
        self.counted_from_start = True  # False: resumed from a checkpoint that predates a count (FLOPs, checksum)
        self.val_means = torch.nn.ModuleDict()  # log_mean's metrics (their sums are not saved in checkpoints)
        # the longest context the model was trained on: the data's sequence length, capped by model.max_len
        self.context_len = min(facts.positions, self.model.cfg.max_len)

    # ----------------------------------------------------------------- optimisation
    def configure_optimizers(self):
        from modforge.components.optim import check_group_scales  # (here: kinds are declared in plugins' order)

        groups = self.param.groups(self)
        if groups is None and getattr(_optimizer_fn(self.run_cfg["optim"]), "by_role", False):
            groups = role_groups(self)  # (Muon: hidden matrices apart from the rest, by their declared roles)
        opt = build("optim", self.run_cfg["optim"], self.parameters() if groups is None else groups)
        if groups is not None and not getattr(_optimizer_fn(self.run_cfg["optim"]), "by_role", False):
            check_group_scales(opt, groups, self.run_cfg["optim"])
        total = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else None
        sched = build("scheduler", self.run_cfg["scheduler"], opt, d_model=self.param.schedule_d_model(self.model),
                      total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, also for a fused Adam/AdamW under mixed precision (``trainer=gpu``, ``gpu_fp16``),
        which Lightning refuses because such an optimizer unscales fp16 gradients inside its step. Here they are
        unscaled first (``GradScaler.unscale_``; the fused step then takes them as they are and still skips a
        step whose gradients overflowed), then clipped; under bf16 there is no scale and nothing to unscale."""
        from lightning.pytorch.plugins.precision import MixedPrecision, Precision
        from lightning.pytorch.utilities import GradClipAlgorithmType

        plugin = self.trainer.precision_plugin
        if not (gradient_clip_val and getattr(optimizer, "_step_supports_amp_scaling", False)
                and isinstance(plugin, MixedPrecision)):
            return L.LightningModule.configure_gradient_clipping(self, optimizer, gradient_clip_val,
                                                                 gradient_clip_algorithm)
        if plugin.scaler is not None:
            plugin.scaler.unscale_(optimizer)
        Precision.clip_gradients(plugin, optimizer, gradient_clip_val,
                                 GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM))

    def xent(self, logits: torch.Tensor, target: torch.Tensor, smoothing: Optional[float] = None) -> torch.Tensor:
        """Mean cross-entropy over the targets that are not :data:`IGNORE` (label smoothing as in Szegedy et al.
        2016); while training, plus ``task.z_loss`` times the mean of (log Z)^2 over the same targets, Z the
        softmax's normaliser (Chowdhery et al. 2022, PaLM §5; Wortsman et al. 2023 §3.1.2), logged as
        ``train/z_loss``, and the model's auxiliary losses of this forward (``ffn=moe``'s load balancing, logged
        as ``train/aux_loss``). Validation reports the cross-entropy alone."""
        ls = self.cfg.label_smoothing if smoothing is None else smoothing
        flat, tgt = logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1)
        loss = F.cross_entropy(flat, tgt, ignore_index=IGNORE, label_smoothing=ls)
        if self.training:  # the model's own auxiliary losses of this forward (a mixture of experts' balancing)
            aux = [m for m in self._aux_modules() if m.aux_loss is not None]
            if aux:
                total = sum(m.aux_loss for m in aux)
                for m in aux:
                    m.aux_loss = None
                self.log("train/aux_loss", total.detach())
                loss = loss + total
        z_coef = getattr(self.cfg, "z_loss", 0.0)
        if z_coef and self.training:
            lse = torch.logsumexp(flat[tgt != IGNORE], -1)
            z = (lse ** 2).mean() if lse.numel() else lse.sum()
            self.log("train/z_loss", z.detach())
            loss = loss + z_coef * z
        return loss

    def _aux_modules(self) -> list:
        """The model's modules that set an ``aux_loss`` in their training forward (``has_aux_loss``)."""
        if getattr(self, "_aux", None) is None:
            self._aux = [m for m in self.model.modules() if getattr(m, "has_aux_loss", False)]
        return self._aux

    def log_mean(self, name: str, value: Any, weight: Any, prog_bar: bool = False) -> None:
        """Log ``name`` as the mean of ``value`` over the validation epoch, each value counting ``weight`` (its
        tokens, its examples): a torchmetrics metric that sums value*weight and weight, reduced across
        DDP ranks by sums, so a DDP run reports exactly what one process does on the same items (Lightning's
        ``sync_dist`` would average the ranks' means instead)."""
        key = name.replace("/", "__").replace(".", "_")  # a ModuleDict key cannot hold "." ("/" kept readable)
        if key not in self.val_means:
            with torch.inference_mode(False):
                self.val_means[key] = _Mean().to(self.device)
        metric = self.val_means[key]
        metric.update(torch.as_tensor(value, dtype=torch.float32, device=self.device).detach(),
                      torch.as_tensor(weight, dtype=torch.float32, device=self.device))
        self.log(name, metric, prog_bar=prog_bar, on_step=False, on_epoch=True, metric_attribute=f"val_means.{key}")

    def setup(self, stage: str) -> None:
        """Hooks the FLOP count onto every module the task has by now (a subclass's own head included)."""
        if self.flop_count is None:
            self.flop_count = FlopCount(self)

    def count_tokens(self, n: int) -> None:
        self.tokens_seen += int(n)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.see(batch)

    def see(self, *tensors: Any) -> None:
        """Fold what the model trains on into :attr:`batch_checksum` (on the batch's device, no synchronisation):
        two runs whose checksums agree trained on the same batches in the same order (``metrics.json``'s
        ``data_checksum``, which the report compares between paired runs)."""
        self.batch_checksum = batch_checksum(self.batch_checksum, tensors)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokens_seen"] = self.tokens_seen
        checkpoint["task_data_rng"] = self.data_generator.get_state()
        checkpoint["batch_checksum"] = [int(v) for v in self.batch_checksum.tolist()]
        checkpoint["forward_flops"] = self.flop_count.state() if self.counted_from_start else None

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokens_seen = int(checkpoint.get("tokens_seen", 0))
        if "task_data_rng" in checkpoint:
            self.data_generator.set_state(checkpoint["task_data_rng"])
        self.setup("fit")
        if checkpoint.get("forward_flops") is None or "batch_checksum" not in checkpoint:
            self.counted_from_start = False  # a checkpoint from before these counts: no whole-run figure
        self.flop_count.load(checkpoint.get("forward_flops"))
        if "batch_checksum" in checkpoint:
            self.batch_checksum = torch.tensor(checkpoint["batch_checksum"], dtype=torch.int64)

    @classmethod
    def declared_metrics(cls, cfg: Any) -> list:
        """The validation metrics (after ``val/``) a run with task config ``cfg`` logs: by default the names of
        :attr:`metric_ranges`; a task that logs more (causal_lm's downstream evaluations) says which."""
        return list(cls.metric_ranges)

    @classmethod
    def metric_info(cls, names: Any) -> dict:
        """{metric: {"low", "high", "better"}} for the logged metrics ``names`` that :attr:`metric_ranges` knows
        (``val@128/loss`` is a ``loss``)."""
        out = {}
        for name in names:
            known = cls.metric_ranges.get(name.rsplit("/", 1)[-1])
            if known is not None:
                out[name] = {"low": known[0], "high": known[1], "better": known[2]}
        return out

    # ----------------------------------------------------------------- reporting
    def summary_sample(self) -> Optional[str]:
        """A short human-readable sample for the end-of-run summary (None: nothing to show)."""
        return None


_P = 2 ** 31 - 1  # a Mersenne prime: every product below stays under 2**62, every sum under 2**63


def _optimizer_fn(cfg: Any) -> Any:
    from modforge.registry import registry

    name = cfg.get("name") if hasattr(cfg, "get") else cfg
    return registry("optim").get(name).cls


def role_groups(root: torch.nn.Module) -> list[dict]:
    """The trainable parameters as {"params", "role"} groups, one per declared role (modforge.models.param), in the
    order of ``root.named_parameters()``: what an optimizer that treats roles apart (``optim=muon``) is given."""
    from modforge.models.param import roles

    role = roles(root, "optim=muon")
    out: dict[str, list] = {}
    for name, p in root.named_parameters():
        if p.requires_grad and name in role:
            out.setdefault(role[name], []).append(p)
    return [{"params": ps, "role": r} for r, ps in out.items()]


def batch_checksum(acc: torch.Tensor, batch: Any) -> torch.Tensor:
    """Two polynomial checksums (mod 2**31 - 1) of ``acc`` followed by every tensor in ``batch`` (tensors, lists,
    tuples and dicts of them, dicts by key; floating tensors by their float32 bits), position by position."""
    for t in _tensors(batch):
        v = (t.detach().to(torch.float32).view(torch.int32) if t.is_floating_point() else t.detach())
        v = v.reshape(-1).to(torch.int64) % _P
        i = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.int64)
        acc = acc.to(v.device)
        lanes = torch.stack([((v * (i * 48271 % _P)) % _P).sum(), ((v * (i * 16807 % _P + 1)) % _P).sum()])
        acc = (acc * torch.tensor([69621, 39373], device=v.device) + lanes % _P + v.numel()) % _P
    return acc


def _tensors(batch: Any):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for k in sorted(batch):
            yield from _tensors(batch[k])
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from _tensors(b)


class _Mean(Metric):
    """A weighted mean whose two sums torchmetrics reduces across DDP ranks. Not torchmetrics' ``MeanMetric``:
    with ``nan_strategy="disable"`` (a NaN loss must stay NaN: that is a divergence) its weights are replaced by
    ones (torchmetrics 1.9). Its sums stay normal tensors: ``trainer.validate`` runs in inference mode, the
    validations inside ``fit`` do not, and a sum re-created by a reset in one could not be updated in the other."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__(sync_on_compute=True)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: torch.Tensor) -> None:
        self.total += torch.where(weight > 0, value * weight, 0.0)  # nothing counted (a NaN mean of none): 0
        self.weight += weight

    def compute(self) -> torch.Tensor:
        return self.total / self.weight

    def reset(self) -> None:
        with torch.inference_mode(False):
            super().reset()


def check_fit(task: Any, model: Any, data: Any) -> None:
    """One line if the task's needs are not what the model and the data provide (entries of the registry)."""
    from modforge.registry import registry

    t = task.cls
    if any(getattr(model.cls, k, None) != v for k, v in t.model_needs.items()):
        fit = [e.name for e in registry("model").entries()
               if all(getattr(e.cls, k, None) == v for k, v in t.model_needs.items())]
        raise ConfigError(f"task={task.name} trains {t.model_role}; model={model.name} is not one. "
                          f"Models that fit: {', '.join(fit) or 'none installed'}.")
    if t.data_needs and getattr(data.cls, "provides", "") != t.data_needs:
        fit = [e.name for e in registry("data").entries() if getattr(e.cls, "provides", "") == t.data_needs]
        raise ConfigError(f"task={task.name} needs data of {t.data_needs}; data={data.name} gives "
                          f"{getattr(data.cls, 'provides', '') or 'something else'}. Data that fit: {', '.join(fit)}.")


def bits(nats: float) -> float:
    return nats / math.log(2)
