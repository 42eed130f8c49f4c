"""python -m modforge.report: one row per configuration, pooled over seeds, best first."""
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
    losses = {("learned", "1"): 2.0, ("learned", "2"): 2.2, ("rope", "1"): 1.5, ("rope", "2"): 1.7,
              ("sinusoidal", "1"): 1.0, ("sinusoidal", "2"): float("nan")}  # diverged at one seed
    for i, ((pos, seed), loss) in enumerate(losses.items()):
        fake_job(tmp_path, f"{i}_pos={pos},seed={seed}", ["experiment=x", f"pos={pos}", f"seed={seed}"], loss)
    fake_job(tmp_path, "6_pos=alibi,seed=1", ["experiment=x", "pos=alibi", "seed=1"])  # failed: no metrics.json
    return tmp_path


def rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("| ") and "runs" not in line]


def test_rows_pool_seeds_and_put_the_lowest_loss_first(sweep, capsys):
    report.main([str(sweep)])
    out = capsys.readouterr().out
    assert "shared: experiment=x" in out and "6 finished jobs, grouped over seed, best first (lower" in out
    assert rows(out) == [
        "| rope | 2 | 0 | 1.6000 | 0.1414 | 1.5000 | 1.7000 |",  # sd with n-1: sqrt(0.02)
        "| learned | 2 | 0 | 2.1000 | 0.1414 | 2.0000 | 2.2000 |",
        "| sinusoidal | 2 | 1 | 1.0000 |  | 1.0000 | 1.0000 |",  # a diverged run sends its row last
    ]
    assert "1 unfinished (no metrics.json): 6_pos=alibi,seed=1" in out


def test_accuracy_puts_the_highest_first_and_name_sort_is_natural(sweep, capsys):
    report.main([str(sweep), "metric=val/acc"])
    out = capsys.readouterr().out
    assert "higher is better" in out and rows(out)[0].startswith("| rope | 2 | 0 | -0.6000")
    report.main([str(sweep), "metric=val/acc", "over=", "sort=name"])
    listed = [r.split(" | ")[:2] for r in rows(capsys.readouterr().out)]
    assert listed[:2] == [["| learned", "1"], ["| learned", "2"]] and len(listed) == 6


def test_seed_10_sorts_after_seed_2_and_pipes_are_escaped(tmp_path, capsys):
    for i, seed in enumerate(["10", "2"]):
        fake_job(tmp_path, f"{i}", [f"seed={seed}", "data.path=a|b"], 1.0)
    fake_job(tmp_path, "2", ["seed=3", "data.path=c"], 1.0)
    report.main([str(tmp_path), "over=", "sort=name"])
    listed = rows(capsys.readouterr().out)
    assert [r.split(" | ")[1] for r in listed] == ["2", "10", "3"] and listed[0].startswith("| a\\|b |")


def test_a_job_directory_whose_name_has_an_equals_sign(sweep, capsys):
    report.main([str(sweep / "2_pos=rope,seed=1")])
    assert "1 finished jobs" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [([], "name the sweep directory"), (["metric=x"], "name the sweep directory"),
                                      (["/nonexistent"], "no such directory"), (["EMPTY"], "no finished jobs"),
                                      (["{d}", "metrc=x"], "unknown argument 'metrc=x'"),
                                      (["{d}", "best=low"], "best=low: use best=min"),
                                      (["CORRUPT"], "unreadable job record")])
def test_errors_are_one_line(argv, msg, capsys, tmp_path, sweep):
    (tmp_path / "EMPTY").mkdir()
    fake_job(tmp_path / "CORRUPT", "0_a=1", ["a=1"])
    (tmp_path / "CORRUPT" / "0_a=1" / "metrics.json").write_text("{not json")
    argv = [str(tmp_path / a) if a in ("EMPTY", "CORRUPT") else a.format(d=sweep) for a in argv]
    with pytest.raises(SystemExit) as e:
        report.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1
