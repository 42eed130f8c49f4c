"""Ranked log-likelihood and bits per byte: how a causal model is scored on a task (lm-evaluation-harness's
conventions, so that a figure here is the figure there).

* A request is (context, continuation). As lm-evaluation-harness's ``_encode_pair``: trailing spaces of the
  context move to the continuation, the continuation's ids are those of ``encode(context + continuation)`` past
  ``encode(context)``'s, an empty context becomes the end-of-text id, and the input is the last
  ``max_len + 1`` ids less the last; the continuation's log-probability is the sum over its ids.
* Multiple choice: ``acc`` is the share of items whose right choice has the highest log-probability;
  ``acc_norm`` divides each choice's log-probability by its length in characters first, less one leading space
  (lm-evaluation-harness's ``acc_norm``, whose choices exclude the ``target_delimiter``); ``bpb`` is the right continuations' bits over their UTF-8 bytes, summed over the items
  (the DataDecide / OLMo measure that ranks small models where accuracy is still at chance).
* Text: ``bpb`` over all the items' bytes, each text cut into windows of ``max_len`` predicted tokens, each
  window conditioned on the token before it, the last and shorter one on a full window's worth
  (lm-evaluation-harness's rolling windows with context 1, :func:`rolling_windows`).
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from modforge.evals.tasks import CHOICE, EvalTask

LN2 = math.log(2)


def encode_pair(tokenizer, context: str, continuation: str, prefix_id: int) -> tuple:
    """(context ids, continuation ids), as lm-evaluation-harness splits them."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    cont = whole[len(ctx):]
    return (ctx if ctx else [prefix_id]), cont


@torch.no_grad()
def loglikelihoods(model: Callable, requests: Sequence[tuple], max_len: int, batch_size: int = 16,
                   device=None) -> list:
    """[(sum of log-probabilities, greedy)] of each (context ids, continuation ids): ``greedy`` says whether
    every continuation id is the model's argmax there. Requests are run longest first, padded on the right."""
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]) - len(requests[i][1]))
    out: list = [None] * len(requests)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        rows, spans = [], []
        for i in idx:
            ctx, cont = requests[i]
            inp = (list(ctx) + list(cont))[-(max_len + 1):]
            n_cont = min(len(cont), len(inp) - 1)
            rows.append(inp[:-1])
            spans.append((len(inp) - 1, n_cont, inp[len(inp) - n_cont:]))
        width = max(len(r) for r in rows)
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for r, row in enumerate(rows):
            x[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        logits = model(x.to(device) if device is not None else x)
        for r, (i, (length, n, targets)) in enumerate(zip(idx, spans)):
            lp = F.log_softmax(logits[r, length - n : length].float(), dim=-1)
            t = torch.tensor(targets, dtype=torch.long, device=lp.device)
            out[i] = (float(lp.gather(-1, t[:, None]).double().sum()), bool((lp.argmax(-1) == t).all()))
    return out


@torch.no_grad()
def rolling_loglikelihood(model: Callable, ids: Sequence[int], prefix_id: int, max_len: int, batch_size: int = 16,
                          device=None) -> float:
    """The sum of log-probabilities of every id of ``ids``, in windows of ``max_len`` predicted ids, each
    conditioned on the id before it (the first on ``prefix_id``)."""
    return sum(ll for ll, _ in loglikelihoods(model, rolling_windows(list(ids), prefix_id, max_len), max_len,
                                              batch_size, device))


def rolling_windows(ids: list, prefix_id: int, max_len: int) -> list:
    """(context, continuation) pairs that predict every id of ``ids`` once, as lm-evaluation-harness's
    ``get_rolling_token_windows`` with one token of context and ``make_disjoint_window`` make them: windows of
    ``max_len`` predicted ids, each after the id before it (the first after ``prefix_id``); the last, shorter
    window keeps a full ``max_len`` of input, so its context is longer."""
    if not ids:
        return []
    first = min(max_len, len(ids))
    out = [([prefix_id], ids[:first])]
    done = first
    while done < len(ids):
        n = min(len(ids) - done, max_len)
        end = done + n
        window = ids[max(0, end - max_len - 1): end - 1]
        out.append((window[: len(window) - (n - 1)], ids[end - n: end]))
        done = end
    return out


@dataclass
class Scores:
    """A task's sums (so that DDP ranks, or batches, add up): ``correct``, ``correct_norm`` and ``items`` for
    multiple choice; ``bits`` and ``bytes`` for bits per byte."""

    name: str
    kind: str
    items: int = 0
    correct: float = 0.0
    correct_norm: float = 0.0
    bits: float = 0.0
    bytes: int = 0

    def metrics(self) -> dict:
        out = {"bpb": self.bits / self.bytes if self.bytes else float("nan")}
        if self.kind == CHOICE:
            out = {"acc": self.correct / self.items, "acc_norm": self.correct_norm / self.items, **out}
        return out


def score(model: Callable, tokenizer, task: EvalTask, max_len: int, batch_size: int = 16, device=None,
          items: Optional[Sequence[int]] = None, prefix_id: Optional[int] = None) -> Scores:
    """Score ``task`` (its items ``items``: all by default) with ``model`` (ids (B, T) -> logits (B, T, V))."""
    prefix = tokenizer.eos_id if prefix_id is None else prefix_id
    if prefix is None:
        from modforge.errors import ConfigError

        raise ConfigError(f"task {task.name}: the model's tokenizer has no end-of-text id, which stands for an empty "
                          "context and starts each text; these evaluations need one")
    chosen = [task.items[i] for i in (range(len(task.items)) if items is None else items)]
    s = Scores(task.name, task.kind, items=len(chosen))
    if task.kind == CHOICE:
        reqs, owners = [], []
        for j, it in enumerate(chosen):
            for c in it["choices"]:
                reqs.append(encode_pair(tokenizer, it["context"], c, prefix))
                owners.append(j)
        lls = loglikelihoods(model, reqs, max_len, batch_size, device)
        k = 0
        for it in chosen:
            n = len(it["choices"])
            ll = [v for v, _ in lls[k : k + n]]
            k += n
            gold = it["label"]
            s.correct += float(_argmax(ll) == gold)
            s.correct_norm += float(_argmax([v / norm_length(c) for v, c in zip(ll, it["choices"])]) == gold)
            s.bits += -ll[gold] / LN2
            s.bytes += len(it["choices"][gold].encode("utf-8"))
        return s
    for it in chosen:
        s.bits += -rolling_loglikelihood(model, tokenizer.encode(it["text"]), prefix, max_len, batch_size,
                                         device) / LN2
        s.bytes += len(it["text"].encode("utf-8"))
    return s


def norm_length(choice: str) -> int:
    """The length ``acc_norm`` divides by: the choice's characters less one leading space, which is
    lm-evaluation-harness's ``target_delimiter`` (its ``acc_norm`` divides by the choice without it)."""
    return max(1, len(choice) - (1 if choice.startswith(" ") else 0))


def _argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (numpy's and lm-evaluation-harness's tie rule)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best
