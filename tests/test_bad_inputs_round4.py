"""Bad input, round four: a file modforge reads back never runs code, and a study never writes into what is not
its own.

The payload everywhere: a mapping Hydra would build (``builtins.open(<file>, "w")``: creates a sentinel, or
truncates a file of the user's) or an interpolation whose resolver acts (``modforge_new_dir`` makes a directory).
After every command the sentinel is absent and the user's file byte-identical.
"""
import copy
import hashlib
import json

import pytest
import torch

from modforge.export import main as export_main
from modforge.generate import main as generate_main
from modforge.report import main as report_main
from modforge.study import main as study_main
from modforge.train import main as train_main

TINY = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "data.block_size=16",
        "data.batch_size=4", "data.max_chars=4000", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
        "sample=false", "eval_at_start=false", "callbacks.progress=none"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny finished run (2 of 4 steps' limit raised on resume): its directory."""
    root = tmp_path_factory.mktemp("round4")
    train_main([*TINY, "trainer.max_steps=2", f"hydra.run.dir={root / 'run'}"])
    return root / "run"


def sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class Victim:
    """A file of the user's that the payload would truncate, and a sentinel that it would create."""

    def __init__(self, root):
        self.protected = root / "protected.txt"
        self.protected.write_text("the user's own work\n")
        self.digest = sha(self.protected)
        self.sentinel = root / "SENTINEL"
        self.made = root / "made-by-a-resolver"

    def payloads(self) -> list:
        return [{"_target_": "builtins.open", "file": str(self.sentinel), "mode": "w"},
                {"_target_": "builtins.open", "file": str(self.protected), "mode": "w"},
                f"${{modforge_new_dir:{self.made}}}"]

    def untouched(self) -> bool:
        return not self.sentinel.exists() and not self.made.exists() and sha(self.protected) == self.digest


def nest(payload, depth: int):
    for _ in range(depth - 1):
        payload = {"inner": payload}
    return payload


def plant(ckpt: dict, key: str, depth: int, payload) -> dict:
    """``ckpt`` with ``payload`` planted under run_cfg[key] at ``depth`` (1: the key's own value)."""
    out = copy.copy(ckpt)
    out["hyper_parameters"] = copy.deepcopy(ckpt["hyper_parameters"])
    rc = out["hyper_parameters"]["run_cfg"]
    node = nest(payload, depth)
    if isinstance(rc.get(key), dict) and depth > 1:
        rc[key] = {**rc[key], "planted": node}
    else:
        rc[key] = node
    return out


def one_line_refusal(capsys, call) -> str:
    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err, err
    return err


ROOT_KEYS = ["pos", "data", "task", "model", "norm", "residual", "ffn", "attention", "optim", "scheduler", "param",
             "trainer", "seed", "eval_at_start", "sample", "compile", "divergence_patience", "eval_block_sizes"]


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_a_checkpoint_that_names_a_callable_under_any_key_is_refused_by_every_verb(trained, tmp_path, capsys, depth):
    v = Victim(tmp_path)
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    assert set(ROOT_KEYS) <= set(ckpt["hyper_parameters"]["run_cfg"])
    for i, key in enumerate(ROOT_KEYS):
        payload = v.payloads()[i % 3]
        path = tmp_path / f"{key}.ckpt"
        torch.save(plant(ckpt, key, depth, payload), path)
        verbs = [lambda: train_main([f"resume={path}", "trainer.max_steps=4", f"hydra.run.dir={tmp_path / 'r'}"]),
                 lambda: train_main([f"init_from={path}", *TINY, "trainer.max_steps=1",
                                     f"hydra.run.dir={tmp_path / 'i'}"]),
                 lambda: generate_main([f"ckpt={path}", "prompt=x", "max_new=2"]),
                 lambda: export_main([f"ckpt={path}", f"out={tmp_path / 'x'}"])]
        for call in verbs[:1] if depth != 2 else verbs:  # every key through resume=; at depth 2, every verb
            err = one_line_refusal(capsys, call)
            assert f"at {key}" in err and "refused" in err, err
            assert v.untouched(), (key, depth, err)
    assert not (tmp_path / "r").exists() and not (tmp_path / "x").exists()


def test_a_run_directory_whose_checkpoint_names_a_callable_is_refused_untouched(trained, tmp_path, capsys):
    import shutil

    v = Victim(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    torch.save(plant(ckpt, "optim", 3, v.payloads()[1]), run / "checkpoints" / "last.ckpt")
    before = {p: sha(p) for p in run.rglob("*") if p.is_file()}
    err = one_line_refusal(capsys, lambda: train_main([f"resume={run}", "trainer.max_steps=4"]))
    assert "at optim" in err
    assert v.untouched() and {p: sha(p) for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("key", ["callbacks", "logger"])
def test_a_checkpoints_callbacks_and_loggers_are_never_built(trained, tmp_path, capsys, caplog, key):
    """The checkpoint's own callbacks and loggers (where a _target_ belongs) are not carried: the resumed run has
    this command line's, says so, and the nested payload never runs."""
    v = Victim(tmp_path)
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    outer = ("lightning.pytorch.callbacks.EarlyStopping" if key == "callbacks" else
             "lightning.pytorch.loggers.CSVLogger")
    planted = copy.deepcopy(ckpt)
    planted["hyper_parameters"]["run_cfg"][key] = {
        "evil": {"_target_": outer, "monitor" if key == "callbacks" else "name": v.payloads()[0]},
        "evil2": {"_target_": "builtins.open", "file": str(v.protected), "mode": "w"}}
    path = tmp_path / "planted.ckpt"
    torch.save(planted, path)
    train_main([f"resume={path}", "trainer.max_steps=3", f"hydra.run.dir={tmp_path / 'r'}"])
    out = capsys.readouterr()
    assert v.untouched()
    assert f"{key} are this command line's" in out.out + out.err + caplog.text
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["steps"] == 3


def test_a_callable_nested_in_a_callbacks_arguments_is_refused_from_the_command_line(tmp_path, capsys):
    v = Victim(tmp_path)
    err = one_line_refusal(capsys, lambda: train_main([
        *TINY, "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'r'}",
        f"+callbacks.x={{_target_:lightning.pytorch.callbacks.EarlyStopping,monitor:val/loss,"
        f"mode:{{_target_:builtins.open,file:'{v.sentinel}',mode:w}}}}"]))
    assert "callbacks.x.mode._target_" in err
    err = one_line_refusal(capsys, lambda: train_main([
        *TINY, "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'r'}",
        f"+data.extra={{_target_:builtins.open,file:'{v.sentinel}',mode:w}}"]))
    assert "data.extra" in err
    assert v.untouched() and not (tmp_path / "r").exists()


SWEEP_RECORDS = [
    ("task", "+callbacks.x._target_=builtins.open"),
    ("task", "+callbacks.x={_target_:builtins.open,file:SENTINEL,mode:w}"),
    ("task", "data.path=${modforge_new_dir:MADE}"),
    ("hydra", "hydra.callbacks.x._target_=builtins.open"),
    ("hydra", "+hydra.callbacks.x={file:SENTINEL}"),
    ("hydra", "hydra.job_logging.handlers.file.filename=PROTECTED"),
    ("hydra", "hydra.job.env_set.LD_PRELOAD=SENTINEL"),
    ("hydra", "hydra.launcher.setup=[touch SENTINEL]"),
    ("hydra", "hydra.searchpath=[file://SENTINEL]"),
]


@pytest.mark.parametrize("part,override", SWEEP_RECORDS, ids=[o for _, o in SWEEP_RECORDS])
def test_a_sweep_record_is_replayed_as_data_only(tmp_path, capsys, part, override):
    import yaml

    v = Victim(tmp_path)
    override = override.replace("SENTINEL", str(v.sentinel)).replace("MADE", str(v.made)) \
        .replace("PROTECTED", str(v.protected))
    rec = {"hydra": {"overrides": {"task": [*TINY, "trainer.max_steps=1"], "hydra": []}}}
    rec["hydra"]["overrides"][part].append(override)
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "multirun.yaml").write_text(yaml.safe_dump(rec))
    before = sha(tmp_path / "sweep" / "multirun.yaml")
    err = one_line_refusal(capsys, lambda: train_main(["-m", f"resume={tmp_path / 'sweep'}"]))
    assert "recorded override" in err and "refused" in err
    assert v.untouched() and sha(tmp_path / "sweep" / "multirun.yaml") == before
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["multirun.yaml"]


def test_report_reads_a_planted_run_as_data(trained, tmp_path, capsys):
    import shutil

    v = Victim(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    m = json.loads((run / "metrics.json").read_text())
    m["config"] = {"norm": v.payloads()[0], "task": v.payloads()[2]}
    (run / "metrics.json").write_text(json.dumps(m))
    (run / "config.yaml").write_text(f"norm:\n  _target_: builtins.open\n  file: {v.protected}\n  mode: w\n"
                                     f"study: '{v.payloads()[2]}'\n")
    try:
        report_main([str(run)])
    except SystemExit:
        pass
    capsys.readouterr()
    assert v.untouched()


def study_cells(tmp_path, cells_overrides) -> None:
    (tmp_path / "s" / "probe").mkdir(parents=True)
    (tmp_path / "s" / "study.json").write_text(json.dumps({"kind": "modforge study"}))
    (tmp_path / "s" / "probe" / "cells.json").write_text(json.dumps(
        {"cells": [{"arm": "a", "rung": "", "setting": "", "seed": 0, "overrides": ov} for ov in cells_overrides]}))


CELLS = [
    {"callbacks.x._target_": "builtins.open"},
    {"+callbacks.x": "{_target_:builtins.open,file:SENTINEL,mode:w}"},
    {"norm": "${modforge_new_dir:MADE}"},
    {"hydra.job.env_set.LD_PRELOAD": "SENTINEL"},
    {"logger.csv.save_dir": "PROTECTED"},
    {"norm": {"_target_": "builtins.open"}},
]


@pytest.mark.parametrize("cell", CELLS, ids=[list(c)[0] for c in CELLS])
def test_a_studys_kept_cells_are_checked_before_they_become_a_command(tmp_path, capsys, monkeypatch, cell):
    v = Victim(tmp_path)
    text = json.dumps(cell).replace("SENTINEL", str(v.sentinel)).replace("MADE", str(v.made)) \
        .replace("PROTECTED", str(v.protected))
    study_cells(tmp_path, [json.loads(text)])
    monkeypatch.chdir(tmp_path)
    err = one_line_refusal(capsys, lambda: study_main(["experiment=study_toy", f"dir={tmp_path / 's'}"]))
    assert "cells.json" in err and "cell 0" in err or "recorded override" in err, err
    assert v.untouched()


# --------------------------------------------------------------------------- a study owns its directory

def users_study_json(d):
    (d / "study.json").write_text("my own notes, not JSON")


def users_json_study_json(d):
    (d / "study.json").write_text(json.dumps({"mine": [1, 2, 3]}))


def a_sweep(d):
    (d / "multirun.yaml").write_text("hydra: {}\n")
    (d / "0_norm=rms").mkdir()
    (d / "0_norm=rms" / "metrics.json").write_text("{}")


def a_run(d):
    (d / "config.yaml").write_text("norm: layer\n")
    (d / "metrics.json").write_text("{}")


def users_files(d):
    (d / "thesis.tex").write_text("chapter 1")


def study_beside_users_files(d):
    (d / "study.json").write_text(json.dumps({"kind": "modforge study", "experiment": "study_toy", "study": {}}))
    (d / "thesis.tex").write_text("chapter 1")


@pytest.mark.parametrize("make", [users_study_json, users_json_study_json, a_sweep, a_run, users_files,
                                  study_beside_users_files])
def test_a_study_refuses_a_directory_that_is_not_its_own_untouched(tmp_path, capsys, monkeypatch, make):
    d = tmp_path / "d"
    d.mkdir()
    make(d)
    before = {str(p.relative_to(d)): sha(p) for p in d.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    err = one_line_refusal(capsys, lambda: study_main(["experiment=study_toy", f"dir={d}"]))
    assert f"dir={d}" in err and "give a new dir=" in err
    assert {str(p.relative_to(d)): sha(p) for p in d.rglob("*") if p.is_file()} == before


def test_a_study_refuses_a_file_as_its_directory(tmp_path, capsys, monkeypatch):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    monkeypatch.chdir(tmp_path)
    err = one_line_refusal(capsys, lambda: study_main(["experiment=study_toy", f"dir={f}"]))
    assert "a file" in err and f.read_text() == "mine"
