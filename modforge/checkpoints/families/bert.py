"""BERT (``BertForMaskedLM``): Post-LN with LayerNorm (eps 1e-12), LayerNorm on the embeddings, token-type
embeddings, exact GELU, and the masked-LM head's transform and bias; pooler and next-sentence head are not
part of a masked LM and are left out (listed). Converts in; not exported."""
import torch

from modforge.checkpoints.families.base import HF_ACTIVATIONS, Family, Taker, need
from modforge.errors import ConfigError


class Bert(Family):
    model_type = "bert"

    def overrides(self, c: dict) -> list[str]:
        what = "BERT config.json:"
        need(c, "position_embedding_type", "absolute", what)
        need(c, "is_decoder", False, what)
        need(c, "hidden_act", ("gelu", "relu", "gelu_new", "silu"), what)
        act = HF_ACTIVATIONS[c.get("hidden_act", "gelu")]
        eps = c.get("layer_norm_eps", 1e-12)
        return [
            "model=encoder_only", "task=masked_lm", "residual=post", "norm=layer", f"norm.eps={eps}",
            "attention=mha", "attention.bias=true", f"attention.dropout={c.get('attention_probs_dropout_prob', 0.1)}",
            "ffn=mlp", f"ffn.activation={act}", "ffn.bias=true", "pos=learned",
            f"model.d_model={c['hidden_size']}", f"model.n_heads={c['num_attention_heads']}",
            f"model.n_layers={c['num_hidden_layers']}", f"model.d_ff={c['intermediate_size']}",
            f"model.max_len={c['max_position_embeddings']}", f"model.dropout={c.get('hidden_dropout_prob', 0.1)}",
            "model.tie_embeddings=true", "model.embed_norm=true", f"model.type_vocab_size={c.get('type_vocab_size', 2)}",
            "model.head_transform=true", f"model.head_activation={act}", "model.head_bias=true",
            f"model.init_std={c.get('initializer_range', 0.02)}",
        ]

    def to_ours(self, theirs: dict, c: dict, n_layers: int) -> tuple[dict, list]:
        t = Taker(theirs, ("bert.",))
        e = "embeddings."
        s = {"tok.weight": t(e + "word_embeddings.weight"), "embed.pos.table.weight": t(e + "position_embeddings.weight"),
             "embed.types.weight": t(e + "token_type_embeddings.weight"),
             "embed.norm.weight": t(e + "LayerNorm.weight"), "embed.norm.bias": t(e + "LayerNorm.bias")}
        if "cls.predictions.transform.dense.weight" not in t.state:
            raise ConfigError("the checkpoint has no masked-LM head (cls.predictions.*): convert a BertForMaskedLM "
                              "(or BertForPreTraining) checkpoint")
        h = "cls.predictions."
        s.update({"head_transform.dense.weight": t(h + "transform.dense.weight"),
                  "head_transform.dense.bias": t(h + "transform.dense.bias"),
                  "head_transform.norm.weight": t(h + "transform.LayerNorm.weight"),
                  "head_transform.norm.bias": t(h + "transform.LayerNorm.bias"), "head.bias": t(h + "bias")})
        t.optional(h + "decoder.weight")  # tied to the word embeddings
        t.optional(h + "decoder.bias")  # the same tensor as cls.predictions.bias
        for i in range(n_layers):
            p, q = f"encoder.layer.{i}.", f"encoder.blocks.{i}."
            for kind in ("weight", "bias"):
                s[q + f"self_attn.qkv.{kind}"] = torch.cat(
                    [t(p + f"attention.self.{n}.{kind}") for n in ("query", "key", "value")], 0)
                s[q + f"self_attn.out.{kind}"] = t(p + f"attention.output.dense.{kind}")
                s[q + f"r_self.norm.{kind}"] = t(p + f"attention.output.LayerNorm.{kind}")
                s[q + f"ffn.w1.{kind}"] = t(p + f"intermediate.dense.{kind}")
                s[q + f"ffn.w2.{kind}"] = t(p + f"output.dense.{kind}")
                s[q + f"r_ffn.norm.{kind}"] = t(p + f"output.LayerNorm.{kind}")
        return s, t.rest(lambda k: k.startswith(("pooler.", "cls.seq_relationship.")) or k.endswith("position_ids"))
