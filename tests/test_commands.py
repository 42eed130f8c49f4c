"""The commands as a whole: ``python -m modforge <verb>``, the files the command and its sweeper exchange
instead of shared module state, and a job's config validated once."""
import os
import subprocess
import sys

import pytest
from pathlib import Path

from conftest import python, run_in_process

from modforge.__main__ import VERBS, main as verb_main


def test_every_verb_names_a_command_module_with_a_main():
    import importlib

    for verb, (module, what) in VERBS.items():
        assert callable(importlib.import_module(module).main) and what, verb


def test_the_verb_table_answers_help_and_refuses_an_unknown_verb(capsys):
    verb_main(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in VERBS)
    with pytest.raises(SystemExit) as e:
        verb_main(["lsit"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: 'lsit' is not a modforge verb. Did you mean 'list'?")
    assert err.count("\n") == 1


@pytest.mark.process  # python -m modforge itself: the module's entry point
def test_a_verb_runs_its_command():
    p = python("-m", "modforge", "list", "norm", cwd=Path.cwd())
    assert p.returncode == 0 and "rms" in p.stdout, p.stderr[-2000:]
    p = run_in_process("modforge", Path.cwd(), "train", "norm=rmss")  # the verb's dispatch, without a second start
    assert p.returncode == 2 and p.stderr.startswith("error: Unknown norm 'rmss'"), p.stderr[-2000:]


def test_the_preflight_verdicts_and_the_sweepers_outcome_go_through_the_commands_channel(tmp_path):
    from modforge.sweeps.record import (CHANNEL_ENV, RECORD, close_channel, job_key, open_channel, read_invalid,
                                        write_invalid, write_outcome)

    assert read_invalid() == {}  # no command around: nothing to skip
    channel = open_channel()
    try:
        write_invalid(channel, [(["norm=rmss", "seed=1", "dry_run=true", "hydra.sweep.dir=x"], "Unknown norm 'rmss'")])
        assert read_invalid() == {job_key(["seed=1", "norm=rmss"]): "Unknown norm 'rmss'"}
        write_outcome(tmp_path / "sweep", {"exit": 1, "summary": "one failed"})
    finally:
        outcome = close_channel(channel)
    assert outcome == {"exit": 1, "summary": "one failed"}
    assert not channel.exists() and CHANNEL_ENV not in os.environ
    assert (tmp_path / "sweep" / RECORD).is_file()  # the sweep's own record stays
    write_outcome(tmp_path / "other", {"exit": 0})  # a sweeper outside a command: only the record
    assert (tmp_path / "other" / RECORD).is_file()


def test_a_resumed_run_is_validated_once(tmp_path, monkeypatch):
    """The pre-flight validates the config the job trains with (the resumed run's); the run does not again."""
    import modforge.cli.preflight as preflight
    import modforge.run.story as story
    from modforge.train import main

    calls = []

    def counting(validate):
        def wrapped(cfg, *a, **k):
            calls.append(cfg.trainer.max_steps)
            return validate(cfg, *a, **k)
        return wrapped

    monkeypatch.setattr(preflight, "validate", counting(preflight.validate))
    monkeypatch.setattr(story, "validate", counting(story.validate))
    monkeypatch.chdir(tmp_path)
    tiny = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "data.block_size=16",
            "data.batch_size=4", "data.max_chars=4000", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
            "sample=false", "eval_at_start=false", "callbacks.progress=none"]
    main([*tiny, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}"])
    assert calls == [2]
    calls.clear()
    main([f"resume={tmp_path / 'run'}", "trainer.max_steps=4", "trainer.limit_val_batches=1"])
    assert calls == [4]  # once, the resumed config (before: four times)
    from modforge.utils.files import read_json

    assert read_json(tmp_path / "run" / "metrics.json")["steps"] == 4


@pytest.mark.parametrize("module,argv", [
    ("export", ["ckpt=run", "out=e1", "out=e2"]),
    ("convert", ["hf=gpt2", "out=a.ckpt", "+out=b.ckpt"]),
    ("generate", ["ckpt=run", "prompt=a", "ckpt=other"]),
])
def test_a_key_given_twice_is_refused_by_every_key_value_command(module, argv, tmp_path, capsys, monkeypatch):
    """export, convert and generate read their key=value options with one parser: a key given twice is one line
    naming it (the last one no longer wins without a word), before any file is read."""
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"modforge.{module}").main(argv)
    err = capsys.readouterr().err
    key = argv[-1].lstrip("+").split("=")[0]
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {key}= given twice ({key}=") and "give it once" in err, err
