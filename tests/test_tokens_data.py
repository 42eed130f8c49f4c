"""Token shards (data=tokens), the prepare verb, and document masking (issue 53, items 1-3)."""
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_module, tiny_overrides
from modforge.config import compose
from modforge.data.prepare import PrepareConfig, prepare
from modforge.data.sources import is_val
from modforge.data.shards import HEADER_BYTES, MAGIC_U16, MAGIC_U32, open_shard, write_shard
from modforge.registry import ConfigError
from modforge.run.story import run

WORDS = "the cat sat on a mat and dog ran far away from home while birds sang songs of old".split()


def corpus(path: Path, n: int = 300, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) + "\n"
                            for _ in range(n)))
    return path


def prepared(tmp_path: Path, name: str = "shards", **kw) -> Path:
    src = tmp_path / "corpus.txt"
    if not src.exists():  # (written once: a prepare is keyed by its inputs' sizes and modification times)
        corpus(src)
    out = tmp_path / name
    cfg = dict(out=str(out), input=str(src), documents="line", vocab_size=300, val_fraction=0.1,
               shard_tokens=2000, workers=1, progress=False)
    prepare(PrepareConfig(**{**cfg, **kw}), log=lambda s: None)
    return out


def tokenizer_json(path: Path, vocab: int):
    """A GPT-2-like byte-level BPE with <|endoftext|> (id 0), saved as a tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator([" ".join(WORDS)] * 5, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(path))
    return hf


SMALL = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.max_len=64", "data.block_size=16",
         "data.batch_size=4", "trainer.limit_val_batches=2", "sample=false"]


# --------------------------------------------------------------------------- shard formats

def test_the_three_shard_layouts_read_the_same_ids(tmp_path):
    ids = np.random.default_rng(0).integers(0, 60000, 1000).astype(np.uint16)
    with open(tmp_path / "a.bin", "wb") as fh:
        write_shard(fh, ids, np.uint16)
    head = np.fromfile(tmp_path / "a.bin", dtype="<i4", count=3)
    assert head.tolist() == [MAGIC_U16, 1, 1000]  # llm.c's header: what modded-nanogpt's loader asserts
    assert (tmp_path / "a.bin").stat().st_size == HEADER_BYTES + 2 * 1000
    ids.tofile(tmp_path / "raw.bin")  # nanoGPT's train.bin: no header
    np.save(tmp_path / "n.npy", ids.astype(np.uint32))
    for name in ("a.bin", "raw.bin", "n.npy"):
        s = open_shard(tmp_path / name)
        assert len(s) == 1000 and np.array_equal(np.asarray(s[:]), ids), name
    big = np.array([0, 70000, 5], dtype=np.uint32)
    with open(tmp_path / "u32.bin", "wb") as fh:
        write_shard(fh, big, np.uint32)
    assert np.fromfile(tmp_path / "u32.bin", dtype="<i4", count=2).tolist() == [MAGIC_U32, 7]
    assert np.asarray(open_shard(tmp_path / "u32.bin")[:]).tolist() == [0, 70000, 5]


def test_bad_shards_are_refused_in_one_line(tmp_path):
    with open(tmp_path / "a.bin", "wb") as fh:
        write_shard(fh, np.arange(100, dtype=np.uint16), np.uint16)
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-10])
    with pytest.raises(ConfigError, match=r"cut.bin: its header counts 100 tokens .* but the file has 1,214 bytes"):
        open_shard(tmp_path / "cut.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(ConfigError, match=r"odd.bin: not an llm.c shard \(its first int32 is None"):
        open_shard(tmp_path / "odd.bin", "llmc")
    with pytest.raises(ConfigError, match=r"3 bytes is not a whole number of uint16 tokens"):
        open_shard(tmp_path / "odd.bin")
    np.save(tmp_path / "f.npy", np.zeros(4, dtype=np.float32))
    with pytest.raises(ConfigError, match=r"1-d array of unsigned integers .* 1-d float32"):
        open_shard(tmp_path / "f.npy")


# --------------------------------------------------------------------------- prepare

def test_prepare_writes_whole_documents_with_end_marks_and_the_same_bytes_with_any_number_of_workers(tmp_path):
    one = prepared(tmp_path, "one")
    two = prepared(tmp_path, "two", workers=2)
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in two.iterdir()) and "meta.json" in files and ".prepare.json" not in files
    for f in files:
        if f.endswith(".bin"):
            assert (one / f).read_bytes() == (two / f).read_bytes(), f
    meta = json.loads((one / "meta.json").read_text())
    assert meta["complete"] and meta["eod_policy"] == "end" and meta["eod_id"] == 3  # modforge's <eos>
    lines = (tmp_path / "corpus.txt").read_text().splitlines()
    val_lines = [t for i, t in enumerate(lines) if is_val(i, 0.1)]
    assert len(val_lines) == 30 and meta["splits"]["val"]["docs"] == 30
    assert meta["splits"]["val"]["chars"] == sum(map(len, val_lines))
    # the validation shard is each validation document's ids, then <eos>, in order
    from modforge.data.tokenizers import load_tokenizer

    tok = load_tokenizer(meta["tokenizer"])
    expected = np.concatenate([np.append(tok.encode_array(t), 3) for t in val_lines])
    assert np.array_equal(np.asarray(open_shard(one / "val_000000.bin")[:]), expected)
    for e in meta["shards"]:  # every shard closes on a document's end
        s = np.asarray(open_shard(one / e["file"])[:])
        assert s[-1] == 3 and e["tokens"] == len(s) and e["max_id"] == s.max()


def test_prepare_start_policy_and_a_pretrained_tokenizer_keep_the_files_ids(tmp_path):
    hf = tokenizer_json(tmp_path / "tokenizer.json", 300)
    out = prepared(tmp_path, tokenizer_path=str(tmp_path / "tokenizer.json"), eod="start")
    meta = json.loads((out / "meta.json").read_text())
    eot = hf.token_to_id("<|endoftext|>")
    assert meta["tokenizer"]["name"] == "pretrained" and meta["eod_id"] == eot == 0 and meta["eod_policy"] == "start"
    first = np.asarray(open_shard(out / "train_000000.bin")[:])
    line = (tmp_path / "corpus.txt").read_text().splitlines()[0]
    assert first[0] == eot and first[1:1 + len(hf.encode(line).ids)].tolist() == hf.encode(line).ids


def test_a_killed_prepare_leaves_no_whole_looking_shard_and_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    import modforge.data.prepare as P

    whole = prepared(tmp_path, "whole")
    real, calls = P.write_shard, []

    def killed_on_the_third(fh, ids, dtype):
        calls.append(1)
        if len(calls) == 3:
            fh.write(b"half a shard")
            raise KeyboardInterrupt  # as a kill in the middle of a write
        real(fh, ids, dtype)

    monkeypatch.setattr(P, "write_shard", killed_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        prepared(tmp_path, "killed")
    monkeypatch.undo()
    killed = tmp_path / "killed"
    assert sorted(p.name for p in killed.iterdir()) == [".prepare-val-pending.npy", ".prepare.json",
                                                        "train_000000.bin", "train_000001.bin"]
    with pytest.raises(ConfigError, match=r"data.path=.*killed: prepare did not finish|no .* names the shards"):
        compose_and_prepare(killed)
    counted, starts = [], []
    monkeypatch.setattr(P, "write_shard", lambda *a: (counted.append(1), real(*a)))
    real_batches = P.batches
    monkeypatch.setattr(P, "batches", lambda docs, start, *a: (starts.append(start), real_batches(docs, start, *a))[1])
    prepared(tmp_path, "killed")  # the same command again: it resumes
    second_end = json.loads((whole / "meta.json").read_text())["shards"][1]["docs"][1]
    last_val = max(i for i in range(second_end) if is_val(i, 0.1))  # val's buffer holds up to it, saved
    assert starts == [min(second_end, last_val + 1)] and starts[0] > 100  # not document 0
    n_shards = len(json.loads((whole / "meta.json").read_text())["shards"])
    assert len(counted) == n_shards - 2  # the two finished shards were not written again
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in whole.iterdir())
    for p in whole.glob("*.bin"):
        assert (killed / p.name).read_bytes() == p.read_bytes()
    with pytest.raises(ConfigError, match=r"out=.*killed: holds shards prepared from other inputs or settings"):
        prepared(tmp_path, "killed", vocab_size=400)


def compose_and_prepare(path: Path):
    from modforge.data.tokens import TokensData, TokensDataConfig

    return TokensData(TokensDataConfig(path=str(path))).prepare()


@pytest.mark.parametrize("argv, message", [
    (["input=c.txt"], r"out=<dir> is required"),
    (["out=o"], r"input= or dataset=: name the text"),
    (["out=o", "input=nope.txt"], r"input=nope.txt: no such file"),
    (["out=o", "input=c.txt", "eod=middle"], r"eod=middle: allowed values are end, start, none"),
    (["out=o", "input=c.txt", "val_fraction=1.5"], r"val_fraction=1.5: must be in \(0, 1\)"),
    (["out=o", "input=c.txt"], r"val_fraction=0.01: of 1 file\(s\), each one document \(documents=file\), none "
                               r"would validate"),
    (["out=o", "input=c.txt", "val_split=validation"], r"val_split=validation: names a split of a dataset"),
    (["out=o", "input=c.txt", "documents=line", "tokenizer=bpe", "vocab_size=10"], r"vocab_size=10: a byte-level BPE"),
    (["out=o", "input=c.txt", "documents=line", "tokenizer_path=none.json"], r"tokenizer_path=none.json: no such file"),
    (["out=o", "input=bad.jsonl"], r"bad.jsonl: line 2 has no text field 'text'"),
])
def test_prepare_refuses_bad_options_in_one_line(tmp_path, argv, message):
    corpus(tmp_path / "c.txt", 20)
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    p = run_module("modforge", tmp_path, "prepare", *argv, "progress=false")
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert __import__("re").search(message, err), err


# --------------------------------------------------------------------------- data=tokens

def test_tokens_data_trains_reports_bits_per_byte_and_resumes_exactly(tmp_path):
    out = prepared(tmp_path)
    base = [*SMALL, "data=tokens", f"data.path={out}"]
    whole = run(compose(tiny_overrides(steps=6) + base), tmp_path / "whole")
    first = run(compose(tiny_overrides(steps=3) + base), tmp_path / "first")
    resumed = run(compose(tiny_overrides(steps=6) + base + [f"resume={first['checkpoint']}"]), tmp_path / "resumed")
    assert resumed["resumed_at_steps"] == [3] and resumed["data_checksum"] == whole["data_checksum"]
    assert resumed["val"]["val/loss"] == pytest.approx(whole["val"]["val/loss"], abs=1e-6)
    meta = json.loads((out / "meta.json").read_text())
    per_byte = meta["splits"]["val"]["tokens"] / meta["splits"]["val"]["bytes"]
    v = whole["val"]
    assert v["val/bpb"] == pytest.approx(v["val/loss"] / np.log(2) * per_byte, rel=1e-5)
    assert "val/bpc" in v  # the text is ASCII: bytes are characters
    assert v["val/bpc"] == pytest.approx(v["val/bpb"], rel=1e-6)


def test_tokens_data_reads_foreign_shards_with_a_tokenizer_file(tmp_path):
    """nanoGPT's layout: raw uint16 train.bin / val.bin and no sidecar; the ids are the tokenizer.json's."""
    tokenizer_json(tmp_path / "tokenizer.json", 280)
    d = tmp_path / "nano"
    d.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 280, 3000).astype(np.uint16).tofile(d / "train.bin")
    rng.integers(0, 280, 600).astype(np.uint16).tofile(d / "val.bin")
    m = run(compose(tiny_overrides(steps=2) + SMALL + ["data=tokens", f"data.path={d}",
                                                       f"data.tokenizer_path={tmp_path / 'tokenizer.json'}",
                                                       "data.vocab_size=320"]), tmp_path / "r")
    assert np.isfinite(m["val"]["val/loss"]) and "val/bpb" not in m["val"]
    from modforge.checkpoints import load_checkpoint

    task = load_checkpoint(m["checkpoint"])
    assert task.model.head.weight.shape[0] == 320 and task.facts.eod_id == 0  # rows padded; <|endoftext|>


def foreign(tmp_path: Path, train: np.ndarray, val: np.ndarray) -> Path:
    d = tmp_path / "f"
    d.mkdir(exist_ok=True)
    train.astype(np.uint16).tofile(d / "train.bin")
    val.astype(np.uint16).tofile(d / "val.bin")
    return d


@pytest.mark.parametrize("case, message", [
    ("no directory", r"data.path=.*nowhere: no such directory .*python -m modforge prepare"),
    ("no val shard", r"data.val=\*val\*: no .bin or .npy shard under"),
    ("id past the vocabulary", r"train.bin holds token id 900, past the vocabulary of 300"),
    ("shorter than a block", r"val.bin holds 10 tokens, fewer than data.block_size \+ 1 = 17"),
    ("no tokenizer", r"no meta.json names the shards' tokenizer; give data.tokenizer_path="),
    ("wrong magic", r"not an llm.c shard \(its first int32 is"),
    ("unfinished prepare", r"prepare did not finish writing it"),
    ("bad dtype key", r"data.dtype=int8: allowed values are auto, llmc, uint16, uint32"),
    ("document mask on text data", r"task.document_mask=true: data=stdlib marks no document ends"),
    ("overlapping globs", r"data.train=\* and data.val=\*val\* both name .*val_000000.bin"),
])
def test_bad_token_data_is_refused_in_one_line_before_training(tmp_path, case, message):
    out = prepared(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    ov = [*SMALL, "data=tokens", f"data.path={out}"]
    if case == "no directory":
        ov[-1] = f"data.path={tmp_path / 'nowhere'}"
    elif case == "no val shard":
        (out / "val_000000.bin").unlink()
    elif case == "id past the vocabulary":
        d = foreign(tmp_path, np.full(100, 900), np.arange(100))
        (d / "meta.json").write_text(json.dumps({**meta, "shards": []}))
        ov[-1] = f"data.path={d}"
    elif case == "shorter than a block":
        d = foreign(tmp_path, np.arange(100), np.arange(10))
        (d / "meta.json").write_text(json.dumps({**meta, "shards": []}))
        ov[-1] = f"data.path={d}"
    elif case == "no tokenizer":
        ov[-1] = f"data.path={foreign(tmp_path, np.arange(100), np.arange(100))}"
    elif case == "wrong magic":
        ov += ["data.dtype=llmc"]
        ov[-2] = f"data.path={foreign(tmp_path, np.arange(100), np.arange(100))}"
    elif case == "unfinished prepare":
        (out / "meta.json").write_text(json.dumps({**meta, "complete": False}))
    elif case == "bad dtype key":
        ov += ["data.dtype=int8"]
    elif case == "document mask on text data":
        ov = [*SMALL, "task.document_mask=true"]
    elif case == "overlapping globs":
        ov += ["data.train=*"]
    p = run_module("modforge.train", tmp_path, *tiny_overrides(steps=1), *ov, "hydra.run.dir=run")
    err = p.stderr.strip()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "run" / "checkpoints").exists()


# --------------------------------------------------------------------------- document masking

@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("attention", ["mha", "gqa", "diff", "mla"])
@pytest.mark.parametrize("policy", ["end", "start"])
def test_document_masking_equals_each_document_run_alone(pos, attention, policy):
    from omegaconf import OmegaConf

    from modforge.models.blocks import Parts
    from modforge.models.param import parametrised
    from modforge.utils.documents import document_ids

    ov = ["model.d_model=32", "model.n_heads=4", "model.n_layers=2", f"pos={pos}", f"attention={attention}"]
    if attention == "gqa":
        ov.append("attention.n_kv_heads=2")
    cfg = OmegaConf.to_container(compose(ov), resolve=True)
    torch.manual_seed(0)
    model, _ = parametrised(cfg["model"], Parts.from_config(cfg), 50, "standard")
    model.eval()
    eod = 3
    body = [[7, 8, 9], [10, 11], [12, 13, 14, 15, 16], [17, 18]]
    docs = [d + [eod] for d in body[:-1]] + [body[-1]] if policy == "end" else \
        [body[0]] + [[eod] + d for d in body[1:]]  # (a window starts inside its first document)
    # a second row in another order (the window's cut documents stay at its ends: end policy, the last one has
    # no mark yet; start policy, the first one's mark came before the window)
    other = [docs[i] for i in ((2, 0, 1, 3) if policy == "end" else (0, 2, 3, 1))]
    x = torch.tensor([sum(docs, []), sum(other, [])])
    documents, positions = document_ids(x, eod, policy)
    with torch.no_grad():
        packed = model(x, documents=documents, positions=positions)
        alone = [torch.cat([model(torch.tensor([d])) for d in order], 1) for order in (docs, other)]
        unmasked = model(x)
    reference = torch.cat(alone, 0)
    assert (packed - reference).abs().max().item() < 1e-5
    assert (unmasked - reference).abs().max().item() > 1e-2  # without the mask the documents do see each other


def test_document_ids_and_positions_under_both_policies():
    from modforge.utils.documents import document_ids

    x = torch.tensor([[5, 3, 6, 7, 3, 8]])
    d, p = document_ids(x, 3, "end")
    assert d.tolist() == [[0, 0, 1, 1, 1, 2]] and p.tolist() == [[0, 1, 0, 1, 2, 0]]
    d, p = document_ids(x, 3, "start")
    assert d.tolist() == [[0, 1, 1, 1, 2, 2]] and p.tolist() == [[0, 0, 1, 2, 0, 1]]


def test_a_document_masked_run_trains_on_prepared_shards(tmp_path):
    out = prepared(tmp_path)
    m = run(compose(tiny_overrides(steps=3) + SMALL + ["data=tokens", f"data.path={out}", "task.document_mask=true",
                                                       "pos=rope"]), tmp_path / "r")
    plain = run(compose(tiny_overrides(steps=3) + SMALL + ["data=tokens", f"data.path={out}", "pos=rope"]),
                tmp_path / "p")
    assert np.isfinite(m["val"]["val/loss"]) and m["data_checksum"] == plain["data_checksum"]
    assert m["val"]["val/loss"] != plain["val"]["val/loss"]


@pytest.mark.process  # SIGKILL at a step: the process is the subject
def test_a_run_on_shards_killed_at_a_step_resumes_on_the_same_batches(tmp_path):
    out = prepared(tmp_path)
    args = [*SMALL, "data=tokens", f"data.path={out}", "trainer.max_steps=8", "trainer.val_check_interval=4",
            "trainer.enable_progress_bar=false"]
    p = run_module("modforge.train", tmp_path, *args, "hydra.run.dir=whole")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run_module("modforge.train", tmp_path, *args, "hydra.run.dir=killed", fault="kill@step=6")
    assert p.returncode == -9 and not (tmp_path / "killed" / "metrics.json").exists()
    p = run_module("modforge.train", tmp_path, "resume=killed")
    assert p.returncode == 0, p.stderr[-2000:]
    whole, killed = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "killed"))
    assert killed["resumed_at_steps"] == [4] and killed["data_checksum"] == whole["data_checksum"]
    assert killed["val"]["val/loss"] == pytest.approx(whole["val"]["val/loss"], abs=1e-6)


def test_a_tiny_corpus_goes_through_prepare_training_and_both_evaluations(tmp_path):
    """Issue 53's chain on one corpus: prepare, data=tokens with document masking, the built-in task scored at
    every validation, and python -m modforge eval on the checkpoint giving the same figures."""
    out = prepared(tmp_path)
    m = run(compose(tiny_overrides(steps=4) + SMALL + ["data=tokens", f"data.path={out}", "task.document_mask=true",
                                                       "task.evals=[pycloze]"]), tmp_path / "r")
    p = run_module("modforge", tmp_path, "eval", f"ckpt={tmp_path / 'r'}", "tasks=pycloze", f"out={tmp_path / 'e.json'}")
    assert p.returncode == 0, p.stderr[-2000:]
    e = json.loads((tmp_path / "e.json").read_text())["pycloze"]
    for k in ("acc", "acc_norm", "bpb"):
        assert e[k] == pytest.approx(m["val"][f"val/pycloze/{k}"], rel=1e-5, abs=1e-6), k


EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_preset_composes(name):
    """The GPU twins and the BPE presets are run only where a GPU is lent: their commands must compose here."""
    cfg = compose([f"experiment={name}"])
    if name.endswith("_bpe_h100"):
        assert cfg.data.name == "tokens" and cfg.trainer.accelerator == "gpu"


def test_a_bpe_preset_without_its_shards_stops_in_one_line(tmp_path):
    from conftest import run_in_process

    p = run_in_process("modforge.train", tmp_path, "experiment=ladder_ffn_bpe_h100", "trainer=cpu",
                       env={"MODFORGE_WIKITEXT103_BPE": str(tmp_path / "nowhere")})
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"data.path={tmp_path / 'nowhere'}: no such directory" in errors[0]


def test_a_prepare_that_leaves_a_split_empty_cleans_up_so_the_corrected_command_runs(tmp_path):
    src = corpus(tmp_path / "c.txt", 20)
    cfg = dict(out=str(tmp_path / "o"), input=str(src), documents="line", vocab_size=300, shard_tokens=50,
               workers=1, progress=False)
    with pytest.raises(ConfigError, match=r"val_fraction=0.01: of 20 documents, none went to val"):
        prepare(PrepareConfig(**cfg, val_fraction=0.01), log=lambda s: None)
    assert [p.name for p in (tmp_path / "o").iterdir()] == []  # no state, no shard of the failed settings
    meta = prepare(PrepareConfig(**cfg, val_fraction=0.1), log=lambda s: None)
    assert meta["splits"]["val"]["docs"] == 2


def test_a_shard_never_overflows_its_header_and_a_document_too_long_for_one_is_refused(tmp_path, monkeypatch):
    import modforge.data.prepare as P

    monkeypatch.setattr(P, "MAX_SHARD", 10)
    w = P.SplitWriter("train", tmp_path, np.uint16, shard_tokens=1000)
    assert not w.add(0, np.arange(6, dtype=np.uint16), 6, 6)
    assert w.add(1, np.arange(6, dtype=np.uint16), 6, 6)  # 12 > 10: the first document's shard is written first
    assert [e["tokens"] for e in w.shards] == [6] and w.buf_tokens == 6
    with pytest.raises(ConfigError, match=r"document 2 is 11 tokens, more than a shard holds \(10"):
        w.add(2, np.arange(11, dtype=np.uint16), 11, 11)


def test_a_dataset_s_own_validation_split_validates(tmp_path):
    """val_split=: the validation documents are that split's rows (WikiText's lines: a share of the training rows
    would put lines of one article on both sides)."""
    d = tmp_path / "ds"
    d.mkdir()
    rng = random.Random(1)
    for split, n in (("train", 40), ("validation", 5)):
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(9))})
                                                  + "\n" for _ in range(n)))
    meta = prepare(PrepareConfig(out=str(tmp_path / "o"), dataset=str(d), val_split="validation", vocab_size=300,
                                 workers=1, progress=False), log=lambda s: None)
    assert meta["splits"]["train"]["docs"] == 40 and meta["splits"]["val"]["docs"] == 5
    val_text = [json.loads(line)["text"] for line in (d / "validation.jsonl").read_text().splitlines()]
    assert meta["splits"]["val"]["chars"] == sum(map(len, val_text))
