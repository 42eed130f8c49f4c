import pytest
import torch

from modforge.data.tokenizers import CharTokenizer
from modforge.models.decoding import Stepper, beam_search, decode, filter_logits, generate
from modforge.models.blocks import Parts
from modforge.registry import ConfigError, build

V = 17
EOS = 3


def model(arch, pos="learned", **kw):
    cfg = {"name": arch, "d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 48, **kw}
    return build("model", cfg, Parts(pos=pos, norm="layer"), V).eval()


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "none"])
def test_cached_greedy_equals_recomputation_decoder_only(pos):
    m = model("decoder_only", pos)
    prefix = torch.randint(5, V, (3, 5))
    cached = decode(Stepper(m, prefix, use_cache=True), 30)
    full = decode(Stepper(m, prefix, use_cache=False), 30)
    assert torch.equal(cached, full)
    # the cached logits themselves match, not just the argmax
    s1, s2 = Stepper(m, prefix, use_cache=True), Stepper(m, prefix, use_cache=False)
    torch.testing.assert_close(s1.start(), s2.start(), rtol=1e-4, atol=1e-5)
    for t in range(5):
        nxt = torch.full((3,), 5 + t)
        torch.testing.assert_close(s1.step(nxt), s2.step(nxt), rtol=1e-4, atol=1e-5)


def test_a_norm_that_mixes_positions_decodes_by_recomputing_the_prefix():
    """norm=batch_causal normalises a position by the prefix's statistics at eval too: one position at a time
    through a KV cache would see none of them, so decoding recomputes the prefix (use_cache is ignored)."""
    m = build("model", {"name": "decoder_only", "d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 48},
              Parts(pos="learned", norm="batch_causal"), V).eval()
    prefix = torch.randint(5, V, (3, 5))
    s = Stepper(m, prefix, use_cache=True)
    assert not s.use_cache and s.cache is None
    assert torch.equal(decode(s, 20), decode(Stepper(m, prefix, use_cache=False), 20))


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope"])
def test_cached_greedy_equals_recomputation_encoder_decoder(pos):
    m = model("encoder_decoder", pos)
    src = torch.randint(5, V, (2, 9))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 6:] = False
    bos = torch.full((2, 1), 2)
    cached = decode(Stepper(m, bos, src=src, src_mask=mask, use_cache=True), 25)
    full = decode(Stepper(m, bos, src=src, src_mask=mask, use_cache=False), 25)
    assert torch.equal(cached, full)


def test_beam_size_one_equals_greedy():
    torch.manual_seed(1)
    for arch in ("decoder_only", "encoder_decoder"):
        m = model(arch)
        src = torch.randint(5, V, (4, 7)) if arch == "encoder_decoder" else None
        prefix = torch.full((4, 1), 2) if src is not None else torch.randint(5, V, (4, 3))
        kw = {"src": src, "src_mask": torch.ones_like(src, dtype=torch.bool)} if src is not None else {}
        greedy = decode(Stepper(m, prefix, **kw), 20, eos_id=EOS)
        beam = beam_search(Stepper(m, prefix, **kw), 20, beam_size=1, eos_id=EOS)
        n = max(greedy.shape[1], beam.shape[1])
        pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], n - t.shape[1])], 1)
        assert torch.equal(pad(greedy), pad(beam)), arch


@pytest.mark.parametrize("arch", ["decoder_only", "encoder_decoder"])
def test_cached_beam_search_equals_recomputation(arch):
    # beam steps gather a partly filled cache into its second buffer: every row must carry its own keys and values
    torch.manual_seed(2)
    m = model(arch, "rope")
    src = torch.randint(5, V, (2, 7)) if arch == "encoder_decoder" else None
    prefix = torch.full((2, 1), 2) if src is not None else torch.randint(5, V, (2, 3))
    kw = {"src": src, "src_mask": torch.ones_like(src, dtype=torch.bool)} if src is not None else {}
    cached = beam_search(Stepper(m, prefix, use_cache=True, **kw), 12, beam_size=3, eos_id=EOS)
    full = beam_search(Stepper(m, prefix, use_cache=False, **kw), 12, beam_size=3, eos_id=EOS)
    assert torch.equal(cached, full)


def test_kv_cache_reorder_keeps_rows_and_room():
    from modforge.components.attention import KVCache

    c = KVCache(6)
    k = torch.arange(3 * 2 * 4 * 1, dtype=torch.float32).view(3, 2, 4, 1)
    real = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)  # left padding
    c.append(k, -k, real)
    index = torch.tensor([2, 2, 0])  # a row twice, one dropped: beam search's gather
    c.reorder(index)
    assert torch.equal(c.k[:, :, :4], k[index]) and torch.equal(c.v[:, :, :4], -k[index])
    k2, v2, mask = c.append(torch.ones(3, 2, 1, 1), torch.zeros(3, 2, 1, 1))  # the room after the filled part remains
    assert k2.shape == (3, 2, 5, 1) and torch.equal(k2[:, :, :4], k[index]) and c.length == 5
    assert torch.equal(mask[:, :4], real[index]) and mask[:, 4].all()  # the key mask follows its rows
    c.reorder(torch.tensor([1, 0]))  # a new batch size
    assert c.k.shape[0] == 2 and torch.equal(c.k[:, :, :5], k2[[1, 0]]) and torch.equal(c.real[:, :5], mask[[1, 0]])


def seq_logprob(m, prefix, tokens):
    """Total log-probability of ``tokens`` after ``prefix`` under the model (full recomputation)."""
    seq = torch.cat([prefix, tokens], 1)
    logp = m(seq).log_softmax(-1)[:, prefix.shape[1] - 1 : -1]
    return logp.gather(-1, tokens[..., None]).sum().item()


def test_beam_finds_at_least_the_greedy_score():
    m = model("decoder_only")
    prefix = torch.randint(5, V, (1, 4))
    greedy = decode(Stepper(m, prefix), 8)
    beam = beam_search(Stepper(m, prefix), 8, beam_size=6, length_penalty=0.0)
    assert beam.shape == (1, 8)
    assert seq_logprob(m, prefix, beam) >= seq_logprob(m, prefix, greedy) - 1e-5


def test_top_k_one_equals_greedy_and_sampling_is_reproducible():
    m = model("decoder_only", "rope")
    prefix = torch.randint(5, V, (2, 4))
    greedy = decode(Stepper(m, prefix), 15)
    topk1 = decode(Stepper(m, prefix), 15, strategy="sample", top_k=1, temperature=1.3,
                   generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, topk1)
    a = decode(Stepper(m, prefix), 15, strategy="sample", generator=torch.Generator().manual_seed(7))
    b = decode(Stepper(m, prefix), 15, strategy="sample", generator=torch.Generator().manual_seed(7))
    c = decode(Stepper(m, prefix), 15, strategy="sample", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, top_p=0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.5 + 0.3
    kept = ~torch.isinf(filter_logits(logits, top_p=0.81))
    assert kept.tolist() == [[True, True, True, False]]


class ScriptedStepper:
    """Emits a fixed token sequence per row (one-hot logits), to test the decoding loop itself."""

    def __init__(self, script):
        self.script, self.t = torch.tensor(script), 0

    def _logits(self):
        return torch.nn.functional.one_hot(self.script[:, self.t], V).float() * 10

    def start(self):
        return self._logits()

    def step(self, tokens):
        self.t += 1
        return self._logits()

    def reorder(self, index):
        self.script = self.script.index_select(0, index)


def test_rows_stop_at_eos_and_are_padded():
    script = [[7, EOS, 9, 9, 9], [8, 8, 8, EOS, 9]]
    out = decode(ScriptedStepper(script), 5, eos_id=EOS, pad_id=0)
    assert out.tolist() == [[7, EOS, 0, 0], [8, 8, 8, EOS]]  # stops once every row is done
    out = beam_search(ScriptedStepper(script), 5, beam_size=2, eos_id=EOS, pad_id=0)
    assert out.tolist() == [[7, EOS, 0, 0], [8, 8, 8, EOS]]
    out = decode(ScriptedStepper(script), 2, eos_id=EOS, pad_id=0)  # length limit
    assert out.tolist() == [[7, EOS], [8, 8]]


def test_generate_checks_capabilities():
    tok = CharTokenizer(chars="abcdefghijkl")
    enc = build("model", {"name": "encoder_only", "d_model": 16, "n_heads": 2, "n_layers": 1}, Parts(), tok.vocab_size)
    with pytest.raises(ConfigError, match="cannot generate"):
        generate(enc, tok, prompt="abc")
    ed = build("model", {"name": "encoder_decoder", "d_model": 16, "n_heads": 2, "n_layers": 1}, Parts(),
               tok.vocab_size)
    with pytest.raises(ConfigError, match="src="):
        generate(ed, tok, prompt="abc")
    assert isinstance(generate(ed.eval(), tok, src="abc", max_new=5), str)
    with pytest.raises(ConfigError, match="strategy"):
        generate(ed, tok, src="abc", strategy="nucleus")


class MarkovStepper:
    """Next-token log-probabilities depend only on the last token: a known search problem."""

    def __init__(self, table, batch=1):
        self.table, self.last = table, torch.full((batch,), -1)

    def _logits(self):
        return torch.stack([self.table(int(t)) for t in self.last])

    def start(self):
        return self._logits()

    def step(self, tokens):
        self.last = tokens.clone()
        return self._logits()

    def reorder(self, index):
        self.last = self.last.index_select(0, index)


def test_beam_beats_greedy_where_greedy_is_myopic():
    def table(last):
        p = torch.full((V,), 1e-9)
        if last == -1:
            p[5], p[6] = 0.6, 0.4  # greedy takes 5 ...
        elif last == 5:
            p[5:] = 1.0 / (V - 5)  # ... and then faces a flat distribution
        elif last == 6:
            p[7] = 0.99  # the path through 6 is almost certain
            p[EOS] = 0.01
        else:
            p[EOS] = 1.0
        return (p / p.sum()).log()

    greedy = decode(MarkovStepper(table), 5, eos_id=EOS)
    beam = beam_search(MarkovStepper(table), 5, beam_size=2, eos_id=EOS, length_penalty=0.0)
    assert greedy[0, 0].item() == 5
    assert beam[0].tolist()[:3] == [6, 7, EOS]


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_generation_slides_past_the_context_window(pos):
    m = model("decoder_only", pos, max_len=16)
    prefix = torch.randint(5, V, (2, 20))  # longer than the context already
    cached = decode(Stepper(m, prefix, max_context=12), 40)  # 60 tokens in all, > max_len
    full = decode(Stepper(m, prefix, max_context=12, use_cache=False), 40)
    assert cached.shape == (2, 40) and torch.equal(cached, full)
    # the uncached path really is "the last tokens since the last slide": check one step by hand
    s = Stepper(m, prefix, max_context=12, use_cache=False)
    first = s.start()
    torch.testing.assert_close(first, m(prefix[:, -12:])[:, -1].float())
