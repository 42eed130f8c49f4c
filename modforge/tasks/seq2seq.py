"""Sequence-to-sequence task (``seq2seq``): teacher forcing in training, greedy decoding in validation."""
from dataclasses import dataclass

import torch

from modforge.data.base import PAIRS
from modforge.decoding import Stepper, beam_search, decode
from modforge.registry import register
from modforge.tasks.base import Task, TaskConfig


@dataclass
class Seq2SeqConfig(TaskConfig):
    decode_in_val: bool = True  # greedy-decode the val set and report exact match
    val_beam_size: int = 0  # > 0: also beam-decode the val set (val/exact_match_beam)
    length_penalty: float = 1.0
    max_decode_len: int = 64


@register("task", "seq2seq", config=Seq2SeqConfig, defaults={"data": "reverse"})
class Seq2Seq(Task):
    """Encoder-decoder training with teacher forcing; reports token accuracy and greedy exact match."""

    model_needs = {"needs_source": True}
    model_role = "an encoder-decoder (a decoder conditioned on an encoded source)"
    data_needs = PAIRS

    def _forward(self, b):
        return self.model(b["src"], b["tgt_in"], b["src_mask"], b["tgt_mask"])

    def training_step(self, b, batch_idx):
        loss = self.xent(self._forward(b), b["tgt_out"])
        self.count_tokens(int(b["src_mask"].sum() + b["tgt_mask"].sum()))
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, b, batch_idx):
        logits = self._forward(b)
        loss = self.xent(logits, b["tgt_out"], smoothing=0.0)
        real = b["tgt_out"] != self.tokenizer.pad_id
        acc = (logits.argmax(-1)[real] == b["tgt_out"][real]).float().mean()
        B, n = b["src"].shape[0], int(real.sum())
        self.log_mean("val/loss", loss, n, prog_bar=True)  # means over target tokens ...
        self.log_mean("val/token_acc", acc, n, prog_bar=True)
        if self.cfg.decode_in_val:  # ... and over pairs
            self.log_mean("val/exact_match", self.exact_match(b), B, prog_bar=True)
        if self.cfg.val_beam_size > 0:
            self.log_mean("val/exact_match_beam", self.exact_match(b, beam=self.cfg.val_beam_size), B)
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

    def exact_match(self, b, beam: int = 0) -> torch.Tensor:
        """Fraction of rows whose decoded output equals the target (through <eos>)."""
        want = b["tgt_out"]
        T = want.shape[1]
        out = self.translate(b["src"], b["src_mask"], min(T, self.cfg.max_decode_len, self.model.cfg.max_len - 1), beam)
        if out.shape[1] < T:  # every row stopped early: pad to compare
            out = torch.cat([out, out.new_full((out.shape[0], T - out.shape[1]), self.tokenizer.pad_id)], 1)
        return (out[:, :T] == want).all(dim=1).float().mean()

    def summary_sample(self):
        """The first validation source, its greedy translation and its reference."""
        tok = self.tokenizer
        b = next(iter(self.trainer.datamodule.val_dataloader()))
        src, mask = b["src"][:1].to(self.device), b["src_mask"][:1].to(self.device)
        was = self.training
        self.eval()
        out = self.translate(src, mask, min(self.cfg.max_decode_len, self.model.cfg.max_len - 1))
        self.train(was)
        return f"{tok.decode(src[0].tolist())} -> {tok.decode(out[0].tolist())}  (reference: {tok.decode(b['tgt_out'][0].tolist())})"
