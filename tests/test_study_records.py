"""A study directory's records read back (``study.json``, each stage's ``cells.json``) and the study command's
values checked before any run: a record of another shape, a metric no run reports, more jobs than cores are one
line (``error: ...``, exit 2), never a traceback or a study that trains for nothing (round four's table, y01-y25).
All fast: nothing trains here but the probe check, which reads a probe's records."""
import json
import os
from pathlib import Path

import pytest

from modforge.errors import ConfigError
from modforge.studies import runner
from modforge.studies.design import design_of
from modforge.studies.stages import Cell, StageClock, check_cells, check_reported, owned_log, probe, stage_cells
from modforge.study import main as study_main

BLOCK = {"question": "q?", "baseline": "norm=layer", "compare": ["norm=rms"]}
CELL = {"arm": "norm=layer", "rung": "", "setting": "", "seed": 0, "overrides": {"norm": "layer", "seed": 0}}


def one_line(call) -> str:
    with pytest.raises(ConfigError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def refused(capsys, tmp_path, monkeypatch, *argv: str) -> str:
    """``python -m modforge.study argv`` in this process: exit 2, one ``error:`` line, nothing written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        study_main(list(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    return err


# --------------------------------------------------------------------------- study.json

@pytest.mark.parametrize("recorded, says", [
    ({"study": "abc"}, "another study (study.json: 'abc', now {"),
    ({"overrides": [5]}, "another overrides (study.json: [5], now [])"),
    ({"overrides": "abc"}, "another overrides (study.json: 'abc', now [])"),
    ({"experiment": ["x"]}, "another experiment (study.json: ['x'], now 'x')"),
    ({"config": 5}, "its runs were trained with another config (study.json holds 5)"),
])
def test_a_study_json_of_another_shape_is_another_study(tmp_path, recorded, says):
    d = design_of("x", [], BLOCK, jobs=1)
    err = one_line(lambda: runner.check_same_study(d, {"kind": "modforge study", **recorded}, tmp_path, {}))
    assert says in err and "give a new dir=" in err, err


@pytest.mark.parametrize("seconds", [[1.0], {"probe": "abc"}, {"probe": -1}, {"probe": True}])
def test_a_study_json_whose_stage_seconds_are_not_seconds_is_refused(tmp_path, seconds):
    (tmp_path / "study.json").write_text(json.dumps({"kind": "modforge study", "stage_seconds": seconds}))
    assert "study.json there holds stage_seconds=" in one_line(lambda: owned_log(tmp_path))
    (tmp_path / "study.json").write_text(json.dumps({"kind": "modforge study", "stage_seconds": {"probe": 2.5}}))
    assert owned_log(tmp_path)["stage_seconds"] == {"probe": 2.5}


# --------------------------------------------------------------------------- cells.json

@pytest.mark.parametrize("text, says", [
    ("[]", "it holds [], not {\"cells\""),
    ("{}", "it holds {}, not {\"cells\""),
    ('{"cells": [], "more": 1}', "it holds {\"cells\": [], \"more\": 1}"),
    ("not json", "not a readable JSON file"),
    ('{"cells": "abc"}', "its cells are \"abc\", not a list of one or more jobs"),
    ('{"cells": []}', "its cells are [], not a list of one or more jobs"),
    ('{"cells": ["abc"]}', "cell 0 is \"abc\", not a mapping of arm, rung, setting, seed, overrides"),
    ('{"cells": [{"arm": "a"}]}', "cell 0 has the keys arm; a cell has exactly arm, rung, setting, seed, overrides"),
    (json.dumps({"cells": [{**CELL, "colour": "red"}]}), "cell 0 has the keys arm, colour, overrides, rung, seed"),
    (json.dumps({"cells": [CELL, {**CELL, "seed": "1"}]}), "cell 1 has seed=\"1\", not a whole number"),
    (json.dumps({"cells": [{**CELL, "seed": True}]}), "cell 0 has seed=true, not a whole number"),
    (json.dumps({"cells": [{**CELL, "overrides": ["norm=layer"]}]}), "cell 0 has overrides=[\"norm=layer\"], not a"),
    (json.dumps({"cells": [{**CELL, "arm": None}]}), "cell 0 has arm=null, not a string"),
])
def test_a_kept_cells_json_of_another_shape_is_one_line_naming_it(tmp_path, text, says):
    (tmp_path / "cells.json").write_text(text)
    err = one_line(lambda: stage_cells(tmp_path, lambda: pytest.fail("kept cells are never decided again")))
    assert err.startswith(f"{tmp_path / 'cells.json'}: {says}") and err.endswith("give the study a new dir="), err


def test_kept_cells_are_read_back_as_written(tmp_path):
    cells = [Cell(**CELL), Cell("norm=rms", "", "lr=0.1", 3, {"norm": "rms", "seed": 3})]
    assert stage_cells(tmp_path, lambda: cells) == cells
    assert stage_cells(tmp_path, lambda: pytest.fail("kept cells are never decided again")) == cells


def test_kept_cells_of_an_arm_or_rung_the_design_lacks_are_refused(tmp_path):
    d = design_of("x", [], BLOCK, jobs=1)
    check_cells(d, tmp_path, [Cell(**CELL)])
    for arm, rung in (("norm=batch", ""), ("norm=layer", "model.d_model=64")):
        err = one_line(lambda: check_cells(d, tmp_path, [Cell(**CELL), Cell(**{**CELL, "arm": arm, "rung": rung})]))
        assert f"cell 1 is arm '{arm}' at rung '{rung}', which this design does not have" in err, err


def test_a_probe_whose_kept_cells_leave_an_arm_out_is_refused_before_it_runs(tmp_path):
    d = design_of("x", [], BLOCK, jobs=1)
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "cells.json").write_text(json.dumps({"cells": [CELL]}))
    err = one_line(lambda: probe(d, tmp_path, StageClock(tmp_path, {})))
    assert "probe/cells.json: no cell measures arm norm=rms at the config" in err, err
    assert sorted(p.name for p in (tmp_path / "probe").iterdir()) == ["cells.json"]  # nothing ran


@pytest.mark.parametrize("cells", ["[]", '{"cells": []}', '{"cells": [{"arm": "a"}]}'])
def test_the_study_command_refuses_a_damaged_cells_json_in_one_line(tmp_path, capsys, monkeypatch, cells):
    """Round four's y06, y08, y11: the command itself, on a study directory whose design has results."""
    s = tmp_path / "s"
    (s / "probe" / "0_x").mkdir(parents=True)
    (s / "probe" / "0_x" / "metrics.json").write_text("{}")
    (s / "study.json").write_text(json.dumps({"kind": "modforge study"}))
    (s / "probe" / "cells.json").write_text(cells)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        study_main(["experiment=study_toy", f"dir={s}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and f"error: {s / 'probe' / 'cells.json'}: " in err, err


# --------------------------------------------------------------------------- the command's values

def test_a_metric_no_task_of_the_study_declares_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    err = refused(capsys, tmp_path, monkeypatch, "experiment=study_toy", "dir=s", "study.metric=val/nosuch")
    assert err.startswith("error: study.metric=val/nosuch: not a validation metric of task=causal_lm "
                          "(study.baseline: model.d_model=16,model.n_heads=2); it declares val/loss, val/bpc"), err


def test_a_metric_is_one_its_task_declares_at_a_length_evaluated():
    from modforge.config.composition import compose_job, load

    load()
    cfg = compose_job(["experiment=study_toy", "eval_block_sizes=[16]"])
    for metric in ("val/loss", "val/bpc", "val@16/loss"):
        runner.check_metric(metric, cfg, "here")
    for metric in ("val/nosuch", "val@32/loss", "loss", "tokens_per_sec"):
        assert one_line(lambda: runner.check_metric(metric, cfg, "here")).startswith(f"study.metric={metric}: ")


def test_a_metric_the_probe_does_not_report_stops_the_study_before_tuning():
    """A task may declare a metric it reports only with some data (val/bpc on text; lm declares val/ppl)."""
    runs = [{"metrics": {"val": {"val/loss": 2.0, "val/bpc": 3.0}}}, {"metrics": {"val": {"val/loss": 2.1}}}]
    check_reported("val/loss", runs)
    check_reported("val/ppl", [{"metrics": {}}])  # nothing reported (a record from before): not judged here
    err = one_line(lambda: check_reported("val/ppl", runs))
    assert err.startswith("study.metric=val/ppl: no run of the probe reports it (they report val/bpc, val/loss)")


def test_more_jobs_than_cores_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    cores = os.cpu_count() or 1
    err = refused(capsys, tmp_path, monkeypatch, "experiment=study_toy", "dir=s", "jobs=99999999999999999999",
                  "dry_run=true")
    assert err == f"error: jobs=99999999999999999999: a whole number from 1 to {cores}, the cores here (jobs run " \
                  "side by side, each a process with its share of the cores)\n", err
    assert one_line(lambda: design_of("x", [], {**BLOCK, "jobs": cores + 1})).startswith(f"study.jobs={cores + 1}: ")
    assert design_of("x", [], {**BLOCK, "jobs": cores}).jobs == cores
    assert "jobs=²: a whole number >= 1" in refused(capsys, tmp_path, monkeypatch, "experiment=study_toy", "jobs=²")


@pytest.mark.parametrize("argv, says", [
    (["jobs=1", "jobs=2"], "jobs= given twice (jobs=1, then jobs=2): give it once"),
    (["draws=" + "9" * 5000], "draws=9999999999999999999999999999999999999999: a whole number from 0 to 1,000,000"),
    (["draws=1000001"], "draws=1000001: a whole number from 0 to 1,000,000"),
])
def test_study_options_given_twice_or_out_of_range_are_one_line(argv, says):
    from modforge.study import parse

    with pytest.raises(ConfigError) as e:
        parse(["experiment=study_toy", *argv])
    assert str(e.value) == says
