"""Bad input, round four: a file modforge reads back never runs code, and a study never writes into what is not
its own.

The payload everywhere: a mapping Hydra would build (``builtins.open(<file>, "w")``: creates a sentinel, or
truncates a file of the user's) or an interpolation whose resolver acts (``modforge_new_dir`` makes a directory).
After every command the sentinel is absent and the user's file byte-identical.
"""
import copy
import hashlib
import json
from pathlib import Path

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
    (tmp_path / "s" / "probe" / "99_done").mkdir()  # a run ended: the kept cells are the design's (not forgotten)
    (tmp_path / "s" / "probe" / "99_done" / "metrics.json").write_text("{}")
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


# --------------------------------------------------------------------------- a study knows its runs

def test_a_study_whose_experiment_changed_outside_its_block_is_refused(tmp_path, capsys, monkeypatch):
    """The experiment edited outside its study: block (steps 80 -> 20) and re-run into the same dir: refused in
    one line naming the key, before anything runs or is rewritten."""
    from modforge.config.composition import compose_job, load
    from modforge.studies import runner

    load()
    config = runner.config_of(compose_job(["experiment=study_toy"]))
    config["trainer"]["max_steps"] = 20  # what the runs were trained with
    d = tmp_path / "s"
    (d / "probe" / "0_x").mkdir(parents=True)
    (d / "probe" / "0_x" / "metrics.json").write_text("{}")  # a run ended: the design is fixed
    (d / "study.json").write_text(json.dumps({"kind": "modforge study", "experiment": "study_toy", "config": config}))
    before = sha(d / "study.json")
    monkeypatch.chdir(tmp_path)
    err = one_line_refusal(capsys, lambda: study_main(["experiment=study_toy", f"dir={d}"]))
    assert "trainer.max_steps: 20 there, 80 now" in err and "give a new dir=" in err
    assert sha(d / "study.json") == before


def write_job(stage, num, overrides):
    job = stage / f"{num}_job"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "metrics.json").write_text(json.dumps({"status": "finished", "val": {"val/loss": 2.0}, "steps": 3}))


def test_a_kept_job_is_checked_against_its_cell_before_its_result_is_used(tmp_path):
    """cells.json edited after its jobs ran (seed 1 -> 2): the job would be read as another seed; refused, naming
    the job and the difference."""
    from modforge.errors import ConfigError
    from modforge.studies.design import design_of
    from modforge.studies.stages import Cell, read_stage

    d = design_of("x", [], {"question": "q?", "baseline": "norm=layer", "compare": ["norm=rms"]}, jobs=1)
    stage = tmp_path / "compare" / "round-1"
    write_job(stage, 0, ["norm=layer", "trainer.max_steps=3", "seed=1"])
    ok = read_stage(d, stage, [Cell("norm=layer", "", "", 1, {"norm": "layer", "trainer.max_steps": 3, "seed": 1})])
    assert ok[0]["status"] == "finished"
    with pytest.raises(ConfigError, match=r"job #0 ran seed=1, but its cell in cells.json says seed=2"):
        read_stage(d, stage, [Cell("norm=layer", "", "", 2, {"norm": "layer", "trainer.max_steps": 3, "seed": 2})])


def test_a_design_that_never_ran_is_not_pinned(tmp_path):
    """A refused or failed design left cells and a log but no record: fixing it and running again starts afresh
    (the kept cells are the old design's and would run again otherwise)."""
    from modforge.studies import runner
    from modforge.studies.stages import owned_log

    d = tmp_path / "s"
    (d / "probe" / "0_x" / ".hydra").mkdir(parents=True)
    (d / "probe" / "cells.json").write_text(json.dumps({"cells": [{"arm": "a", "rung": "", "setting": "", "seed": 0,
                                                                    "overrides": {"optim.lrr": 1}}]}))
    (d / "probe" / "0_x" / "status.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    (d / "study.json").write_text(json.dumps({"kind": "modforge study", "experiment": "study_toy",
                                              "study": {"tune": {"params": {"optim.lrr": [1]}}}}))
    assert owned_log(d) and not runner.ran_before(d)
    runner.forget_unrun(d)
    assert not (d / "probe").exists() and (d / "study.json").exists()


# --------------------------------------------------------------------------- refusals before the probe

@pytest.mark.parametrize("argv, says", [
    (["~study.tune.params", "+study.tune.params={optim.lrr:[0.003,0.03]}"], "study.tune.params.optim.lrr=0.003: "),
    (["~study.tune.params", "+study.tune.params={optim.lr:[0.003,0.003]}"], "study.tune.params.optim.lr=[0.003, 0.003]: 0.003 is listed twice"),
    (["~study.tune.params", "+study.tune.params={seed:[1,2]}"], "study.tune.params.seed: the runner sets seed"),
    (["~study.tune.params", "+study.tune.params={trainer.max_steps:[10,20]}"], "study.tune.params.trainer.max_steps: the runner sets"),
    (["study.compare=[{model.d_model:16,model.n_heads:2,seed:3}]"], "sets seed, which the runner sets"),
    (["study.compare=[{model.d_model:16,model.n_heads:2}]"], "is listed twice (or is the baseline)"),
    (["study.compare=[{model.d_model:24,model.n_heads:5}]"], "study.compare: model.d_model=24,model.n_heads=5: "),
])
def test_a_broken_design_is_refused_before_the_probe_naming_the_study_key(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    err = one_line_refusal(capsys, lambda: study_main(["experiment=study_toy", f"dir={tmp_path / 's'}", *argv]))
    assert says in err and "hydra.sweeper.cells" not in err, err
    assert not (tmp_path / "s").exists()  # nothing written, nothing pinned


@pytest.mark.parametrize("value", ["x}y", "it's", "a\\b", "[1, 2]", "{a: 1}", "0.001", "${x}", "'quoted'"])
def test_a_cell_value_reaches_its_job_as_written(value):
    """A study's cell value, through the internal override and the sweeper's expansion, is the value declared
    (a value holding } or ' is a string, not a grammar error; a list stays a list)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from modforge.config.grid import cell_overrides
    from modforge.studies.stages import Cell, cells_argument

    parser = OverridesParser.create()
    cells = parser.parse_overrides([f"hydra.sweeper.cells={cells_argument([Cell('a', '', '', 1, {'k': value})])}"])
    (ov,) = cell_overrides(cells[0].value())[0:1][0]
    got = parser.parse_override(ov).value()
    assert got == value or str(got) == value or got == [1, 2] and value == "[1, 2]" or \
        got == {"a": 1} and value == "{a: 1}" or got == 0.001 and value == "0.001", (value, ov, got)


# --------------------------------------------------------------------------- signals

def test_ctrl_c_stops_a_study_in_one_line_with_130(capsys, monkeypatch):
    from modforge import study

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "study_command", interrupted)
    with pytest.raises(SystemExit) as e:
        study_main(["experiment=study_toy"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 130
    assert err.startswith("error: stopped by an interruption: run the same command again") and "\n" not in err


@pytest.mark.process  # SIGTERM to the study's own process, its stage's job training in it
@pytest.mark.slow
def test_sigterm_stops_a_study_and_its_running_job_with_143(tmp_path):
    import os
    import signal
    import time

    from conftest import python_popen

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["MODFORGE_FAULT"] = "hold@step=1@job=0"  # the probe's first job waits after step 1 until signalled
    p = python_popen("-m", "modforge.study", "experiment=study_toy", f"dir={tmp_path / 's'}", "jobs=1", "force=true",
                     cwd=tmp_path, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list((tmp_path / "s" / "probe").glob("0_*/.lock")) \
            and p.poll() is None:
        time.sleep(0.2)
    assert p.poll() is None, "the study ended before its probe's first job trained"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: stopped by SIGTERM: run the same command again")
    from modforge.results.jobs import load_jobs

    stage = tmp_path / "s" / "probe"
    jobs = load_jobs(stage)
    # the stage's sweep stopped its job at a step (recorded 'interrupted'), wrote its summary (exit 1), went no further
    assert json.loads((stage / "sweep.json").read_text())["exit"] == 1
    assert [j.status for j in jobs] == ["interrupted"], [(j.name, j.status) for j in jobs]




# --------------------------------------------------------------------------- silent cases, wrong exits, tracebacks

def test_a_metric_outside_its_range_is_counted_unreadable_never_ranked(tmp_path):
    from modforge.results.jobs import load_jobs

    write_job(tmp_path, 0, ["norm=layer"])
    write_job(tmp_path, 1, ["norm=rms"])
    m = json.loads((tmp_path / "1_job" / "metrics.json").read_text())
    m["val"]["val/loss"] = -5.0  # no loss is below 0
    (tmp_path / "1_job" / "metrics.json").write_text(json.dumps(m))
    jobs = {j.overrides["norm"]: j for j in load_jobs(tmp_path)}
    assert jobs["layer"].status == "finished"
    assert jobs["rms"].status == "unreadable" and "val/loss=-5.0 outside its range [0.0, inf]" in jobs["rms"].error


def test_at_a_fractional_step_is_refused():
    from modforge.results.jobs import ReportError, at_point

    with pytest.raises(ReportError, match=r"at=step:1.5: use"):
        at_point([], "val/loss", "step:1.5")


def test_one_file_named_twice_in_data_path_is_refused(tmp_path):
    from modforge.data.corpus import expand_paths
    from modforge.errors import ConfigError

    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "b.txt").symlink_to(tmp_path / "a.txt")
    for spec in ([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], [str(tmp_path / "a.txt"), str(tmp_path / "*.txt")]):
        with pytest.raises(ConfigError, match="is named twice"):
            expand_paths(spec)


def test_a_device_listed_twice_is_a_command_line_mistake(tmp_path):
    from conftest import run_module

    p = run_module("modforge.train", tmp_path, "-m", "hydra/launcher=gpus", "hydra.launcher.devices=[0,0]",
                   "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "device 0 is listed twice" in p.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_record_nested_too_deeply_is_one_line(tmp_path):
    from modforge.errors import ConfigError
    from modforge.run.dirs import read_state
    from modforge.utils.readers import json_file

    (tmp_path / "metrics.json").write_text("[" * 200_000 + "]" * 200_000)
    assert read_state(tmp_path, owned=False).status == "unreadable"
    with pytest.raises(ConfigError, match="nested too deeply"):
        json_file(tmp_path / "metrics.json")


def test_a_base_shape_too_big_to_build_is_refused_not_allocated():
    from types import SimpleNamespace

    from modforge.errors import ConfigError
    from modforge.models.param import check_buildable

    check_buildable({"d_model": 64}, SimpleNamespace(d_model=256, d_ff=1024))
    with pytest.raises(ConfigError, match="would not fit in this machine's"):
        check_buildable({"d_model": 1_000_000_000}, SimpleNamespace(d_model=256, d_ff=None))


def test_zero_readout_with_a_tied_readout_is_refused_not_ignored(tmp_path):
    from conftest import run_module

    p = run_module("modforge.train", tmp_path, "param=mup", "param.zero_readout=true", "model.tie_embeddings=true",
                   f"hydra.run.dir={tmp_path / 'r'}")
    assert p.returncode == 2 and "param.zero_readout=true: the readout is tied" in p.stderr
    assert not (tmp_path / "r").exists()


def test_a_full_disk_during_a_checkpoint_save_is_one_line_naming_the_file(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from modforge.cli.command import one_line_errors
    from modforge.run import callbacks

    def full(obj, fh):
        fh.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 768")

    monkeypatch.setattr(callbacks.torch, "save", full)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10, 10, 0))
    (tmp_path / "last.ckpt").write_bytes(b"the previous checkpoint")
    with pytest.raises(SystemExit) as e, one_line_errors():
        callbacks.AtomicCheckpointIO().save_checkpoint({}, tmp_path / "last.ckpt")
    assert e.value.code == 2
    assert (tmp_path / "last.ckpt").read_bytes() == b"the previous checkpoint"  # intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary left


def test_a_full_disk_message(tmp_path, monkeypatch, capsys):
    import shutil
    from collections import namedtuple

    from modforge.run.callbacks import write_failure

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10, 10, 0))
    err = write_failure(tmp_path / "last.ckpt", RuntimeError("[enforce fail at inline_container.cc:672]"))
    assert err.filename == str(tmp_path / "last.ckpt") and "no space left on the device" in err.strerror
