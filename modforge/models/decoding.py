"""Decoding: greedy, beam search and sampling (temperature, top-k, top-p), batched, with a KV cache.

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


class Stepper:
    """Incremental decoding over a decoder-only model or the decoder of an encoder-decoder.

    ``max_context`` bounds how many tokens the decoder attends to (default
    ``model.max_len``; pass the training length so that learned positions stay
    in the range they were trained on). When the context would outgrow it, the
    oldest tokens are dropped down to half of it and the rest is re-encoded
    from position 0 (nanoGPT crops the same way, but at every step; halving
    keeps the cache useful). The uncached path applies the same rule, so both
    produce the same tokens.

    ``prefix_mask`` (B, T), True at real tokens, decodes a batch of prompts of
    different lengths padded on the left: each row's positions count its real
    tokens only (position 0 at its first real token), and its padding is never
    attended to, so every row decodes exactly as it would alone.
    """

    def __init__(self, model, prefix: torch.Tensor, *, src: Optional[torch.Tensor] = None,
                 src_mask: Optional[torch.Tensor] = None, use_cache: bool = True,
                 max_context: Optional[int] = None, prefix_mask: Optional[torch.Tensor] = None):
        # a part whose output mixes positions at eval (norm=batch_causal) cannot decode one position at a time
        mixes = any(getattr(m, "mixes_positions", False) for m in model.modules())
        self.model, self.use_cache = model, use_cache and not mixes
        self.max_context = min(max_context or model.cfg.max_len, model.cfg.max_len)
        self.seq = prefix
        self.mask = None if prefix_mask is None or bool(prefix_mask.all()) else prefix_mask.bool()
        self.src_mask = src_mask
        self.memory = model.encode(src, src_mask) if src is not None else None
        self.cache = model.new_cache(self.max_context) if self.use_cache else None
        self.start_at = max(0, prefix.shape[1] - self.max_context)  # first token of the current context
        self.fed = self.start_at  # tokens of self.seq already in the cache

    def _logits(self, tokens: torch.Tensor, offset: int) -> torch.Tensor:
        if self.memory is None:
            if self.mask is None:
                return self.model(tokens, cache=self.cache, offset=offset)
            # each row's positions count its real tokens in the current context; pads are masked keys
            window = self.mask[:, self.start_at :]
            positions = (window.cumsum(1) - 1).clamp(min=0)[:, offset : offset + tokens.shape[1]]
            return self.model(tokens, mask=window[:, offset : offset + tokens.shape[1]], cache=self.cache,
                              offset=offset, positions=positions)
        return self.model.decode(tokens, self.memory, self.src_mask, cache=self.cache, offset=offset)

    def _run(self) -> torch.Tensor:
        if self.seq.shape[1] - self.start_at > self.max_context:  # slide: keep the newest half
            self.start_at = self.seq.shape[1] - max(1, self.max_context // 2)
            self.fed = self.start_at
            if self.use_cache:
                self.cache = self.model.new_cache(self.max_context)
        if self.use_cache:
            logits = self._logits(self.seq[:, self.fed :], self.fed - self.start_at)
            self.fed = self.seq.shape[1]
        else:
            logits = self._logits(self.seq[:, self.start_at :], 0)
        return logits[:, -1].float()

    def start(self) -> torch.Tensor:
        return self._run()

    def reorder(self, index: torch.Tensor) -> None:
        """Keep (or replicate) the batch rows ``index``: beam search's bookkeeping."""
        self.seq = self.seq.index_select(0, index)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index) if self.src_mask is not None else None
        for layer in self.cache or []:
            for c in layer.values():
                c.reorder(index)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.seq = torch.cat([self.seq, tokens.view(-1, 1)], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
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


@torch.no_grad()
def beam_search(stepper: Stepper, max_new: int, *, beam_size: int = 4, eos_id: Optional[int] = None,
                pad_id: int = 0, length_penalty: float = 1.0) -> torch.Tensor:
    """Beam search -> the best hypothesis per row, (B, n), padded after <eos>.

    Each step keeps the ``w`` best extensions of the live hypotheses (``w`` =
    the live beam width, ``beam_size`` at first); extensions that end in <eos>
    retire as finished and the beam narrows by one, so a row stops when all its
    beams have finished (the "shrinking beam" of Marian and OpenNMT). Finished
    and, at the length limit, unfinished hypotheses are ranked by sum of
    log-probabilities / length ** length_penalty (fairseq's and Hugging Face's
    normalisation: 0 = none; larger values favour longer outputs).
    ``beam_size=1`` is exactly greedy decoding.
    """
    K = beam_size
    logp = stepper.start().log_softmax(-1)  # (B, V)
    B, V = logp.shape
    device = logp.device
    rows = torch.arange(B, device=device).repeat_interleave(K)
    stepper.reorder(rows)
    logp = logp.index_select(0, rows)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # at the start all beams are the same: expand only one
    width = torch.full((B, 1), K, device=device)  # live beams per row
    rank = torch.arange(K, device=device)
    base = torch.arange(B, device=device)[:, None] * K
    tokens = torch.empty(B * K, 0, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(max_new):
        # every step is tensor work; Python only touches the (rare) candidates that end in <eos>
        top_s, top_i = (scores.view(-1, 1) + logp).view(B, K * V).topk(K, dim=1)
        beam, tok = top_i // V, top_i % V
        valid = (rank < width) & (top_s > float("-inf"))  # the first w candidates of each row
        ends = valid & (tok == eos_id) if eos_id is not None else torch.zeros_like(valid)
        if bool(ends.any()):
            for b, k in ends.nonzero().tolist():
                hyp = tokens[b * K + beam[b, k]].tolist() + [eos_id]
                finished[b].append((float(top_s[b, k]) / len(hyp) ** length_penalty, hyp))
        live = valid & ~ends
        order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)  # live candidates first, in rank order
        live = live.gather(1, order)
        scores = top_s.gather(1, order).masked_fill(~live, float("-inf"))
        beam = beam.gather(1, order).masked_fill(~live, 0)
        step_tok = tok.gather(1, order).masked_fill(~live, pad_id).view(-1)
        width = live.sum(1, keepdim=True)
        src_rows = (base + beam).view(-1)
        tokens = torch.cat([tokens.index_select(0, src_rows), step_tok[:, None]], dim=1)
        if t + 1 == max_new or not bool(width.any()):
            break
        stepper.reorder(src_rows)
        logp = stepper.step(step_tok).log_softmax(-1)
    best = []
    widths, scores_l = width.view(-1).tolist(), scores.tolist()
    for b in range(B):
        hyps = list(finished[b])
        for k in range(widths[b]):  # out of length: live beams compete too
            hyp = tokens[b * K + k].tolist()
            hyps.append((scores_l[b][k] / max(len(hyp), 1) ** length_penalty, hyp))
        best.append(max(hyps, key=lambda h: h[0])[1] if hyps else [])
    n = max((len(h) for h in best), default=0)
    out = torch.full((B, n), pad_id, dtype=torch.long, device=device)
    for b, h in enumerate(best):
        out[b, : len(h)] = torch.tensor(h, dtype=torch.long)
    return out


STRATEGIES = ("greedy", "beam", "sample")


@torch.no_grad()
def generate(model, tokenizer, *, prompt: str = "", src: Optional[str] = None, strategy: str = "greedy",
             max_new: int = 200, beam_size: int = 4, length_penalty: float = 1.0, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
             use_cache: bool = True, max_context: Optional[int] = None) -> str:
    """Text in, text out, for any model that ``can_generate``; returns the generated continuation."""
    from modforge.registry import ConfigError

    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy={strategy!r}: allowed values are {', '.join(STRATEGIES)}")
    if not model.can_generate:
        raise ConfigError(f"{type(model).__name__} has no autoregressive decoder: it cannot generate text")
    if model.needs_source and src is None:
        raise ConfigError("this model translates a source: give src=\"...\"")
    if not model.needs_source and src:
        raise ConfigError(f"src={src}: this model ({type(model).__name__}) reads no source; it continues prompt=")
    device = next(model.parameters()).device
    max_len = model.cfg.max_len
    if model.needs_source:
        src_tokens = tokenizer.encode(src)
        if len(src_tokens) > max_len:
            raise ConfigError(f"src=: {len(src_tokens)} tokens, longer than the model's {max_len} positions "
                              "(model.max_len); shorten it")
        src_ids = torch.tensor([src_tokens], device=device)
        ids = [tokenizer.bos_id] + tokenizer.encode(prompt)
        stepper_kw = {"src": src_ids, "src_mask": torch.ones_like(src_ids, dtype=torch.bool)}
    else:
        ids = tokenizer.encode(prompt) or [tokenizer.bos_id]
        stepper_kw = {}
    max_new = max(1, max_new)
    stepper = Stepper(model, torch.tensor([ids], device=device), use_cache=use_cache, max_context=max_context,
                      **stepper_kw)
    if strategy == "beam":
        out = beam_search(stepper, max_new, beam_size=beam_size, eos_id=tokenizer.eos_id,
                          pad_id=tokenizer.pad_id, length_penalty=length_penalty)
    else:
        gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        out = decode(stepper, max_new, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, strategy=strategy,
                     temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
    return tokenizer.decode(out[0].tolist())
