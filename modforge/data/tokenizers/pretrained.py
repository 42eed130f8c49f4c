"""``pretrained``: a pretrained model's ``tokenizer.json`` with the model's own ids and special tokens."""
from dataclasses import dataclass
from typing import Optional, Sequence

from modforge.data.tokenizers.bpe import BPEConfig, BPETokenizer
from modforge.registry import register


@dataclass
class PretrainedConfig:
    path: Optional[str] = None  # the tokenizer.json of a pretrained model (python -m modforge.convert writes one)


@register("tokenizer", "pretrained", config=PretrainedConfig)
class PretrainedTokenizer(BPETokenizer):
    """A pretrained model's Hugging Face ``tokenizer.json``, with the model's own ids and special tokens.

    Unlike ``bpe`` with a path, nothing is shifted: id i is the model's row i, so
    a converted checkpoint (``python -m modforge.convert``) reads text exactly as
    the model was trained to. Its specials are the model's (GPT-2: <|endoftext|>
    is <bos> and <eos>, and pads too, having no pad of its own; BERT: [PAD],
    [CLS], [SEP], [MASK], [UNK]); ``vocab_size`` is the model's embedding rows,
    which may exceed the tokenizer's (Llama checkpoints pad it). Text is
    encoded without the tokenizer's template (no [CLS] ... [SEP] added), and a
    special token's spelling in the text is text.
    """

    name = "pretrained"
    ROLES = ("pad", "unk", "bos", "eos", "mask")

    def __init__(self, cfg: Optional[PretrainedConfig] = None):
        self.specials: dict = {}
        self.rows: Optional[int] = None
        super().__init__(BPEConfig(path=(cfg or PretrainedConfig()).path))  # loads the path, if given
        self.cfg = cfg or PretrainedConfig()

    @property
    def fits_on_data(self) -> bool:  # type: ignore[override]
        return False

    def _set(self, hf) -> None:
        super()._set(hf)
        self.offset, self.n_special = 0, 0
        for role in self.ROLES:  # read from the file where the state does not say (data.tokenizer_path=)
            if role not in self.specials:
                self.specials[role] = next((hf.token_to_id(t) for t in _SPELLINGS[role]
                                            if hf.token_to_id(t) is not None), None)
        self._ids()

    def _ids(self) -> None:
        sp = self.specials
        self.eos_id = sp.get("eos") if sp.get("eos") is not None else sp.get("bos")
        self.bos_id = sp.get("bos") if sp.get("bos") is not None else self.eos_id
        self.pad_id = next((i for i in (sp.get("pad"), self.eos_id, 0) if i is not None))  # GPT-2 pads with <eos>
        self.unk_id = sp.get("unk") if sp.get("unk") is not None else self.pad_id
        self.mask_id = sp.get("mask") if sp.get("mask") is not None else self.unk_id
        if self.bos_id is None:
            self.bos_id = self.pad_id

    @property
    def vocab_size(self) -> int:
        return max(self._need().get_vocab_size(with_added_tokens=True), self.rows or 0)

    def decode(self, ids: Sequence[int]) -> str:
        n = self._need().get_vocab_size(with_added_tokens=True)
        return self._need().decode([int(i) for i in ids if 0 <= i < n], skip_special_tokens=True)

    def own_state(self) -> dict:
        return {"json": self._need().to_str(), "specials": dict(self.specials), "rows": self.rows}

    def load_own_state(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.specials = dict(state.get("specials") or {})
        self.rows = state.get("rows")
        self._set(HFTokenizer.from_str(state["json"]))


# how the families spell each special token, for a tokenizer.json loaded without a model's config
_SPELLINGS = {"pad": ("[PAD]", "<pad>", "<|pad|>"), "unk": ("[UNK]", "<unk>"),
              "bos": ("<s>", "<|begin_of_text|>", "[CLS]", "<|endoftext|>"),
              "eos": ("</s>", "<|end_of_text|>", "[SEP]", "<|endoftext|>"), "mask": ("[MASK]", "<mask>")}
