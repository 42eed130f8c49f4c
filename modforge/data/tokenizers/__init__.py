"""Tokenizers (kind ``tokenizer``): ``char``, ``byte``, ``bpe`` and ``pretrained``, one module each.

Special tokens live in :mod:`modforge.data.tokenizers.base` and only there: every tokenizer reserves the same
five ids at the start of its vocabulary (``SPECIALS``: <pad> 0, <unk> 1, <bos> 2, <eos> 3, <mask> 4), and plain
text never encodes to them (a pretrained model's tokenizer keeps its own ids). A tokenizer's
:meth:`~modforge.data.tokenizers.base.Tokenizer.state` is stored in every checkpoint (inside the data facts,
:class:`modforge.data.base.DataFacts`), so a model can be rebuilt and used from the checkpoint alone.

Importing this package registers the four. Data configs select one with ``data.tokenizer=<name>``
(:func:`modforge.data.config.make_tokenizer`); text is cut for them by :mod:`modforge.data.text`.
"""
from modforge.data.tokenizers.base import (BOS, EOS, MASK, PAD, SPECIALS, UNK, Tokenizer,  # noqa: F401
                                           load_tokenizer)
# registered in this order (as listed by `python -m modforge list`): char, byte, bpe, pretrained
from modforge.data.tokenizers.char import CharTokenizer  # noqa: F401, I001
from modforge.data.tokenizers.byte import ByteTokenizer  # noqa: F401
from modforge.data.tokenizers.bpe import BPE_VOCAB, BPEConfig, BPETokenizer  # noqa: F401
from modforge.data.tokenizers.pretrained import PretrainedConfig, PretrainedTokenizer  # noqa: F401
