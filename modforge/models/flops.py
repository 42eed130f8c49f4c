"""Training FLOPs from the shapes a run really trains at.

:class:`FlopCount` hooks every :class:`~modforge.models.blocks.Stack` of a module (the encoder, the decoder) and
every Linear outside them (the output projection, BERT's head transform, a classifier), and adds up, at each
training forward pass, the matrix products at that batch's real sizes: queries, keys and values, attention
scores and values over the whole n_q x n_kv matrix (SDPA computes it, causal or not), cross-attention over the
encoder's positions, the feed-forward block, the head. Each side is counted apart. Norms, activations, softmax
and residual additions are left out (a few percent at these sizes, and what ``torch.utils.flop_counter`` leaves
out too). Training is 3x the forward pass (the backward pass takes two matrix products for each of the
forward's: Kaplan et al. 2020), so ``train`` = 3 * forward.

Only forward passes in training mode with gradients count: validations, generation and the step-0 evaluation
do not. Under ``torch.compile`` the hooks add to small integer tensors on the CPU instead of Python ints: Dynamo
guards on a Python int it reads, so ``count += n`` would change the guarded value at every step and recompile
the model each step until its recompile limit, then run it eagerly (what the first GPU check measured: the
compiled GPT-2 small at 0.67x plain torch). The tensors are folded into the ints whenever the count is read.
"""
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from modforge.models.blocks import Stack


class FlopCount:
    def __init__(self, root: nn.Module):
        self._counted: dict = defaultdict(int)  # part ("encoder", "decoder", "head") -> forward FLOPs so far
        stacks = [(name, m) for name, m in root.named_modules() if isinstance(m, Stack)]
        inside = {id(x) for _, s in stacks for x in s.modules()}
        parts = [name.rsplit(".", 1)[-1] for name, _ in stacks] + ["head"]
        # under torch.compile: one step's FLOPs, folded into _counted when read (int64: a step's count fits)
        self._traced = {part: torch.zeros((), dtype=torch.int64) for part in parts}
        for name, stack in stacks:
            stack.register_forward_hook(self._stack(name.rsplit(".", 1)[-1]), with_kwargs=True)
        for _, m in root.named_modules():
            if isinstance(m, nn.Linear) and id(m) not in inside:
                m.register_forward_hook(self._linear)

    def _add(self, part: str, n: int) -> None:
        if torch.compiler.is_compiling():
            self._traced[part].add_(n)  # in the graph: no Python int read, no guard on the count
        else:
            self._counted[part] += n

    def _stack(self, part: str):
        def hook(module: Stack, args: tuple, kwargs: dict, out: Any) -> None:
            if module.training and torch.is_grad_enabled():
                x = args[0] if args else kwargs["x"]
                memory = kwargs.get("memory")
                self._add(part, x.shape[0] * module.flops(x.shape[1], memory.shape[1] if memory is not None else 0))
        return hook

    def _linear(self, module: nn.Linear, args: tuple, out: Any) -> None:
        if module.training and torch.is_grad_enabled():
            self._add("head", 2 * module.in_features * module.out_features * (args[0].numel() // module.in_features))

    @property
    def forward(self) -> dict:
        """Forward FLOPs so far by part (what compiled steps added folded in)."""
        for part, t in self._traced.items():
            n = int(t.item())
            if n:
                self._counted[part] += n
                t.zero_()
        return self._counted

    @property
    def train(self) -> int:
        return 3 * sum(self.forward.values())

    def state(self) -> dict:
        return dict(self.forward)

    def load(self, state: dict) -> None:
        self._counted = defaultdict(int, {k: int(v) for k, v in (state or {}).items()})
        for t in self._traced.values():
            t.zero_()
