"""Transformer blocks and stacks, assembled only through the registry.

A :class:`Parts` bundle carries the composed configs of the swappable parts:
one per kind declared ``part=True`` (norm, residual, ffn, pos, attention, and
any a plugin declares). Every layer builds its own fresh modules from it with
:func:`modforge.registry.build`, so no two layers share a norm.
"""
from typing import Any, Optional

import torch
from torch import nn

from modforge.registry import ConfigError, build, kind, part_kinds, suggest


class Parts:
    """Configs (names, mappings or DictConfigs) of the parts a model is built from.

    ``Parts(norm="rms", ffn={"name": "swiglu"})``: one keyword per part kind; a
    kind not given takes its declared default. ``parts.norm`` is that config.
    """

    def __init__(self, **configs: Any):
        kinds = part_kinds()
        if not kinds:
            raise ConfigError("Parts: no part kinds are declared yet; modforge.plugins.load_all() declares them")
        for k in configs:
            if k not in kinds:
                raise ConfigError(f"Parts: '{k}' is not a part kind.{suggest(k, kinds)} Part kinds: {', '.join(kinds)}.")
        self.configs = {k: configs[k] if k in configs else kind(k).default for k in kinds}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["configs"][name]
        except KeyError:
            raise AttributeError(f"Parts has no part '{name}' (part kinds: {', '.join(part_kinds())})") from None

    def __repr__(self) -> str:
        return "Parts(" + ", ".join(f"{k}={v!r}" for k, v in self.configs.items()) + ")"

    @classmethod
    def from_config(cls, cfg: Any) -> "Parts":
        """Pick the part groups out of a composed run config (missing groups keep defaults)."""
        return cls(**{k: cfg[k] for k in part_kinds() if k in cfg})


def head_dim_kw(head_dim: Optional[int]) -> dict:
    """``head_dim=`` for attention and positions only when the model sets one (a plugin written before the
    option existed keeps working in every model that does not)."""
    return {} if head_dim is None else {"head_dim": head_dim}


class Block(nn.Module):
    """Self-attention (causal or not), optional cross-attention, feed-forward; each in a residual."""

    def __init__(self, parts: Parts, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 *, causal: bool, cross: bool = False, head_dim: Optional[int] = None):
        super().__init__()
        self.causal = causal

        def residual() -> nn.Module:
            return build("residual", parts.residual, build("norm", parts.norm, d_model), dropout)

        self.self_attn = build("attention", parts.attention, d_model, n_heads, **head_dim_kw(head_dim))
        self.r_self = residual()
        self.parallel = self.r_self.parallel  # one residual (and norm) for every sub-layer: residual=parallel
        self.cross_attn = (build("attention", parts.attention, d_model, n_heads, cross=True, **head_dim_kw(head_dim))
                           if cross else None)
        self.r_cross = residual() if cross and not self.parallel else None
        self.ffn = build("ffn", parts.ffn, d_model, d_ff)
        self.r_ffn = None if self.parallel else residual()

    def forward(self, x: torch.Tensor, *, pos, mask: Optional[torch.Tensor] = None,
                memory: Optional[torch.Tensor] = None, memory_mask: Optional[torch.Tensor] = None,
                cache: Optional[dict] = None, positions: Optional[torch.Tensor] = None,
                documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        cache = cache or {}
        at = {} if positions is None else {"positions": positions}
        if documents is not None:  # (passed only when given: an attention written before documents still works)
            at["documents"] = documents

        def attend(h):
            return self.self_attn(h, pos=pos, causal=self.causal, key_mask=mask, cache=cache.get("self"), **at)

        def cross(h):
            return self.cross_attn(h, key_mask=memory_mask, memory=memory, cache=cache.get("cross"))

        if self.parallel:
            return self.r_self.forward_all(x, [attend] + ([cross] if self.cross_attn is not None else []) + [self.ffn],
                                           mask)
        x = self.r_self(x, attend, mask)
        if self.cross_attn is not None:
            x = self.r_cross(x, cross, mask)
        return self.r_ffn(x, self.ffn, mask)

    def flops(self, n: int, n_memory: int = 0) -> int:
        """Forward FLOPs for one sequence of ``n`` positions (over ``n_memory`` encoder positions when it has
        cross-attention): the matrix products; norms, activations and residual additions are left out."""
        total = self.self_attn.flops(n, n) + n * self.ffn.flops_per_token()
        if self.cross_attn is not None:
            total += self.cross_attn.flops(n, n_memory)
        return total


class Stack(nn.Module):
    """N blocks, then a final norm if the residual style asks for one."""

    def __init__(self, parts: Parts, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 *, causal: bool, cross: bool = False, head_dim: Optional[int] = None):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(parts, d_model, n_heads, d_ff, dropout, causal=causal, cross=cross, head_dim=head_dim)
            for _ in range(n_layers)
        )
        for i, b in enumerate(self.blocks):  # a layer's options may depend on its place (attention.global_every)
            for attn in (b.self_attn, b.cross_attn):
                if attn is not None:
                    attn.layer_index = i
        self.cross = cross
        last = self.blocks[-1]
        ends = last.r_ffn if last.r_ffn is not None else last.r_self  # (a parallel block has one residual)
        self.final_norm = build("norm", parts.norm, d_model) if ends.final_norm else None

    def flops(self, n: int, n_memory: int = 0) -> int:
        return sum(b.flops(n, n_memory) for b in self.blocks)

    def new_cache(self, capacity: int) -> list[dict]:
        """One dict per layer: the caches its attentions made (``self``, and ``cross`` in a decoder with cross-attention)."""
        return [
            {"self": b.self_attn.new_cache(capacity), **({"cross": b.cross_attn.new_cache(capacity)} if self.cross else {})}
            for b in self.blocks
        ]

    def forward(self, x: torch.Tensor, *, pos, mask=None, memory=None, memory_mask=None,
                cache: Optional[list] = None, positions: Optional[torch.Tensor] = None,
                documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        at = {} if documents is None else {"documents": documents}
        for i, block in enumerate(self.blocks):
            x = block(x, pos=pos, mask=mask, memory=memory, memory_mask=memory_mask,
                      cache=cache[i] if cache is not None else None, positions=positions, **at)
        return self.final_norm(x, mask) if self.final_norm is not None else x


class Embedder(nn.Module):
    """Token embedding (optionally scaled by sqrt(d_model), as in the paper), positions, token types (BERT's
    segments, when the model has them), a norm (BERT's embedding LayerNorm, when asked), dropout."""

    param_roles = {"types.weight": "input"}  # the token table is the model's own (Model.param_roles)
    held_at_base = ("scale",)  # sqrt(d_model) grows with width: under param=mup it is the base's

    def __init__(self, tokens: nn.Embedding, pos: nn.Module, dropout: float, scale: bool,
                 types: Optional[nn.Embedding] = None, norm: Optional[nn.Module] = None):
        super().__init__()
        self.tokens, self.pos, self.types, self.norm = tokens, pos, types, norm
        self.scale = tokens.embedding_dim ** 0.5 if scale else 1.0
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()  # p=0 would still copy when compiled

    def forward(self, idx: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None,
                token_types: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.tokens(idx)
        if self.scale != 1.0:
            x = x * self.scale
        if self.types is not None:  # no types given: every token is of type 0 (BERT's default)
            x = x + (self.types(token_types) if token_types is not None else self.types.weight[0])
        x = self.pos.embed(x, offset) if positions is None else self.pos.embed(x, offset, positions=positions)
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x)


def init_weights(model: nn.Module, std: float, n_layers: int = 0) -> None:
    """GPT-2 style: N(0, std) for every Linear and Embedding weight, zero biases.

    With ``n_layers`` > 0, a Linear that a component marks ``residual_out = True``
    (the projection whose output is added to the residual stream: attention's
    output, the FFN's second matrix) gets std / sqrt(2 * n_layers) instead, so
    the residual stream's variance does not grow with depth (GPT-2, nanoGPT).
    Norms and components' own parameters keep their constructors' init.
    """
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            scaled = n_layers > 0 and getattr(m, "residual_out", False)
            nn.init.normal_(m.weight, mean=0.0, std=std / (2 * n_layers) ** 0.5 if scaled else std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
