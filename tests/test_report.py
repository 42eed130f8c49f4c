"""python -m modforge.report: one row per configuration, pooled over seeds, with intervals and differences that
agree with scipy, every job counted by its status, and plots that are real pictures."""
import json
import math
import subprocess
import sys

import pytest
import yaml
from scipy import stats as ss

from modforge import report


def fake_job(root, name, overrides, loss=None, task="causal_lm", status=None, curve=None, extra=None):
    """A job directory as a run leaves it: .hydra records, and metrics.json (loss given) or status.json."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"task": {"name": task}}))
    if loss is not None:
        finite = not math.isnan(loss)  # a diverged run writes null, as train.py does (strict JSON)
        m = {"status": "finished" if finite else "diverged",
             "val": {"val/loss": loss if finite else None, "val/acc": 1 - loss if finite else None},
             "steps": 10, "config": {"task": task},
             "params": 1000, "params_non_embedding": 800, "tokens_seen": 5000, "tokens_per_sec": 100.0,
             "wall_seconds": 2.0, **(extra or {})}
        (d / "metrics.json").write_text(json.dumps(m, allow_nan=False))
    if status is not None:
        (d / "status.json").write_text(json.dumps(status))
    if curve is not None:
        (d / "logs").mkdir()
        (d / "logs" / "metrics.csv").write_text("step,train/loss,val/loss\n" + "".join(
            f"{s},,{v}\n" for s, v in curve))
    return d


@pytest.fixture
def sweep(tmp_path):
    losses = {("learned", "1"): 2.0, ("learned", "2"): 2.2, ("rope", "1"): 1.5, ("rope", "2"): 1.7,
              ("sinusoidal", "1"): 1.0, ("sinusoidal", "2"): float("nan")}  # diverged at one seed
    for i, ((pos, seed), loss) in enumerate(losses.items()):
        fake_job(tmp_path, f"{i}_pos={pos},seed={seed}", ["experiment=x", f"pos={pos}", f"seed={seed}"], loss)
    fake_job(tmp_path, "6_pos=alibi,seed=1", ["experiment=x", "pos=alibi", "seed=1"])  # still running, or killed
    fake_job(tmp_path, "7_pos=none,seed=1", ["experiment=x", "pos=none", "seed=1"],
             status={"status": "failed", "error": "ConfigError: model.max_len=8 is shorter than ..."})
    return tmp_path


def records(capsys, *argv) -> list[dict]:
    report.main([*map(str, argv), "format=json"])
    return json.loads(capsys.readouterr().out)["rows"]


def test_rows_pool_seeds_and_put_the_lowest_loss_first(sweep, capsys):
    rows = records(capsys, sweep)
    assert [r["pos"] for r in rows] == ["rope", "learned", "sinusoidal", "alibi", "none"]  # no result: last
    rope = rows[0]
    assert (rope["runs"], rope["mean"], rope["min"], rope["max"]) == (2, pytest.approx(1.6), 1.5, 1.7)
    assert rope["sd"] == pytest.approx(math.sqrt(0.02))  # n - 1
    sinus = rows[2]
    assert (sinus["runs"], sinus["diverged"], sinus["mean"]) == (1, 1, 1.0)  # a diverged run sends its row down
    assert rows[3]["unfinished"] == 1 and rows[4]["failed"] == 1
    report.main([str(sweep)])
    out = capsys.readouterr().out
    assert out.startswith("shared: experiment=x\njobs: 5 finished, 1 diverged, 1 failed, 1 unfinished")
    assert "unfinished: 6_pos=alibi,seed=1" in out
    assert "failed: 7_pos=none,seed=1 (ConfigError: model.max_len=8 is shorter than ...)" in out


def test_intervals_and_differences_agree_with_scipy(tmp_path, capsys):
    a = {"1": 2.00, "2": 2.10, "3": 1.95, "4": 2.05}  # baseline
    b = {"1": 1.90, "2": 2.02, "3": 1.80, "4": 1.99}  # the same seeds: paired
    c = {"5": 2.30, "6": 2.10, "7": 2.45}  # other seeds: Welch
    for cfg, vals in (("a", a), ("b", b), ("c", c)):
        for seed, v in vals.items():
            fake_job(tmp_path, f"{cfg}{seed}", [f"cfg={cfg}", f"seed={seed}"], v)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    for cfg, vals in (("a", a), ("b", b), ("c", c)):
        x = list(vals.values())
        lo, hi = ss.t.interval(0.95, len(x) - 1, loc=ss.tmean(x), scale=ss.sem(x))
        assert (rows[cfg]["ci_low"], rows[cfg]["ci_high"]) == (pytest.approx(lo, abs=1e-10), pytest.approx(hi, abs=1e-10))
    paired = ss.ttest_rel(list(b.values()), list(a.values()))
    pci = paired.confidence_interval(0.95)
    assert rows["b"]["test"] == "paired" and rows["b"]["p"] == pytest.approx(paired.pvalue, rel=1e-9)
    assert (rows["b"]["diff_ci_low"], rows["b"]["diff_ci_high"]) == (pytest.approx(pci.low), pytest.approx(pci.high))
    welch = ss.ttest_ind(list(c.values()), list(a.values()), equal_var=False)
    wci = welch.confidence_interval(0.95)
    assert rows["c"]["test"] == "welch" and rows["c"]["p"] == pytest.approx(welch.pvalue, rel=1e-9)
    assert (rows["c"]["diff_ci_low"], rows["c"]["diff_ci_high"]) == (pytest.approx(wci.low), pytest.approx(wci.high))
    # Holm over the two comparisons with the baseline: the smaller p times 2, the larger times 1, kept monotone
    assert paired.pvalue < welch.pvalue
    first = min(1.0, 2 * paired.pvalue)
    assert rows["b"]["p_holm"] == pytest.approx(first)
    assert rows["c"]["p_holm"] == pytest.approx(max(first, welch.pvalue))
    assert rows["a"]["baseline"] and rows["a"]["verdict"] == "baseline"
    assert rows["b"]["verdict"].startswith("better (paired, Holm p=")  # its interval excludes 0, adjusted p < 0.05
    assert rows["c"]["verdict"].startswith("not distinguishable at n=3 (welch")


def test_paired_only_when_both_ran_the_same_seeds(tmp_path, capsys):
    for cfg, seeds in (("a", "123"), ("b", "12")):
        for s in seeds:
            fake_job(tmp_path, f"{cfg}{s}", [f"cfg={cfg}", f"seed={s}"], 1.0 + 0.1 * int(s) + (cfg == "b") * 0.05)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=first")}
    assert rows["a"]["baseline"] and rows["b"]["test"] == "welch"


def test_the_shared_line_counts_unfinished_jobs(tmp_path, capsys):
    fake_job(tmp_path, "0", ["norm=layer", "seed=1"], 1.0)
    fake_job(tmp_path, "1", ["norm=layer", "seed=2"], 1.1)
    fake_job(tmp_path, "2", ["norm=rms", "seed=1"])  # unfinished: norm is swept, not shared
    report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "shared:" not in out and "| norm |" in out and "1 unfinished" in out


def test_tasks_are_reported_apart_and_an_unknown_metric_lists_the_real_ones(tmp_path, capsys):
    fake_job(tmp_path, "0", ["model=decoder_only", "seed=1"], 1.0)
    fake_job(tmp_path, "1", ["model=encoder_only", "seed=1"], 2.0, task="masked_lm")
    report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "task causal_lm, metric val/loss" in out and "task masked_lm, metric val/loss" in out
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "metric=val/los"])
    err = capsys.readouterr().err
    assert "metric=val/los: no job reports it. Did you mean 'val/loss'" in err
    assert "Metrics that exist: val/acc, val/loss." in err and len(err.strip().splitlines()) == 1


def test_accuracy_puts_the_highest_first_and_name_sort_is_natural(sweep, capsys):
    rows = records(capsys, sweep, "metric=val/acc")
    assert rows[0]["pos"] == "rope" and rows[0]["mean"] == pytest.approx(-0.6)
    rows = records(capsys, sweep, "metric=val/acc", "over=", "sort=name")
    assert [(r["pos"], r["seed"]) for r in rows[:2]] == [("alibi", "1"), ("learned", "1")]


def test_seed_10_sorts_after_seed_2_and_pipes_are_escaped(tmp_path, capsys):
    for i, seed in enumerate(["10", "2"]):
        fake_job(tmp_path, f"{i}", [f"seed={seed}", "data.path=a|b"], 1.0)
    fake_job(tmp_path, "2", ["seed=3", "data.path=c"], 1.0)
    report.main([str(tmp_path), "over=", "sort=name"])
    listed = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "runs" not in r]
    assert [r.split(" | ")[1] for r in listed[:3]] == ["2", "10", "3"] and listed[0].startswith("| a\\|b |")


def test_a_job_directory_whose_name_has_an_equals_sign(sweep, capsys):
    report.main([str(sweep / "2_pos=rope,seed=1")])
    assert "jobs: 1 finished" in capsys.readouterr().out


def test_csv_and_out_dir_write_every_format_and_real_plots(sweep, tmp_path, capsys):
    import matplotlib.image

    for i, (pos, seed) in enumerate([("learned", 1), ("learned", 2), ("rope", 1), ("rope", 2)]):
        log = sweep / f"{i}_pos={pos},seed={seed}" / "logs"
        log.mkdir()
        (log / "metrics.csv").write_text("step,val/loss\n" + "".join(f"{s},{3.0 - s / 100 - i / 10}\n" for s in (0, 50, 100)))
    report.main([str(sweep), "format=csv"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("task,metric,pos,runs,diverged,failed,interrupted,unfinished,") and len(lines) == 6
    out = tmp_path / "rep"
    report.main([str(sweep), f"out={out}"])
    assert "wrote report.md, report.csv, report.json, val_loss_curves.png" in capsys.readouterr().out
    strict = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert strict["jobs"]["finished"] == 5
    for name in ("val_loss_curves", "val_loss_final"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / f"{name}.svg").stat().st_size > 1000
        assert matplotlib.image.imread(png)[..., :3].var() > 1e-3  # not blank


def test_without_matplotlib_the_tables_still_print_with_a_hint(sweep, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            f"from modforge import report; report.main([{str(sweep)!r}, 'out={tmp_path / 'rep'}'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "| rope |" in p.stdout and "no plots: matplotlib is not installed; for plots: pip install 'modforge[report]'" in p.stdout
    assert (tmp_path / "rep" / "report.md").exists()


@pytest.mark.parametrize("argv,msg", [([], "name the sweep directory"), (["metric=x"], "name the sweep directory"),
                                      (["/nonexistent"], "no such directory"), (["EMPTY"], "no jobs"),
                                      (["{d}", "metrc=x"], "unknown argument 'metrc=x'. Did you mean 'metric'?"),
                                      (["{d}", "best=low"], "best=low: use best=min"),
                                      (["{d}", "baseline=pos=nope"], "baseline=pos=nope: matches 0 configurations"),
                                      (["{d}", "level=95"], "level=95: a confidence level"),
                                      (["CORRUPT"], "unreadable: 0_a=1 (JSONDecodeError")])
def test_errors_are_one_line(argv, msg, capsys, tmp_path, sweep):
    (tmp_path / "EMPTY").mkdir()
    fake_job(tmp_path / "CORRUPT", "0_a=1", ["a=1"])
    (tmp_path / "CORRUPT" / "0_a=1" / "metrics.json").write_text("{not json")
    argv = [str(tmp_path / a) if a in ("EMPTY", "CORRUPT") else a.format(d=sweep) for a in argv]
    with pytest.raises(SystemExit) as e:
        report.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_a_corrupt_record_is_listed_and_the_rest_reported(sweep, capsys):
    (sweep / "0_pos=learned,seed=1" / "metrics.json").write_text("{not json")
    report.main([str(sweep)])
    out = capsys.readouterr().out
    assert "1 unreadable" in out and "unreadable: 0_pos=learned,seed=1 (JSONDecodeError" in out and "| rope |" in out


def test_holm_over_every_pair_when_the_baseline_is_the_best(tmp_path, capsys):
    """baseline=best picks the winner from the data: the verdicts are Holm-adjusted over all pairs (3 here)."""
    vals = {"a": [1.00, 1.02, 0.98], "b": [1.10, 1.13, 1.08], "c": [1.30, 1.20, 1.25]}
    for cfg, xs in vals.items():
        for seed, v in enumerate(xs, 1):
            fake_job(tmp_path, f"{cfg}{seed}", [f"cfg={cfg}", f"seed={seed}"], v)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path)}
    assert rows["a"]["baseline"]
    raw = {(x, y): ss.ttest_rel(vals[x], vals[y]).pvalue for x, y in (("a", "b"), ("a", "c"), ("b", "c"))}
    order = sorted(raw, key=raw.get)
    expected, running = {}, 0.0
    for rank, pair in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[pair]))
        expected[pair] = running
    assert rows["b"]["p_holm"] == pytest.approx(expected[("a", "b")])
    assert rows["c"]["p_holm"] == pytest.approx(expected[("a", "c")])
    report.main([str(tmp_path)])
    assert "Holm-adjusted over the 3 pairs of configurations" in capsys.readouterr().out


def test_a_baseline_with_an_interval_is_preferred_and_a_short_one_is_named(tmp_path, capsys):
    fake_job(tmp_path, "a1", ["cfg=a", "seed=1"], 0.5)  # best, but n=1
    for s in (1, 2):
        fake_job(tmp_path, f"b{s}", ["cfg=b", f"seed={s}"], 1.0 + s / 100)
        fake_job(tmp_path, f"c{s}", ["cfg=c", f"seed={s}"], 2.0 + s / 100)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path)}
    assert rows["b"]["baseline"] and rows["a"]["verdict"] == "n=1: no interval"
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    assert rows["b"]["verdict"] == "baseline has n=1: no interval"


def test_interrupted_and_all_diverged_jobs_are_counted(tmp_path, capsys):
    fake_job(tmp_path, "0", ["norm=layer", "seed=1"], float("nan"))
    fake_job(tmp_path, "1", ["norm=rms", "seed=1"], status={"status": "interrupted", "error": "KeyboardInterrupt: "})
    report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "jobs: 1 diverged, 1 interrupted" in out and "| layer | 0 |" in out and "1 diverged" in out
    assert "interrupted: 1 (KeyboardInterrupt: )" in out


def test_two_runs_of_one_seed_are_refused_not_overwritten(tmp_path, capsys):
    fake_job(tmp_path / "sweep1", "0", ["norm=layer", "seed=1"], 1.0)
    fake_job(tmp_path / "sweep2", "0", ["norm=layer", "seed=1"], 2.0)
    with pytest.raises(SystemExit):
        report.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert "two runs of one configuration with seed=1: sweep1/0 and sweep2/0" in err


def test_a_key_the_sweep_varies_is_never_shared_even_before_its_jobs_start(tmp_path, capsys):
    fake_job(tmp_path, "0", ["norm=layer", "seed=1"], 1.0)  # killed before norm=rms started
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["norm=layer,rms", "seed=1"]}}}))
    report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "shared:" not in out and "| norm |" in out  # (seed is pooled over, so it is in neither)


def test_an_over_key_no_job_has_is_a_typo(sweep, capsys):
    with pytest.raises(SystemExit):
        report.main([str(sweep), "over=sed"])
    assert "over=sed: no job has the key 'sed'. Did you mean 'seed'?" in capsys.readouterr().err


def test_the_final_chart_is_best_first_whatever_the_table_order(sweep, tmp_path, capsys):
    from modforge.results import plots

    report.main([str(sweep), "sort=name", f"out={tmp_path / 'r'}"])
    capsys.readouterr()
    captured = {}
    real = plots._save

    def spy(fig, out, stem):
        ticks = fig.axes[0].get_yticklabels()
        captured[stem] = [t.get_text() for t in sorted(ticks, key=lambda t: -t.get_position()[1])]  # top down
        return real(fig, out, stem)

    plots._save = spy
    try:
        report.main([str(sweep), "sort=name", f"out={tmp_path / 'r2'}"])
    finally:
        plots._save = real
    labels = captured["val_loss_final"]
    assert [label.split()[0] for label in labels] == ["pos=rope", "pos=learned", "pos=sinusoidal"]


def test_a_metric_a_run_cannot_have_is_not_applicable_not_missing(tmp_path, capsys):
    """The positions study: val@128/loss of a learned table is recorded as not applicable, with its reason."""
    why = {"val@128": "pos=learned has a trained row for each of its 64 positions"}
    for i, (pos, seed) in enumerate([(p, s) for p in ("rope", "learned") for s in (1, 2)]):
        extra = {"not_applicable": why} if pos == "learned" else {}
        d = fake_job(tmp_path, f"{i}", [f"pos={pos}", f"seed={seed}"], 1.0 + i / 10, extra=extra)
        if pos == "rope":
            m = json.loads((d / "metrics.json").read_text())
            m["val"]["val@128/loss"] = 1.5 + i / 10
            (d / "metrics.json").write_text(json.dumps(m))
    report.main([str(tmp_path), "metric=val@128/loss"])
    out = capsys.readouterr().out
    learned = next(line for line in out.splitlines() if line.startswith("| learned"))
    assert "2 not applicable (pos=learned has a trained row" in learned and "without the metric" not in learned
    assert "| rope | 2 | 1.5500" in out


def test_tasks_together_puts_one_pair_task_of_three_architectures_in_one_table(tmp_path, capsys):
    for i, (task, seed) in enumerate([(t, s) for t in ("seq2seq", "seq2seq_lm", "transduce") for s in (1, 2)]):
        fake_job(tmp_path, f"{i}", [f"task={task}", f"seed={seed}"], 0.5 + i / 20, task=task)
    report.main([str(tmp_path), "metric=val/acc"])
    assert capsys.readouterr().out.count(", metric val/acc, best first") == 3  # apart, by default
    rows = records(capsys, tmp_path, "metric=val/acc", "tasks=together")
    assert [r["task"] for r in rows] == ["seq2seq", "seq2seq_lm", "transduce"]  # highest accuracy first


def test_where_reports_a_slice_of_the_sweep(tmp_path, capsys):
    for i, (depth, res, seed) in enumerate([(d, r, s) for d in (2, 8) for r in ("pre", "post") for s in (1, 2)]):
        fake_job(tmp_path, f"{i}", [f"model.n_layers={depth}", f"residual={res}", f"seed={seed}", "optim.lr=0.003"],
                 1.0 + i / 10)
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"sweeper": {"params": {"model.n_layers": "2,8", "residual": "pre,post"}}}}))
    rows = records(capsys, tmp_path, "where=model.n_layers=8,optim.lr=3e-3")
    assert [(r["residual"], r["runs"]) for r in rows] == [("pre", 2), ("post", 2)] and "model.n_layers" not in rows[0]
    report.main([str(tmp_path), "where=model.n_layers=8"])
    assert capsys.readouterr().out.startswith("shared: model.n_layers=8 optim.lr=0.003\njobs: 4 finished")
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "where=model.n_layer=8"])
    assert "no job has the key 'model.n_layer'. Did you mean 'model.n_layers'" in capsys.readouterr().err
