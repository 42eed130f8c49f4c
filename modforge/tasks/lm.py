"""Language-modelling tasks: ``causal_lm`` (next token) and ``masked_lm`` (BERT-style)."""
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F

from modforge.data.base import TOKENS
from modforge.models.decoding import generate
from modforge.registry import ConfigError, register
from modforge.tasks.base import IGNORE, Task, TaskConfig, bits
from modforge.evals.scoring import Scores, score
from modforge.evals.tasks import load_tasks, metric_names
from modforge.utils.documents import document_ids


@dataclass
class CausalLMConfig(TaskConfig):
    sample_chars: int = 200  # length of the end-of-run sample
    sample_prompt: str = "\n"
    sample_temperature: float = 0.8
    sample_top_k: int = 0  # 0: no top-k filter
    document_mask: bool = False  # attention stays inside each packed document (data with end-of-document ids)
    document_positions: str = "restart"  # with document_mask: positions count from 0 in each document, or continue
    evals: list = field(default_factory=list)  # downstream tasks scored at every validation: built-in names or .jsonl
    eval_batch_size: int = 16  # sequences per forward pass of those evaluations

    def __post_init__(self):
        super().__post_init__()
        if self.sample_chars < 0 or self.sample_top_k < 0 or not self.sample_temperature > 0:
            raise ConfigError(f"task.sample_chars={self.sample_chars}, task.sample_top_k={self.sample_top_k}, "
                              f"task.sample_temperature={self.sample_temperature}: chars >= 0, top_k >= 0, "
                              "temperature > 0")
        if self.eval_batch_size < 1:
            raise ConfigError(f"task.eval_batch_size={self.eval_batch_size}: must be >= 1")
        if self.document_positions not in ("restart", "continue"):
            raise ConfigError(f"task.document_positions={self.document_positions}: allowed values are restart "
                              "(positions count from 0 in each document) and continue (as in the window)")

    def check(self, run: dict) -> list:
        """``evals`` must be readable tasks; ``document_mask`` needs data that marks document ends, and a model
        and attention that take them."""
        load_tasks(self.evals, "task.evals")
        if not self.document_mask:
            return []
        from modforge.registry import get

        data = run.get("data", {}).get("name")
        if not getattr(get("data", data).cls, "marks_documents", False):
            raise ConfigError(f"task.document_mask=true: data={data} marks no document ends in its token stream; use "
                              "data=tokens (shards with an end-of-document id: python -m modforge prepare)")
        attention = (run.get("attention") or {}).get("name")
        if attention and not getattr(get("attention", attention).cls, "masks_documents", False):
            raise ConfigError(f"task.document_mask=true: attention={attention} takes no documents= mask")
        model = (run.get("model") or {}).get("name")
        if model and not getattr(get("model", model).cls, "masks_documents", False):
            raise ConfigError(f"task.document_mask=true: model={model} takes no documents= (decoder_only does)")
        return []


@register("task", "causal_lm", config=CausalLMConfig, defaults={"data": "stdlib"})
class CausalLM(Task):
    """Next-token prediction with teacher forcing; reports val loss and bits per character."""
    metric_ranges = {**Task.metric_ranges, "bpc": (0.0, None, "min"), "bpb": (0.0, None, "min"),
                     "ppl": (1.0, None, "min"), "acc": (0.0, 1.0, "max"), "acc_norm": (0.0, 1.0, "max")}

    model_needs = {"can_generate": True, "needs_source": False}
    model_role = "a causal decoder (next-token prediction must not see its targets)"
    data_needs = TOKENS

    @classmethod
    def declared_metrics(cls, cfg) -> list:
        """The validation metrics a run with task config ``cfg`` logs (after ``val/``): the task's own, and each
        evaluation task's ``<name>/acc``, ``<name>/acc_norm``, ``<name>/bpb``."""
        evals = load_tasks(getattr(cfg, "evals", None) or [], "task.evals")
        return [*super().declared_metrics(cfg), *(f"{t.name}/{m}" for t in evals for m in metric_names(t))]

    def __init__(self, cfg, run_cfg, facts):
        super().__init__(cfg, run_cfg, facts)
        self._eval_tasks = None  # read at the first validation: a checkpoint rebuilt elsewhere needs no task file
        if cfg.document_mask and facts.eod_id is None:
            raise ConfigError("task.document_mask=true: the data has no end-of-document id (prepared with eod=none?); "
                              "give data.eod_id=, or prepare the shards with eod=end|start")

    def forward_lm(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits for a batch of packed windows: with ``task.document_mask`` each token attends
        within its document only, at positions that restart there (``document_positions=restart``)."""
        if not self.cfg.document_mask:
            return self.model(x)
        documents, positions = document_ids(x, self.facts.eod_id, self.facts.eod_policy)
        at = {"positions": positions} if self.cfg.document_positions == "restart" else {}
        return self.model(x, documents=documents, **at)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.xent(self.forward_lm(x), y)
        self.count_tokens(y.numel())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    position_loss = None  # a PositionLoss while an evaluation records the loss at each position of the window

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.forward_lm(x)
        loss = self.xent(logits, y, smoothing=0.0)
        if self.position_loss is not None:
            self.position_loss.add(logits, y)
        n = int((y != IGNORE).sum())  # the mean over target tokens, whatever the batches
        self.log_mean("val/loss", loss, n, prog_bar=True)
        # bits per character: nats per token -> bits, times tokens per character of the val text
        if self.facts.tokens_per_char is not None:
            self.log_mean("val/bpc", bits(loss) * self.facts.tokens_per_char, n)
        if self.facts.tokens_per_byte is not None:  # bits per UTF-8 byte: comparable across tokenizers
            self.log_mean("val/bpb", bits(loss) * self.facts.tokens_per_byte, n)
        return loss

    def on_validation_epoch_end(self) -> None:
        """The downstream tasks of ``task.evals``, scored on the model as it is now; each DDP rank scores every
        world_size-th item, and the sums are reduced (one process's figures)."""
        if not self.cfg.evals:
            return
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        was_training = self.model.training
        self.model.eval()
        try:
            for t in self.eval_tasks():
                mine = range(rank, len(t), world)
                s = score(self.model, self.tokenizer, t, self.context_len, self.cfg.eval_batch_size, self.device,
                          items=mine) if len(mine) else Scores(t.name, t.kind)
                self.log_scores(s)
        finally:
            self.model.train(was_training)

    def eval_tasks(self) -> list:
        """``task.evals`` read once, at the first validation that scores them (the run's pre-flight has checked
        them already; rebuilding a checkpoint for ``eval``, ``generate`` or ``export`` never reads them)."""
        if self._eval_tasks is None:
            self._eval_tasks = load_tasks(self.cfg.evals, "task.evals")
        return self._eval_tasks

    def log_scores(self, s: Scores) -> None:
        if s.kind == "choice":
            n = max(s.items, 0)
            self.log_mean(f"val/{s.name}/acc", s.correct / n if n else 0.0, n)
            self.log_mean(f"val/{s.name}/acc_norm", s.correct_norm / n if n else 0.0, n)
        self.log_mean(f"val/{s.name}/bpb", s.bits / s.bytes if s.bytes else 0.0, s.bytes)

    def generate_text(self, prompt: str, max_new: int, temperature: float = 0.8, top_k: int = 0,
                      seed: int = 0) -> str:
        was_training = self.training
        self.eval()
        out = generate(self.model, self.tokenizer, prompt=prompt, strategy="sample", max_new=max_new,
                       temperature=temperature, top_k=top_k or None, seed=seed, max_context=self.context_len)
        self.train(was_training)
        return prompt + out

    def summary_sample(self):
        c = self.cfg
        if c.sample_chars <= 0:
            return None
        return self.generate_text(c.sample_prompt, c.sample_chars, c.sample_temperature, c.sample_top_k)


class PositionLoss:
    """The mean cross-entropy at each position of the evaluation windows (position 0 predicts the window's second
    token from its first): where in a window a model loses, e.g. past its training length. Sums per position,
    reduced over DDP ranks by :meth:`means`."""

    def __init__(self, length: int, device: Any = "cpu"):
        self.sums = torch.zeros(length, dtype=torch.float64, device=device)
        self.counts = torch.zeros(length, dtype=torch.float64, device=device)

    def add(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE,
                              reduction="none").view_as(y)
        real = (y != IGNORE)
        self.sums = self.sums.to(tok.device) + (tok * real).sum(0).double()
        self.counts = self.counts.to(tok.device) + real.sum(0).double()

    def means(self, strategy: Any = None) -> list:
        sums, counts = self.sums, self.counts
        if strategy is not None:
            sums, counts = strategy.reduce(sums, reduce_op="sum"), strategy.reduce(counts, reduce_op="sum")
        return [round(float(a / b), 6) if b > 0 else None for a, b in zip(sums.tolist(), counts.tolist())]


@dataclass
class MaskedLMConfig(TaskConfig):
    mask_prob: float = 0.15  # fraction of tokens selected for prediction
    replace_mask: float = 0.8  # of those: replaced by <mask>
    replace_random: float = 0.1  # replaced by a random token (the rest stay unchanged)

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"task.mask_prob={self.mask_prob}: must be in (0, 1)")
        if self.replace_mask + self.replace_random > 1.0:
            raise ConfigError("task.replace_mask + task.replace_random must be <= 1")


@register("task", "masked_lm", config=MaskedLMConfig, defaults={"data": "stdlib"})
class MaskedLM(Task):
    """BERT-style masked language modelling (15% of tokens; 80/10/10 replacement); reports masked accuracy."""

    model_needs = {"has_encoder": True, "needs_source": False}
    model_role = "a bidirectional encoder"
    metric_ranges = {**Task.metric_ranges, "masked_acc": (0.0, 1.0, "max")}
    data_needs = TOKENS

    def corrupt(self, x: torch.Tensor, generator: Optional[torch.Generator] = None):
        """-> (inputs, targets): targets are <pad> (ignored) except at the selected positions. The draws come from
        ``generator`` (a CPU one; default: the task's data stream, the same masks whatever the model), on the CPU,
        so that they are the same on every device."""
        c, tok = self.cfg, self.tokenizer
        g = self.data_generator if generator is None else generator
        u = torch.rand(x.shape, generator=g).to(x.device)
        selected = torch.rand(x.shape, generator=g).to(x.device) < c.mask_prob
        random_ids = torch.randint(tok.n_special, tok.vocab_size, x.shape, generator=g).to(x.device)
        targets = x.masked_fill(~selected, IGNORE)
        inputs = x.clone()
        inputs[selected & (u < c.replace_mask)] = tok.mask_id
        rnd = selected & (u >= c.replace_mask) & (u < c.replace_mask + c.replace_random)
        inputs[rnd] = random_ids[rnd]
        return inputs, targets

    def _step(self, x, generator=None):
        inputs, targets = self.corrupt(x, generator)
        logits = self.model(inputs)
        sel = targets != IGNORE
        acc = (logits.argmax(-1)[sel] == targets[sel]).float().mean() if sel.any() else torch.tensor(0.0)
        return logits, targets, acc, int(sel.sum())

    def training_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        inputs, targets = self.corrupt(x)
        self.see(inputs, targets)  # the masks too: the same in two runs with one seed
        logits = self.model(inputs)
        loss = self.xent(logits, targets)
        self.count_tokens(x.numel())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        gen = torch.Generator().manual_seed(batch_idx)  # same masks at every evaluation
        logits, targets, acc, n = self._step(x, gen)
        loss = self.xent(logits, targets, smoothing=0.0)
        self.log_mean("val/loss", loss, n, prog_bar=True)  # over the masked tokens
        self.log_mean("val/masked_acc", acc, n, prog_bar=True)
        return loss


