"""Sequence-to-sequence tasks: one problem (source -> target pairs), learnt by each kind of architecture.

* ``seq2seq``: an encoder-decoder (Vaswani et al. 2017): teacher forcing in training, greedy (or beam)
  decoding of the target from the encoded source in validation;
* ``seq2seq_lm``: a decoder-only model reads ``source <bos> target <eos>`` as one causal sequence, the loss
  on the target only (the source is a prompt: Raffel et al. 2020's "language model" objective with a
  prefix, causal over the prefix too, not their fully visible "prefix LM" mask); validation decodes
  greedily after ``source <bos>``;
* ``transduce``: an encoder-only model predicts the target token at each source position, for tasks whose
  target is as long as its source (``reverse``, ``sort``); no decoding.

All three report, over the validation pairs, ``val/loss`` and ``val/token_acc`` (per target token; the
generative two also predict <eos>), ``val/target_loss`` (the cross-entropy per token of the target itself,
<eos> left out: the same tokens scored for all three, so the one loss they can be compared on) and
``val/exact_match`` (the fraction of pairs whose whole target is right), so the architectures can be compared
on one task.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from modforge.data.base import PAIRS
from modforge.models.decoding import Stepper, beam_search, decode
from modforge.registry import ConfigError, ModforgeError, register
from modforge.tasks.base import IGNORE, Task, TaskConfig


@dataclass
class PairsConfig(TaskConfig):
    decode_in_val: bool = True  # report val/exact_match (the generative tasks decode the val set greedily)
    max_decode_len: int = 64

    def __post_init__(self):
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        if self.max_decode_len < 1:
            raise ConfigError(f"task.max_decode_len={self.max_decode_len}: must be >= 1 (tokens decoded per target)")


@dataclass
class Seq2SeqConfig(PairsConfig):
    val_beam_size: int = 0  # > 0: also beam-decode the val set (val/exact_match_beam)
    length_penalty: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.val_beam_size < 0:
            raise ConfigError(f"task.val_beam_size={self.val_beam_size}: must be >= 0 (0: no beam decoding in "
                              "validation; k: beams of width k)")


class PairsTask(Task):
    """Base of the tasks on source -> target pairs: subclasses say how the model is run with teacher forcing
    (:meth:`teacher_forced`) and how it predicts a whole target (:meth:`predict`); training, the validation
    metrics and the end-of-run sample are shared."""
    metric_ranges = {**Task.metric_ranges, "target_loss": (0.0, None, "min"), "token_acc": (0.0, 1.0, "max"),
                     "exact_match": (0.0, 1.0, "max"), "exact_match_beam": (0.0, 1.0, "max")}

    data_needs = PAIRS

    def teacher_forced(self, b) -> tuple:
        """-> (logits (B, L, V), targets (B, L), IGNORE where there is no loss, input tokens read)."""
        raise NotImplementedError

    def predict(self, b) -> torch.Tensor:
        """The model's whole answer for each row (B, n), <pad> after its end, to compare with :meth:`wanted`."""
        raise NotImplementedError

    def wanted(self, b) -> torch.Tensor:
        return b["tgt_out"]  # target + <eos>, <pad> after

    def training_step(self, b, batch_idx):
        logits, targets, n_in = self.teacher_forced(b)
        loss = self.xent(logits, targets)
        self.count_tokens(n_in)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, b, batch_idx):
        logits, targets, _ = self.teacher_forced(b)
        loss = self.xent(logits, targets, smoothing=0.0)
        real = targets != IGNORE
        acc = (logits.argmax(-1)[real] == targets[real]).float().mean()
        n = int(real.sum())
        self.log_mean("val/loss", loss, n, prog_bar=True)  # means over target tokens ...
        self.log_mean("val/token_acc", acc, n, prog_bar=True)
        target_loss, k = self.target_loss(logits, targets)
        if k:
            self.log_mean("val/target_loss", target_loss, k)
        if self.cfg.decode_in_val:  # ... and over pairs
            self.log_mean("val/exact_match", self.exact_match(b), b["src"].shape[0], prog_bar=True)
        return loss

    def target_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple:
        """(mean cross-entropy, tokens) over the target's own tokens: not :data:`IGNORE` and not <eos>, which only
        the generative tasks predict (an encoder-only model's target has none), so every task scores the same
        tokens of a pair. The mean is NaN where there are none."""
        content = (targets != IGNORE) & (targets != self.tokenizer.eos_id)
        k = int(content.sum())
        return (F.cross_entropy(logits[content].float(), targets[content]) if k else logits.new_tensor(math.nan)), k

    def exact_match(self, b, **kw) -> torch.Tensor:
        """Fraction of rows whose predicted target equals the wanted one (through <eos> where there is one)."""
        want = self.wanted(b)
        out = self.predict(b, **kw)
        T = want.shape[1]
        if out.shape[1] < T:  # every row stopped early: pad to compare
            out = torch.cat([out, out.new_full((out.shape[0], T - out.shape[1]), self.tokenizer.pad_id)], 1)
        return (out[:, :T] == want).all(dim=1).float().mean()

    def summary_sample(self):
        """The first validation source, the model's answer and the reference."""
        tok = self.tokenizer
        b = next(iter(self.trainer.datamodule.val_dataloader()))
        b = {k: v[:1].to(self.device) for k, v in b.items()}
        was = self.training
        self.eval()
        with torch.no_grad():
            out = self.predict(b)
        self.train(was)
        return (f"{tok.decode(b['src'][0].tolist())} -> {tok.decode(out[0].tolist())}  "
                f"(reference: {tok.decode(self.wanted(b)[0].tolist())})")

    def decode_limit(self, T: int, used: int = 0) -> int:
        """Tokens to generate for targets of width T: within max_decode_len and the model's positions."""
        return max(1, min(T, self.cfg.max_decode_len, self.model.cfg.max_len - 1 - used))


@register("task", "seq2seq", config=Seq2SeqConfig, defaults={"data": "reverse"})
class Seq2Seq(PairsTask):
    """Encoder-decoder training with teacher forcing; reports token accuracy and greedy exact match."""

    model_needs = {"needs_source": True}
    model_role = "an encoder-decoder (a decoder conditioned on an encoded source)"

    def teacher_forced(self, b):
        logits = self.model(b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"])
        targets = b["tgt_out"].masked_fill(~b["tgt_mask"], IGNORE)
        return logits, targets, int(b["src_mask"].sum() + b["tgt_mask"].sum())

    def validation_step(self, b, batch_idx):
        loss = super().validation_step(b, batch_idx)
        if self.cfg.val_beam_size > 0:
            self.log_mean("val/exact_match_beam", self.exact_match(b, beam=self.cfg.val_beam_size), b["src"].shape[0])
        return loss

    @torch.no_grad()
    def translate(self, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, beam: int = 0) -> torch.Tensor:
        """Greedy (beam=0) or beam-search decoding of a batch of sources -> (B, n) ids."""
        tok = self.tokenizer
        prefix = torch.full((src.shape[0], 1), tok.bos_id, dtype=torch.long, device=src.device)
        stepper = Stepper(self.model, prefix, src=src, src_mask=src_mask)
        if beam > 0:
            return beam_search(stepper, max_len, beam_size=beam, eos_id=tok.eos_id, pad_id=tok.pad_id,
                               length_penalty=self.cfg.length_penalty)
        return decode(stepper, max_len, eos_id=tok.eos_id, pad_id=tok.pad_id)

    def predict(self, b, beam: int = 0) -> torch.Tensor:
        return self.translate(b["src"], b["src_mask"], self.decode_limit(b["tgt_out"].shape[1]), beam)


@register("task", "seq2seq_lm", config=PairsConfig, defaults={"data": "reverse"})
class Seq2SeqLM(PairsTask):
    """A pair task for a decoder-only model: ``source <bos> target <eos>`` as one causal sequence, the loss on
    the target only; exact match by greedy decoding after ``source <bos>``."""

    model_needs = {"can_generate": True, "needs_source": False}
    model_role = "a causal decoder (it reads the source as a prompt)"

    def __init__(self, cfg, run_cfg, facts):
        super().__init__(cfg, run_cfg, facts)
        need = 2 * facts.positions  # the longest source, <bos>, the longest target and <eos>, less one
        if need > self.model.cfg.max_len:
            raise ConfigError(f"model.max_len={self.model.cfg.max_len}: task=seq2seq_lm reads source and target "
                              f"as one sequence of up to {need} positions here; raise model.max_len")

    def joined(self, b) -> tuple:
        """-> inputs ``source <bos> target`` (B, L) and targets (B, L): IGNORE under the source, then
        ``target <eos>``; rows right-padded (a causal model's real positions never see the padding)."""
        pad = self.tokenizer.pad_id
        s_len, t_len = b["src_mask"].sum(1).tolist(), b["tgt_mask"].sum(1).tolist()  # t: target + 1
        B, L = len(s_len), max(s + t for s, t in zip(s_len, t_len))
        x = b["src"].new_full((B, L), pad)
        y = b["src"].new_full((B, L), IGNORE)
        for i, (s, t) in enumerate(zip(s_len, t_len)):
            x[i, :s], x[i, s:s + t] = b["src"][i, :s], b["tgt_in"][i, :t]
            y[i, s:s + t] = b["tgt_out"][i, :t]
        return x, y, sum(s_len) + sum(t_len)

    def teacher_forced(self, b):
        x, y, n = self.joined(b)
        return self.model(x), y, n

    @torch.no_grad()
    def predict(self, b) -> torch.Tensor:
        """Greedy decoding after ``source <bos>``, the rows of each source length together (no padding inside a
        prompt, so every row is decoded exactly as it would be alone)."""
        tok, T = self.tokenizer, b["tgt_out"].shape[1]
        s_len = b["src_mask"].sum(1)
        out = b["src"].new_full((b["src"].shape[0], T), tok.pad_id)
        for s in s_len.unique().tolist():
            rows = (s_len == s).nonzero().squeeze(1)
            prompt = torch.cat([b["src"][rows, :s], b["src"].new_full((len(rows), 1), tok.bos_id)], dim=1)
            got = decode(Stepper(self.model, prompt), self.decode_limit(T, s + 1), eos_id=tok.eos_id,
                         pad_id=tok.pad_id)
            out[rows, : got.shape[1]] = got[:, :T]
        return out


@register("task", "transduce", config=PairsConfig, defaults={"data": "reverse"})
class Transduce(PairsTask):
    """A pair task for an encoder-only model whose targets are as long as their sources: the target token at
    each source position, predicted all at once (no <eos>, no decoding)."""

    model_needs = {"has_encoder": True, "needs_source": False}
    model_role = "a bidirectional encoder"

    def wanted(self, b) -> torch.Tensor:
        """The target at the source's positions (B, S), <pad> after it."""
        src_n, tgt_n = b["src_mask"].sum(1), b["tgt_mask"].sum(1) - 1
        if not torch.equal(src_n, tgt_n):
            i = int((src_n != tgt_n).nonzero()[0])
            raise ModforgeError(f"task=transduce predicts one target token per source token, but a pair of "
                                f"data={self.run_cfg['data']['name']} has a source of {int(src_n[i])} and a target "
                                f"of {int(tgt_n[i])} tokens; use task=seq2seq or task=seq2seq_lm for such data")
        S, pad = b["src"].shape[1], self.tokenizer.pad_id
        y = b["tgt_out"][:, :S].masked_fill(~b["src_mask"], pad)
        return y.masked_fill(y == self.tokenizer.eos_id, pad) if y.shape[1] else y

    def teacher_forced(self, b):
        targets = self.wanted(b).masked_fill(~b["src_mask"], IGNORE)  # wanted() checks the lengths
        return self.model(b["src"], b["src_mask"]), targets, int(b["src_mask"].sum())

    @torch.no_grad()
    def predict(self, b) -> torch.Tensor:
        out = self.model(b["src"], b["src_mask"]).argmax(-1)
        return out.masked_fill(~b["src_mask"], self.tokenizer.pad_id)
