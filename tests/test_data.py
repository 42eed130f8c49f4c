"""Data: the memory-mapped token cache, the corpora (stdlib, tinyshakespeare, text, hf), classification and
parallel text. Caches go to tmp_path; nothing touches the network."""
import io
import json
import os
import sys
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import math

import pytest
import torch

import modforge.data.cache as cache
import modforge.data.lm as lm
from conftest import tiny_overrides
from modforge.config import compose
from modforge.data.tokenizers import BPETokenizer, CharTokenizer
from modforge.registry import ConfigError, build
from modforge.checkpoints.files import load_checkpoint
from modforge.run.story import run
from modforge.utils.files import atomic_file

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "data"
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"



def unigram_cross_entropy(train, val, vocab: int) -> float:
    """The reference: cross-entropy (nats/token) on val of the train split's add-one-smoothed unigram distribution."""
    train, val = torch.as_tensor(np.asarray(train, dtype=np.int64)), torch.as_tensor(np.asarray(val, dtype=np.int64))
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[val].mean())

@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODFORGE_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def small_chunks(monkeypatch):
    """Tokenize in many small chunks so chunk boundaries are exercised."""
    monkeypatch.setattr(cache, "CHUNK_CHARS", 4096)
    monkeypatch.setattr(lm, "CHUNK_CHARS", 4096)


def stdlib_text(n: int) -> str:
    parts = []
    for f in lm.stdlib_sources():
        with open(f, encoding="utf-8", errors="replace") as fh:
            parts.append(fh.read())
        if sum(map(len, parts)) > n:
            break
    return "\n".join(parts)[:n]


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text(stdlib_text(120_000), encoding="utf-8")
    return p


def text_data(path, **kw):
    path = path if isinstance(path, list) else str(path)
    return build("data", {"name": "text", "path": path, "block_size": 16, "batch_size": 4, **kw})


def split(text: str, vf: float = 0.1):
    cut = int(len(text) * (1 - vf))
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------- token cache

@pytest.mark.parametrize("tokenizer", ["char", "byte", "bpe"])
def test_token_cache_gives_the_ids_of_direct_tokenization(corpus_file, small_chunks, tokenizer):
    kw = {"vocab_size": 400} if tokenizer == "bpe" else {}
    dm = text_data(corpus_file, tokenizer=tokenizer, **kw)
    tok = dm.prepare().tokenizer
    train, val = split(corpus_file.read_text(encoding="utf-8"))
    assert isinstance(dm.train_tokens.array, np.memmap) and dm.train_tokens.dtype == np.uint16
    direct = {"train": tok.encode_array(train), "val": tok.encode_array(val)}
    if tokenizer == "bpe":  # and the library's own single-call encoding agrees
        assert direct["train"].tolist() == tok.hf.encode(train, add_special_tokens=False).ids
    assert np.array_equal(np.asarray(dm.train_tokens.array), direct["train"])
    assert np.array_equal(np.asarray(dm.val_tokens.array), direct["val"])
    s = dm.facts.stats
    assert (s["train_chars"], s["val_chars"]) == (len(train), len(val))
    assert (s["train_tokens"], s["val_tokens"]) == (len(direct["train"]), len(direct["val"]))
    assert s["unigram_val_loss"] == pytest.approx(
        unigram_cross_entropy(direct["train"], direct["val"], tok.vocab_size), rel=1e-9)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])


def test_token_cache_is_reused_and_rebuilt_when_tokenizer_or_corpus_changes(corpus_file, monkeypatch):
    first = cache.token_cache
    calls = []

    def spy(*a, **k):
        out = first(*a, **k)
        calls.append(out)
        return out

    monkeypatch.setattr(lm, "token_cache", spy)
    text_data(corpus_file).prepare()
    text_data(corpus_file).prepare()
    assert [c.built for c in calls] == [True, False]  # second run: memory-mapped from the cache
    assert calls[0].directory == calls[1].directory

    text_data(corpus_file, tokenizer="byte").prepare()  # other tokenizer -> other cache
    assert calls[-1].built and calls[-1].directory != calls[0].directory

    text_data(corpus_file, max_chars=50_000).prepare()  # other length -> other cache
    assert calls[-1].built and calls[-1].directory not in {c.directory for c in calls[:-1]}

    text = "A NEW FIRST LINE, with a new character: §\n" + corpus_file.read_text(encoding="utf-8")
    corpus_file.write_text(text, encoding="utf-8")
    os.utime(corpus_file, ns=(1, 1))  # even with an old mtime, the size differs
    dm = text_data(corpus_file)
    tok = dm.prepare().tokenizer
    assert calls[-1].built and "§" in tok.chars
    assert np.array_equal(np.asarray(dm.train_tokens.array), tok.encode_array(split(text)[0]))


def test_fitted_bpe_is_cached_beside_the_data(corpus_file, monkeypatch, tmp_path):
    text_data(corpus_file, tokenizer="bpe", vocab_size=300).prepare()
    assert len(list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json"))) == 1

    def no_fit(self, texts):
        raise AssertionError("the cached BPE should have been loaded")

    monkeypatch.setattr(BPETokenizer, "fit", no_fit)
    tok = text_data(corpus_file, tokenizer="bpe", vocab_size=300).prepare().tokenizer
    assert tok.vocab_size == 300
    monkeypatch.undo()
    monkeypatch.setenv("MODFORGE_CACHE", str(tmp_path / "cache"))
    text_data(corpus_file, tokenizer="bpe", vocab_size=320).prepare()  # other vocab size: trained anew
    assert len(list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json"))) == 2


def test_cache_files_are_written_atomically(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_file(tmp_path / "x.bin") as fh:
            fh.write(b"partial")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    with atomic_file(tmp_path / "x.bin") as fh:
        fh.write(b"done")
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_cache_dir_key_and_env(tmp_path, monkeypatch):
    assert cache.cache_root(str(tmp_path / "a")) == tmp_path / "a"
    monkeypatch.setenv("MODFORGE_CACHE", str(tmp_path / "b"))
    assert cache.cache_root(None) == tmp_path / "b"
    monkeypatch.delenv("MODFORGE_CACHE")
    assert cache.cache_root(None) == Path(os.path.expanduser("~/.cache/modforge"))


def test_windows_read_from_the_memory_map_and_pickle_small(corpus_file):
    import pickle

    dm = text_data(corpus_file)
    dm.prepare()
    ds = dm.train_dataloader().dataset
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000  # the token array travels as (path, dtype, length), not as data
    x, y = pickle.loads(blob)[5]
    assert torch.equal(x, torch.from_numpy(dm.train_tokens[5:21].astype(np.int64)))
    assert torch.equal(y, torch.from_numpy(dm.train_tokens[6:22].astype(np.int64)))


# --------------------------------------------------------------------------- corpora

def test_stdlib_keeps_its_text_split_and_ids():
    dm = build("data", {"name": "stdlib", "max_chars": 60_000})
    tok = dm.prepare().tokenizer
    text = "\n".join(open(f, encoding="utf-8", errors="replace").read() for f in lm.stdlib_sources()[:40])[:60_000]
    train, val = split(text)
    assert tok.chars == CharTokenizer().fit([train]).chars
    assert np.array_equal(np.asarray(dm.train_tokens.array), tok.encode_array(train))
    assert np.array_equal(np.asarray(dm.val_tokens.array), tok.encode_array(val))


def test_text_reads_files_and_globs_in_order(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for name, body in [("b.txt", "bravo " * 400), ("a.txt", "alpha " * 400), ("sub/c.txt", "charlie " * 400)]:
        (d / name).write_text(body)
    dm = text_data(f"{d}/**/*.txt", val_fraction=0.5)
    tok = dm.prepare().tokenizer
    assert dm.facts.stats["train_chars"] + dm.facts.stats["val_chars"] == 2400 + 2400 + 3200 + 2  # joined by newlines
    first = tok.decode(dm.train_tokens[:6].tolist())
    assert first == "alpha "  # sorted: a.txt, b.txt, sub/c.txt
    dm = text_data([str(d / "sub" / "c.txt"), str(d / "a.txt")], val_fraction=0.5)
    assert dm.prepare().tokenizer.decode(dm.train_tokens[:8].tolist()) == "charlie "


@pytest.mark.parametrize("path,match", [
    ("{d}/*.md", r"data.path=.*\*.md: the glob matches no file"),
    ("{d}/missing.txt", r"data.path=.*missing.txt: no such file"),
    ("{d}", r"data.path=.*: is a directory; name its files with a glob"),
])
def test_text_bad_paths_are_clear_errors(tmp_path, path, match):
    (tmp_path / "a.txt").write_text("hello\n" * 100)
    with pytest.raises(ConfigError, match=match):
        text_data(path.format(d=tmp_path)).prepare()


def test_text_needs_a_path():
    with pytest.raises(ConfigError, match="data.path: name the text files"):
        build("data", {"name": "text"}).prepare()


def offline(monkeypatch):
    def no_network(*a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


def test_tinyshakespeare_offline_without_a_copy_is_one_clear_error(monkeypatch, tmp_path):
    offline(monkeypatch)
    dm = build("data", "tinyshakespeare")
    with pytest.raises(ConfigError) as e:
        dm.prepare()
    msg = str(e.value)
    dest = tmp_path / "cache" / "tinyshakespeare" / "input.txt"
    assert f"{dest} is missing" in msg and lm.TINYSHAKESPEARE_URL in msg
    assert f"put it at {dest}" in msg and "data.path=" in msg
    assert not dest.exists() and not list(dest.parent.glob("*.tmp"))


def test_tinyshakespeare_missing_local_copy_names_the_key(monkeypatch, tmp_path):
    offline(monkeypatch)
    with pytest.raises(ConfigError, match=r"data.path=.*nowhere/input.txt: no such file"):
        build("data", {"name": "tinyshakespeare", "path": str(tmp_path / "nowhere" / "input.txt")}).prepare()


def test_tinyshakespeare_downloads_into_the_cache_once(monkeypatch, tmp_path):
    import hashlib

    body = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 300).encode()
    fetched = []

    def fake_urlopen(url, timeout=None):
        fetched.append(url)
        return io.BytesIO(body)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setattr(lm, "TINYSHAKESPEARE_SHA256", hashlib.sha256(body).hexdigest())
    tok = build("data", {"name": "tinyshakespeare", "block_size": 16}).prepare().tokenizer
    assert fetched == [lm.TINYSHAKESPEARE_URL] and tok.decode(tok.encode("Citizen")) == "Citizen"
    assert (tmp_path / "cache" / "tinyshakespeare" / "input.txt").read_bytes() == body
    build("data", {"name": "tinyshakespeare", "block_size": 16}).prepare()
    assert len(fetched) == 1
    # a corrupted download is refused, not cached
    (tmp_path / "cache" / "tinyshakespeare" / "input.txt").unlink()
    monkeypatch.setattr(lm, "TINYSHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(ConfigError, match="sha256"):
        build("data", "tinyshakespeare").prepare()
    assert not (tmp_path / "cache" / "tinyshakespeare" / "input.txt").exists()


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="shared tinyshakespeare copy not present")
def test_tinyshakespeare_local_copy_is_the_standard_split():
    dm = build("data", {"name": "tinyshakespeare", "path": str(SHAKESPEARE)})
    tok = dm.prepare().tokenizer
    assert tok.vocab_size == 65 + 5
    assert (dm.facts.stats["train_chars"], dm.facts.stats["val_chars"]) == (1_003_854, 111_540)  # nanoGPT's 90/10


class FakeDataset:
    def __init__(self, rows, fingerprint="abc123"):
        self.rows, self._fingerprint = rows, fingerprint
        self.column_names = list(rows[0])

    def iter(self, batch_size):
        for i in range(0, len(self.rows), batch_size):
            chunk = self.rows[i:i + batch_size]
            yield {k: [r[k] for r in chunk] for k in self.column_names}


def fake_datasets(monkeypatch, rows, calls=None):
    mod = types.ModuleType("datasets")

    def load_dataset(name, subset=None, split=None, cache_dir=None):
        if calls is not None:
            calls.append((name, subset, split))
        if name == "missing/dataset":
            raise FileNotFoundError("Couldn't find 'missing/dataset' on the Hugging Face Hub either")
        return FakeDataset(rows)

    mod.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", mod)


def test_hf_reads_a_datasets_split_by_field(monkeypatch):
    rows = [{"text": f"story number {i}: once upon a time there was a fox.", "id": i} for i in range(300)]
    calls = []
    fake_datasets(monkeypatch, rows, calls)
    dm = build("data", {"name": "hf", "dataset": "someone/stories", "subset": "v2", "block_size": 16})
    tok = dm.prepare().tokenizer
    assert calls == [("someone/stories", "v2", "train")]
    whole = "\n".join(r["text"] for r in rows)
    assert dm.facts.stats["train_chars"] + dm.facts.stats["val_chars"] == len(whole)
    assert tok.decode(dm.train_tokens[:20].tolist()) == whole[:20]


def test_hf_errors_name_the_key_and_the_fix(monkeypatch):
    fake_datasets(monkeypatch, [{"story": "x"}])
    with pytest.raises(ConfigError, match=r"data.text_field=text: not a column of a/b \(columns: story\)"):
        build("data", {"name": "hf", "dataset": "a/b"}).prepare()
    with pytest.raises(ConfigError, match=r"data.dataset=missing/dataset .*could not be loaded.*cache"):
        build("data", {"name": "hf", "dataset": "missing/dataset"}).prepare()
    with pytest.raises(ConfigError, match="data.dataset: name a Hugging Face dataset"):
        build("data", {"name": "hf"})
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ConfigError, match=r"pip install 'modforge\[hf\]'"):
        build("data", {"name": "hf", "dataset": "a/b"}).prepare()


# --------------------------------------------------------------------------- classification

CSV = FIXTURES / "sentiment.csv"


def test_classify_reads_csv_and_jsonl_alike(tmp_path):
    import csv

    dm = build("data", {"name": "classify", "path": str(CSV), "batch_size": 5})
    tok = dm.prepare().tokenizer
    assert dm.facts.labels == ["negative", "positive"]
    assert dm.facts.stats["train_examples"] + dm.facts.stats["val_examples"] == 64
    b = next(iter(dm.train_dataloader()))
    assert set(b) == {"src", "src_mask", "label"}
    assert (b["src"][:, 0] == tok.bos_id).all() and torch.equal(b["src_mask"], b["src"] != tok.pad_id)
    with open(CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    jl = tmp_path / "s.jsonl"
    jl.write_text("".join(json.dumps({"sentence": r["text"], "y": r["label"]}) + "\n" for r in rows))
    dj = build("data", {"name": "classify", "path": str(jl), "text_field": "sentence", "label_field": "y",
                        "batch_size": 5})
    dj.prepare()
    assert dj.train_set == dm.train_set and dj.val_set == dm.val_set


def test_classify_errors_name_key_value_and_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"data.label_field=sentiment: .*sentiment.csv has no such column "
                                          r"\(header: text, label\)"):
        build("data", {"name": "classify", "path": str(CSV), "label_field": "sentiment"}).prepare()
    val = tmp_path / "val.csv"
    val.write_text("text,label\nso so,neutral\n")
    with pytest.raises(ConfigError, match=r"data.val_path=.*val.csv, line 2: label 'neutral' does not occur"):
        build("data", {"name": "classify", "path": str(CSV), "val_path": str(val)}).prepare()
    with pytest.raises(ConfigError, match=r"data.path=.*nope.csv: no such file"):
        build("data", {"name": "classify", "path": str(tmp_path / "nope.csv")}).prepare()
    with pytest.raises(ConfigError, match="data.path: required"):
        build("data", "classify")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classify_trains_and_its_checkpoint_keeps_the_labels(tmp_path, pooling):
    cfg = compose(tiny_overrides(steps=3) + ["model=encoder_only", "task=classify", f"task.pooling={pooling}",
                                             f"data.path={CSV}", "data.batch_size=8", "data.max_len=64"])
    m = run(cfg, tmp_path / "run")
    assert 0.0 <= m["val"]["val/acc"] <= 1.0 and np.isfinite(m["val"]["val/loss"])
    task = load_checkpoint(m["checkpoint"])
    assert task.labels == ["negative", "positive"]
    assert set(task.predict(["the film was wonderful", "a dull game"])) <= {"negative", "positive"}
    # padding never changes a prediction: one example alone == the same example in a padded batch
    tok = task.tokenizer
    short, long = [tok.bos_id] + tok.encode("dull"), [tok.bos_id] + tok.encode("what a wonderful show it was")
    batch = torch.full((2, len(long)), tok.pad_id)
    batch[0, :len(short)], batch[1] = torch.tensor(short), torch.tensor(long)
    with torch.no_grad():
        alone = task(torch.tensor([short]))
        padded = task(batch, batch != tok.pad_id)
    torch.testing.assert_close(alone[0], padded[0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- parallel text

TSV = FIXTURES / "parallel.tsv"


def test_parallel_tsv_and_aligned_files_give_the_same_batches(tmp_path):
    lines = TSV.read_text().splitlines()
    (tmp_path / "src.txt").write_text("\n".join(line.split("\t")[0] for line in lines) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(line.split("\t")[1] for line in lines) + "\n")
    a = build("data", {"name": "parallel", "path": str(TSV), "batch_size": 8})
    b = build("data", {"name": "parallel", "src_path": str(tmp_path / "src.txt"), "tgt_path": str(tmp_path / "tgt.txt"),
                       "batch_size": 8})
    tok = a.prepare().tokenizer
    b.prepare()
    assert a.train_set == b.train_set and a.val_set == b.val_set and len(a.val_set) == 9
    assert "w" in tok.chars and "'" in tok.chars  # fitted on both sides (w: English only, ': French only)
    batch = next(iter(a.val_dataloader()))
    assert set(batch) == {"src", "src_mask", "tgt_in", "tgt_out", "tgt_mask"}
    assert torch.equal(batch["src_mask"], batch["src"] != tok.pad_id)
    assert torch.equal(batch["tgt_mask"], batch["tgt_in"] != tok.pad_id)
    assert (batch["tgt_in"][:, 0] == tok.bos_id).all()
    first = a.val_set[0]
    assert tok.decode(batch["tgt_out"][0].tolist()) == tok.decode(first[1])
    assert (batch["tgt_out"][0] == tok.eos_id).sum() == 1


def test_parallel_errors_name_key_value_and_fix(tmp_path):
    (tmp_path / "s.txt").write_text("a\nb\nc\n")
    (tmp_path / "t.txt").write_text("x\ny\n")
    with pytest.raises(ConfigError, match=r"data.src_path=.*s.txt has 3 lines but data.tgt_path=.*t.txt has 2"):
        build("data", {"name": "parallel", "src_path": str(tmp_path / "s.txt"),
                       "tgt_path": str(tmp_path / "t.txt")}).prepare()
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\tun\ntwo deux\n")
    with pytest.raises(ConfigError, match=r"data.path=.*bad.tsv, line 2: expected source<TAB>target"):
        build("data", {"name": "parallel", "path": str(bad)}).prepare()
    with pytest.raises(ConfigError, match="either data.path=.* or data.src_path="):
        build("data", "parallel")


def test_seq2seq_trains_on_parallel_text(tmp_path):
    cfg = compose(tiny_overrides(steps=3) + ["model=encoder_decoder", "data=parallel", f"data.path={TSV}",
                                             "data.batch_size=16", "data.max_len=64", "task.max_decode_len=8"])
    m = run(cfg, tmp_path / "run")
    assert np.isfinite(m["val"]["val/loss"]) and "val/exact_match" in m["val"]
    assert " -> " in m["sample"]


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="shared tinyshakespeare copy not present")
def test_causal_lm_trains_on_tinyshakespeare_with_bpe(tmp_path):
    cfg = compose(tiny_overrides(steps=2) + ["data=tinyshakespeare", f"data.path={SHAKESPEARE}",
                                             "data.tokenizer=bpe", "data.vocab_size=300", "task.sample_chars=10"])
    m = run(cfg, tmp_path / "run")
    assert np.isfinite(m["val"]["val/loss"]) and m["unigram_val_loss"] > 0
    assert load_checkpoint(m["checkpoint"]).tokenizer.vocab_size == 300


def test_synthetic_targets_are_reversed_and_sorted_digits():
    for name, rule in (("reverse", lambda s: s[::-1]), ("sort", lambda s: "".join(sorted(s)))):
        dm = build("data", {"name": name, "n_train": 20, "n_val": 8, "batch_size": 4})
        tok = dm.prepare().tokenizer
        assert dm.facts.positions == 13  # max_len 12 plus <bos>/<eos>
        b = next(iter(dm.val_dataloader()))
        for src, out in zip(b["src"], b["tgt_out"]):
            s = tok.decode(src.tolist())
            assert 3 <= len(s) <= 12 and s.isdigit()
            assert tok.decode(out.tolist()) == rule(s)


@pytest.mark.parametrize("n,bs,limit,world", [(37, 5, 4, 3), (37, 5, 100, 2), (10, 4, 1.0, 3), (9, 2, 0.5, 2)])
def test_ddp_validation_sees_one_process_items_once_each(n, bs, limit, world):
    """Each rank's part of the validation set: together exactly the items one process validates under
    trainer.limit_val_batches (Lightning's rule), none repeated (torch's DistributedSampler pads with repeats),
    each rank within Lightning's limit so it cuts nothing more."""
    from modforge.data.loading import eval_loader, evaluated_items

    data = list(range(100, 100 + n))
    single = [x for batch in eval_loader(data, batch_size=bs) for x in batch.tolist()]
    per_batch = math.ceil(n / bs)
    kept = int(per_batch * limit) if isinstance(limit, float) else min(per_batch, limit)
    assert evaluated_items(n, bs, limit) == len(single[:kept * bs])
    parts = [[x for b in eval_loader(data, batch_size=bs, world_size=world, rank=r, limit=limit) for x in b.tolist()]
             for r in range(world)]
    seen = [x for p in parts for x in p]
    assert sorted(seen) == single[:kept * bs] and len(set(seen)) == len(seen)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert all(len(eval_loader(data, batch_size=bs, world_size=world, rank=r, limit=limit)) <= kept
               for r in range(world))
