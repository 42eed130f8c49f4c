"""Decoding: greedy and sampling (temperature, top-k, top-p), batched, with a KV cache.

A :class:`Stepper` hides the architecture: ``start()`` consumes the prompt (or
encodes the source and feeds <bos>) and returns the logits of the next token;
``step(tokens)`` appends one token per row and returns the next logits. With
``use_cache=True`` each step runs one position through the decoder, reusing
the cached keys and values (cross-attention keys/values are computed once per
source); with ``use_cache=False`` it recomputes the whole prefix, which is the
reference the cached path is tested against.
"""
from typing import Optional

import torch
import torch.nn.functional as F


class Stepper:
    """Incremental decoding over a decoder-only model or the decoder of an encoder-decoder."""

    def __init__(self, model, prefix: torch.Tensor, *, src: Optional[torch.Tensor] = None,
                 src_mask: Optional[torch.Tensor] = None, use_cache: bool = True):
        self.model, self.use_cache = model, use_cache
        self.seq = prefix
        self.src_mask = src_mask
        self.memory = model.encode(src, src_mask) if src is not None else None
        self.cache = model.new_cache(model.cfg.max_len) if use_cache else None
        self.fed = 0  # tokens of self.seq already in the cache

    def _logits(self, tokens: torch.Tensor, offset: int) -> torch.Tensor:
        if self.memory is None:
            return self.model(tokens, cache=self.cache, offset=offset)
        return self.model.decode(tokens, self.memory, self.src_mask, cache=self.cache, offset=offset)

    def _run(self) -> torch.Tensor:
        if self.use_cache:
            logits = self._logits(self.seq[:, self.fed :], self.fed)
            self.fed = self.seq.shape[1]
        else:
            logits = self._logits(self.seq, 0)
        return logits[:, -1].float()

    def start(self) -> torch.Tensor:
        return self._run()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.seq = torch.cat([self.seq, tokens.view(-1, 1)], dim=1)
        return self._run()


def filter_logits(logits: torch.Tensor, top_k: Optional[int] = None, top_p: Optional[float] = None) -> torch.Tensor:
    """Keep the top-k logits and/or the smallest set whose probability reaches top_p; -inf elsewhere."""
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # tokens entirely beyond the nucleus
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


@torch.no_grad()
def decode(stepper: Stepper, max_new: int, *, eos_id: Optional[int] = None, pad_id: int = 0,
           strategy: str = "greedy", temperature: float = 1.0, top_k: Optional[int] = None,
           top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Generate up to ``max_new`` tokens per row -> (B, n); rows that emitted <eos> are padded after it."""
    logits = stepper.start()
    B = logits.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=logits.device)
    out = []
    for i in range(max_new):
        if strategy == "greedy":
            nxt = logits.argmax(-1)
        else:
            probs = filter_logits(logits / max(temperature, 1e-8), top_k, top_p).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = nxt.masked_fill(done, pad_id)
        out.append(nxt)
        if eos_id is not None:
            done = done | (nxt == eos_id)
            if bool(done.all()):
                break
        if i + 1 < max_new:
            logits = stepper.step(nxt)
    return torch.stack(out, dim=1) if out else torch.empty(B, 0, dtype=torch.long)
