"""python -m modforge.report: one row per configuration, pooled over seeds."""
import json

import pytest
import yaml

from modforge import report


def fake_job(root, name, overrides, loss=None):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if loss is not None:
        (d / "metrics.json").write_text(json.dumps({"val": {"val/loss": loss, "val/acc": 1 - loss}, "steps": 10}))


@pytest.fixture
def sweep(tmp_path):
    losses = {("learned", "1"): 2.0, ("learned", "2"): 2.2, ("rope", "1"): 1.5, ("rope", "2"): 1.7}
    for i, ((pos, seed), loss) in enumerate(losses.items()):
        fake_job(tmp_path, f"{i}_pos={pos},seed={seed}", ["experiment=x", f"pos={pos}", f"seed={seed}"], loss)
    fake_job(tmp_path, "4_pos=alibi,seed=1", ["experiment=x", "pos=alibi", "seed=1"])  # failed: no metrics.json
    return tmp_path


def test_rows_pool_seeds_and_sort_by_mean(sweep, capsys):
    report.main([str(sweep)])
    out = capsys.readouterr().out
    assert "shared: experiment=x" in out and "4 finished jobs, grouped over seed" in out
    table = [line for line in out.splitlines() if line.startswith("| ") and "runs" not in line]
    assert table[0] == "| rope | 2 | 1.6000 | 0.1414 | 1.5000 | 1.7000 |"  # sd with n-1: sqrt(0.02)
    assert table[1] == "| learned | 2 | 2.1000 | 0.1414 | 2.0000 | 2.2000 |"
    assert "1 unfinished (no metrics.json): 4_pos=alibi,seed=1" in out


def test_other_metric_and_no_pooling(sweep, capsys):
    report.main([str(sweep), "metric=val/acc", "over=", "sort=name"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "runs" not in line]
    assert len(rows) == 4 and rows[0].startswith("| learned | 1 | 1 | -1.0000")  # pos, seed, runs, mean


@pytest.mark.parametrize("argv,msg", [([], "name the sweep directory"), (["/nonexistent"], "no such directory"),
                                      (["."], "no finished jobs"), (["{d}", "metrc=x"], "unknown argument 'metrc=x'")])
def test_errors_are_one_line(argv, msg, capsys, tmp_path, sweep):
    argv = [a.format(d=sweep) for a in argv]
    if argv == ["."]:
        argv = [str(tmp_path / "empty")]
        (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        report.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1
