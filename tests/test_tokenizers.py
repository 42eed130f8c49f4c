"""Tokenizers: exact round trips, special tokens in one place and never produced by text, BPE state and files."""
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from modforge.data.lm import stdlib_sources
from modforge.data.config import make_tokenizer
from modforge.data.text import rechunk, safe_cut, split_text
from modforge.data.tokenizers import (
    BOS, EOS, MASK, PAD, SPECIALS, UNK, BPETokenizer, ByteTokenizer, CharTokenizer, load_tokenizer,
)
from modforge import registry
from modforge.registry import ConfigError, build

SPECIAL_TEXT = "<pad><unk><bos><eos><mask> <pad> x<mask>y <|endoftext|> [CLS] [PAD]"
ODD_TEXT = "naïve café — 漢字 and emoji 🙂\ttabs\r\nCRLF  double  spaces\n\n\nblank lines \u00a0nbsp \x00nul"


@pytest.fixture(scope="module")
def corpus() -> str:
    """~150 KB of real text that every Python ships with (the standard library's sources)."""
    parts = []
    for f in stdlib_sources()[:40]:
        with open(f, encoding="utf-8", errors="replace") as fh:
            parts.append(fh.read())
    return "\n".join(parts)[:150_000]


def gpt2ish(corpus, path):
    """A byte-level BPE tokenizer.json with GPT-2's one special token, written to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator([corpus[:20000]], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    hf.save(str(path))
    return path


@pytest.fixture(scope="module")
def bpe(corpus) -> BPETokenizer:
    return build("tokenizer", {"name": "bpe", "vocab_size": 600}).fit([corpus])


def test_special_ids_are_fixed():
    assert SPECIALS == ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
    assert (PAD, UNK, BOS, EOS, MASK) == (0, 1, 2, 3, 4)
    for name in ("char", "byte", "bpe"):
        t = build("tokenizer", name)
        assert (t.pad_id, t.unk_id, t.bos_id, t.eos_id, t.mask_id) == (0, 1, 2, 3, 4)


def test_char_ids_are_unchanged_and_round_trip_exactly():
    tok = CharTokenizer().fit(["hello"])
    assert tok.chars == "ehlo" and tok.vocab_size == 9
    assert tok.encode("hello") == [6, 5, 7, 7, 8]
    text = ODD_TEXT + SPECIAL_TEXT
    tok = CharTokenizer().fit([text[:40], text[40:]])  # fitting on chunks = fitting on the whole
    assert tok.chars == CharTokenizer().fit([text]).chars == "".join(sorted(set(text)))
    ids = tok.encode_array(text)
    assert ids.dtype == np.int64 and ids.min() >= tok.n_special  # every character was seen: no special id
    assert tok.decode(ids.tolist()) == text
    # unseen characters (only those) become <unk>; nothing else is special
    assert tok.encode("h\u2603") == [tok.encode("h")[0], UNK]
    assert load_tokenizer(json.loads(json.dumps(tok.state()))).encode(text) == tok.encode(text)


def test_byte_round_trips_any_text_exactly():
    tok = ByteTokenizer()
    text = ODD_TEXT + SPECIAL_TEXT
    ids = tok.encode_array(text)
    assert ids.min() >= tok.n_special and ids.max() < tok.vocab_size == 261
    assert tok.decode(ids.tolist()) == text
    assert load_tokenizer(tok.state()).encode(text) == tok.encode(text)


def test_bpe_reserves_our_specials_at_0_to_4_and_round_trips_its_training_text(bpe, corpus):
    assert [bpe.hf.id_to_token(i) for i in range(5)] == list(SPECIALS)
    assert 261 < bpe.vocab_size <= 600
    ids = bpe.encode_array(corpus)
    assert len(ids) < 0.6 * len(corpus)  # it actually merges
    assert ids.min() >= bpe.n_special
    assert bpe.decode(ids.tolist()) == corpus
    assert bpe.decode(bpe.encode(ODD_TEXT)) == ODD_TEXT  # byte-level: any text, no <unk>


@pytest.mark.parametrize("name", registry.registry("tokenizer").names())
def test_plain_text_never_produces_special_tokens(name, corpus, tmp_path):
    text = corpus[:20_000] + SPECIAL_TEXT + ODD_TEXT
    fields = {f.name for f in dataclasses.fields(registry.get("tokenizer", name).config)}
    keys = {"vocab_size": 400} if "vocab_size" in fields else {}
    if "path" in fields and not registry.get("tokenizer", name).cls().fits_on_data:  # reads a file: a GPT-2-like one
        keys = {"path": str(gpt2ish(corpus, tmp_path / "tokenizer.json"))}
    tok = build("tokenizer", {"name": name, **keys}).fit([text])
    ids = tok.encode_array(text)
    specials = {tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.mask_id} | set(range(tok.n_special))
    assert not specials & set(ids.tolist()), [int(i) for i in ids if i in specials]
    assert tok.decode(tok.encode(SPECIAL_TEXT)) == SPECIAL_TEXT


def test_bpe_state_embeds_the_tokenizer_json_and_rebuilds_it(bpe, corpus):
    state = json.loads(json.dumps(bpe.state()))  # what a checkpoint stores
    assert state["name"] == "bpe" and isinstance(state["json"], str) and '"model"' in state["json"]
    again = load_tokenizer(state)
    text = corpus[-5000:] + SPECIAL_TEXT
    assert again.encode(text) == bpe.encode(text) and again.vocab_size == bpe.vocab_size
    assert again.encode_array(SPECIAL_TEXT).min() >= 5  # the special-token matcher stays off after reload


def test_data_facts_travel_with_their_state(bpe):
    """What a datamodule learns (labels, tokens per character, positions) travels beside the tokenizer, in
    plain containers, and leaves the tokenizer's own state and token ids alone."""
    import json

    from modforge.data.base import DataFacts

    tok = CharTokenizer().fit(["abc"])
    facts = DataFacts(tok, positions=16, tokens_per_char=1.0, labels=["neg", "pos"], stats={"n": 3})
    state = json.loads(json.dumps(facts.state()))  # plain containers only
    again = DataFacts.from_state(state)
    assert again.labels == ["neg", "pos"] and again.tokens_per_char == 1.0 and again.positions == 16
    assert again.tokenizer.encode("cab") == tok.encode("cab")
    assert tok.state() == CharTokenizer().fit(["abc"]).state()  # the tokenizer's state is untouched
    assert tok.digest() == CharTokenizer().fit(["abc"]).digest()  # labels do not change the token ids


def test_bpe_loads_a_tokenizer_json(bpe, corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.hf.save(str(path))
    tok = make_tokenizer(SimpleNamespace(tokenizer="bpe", vocab_size=None, tokenizer_path=str(path)))
    assert not tok.fits_on_data and tok.fit(["ignored"]) is tok
    assert tok.offset == 0 and tok.encode(corpus[:3000]) == bpe.encode(corpus[:3000])


def test_a_foreign_tokenizer_json_is_shifted_past_our_specials(corpus, tmp_path):
    from tokenizers import Tokenizer

    path = gpt2ish(corpus, tmp_path / "gpt2ish.json")
    hf = Tokenizer.from_file(str(path))
    tok = build("tokenizer", {"name": "bpe", "path": str(path)})
    assert tok.offset == 5 and tok.vocab_size == hf.get_vocab_size() + 5
    text = "hello <|endoftext|> world <pad>"
    ids = tok.encode(text)
    assert min(ids) >= 5 and tok.decode(ids) == text
    assert load_tokenizer(tok.state()).encode(text) == ids


def test_chunked_bpe_encoding_equals_encoding_the_whole(bpe, corpus):
    whole = bpe.hf.encode(corpus, add_special_tokens=False).ids
    assert bpe.encode(corpus) == whole  # encode_array cuts into pieces internally
    for size in (300, 997, 20_000):  # windows of >= 150 characters always hold whitespace here
        pieces = list(rechunk([corpus[i:i + 333] for i in range(0, len(corpus), 333)], size))
        assert "".join(pieces) == corpus
        assert max(len(p) for p in pieces) <= size
        ids = [i for p in pieces for i in bpe.hf.encode(p, add_special_tokens=False).ids]
        assert ids == whole, size


def test_safe_cut_prefers_a_newline_after_text():
    text = "alpha beta\n\n  gamma\ndelta"
    assert split_text(text, 100) == [text]
    cut = safe_cut(text, 22)
    assert text[cut] == "\n" and not text[cut - 1].isspace()
    assert safe_cut("x" * 50, 20) == 20  # no whitespace at all: a hard cut


def test_tokenizer_keys_are_checked_against_the_chosen_tokenizer(tmp_path):
    cfg = SimpleNamespace(tokenizer="char", vocab_size=512, tokenizer_path=None)
    with pytest.raises(ConfigError, match=r"data.vocab_size=512: tokenizer 'char' takes no vocab_size.*bpe"):
        make_tokenizer(cfg)
    with pytest.raises(ConfigError, match=r"data.vocab_size=100: .*at least 261"):
        make_tokenizer(SimpleNamespace(tokenizer="bpe", vocab_size=100, tokenizer_path=None))
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"data.tokenizer_path=.*nope.json: no such file"):
        make_tokenizer(SimpleNamespace(tokenizer="bpe", vocab_size=None, tokenizer_path=str(missing)))
    with pytest.raises(ConfigError, match="Did you mean 'bpe'"):
        make_tokenizer(SimpleNamespace(tokenizer="bpee", vocab_size=None, tokenizer_path=None))


def test_token_dtype_fits_the_vocabulary(bpe):
    assert bpe.token_dtype == np.uint16
    big = CharTokenizer(chars="".join(chr(0x4E00 + i) for i in range(70_000)))
    assert big.token_dtype == np.uint32
