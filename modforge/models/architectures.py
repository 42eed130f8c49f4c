"""Architectures (kind ``model``): the contract, and ``decoder_only``, ``encoder_only``, ``encoder_decoder``.

Each is built as ``build("model", cfg.model, parts, vocab_size)`` and selects its
default task (and through it, its default data) via the registry's ``defaults``.
"""
import inspect
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from modforge.components.positions import PositionalScheme
from modforge.models.blocks import Embedder, Parts, Stack, head_dim_kw, init_weights
from modforge.registry import ConfigError, build, kind, register, registry


@dataclass
class ModelConfig:
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: Optional[int] = None  # hidden width of the FFN; None = 4 * d_model
    dropout: float = 0.0
    max_len: int = 256  # longest sequence (positions table, KV cache capacity)
    tie_embeddings: bool = True  # output projection shares the token embedding matrix
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (the paper)
    init_std: float = 0.02
    scaled_residual_init: bool = True  # residual-output projections get init_std / sqrt(2 n_layers) (GPT-2)
    head_dim: Optional[int] = None  # per attention head; None = d_model / n_heads
    embed_norm: bool = False  # a norm (of the norm group) on the summed embeddings (BERT)
    type_vocab_size: int = 0  # token-type (segment) embeddings added to the tokens' (BERT: 2); 0 = none
    head_transform: bool = False  # before the output projection: Linear(d, d), head_activation, a norm (BERT's MLM)
    head_activation: str = "gelu"  # of the head transform
    head_bias: bool = False  # a bias on the output projection (BERT's MLM decoder)

    def __post_init__(self):
        for key in ("d_model", "n_heads", "n_layers", "max_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)}: must be >= 1")
        if self.head_dim is not None and self.head_dim < 1:
            raise ConfigError(f"model.head_dim={self.head_dim}: must be >= 1 (or null: d_model / n_heads)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads} "
                              "(or set model.head_dim)")
        if self.type_vocab_size < 0:
            raise ConfigError(f"model.type_vocab_size={self.type_vocab_size}: must be >= 0 (0: no token types)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: must be in [0, 1)")
        if self.d_ff is not None and self.d_ff < 1:
            raise ConfigError(f"model.d_ff={self.d_ff}: must be >= 1 (or null: 4 * d_model)")
        if not self.init_std > 0:
            raise ConfigError(f"model.init_std={self.init_std}: must be > 0")

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model


@dataclass
class EncoderDecoderConfig(ModelConfig):
    n_layers: int = 2
    enc_layers: Optional[int] = None  # None = n_layers
    dec_layers: Optional[int] = None  # None = n_layers


class Model(nn.Module):
    """Base class of kind ``model``: built as ``cls(cfg, parts, vocab_size)``, ``cfg`` a :class:`ModelConfig`.

    Holds the token embedding and its tied (or separate) output projection.
    Capabilities tell tasks and decoding what they may call, so no code asks
    for an architecture by name:

    * ``has_encoder``: ``encode(idx, mask) -> (B, T, d_model)`` hidden states;
    * ``can_generate``: an autoregressive decoder with ``new_cache(capacity)`` (a
      list of per-layer caches made by the attentions), called as
      ``model(idx, cache=, offset=)`` -> logits, or, with ``needs_source``,
      ``model.decode(tgt, memory, src_mask, cache=, offset=)`` on ``memory = encode(src, src_mask)``.
    """

    has_encoder = False
    can_generate = False
    needs_source = False
    # the roles of its own parameters under a parametrisation (modforge.models.param); a subclass adding
    # parameters declares them too
    param_roles = {"tok.weight": "input", "head.weight": "output", "head.bias": "vector", "*embed.types.weight": "input",
                   "head_transform.dense.weight": "hidden", "head_transform.dense.bias": "vector"}
    readout_mult = 1.0  # the head's input x this (param=mup: output_mult * base d_model / d_model)
    init_layers = 0  # the depth GPT-2's residual-output init was scaled by (0: not scaled)

    def __init__(self, cfg: ModelConfig, vocab_size: int, parts: Optional[Parts] = None):
        super().__init__()
        if vocab_size < 1:
            raise ConfigError(f"vocab_size={vocab_size}: the data module must set a vocabulary")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.head_transform = HeadTransform(cfg, parts) if cfg.head_transform else None
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=cfg.head_bias)
        self.logit_map = build("logits", parts.logits if parts is not None else kind("logits").default)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, d_model) -> logits (B, T, V): the head transform if any, the projection, then the
        ``logits`` part (soft-capping ...)."""
        h = self.head_transform(h) if self.head_transform is not None else h
        z = self.head(h * self.readout_mult if self.readout_mult != 1.0 else h)
        return z if self.logit_map.identity else self.logit_map(z)

    def _finish(self, n_layers: int) -> None:
        self.init_layers = n_layers if self.cfg.scaled_residual_init else 0
        init_weights(self, self.cfg.init_std, self.init_layers)
        if self.cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    def _embedder(self, parts: Parts) -> Embedder:
        c = self.cfg
        pos = build("pos", parts.pos, c.d_model, c.n_heads, c.max_len, **position_kw(parts, c))
        types = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        norm = build("norm", parts.norm, c.d_model) if c.embed_norm else None
        return Embedder(self.tok, pos, c.dropout, c.scale_embeddings, types, norm)

    def _stack(self, parts: Parts, n_layers: int, *, causal: bool, cross: bool = False) -> Stack:
        c = self.cfg
        return Stack(parts, n_layers, c.d_model, c.n_heads, c.ff, c.dropout, causal=causal, cross=cross,
                     head_dim=c.head_dim)

    def extend_positions(self, n: int) -> None:
        """Let the model run sequences of ``n`` positions (its positional schemes extended; the KV cache's
        capacity stays model.max_len). Raises :class:`~modforge.components.positions.LengthNotSupported`
        when a scheme cannot (a learned table)."""
        for m in self.modules():
            if isinstance(m, PositionalScheme):
                m.extend(n)

    def encode(self, idx: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no encoder (has_encoder is False)")

    def new_cache(self, capacity: Optional[int] = None) -> list:
        raise NotImplementedError(f"{type(self).__name__} does not generate (can_generate is False)")


def position_kw(parts: Parts, c: ModelConfig) -> dict:
    """``head_dim=`` for the positional scheme: the model's, unless the attention says otherwise (its
    ``position_head_dim``: differential attention rotates half-heads). A scheme from before the option, which
    takes no ``head_dim``, is built without it where it rotates nothing (ALiBi's bias needs no head width) and
    refused in one line where it would rotate at the wrong width."""
    name = parts.attention.get("name") if hasattr(parts.attention, "get") else parts.attention
    own = getattr(registry("attention").get(name).cls, "position_head_dim", None)
    if own is None:
        return head_dim_kw(c.head_dim)
    hd = own(c.d_model, c.n_heads, c.head_dim, parts.attention)
    pos_name = parts.pos.get("name") if hasattr(parts.pos, "get") else parts.pos
    cls = registry("pos").get(pos_name).cls
    if "head_dim" in inspect.signature(cls.__init__).parameters:
        return {"head_dim": hd}
    if cls.rotate is not PositionalScheme.rotate:
        raise ConfigError(f"pos={pos_name} with attention={name}: the scheme rotates queries and keys but takes no "
                          f"head_dim, and this attention's halves are {hd} wide; give the scheme a head_dim")
    return {}


class HeadTransform(nn.Module):
    """norm(act(x W + b)) before the output projection: BERT's masked-LM head (``model.head_transform``)."""

    def __init__(self, cfg: ModelConfig, parts: Optional[Parts]):
        super().__init__()
        if parts is None:
            raise ConfigError("model.head_transform needs the model's parts (its norm)")
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.act = build("activation", cfg.head_activation)
        self.norm = build("norm", parts.norm, cfg.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))


@register("model", "decoder_only", config=ModelConfig, defaults={"task": "causal_lm"})
class DecoderOnly(Model):
    """GPT-style causal language model."""

    can_generate = True
    masks_documents = True  # forward takes documents= (packed training sequences)

    def __init__(self, cfg: ModelConfig, parts: Parts, vocab_size: int):
        super().__init__(cfg, vocab_size, parts)
        self.embed = self._embedder(parts)
        self.decoder = self._stack(parts, cfg.n_layers, causal=True)
        self._finish(cfg.n_layers)

    def forward(self, idx: torch.Tensor, mask: Optional[torch.Tensor] = None, cache: Optional[list] = None,
                offset: int = 0, positions: Optional[torch.Tensor] = None,
                token_types: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) -> logits (B, T, V). ``mask`` (B, T) True at real tokens; ``cache`` from :meth:`new_cache`;
        ``positions`` (B, T) each row's positions (a left-padded batch, or restarting at each document), else
        offset + 0..T-1; ``documents`` (B, T) each token's document number: attention stays inside a document
        (training on packed documents; not with a cache)."""
        x = self.embed(idx, offset, positions, token_types)
        at = {} if documents is None else {"documents": documents}
        return self.logits(self.decoder(x, pos=self.embed.pos, mask=mask, cache=cache, positions=positions, **at))

    def new_cache(self, capacity: Optional[int] = None) -> list:
        return self.decoder.new_cache(capacity or self.cfg.max_len)


@register("model", "encoder_only", config=ModelConfig, defaults={"task": "masked_lm"})
class EncoderOnly(Model):
    """BERT-style bidirectional encoder with a (tied) token-prediction head."""

    has_encoder = True

    def __init__(self, cfg: ModelConfig, parts: Parts, vocab_size: int):
        super().__init__(cfg, vocab_size, parts)
        self.embed = self._embedder(parts)
        self.encoder = self._stack(parts, cfg.n_layers, causal=False)
        self._finish(cfg.n_layers)

    def encode(self, idx: torch.Tensor, mask: Optional[torch.Tensor] = None,
               token_types: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) -> hidden states (B, T, d_model); ``token_types`` (B, T) when the model has them."""
        return self.encoder(self.embed(idx, token_types=token_types), pos=self.embed.pos, mask=mask)

    def forward(self, idx: torch.Tensor, mask: Optional[torch.Tensor] = None,
                token_types: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.logits(self.encode(idx, mask, token_types))


@register("model", "encoder_decoder", config=EncoderDecoderConfig, defaults={"task": "seq2seq"})
class EncoderDecoder(Model):
    """The original Transformer: encoder, then a decoder with masked self-attention and cross-attention.

    Source and target share one vocabulary and one embedding matrix (tied to the
    output projection when ``tie_embeddings``), as in the paper; each side has
    its own positional scheme instance.
    """

    has_encoder = True
    can_generate = True
    needs_source = True

    def __init__(self, cfg: EncoderDecoderConfig, parts: Parts, vocab_size: int):
        super().__init__(cfg, vocab_size, parts)
        enc_n, dec_n = cfg.enc_layers or cfg.n_layers, cfg.dec_layers or cfg.n_layers
        self.src_embed = self._embedder(parts)
        self.tgt_embed = self._embedder(parts)
        self.encoder = self._stack(parts, enc_n, causal=False)
        self.decoder = self._stack(parts, dec_n, causal=True, cross=True)
        self._finish(max(enc_n, dec_n))

    def encode(self, src: torch.Tensor, src_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.encoder(self.src_embed(src), pos=self.src_embed.pos, mask=src_mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: Optional[torch.Tensor] = None,
               tgt_mask: Optional[torch.Tensor] = None, cache: Optional[list] = None, offset: int = 0) -> torch.Tensor:
        """Teacher-forced (or cached, step by step) decoding: -> logits (B, T, V)."""
        x = self.tgt_embed(tgt, offset)
        h = self.decoder(x, pos=self.tgt_embed.pos, mask=tgt_mask, memory=memory, memory_mask=src_mask, cache=cache)
        return self.logits(h)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None) -> torch.Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    def new_cache(self, capacity: Optional[int] = None) -> list:
        return self.decoder.new_cache(capacity or self.cfg.max_len)
