"""Bad input, round three: nothing lost, nothing misread.

* Work that is not modforge's, or that modforge cannot attribute to the run at hand, is never deleted or
  overwritten: the files are byte-identical afterwards.
* Values that could only train to nothing are refused in one line before any work.
* Every file read goes through one reader per format: a damaged file is one line naming it.
"""
import hashlib
import json
import os
import random
import shutil

import pytest
import torch

from conftest import tiny_overrides
from modforge.config import compose
from modforge.config.checks import validate
from modforge.errors import ConfigError, ModforgeError, RunDirTaken
from modforge.run.story import run


def snapshot(d) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def tiny(steps: int = 2) -> list:
    return tiny_overrides(steps=steps) + ["data.max_chars=20000", "sample=false", "eval_at_start=false",
                                          "callbacks.progress=none"]


# --------------------------------------------------------------------------- nothing lost

def foreign_status(d):
    (d / "status.json").write_text('{"status": "failed", "error": "their tool"}')
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "model-epoch9.pt").write_bytes(b"weights of another tool")
    (d / "logs").mkdir()
    (d / "logs" / "events.txt").write_text("their events")


def foreign_metrics(d):
    (d / "metrics.json").write_text("{not json")
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "important.ckpt").write_bytes(b"irreplaceable")


def foreign_hydra(d):
    (d / ".hydra").mkdir()
    (d / ".hydra" / "config.yaml").write_text("their: app\n")
    (d / "notes.txt").write_text("mine")


@pytest.mark.parametrize("make", [foreign_status, foreign_metrics, foreign_hydra])
def test_another_tools_directory_is_refused_and_left_byte_identical(tmp_path, make):
    make(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(RunDirTaken, match="not a modforge run's directory"):
        run(compose(tiny()), tmp_path)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", ["", "{not: yaml: [", "- a list\n- not a run config\n"])
def test_a_finished_run_whose_config_is_damaged_is_never_retrained(tmp_path, damage):
    run(compose(tiny()), tmp_path)
    (tmp_path / "config.yaml").write_text(damage)
    before = snapshot(tmp_path)
    with pytest.raises(RunDirTaken, match="config.yaml cannot be read.*never trained again"):
        run(compose(tiny()), tmp_path)
    assert snapshot(tmp_path) == before


def test_the_command_refuses_a_foreign_run_directory_before_hydra_writes_into_it(tmp_path, capsys):
    from modforge.train import main

    foreign_status(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(tiny() + [f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: hydra.run.dir=") and err.count("\n") == 1, err
    assert snapshot(tmp_path) == before and not (tmp_path / ".hydra").exists()


def test_clearing_an_unfinished_run_removes_only_what_a_run_writes(tmp_path):
    from modforge.run.dirs import MARKER, clear_records

    (tmp_path / MARKER).write_text("{}")
    for name in ("config.yaml", "status.json", "checkpoints/last.ckpt", "checkpoints/mine.pt", "logs/metrics.csv",
                 "logs/notes.txt", "keep.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    clear_records(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == \
        [MARKER, "checkpoints/mine.pt", "keep.txt", "logs/notes.txt"]


def test_a_moved_run_resumes_with_one_set_of_checkpoints(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run(compose(tiny(steps=2)), a)
    shutil.move(a, b)
    m = run(compose(tiny(steps=4) + [f"resume={b}"]), b)
    assert m["steps"] == 4
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    steps = [int(float(r.split(",")[0])) for r in (b / "logs" / "metrics.csv").read_text().splitlines()[1:]
             if r.split(",")[0]]
    assert len(steps) == len(set(zip(steps, range(len(steps))))) and sorted(steps) == steps


# --------------------------------------------------------------------------- nothing trained for nothing

VALUES = [
    (["norm.eps=-1"], "norm.eps=-1.0: must be > 0"),
    (["norm=rms", "norm.eps=0"], "norm.eps=0.0: must be > 0"),
    (["norm=batch", "norm.eps=-1e-5"], "norm.eps"),
    (["norm=batch", "norm.momentum=2"], "norm.momentum=2.0"),
    (["norm=scale", "norm.eps=0"], "norm.eps=0.0"),
    (["pos=rope", "pos.base=-5"], "pos.base=-5.0: must be > 1"),
    (["pos=sinusoidal", "pos.base=1"], "pos.base=1.0: must be > 1"),
    (["trainer.limit_val_batches=0"], "0 validates nothing"),
    (["trainer.limit_val_batches=0.0"], "0 validates nothing"),
    (["trainer.limit_train_batches=0"], "0 trains nothing"),
    (["trainer.limit_train_batches=1.5"], "a fraction must be in (0, 1]"),
    (["trainer.max_epochs=0"], "0 trains nothing"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0"),
    (["attention=gqa", "attention.n_kv_heads=3"], "must divide model.n_heads=4"),
    (["model=encoder_decoder", "task.max_decode_len=0"], "task.max_decode_len=0"),
    (["callbacks=early_stopping", "callbacks.early_stopping.monitor=loss"], "runs log train/loss and val/<metric>"),
]


@pytest.mark.parametrize("overrides,msg", VALUES, ids=[" ".join(o) for o, _ in VALUES])
def test_values_that_train_to_nothing_are_refused(overrides, msg):
    with pytest.raises(ConfigError) as e:
        validate(compose(overrides))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_warm_up_longer_than_training_is_a_note_not_an_error():
    notes = validate(compose(["trainer.max_steps=20", "scheduler.warmup_steps=100"]))
    assert len(notes) == 1 and "never reaches optim.lr" in notes[0]
    assert validate(compose([])) == []


def test_a_run_that_trains_no_step_fails_in_one_line(tmp_path):
    with pytest.raises(ModforgeError, match="trained no step.*data.batch_size=100000"):
        run(compose(tiny() + ["data.batch_size=100000"]), tmp_path)
    assert not (tmp_path / "metrics.json").exists()


def test_an_evaluation_length_the_data_cannot_hold_fails_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"eval_block_sizes=\[100000\]: the validation split has \d+ tokens"):
        run(compose(tiny() + ["pos=rope", "eval_block_sizes=[100000]"]), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_init_from_keeps_its_tokenizer_and_refuses_another(tmp_path):
    from modforge.checkpoints.files import init_config

    ckpt = {"hyper_parameters": {"run_cfg": {"data": {"name": "stdlib", "tokenizer": "bpe", "vocab_size": 300}}}}
    cfg = compose(["data.tokenizer=char", f"init_from={tmp_path}"])
    assert init_config(cfg, ckpt, user_keys=["init_from"]).data.tokenizer == "bpe"  # what config.yaml records
    with pytest.raises(ConfigError, match="data.tokenizer=char: init_from=.* reads text with its own tokenizer"):
        init_config(cfg, ckpt, user_keys=["data.tokenizer", "init_from"])


def test_a_plugin_that_exits_at_import_is_a_failed_plugin_not_the_end(monkeypatch):
    import importlib.metadata

    from modforge import plugins, registry

    class Exits:
        name, value, dist = "exits", "exits_plugin:x", None

        def load(self):
            raise SystemExit(0)

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Exits()])
    with pytest.warns(UserWarning, match="exits_plugin:x.*failed to load: SystemExit"):
        failed = plugins.load_plugins()
    assert "SystemExit" in failed["exits_plugin:x"]
    registry.forget_provider("exits_plugin:x")


# --------------------------------------------------------------------------- files: one reader per format

def test_the_readers_name_what_a_path_is(tmp_path):
    from modforge.utils import readers

    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for name, msg in [("fifo", "a FIFO"), ("loop1", "cannot be reached"), ("dangling", "link whose target does not "
                      "exist"), ("missing", "no such file"), (".", "a directory")]:
        with pytest.raises(ConfigError, match=msg):
            readers.regular_file(tmp_path / name, "data.path")
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "bad.yaml").write_text("a: [")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "latin.json").write_bytes('{"a": "caf\xe9"}'.encode("latin-1"))
    for call, msg in [(lambda: readers.json_file(tmp_path / "bad.json"), r"not valid JSON \(line 1"),
                      (lambda: readers.json_file(tmp_path / "list.json"), "expected a JSON object, found list"),
                      (lambda: readers.json_file(tmp_path / "latin.json"), "not utf-8 text"),
                      (lambda: readers.yaml_file(tmp_path / "bad.yaml"), "not valid YAML"),
                      (lambda: readers.yaml_file(tmp_path / "empty.yaml"), "nothing \\(an empty file\\)")]:
        with pytest.raises(ConfigError, match=msg) as e:
            call()
        assert "\n" not in str(e.value)


def test_the_checkpoint_reader_turns_any_bytes_into_one_line(tmp_path):
    """A property over random and mangled files: whatever the bytes, one ConfigError, never another exception."""
    from modforge.checkpoints.files import read_checkpoint

    real = tmp_path / "real.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(3)}, "hyper_parameters": {"run_cfg": {}}, "global_step": 1}, real)
    good = real.read_bytes()
    rng = random.Random(0)
    cases = [b"", b"a,b\n1,2\n", b"PK\x03\x04", good[: len(good) // 2], good[:-7]]
    cases += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))) for _ in range(40)]
    for _ in range(20):  # the real file with a few bytes flipped
        b = bytearray(good)
        for _ in range(3):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    for i, data in enumerate(cases):
        p = tmp_path / f"{i}.ckpt"
        p.write_bytes(data)
        try:
            read_checkpoint(p, "resume")
        except ConfigError as e:
            assert "\n" not in str(e) and str(p) in str(e)


def test_a_broken_sweep_record_is_one_line(tmp_path, capsys):
    from modforge.train import main

    (tmp_path / "multirun.yaml").write_text("hydra: [unclosed\n")
    with pytest.raises(SystemExit) as e:
        main(["-m", f"resume={tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "multirun.yaml: not valid YAML" in err and err.count("\n") == 1


def test_a_path_the_override_grammar_cannot_read_gets_the_quoting_hint():
    from modforge.config.command_line import check_overrides

    with pytest.raises(ConfigError, match="quote the value: 'data.path=\"/tmp/körpus.txt\"'"):
        check_overrides(["data=text", "data.path=/tmp/körpus.txt"])


def test_a_special_file_as_data_is_named_for_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="data.path=.*fifo: a FIFO"):
        validate(compose(["data=text", f"data.path={tmp_path / 'fifo'}"]))


def test_a_run_of_another_architecture_resumes_without_repeating_it(tmp_path):
    """The resume command line composes today's defaults (decoder_only, stdlib): the saved run's groups replace
    them whole, not merged into the defaults' typed schemas (seq2seq's data has keys stdlib's has not)."""
    from modforge.train import main
    from modforge.utils.files import read_json

    small = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "trainer.val_check_interval=2",
             "trainer.limit_val_batches=1", "sample=false", "callbacks.progress=none"]
    main(["model=encoder_decoder", "trainer.max_steps=2", *small, f"hydra.run.dir={tmp_path / 'a'}"])
    main([f"resume={tmp_path / 'a'}", "trainer.max_steps=3", f"hydra.run.dir={tmp_path / 'b'}"])
    m = read_json(tmp_path / "b" / "metrics.json")
    assert m["steps"] == 3 and m["config"]["model"] == "encoder_decoder" and m["config"]["data"] == "reverse"
