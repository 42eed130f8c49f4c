"""python -m modforge.report: one row per configuration, pooled over seeds, with intervals and differences that
agree with scipy, every job counted by its status, and plots that are real pictures."""
import json
import math
import subprocess
import sys

import pytest

from conftest import python
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
    # by the mean of the finished runs; a diverged run is an outcome counted beside it, not a rank; no result: last
    assert [r["pos"] for r in rows] == ["sinusoidal", "rope", "learned", "alibi", "none"]
    rope = rows[1]
    assert (rope["runs"], rope["mean"], rope["min"], rope["max"]) == (2, pytest.approx(1.6), 1.5, 1.7)
    assert rope["sd"] == pytest.approx(math.sqrt(0.02))  # n - 1
    sinus = rows[0]
    assert (sinus["runs"], sinus["diverged"], sinus["mean"]) == (1, 1, 1.0)
    assert (sinus["bad_runs"], sinus["ended_runs"]) == (1, 2)
    assert rows[3]["unfinished"] == 1 and rows[4]["failed"] == 1
    report.main([str(sweep)])
    out = capsys.readouterr().out
    assert out.startswith("shared: experiment=x\njobs: 5 finished, 1 diverged, 1 failed, 1 unfinished")
    assert "unfinished: 6_pos=alibi,seed=1" in out
    assert "failed: 7_pos=none,seed=1 (ConfigError: model.max_len=8 is shorter than ...)" in out


def sweep_of(root, arms: dict) -> None:
    for cfg, vals in arms.items():
        for seed, v in vals.items():
            fake_job(root, f"{cfg}{seed}", [f"cfg={cfg}", f"seed={seed}"], v)


def block_reference(arms: dict, base: str):
    """The randomised-block model by ordinary least squares on dummies (an intercept, arm and seed effects), as
    numpy solves it: each arm's difference from ``base``, its se, and the residual df."""
    import numpy as np

    names = [base] + [k for k in arms if k != base]
    seeds = sorted({s for v in arms.values() for s in v})
    rows, y = [], []
    for i, name in enumerate(names):
        for s, v in arms[name].items():
            rows.append([1.0] + [float(i == j) for j in range(1, len(names))]
                        + [float(s == t) for t in seeds[1:]])
            y.append(v)
    x, y = np.array(rows), np.array(y)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - np.linalg.matrix_rank(x)
    s2 = float(((y - x @ beta) ** 2).sum() / df)
    cov = s2 * np.linalg.inv(x.T @ x)
    return {n: (beta[i], math.sqrt(cov[i, i])) for i, n in enumerate(names) if i}, df, cov[1:len(names), 1:len(names)]


def test_intervals_and_the_block_models_simultaneous_differences_agree_with_references(tmp_path, capsys):
    a = {"1": 2.00, "2": 2.10, "3": 1.95, "4": 2.05}  # baseline
    b = {"1": 1.90, "2": 2.02, "3": 1.80, "4": 1.99}
    c = {"1": 2.30, "2": 2.10, "3": 2.45, "5": 2.2}  # seed 4 missing, seed 5 the baseline lacks: 3 pairs
    sweep_of(tmp_path, {"a": a, "b": b, "c": c})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    for cfg, vals in (("a", a), ("b", b), ("c", c)):
        x = list(vals.values())
        lo, hi = ss.t.interval(0.95, len(x) - 1, loc=ss.tmean(x), scale=ss.sem(x))
        assert (rows[cfg]["ci_low"], rows[cfg]["ci_high"]) == (pytest.approx(lo, abs=1e-10), pytest.approx(hi, abs=1e-10))
    # every run in one model (seed as block): estimates, se and df as least squares gives them; two comparisons
    # in one family at 95%, Dunnett's critical value at the model's df (checked against scipy in test_stats.py)
    ref, df, _ = block_reference({"a": a, "b": b, "c": c}, "a")
    assert df == 12 - 5 - 2  # 12 runs, 5 seeds, 3 arms: where each arm's paired t would have 3 and 2 df
    crit = ss.t.isf(0.025, df)  # the single t's value, which Dunnett's for two must exceed
    for cfg, seeds in (("b", "1234"), ("c", "123")):
        est, se = ref[cfg]
        r = rows[cfg]
        assert (r["test"], r["pairs"], r["family"]) == ("block", len(seeds), 2)
        assert (r["diff"], r["diff_se"]) == (pytest.approx(est, abs=1e-12), pytest.approx(se, rel=1e-9))
        half = (r["diff_ci_high"] - r["diff_ci_low"]) / (2 * se)
        assert crit < half < ss.t.isf(0.025 / 2, df)  # between the single t and Bonferroni's
        assert r["diff_ci_level"] == pytest.approx(1 - 2 * ss.t.sf(half, df), rel=1e-9)
        assert r["p"] == pytest.approx(2 * ss.t.sf(abs(est) / se, df), rel=1e-9)
        vals = {"b": b, "c": c}[cfg]
        d = [vals[k] - a[k] for k in seeds]
        assert r["correlation"] == pytest.approx(ss.pearsonr([vals[k] for k in seeds], [a[k] for k in seeds])[0])
        assert r["variance_removed"] == pytest.approx(
            1 - ss.tvar(d) / (ss.tvar([vals[k] for k in seeds]) + ss.tvar([a[k] for k in seeds])))
    assert rows["a"]["baseline"] and rows["a"]["verdict"] == "baseline"
    # c's noisy runs widen b's interval too: one residual variance for the model (its equal-variance premise)
    assert rows["b"]["verdict"].startswith("inconclusive (MDE") and "; block model, 4 pairs, df 5, Dunnett over 2" \
        in rows["b"]["verdict"]
    assert rows["c"]["verdict_word"] == "inconclusive"


def test_a_complete_block_design_is_dunnetts_and_a_two_arm_one_the_paired_t(tmp_path, capsys):
    """Complete data: the two contrasts have correlation 1/2, so the interval's critical value and the adjusted
    p are the multivariate t's (scipy); model=paired reads each on its own pairs at Bonferroni's level; with two
    arms the model is the paired t exactly."""
    import numpy as np

    rng = np.random.default_rng(3)
    base = rng.normal(2.0, 0.05, 5)
    arms = {"a": base, "b": base - 0.04 + rng.normal(0, 0.03, 5), "c": base + rng.normal(0, 0.03, 5)}
    data = {k: {str(i + 1): float(v) for i, v in enumerate(x)} for k, x in arms.items()}
    sweep_of(tmp_path / "three", data)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path / "three", "baseline=cfg=a")}
    df = 2 * 4
    mvt = ss.multivariate_t(shape=[[1, 0.5], [0.5, 1]], df=df, seed=7)
    for cfg in "bc":
        r = rows[cfg]
        c = (r["diff_ci_high"] - r["diff_ci_low"]) / (2 * r["diff_se"])
        assert mvt.cdf([c, c], lower_limit=[-c, -c]) == pytest.approx(0.95, abs=1e-3)
        t = abs(r["diff"]) / r["diff_se"]
        assert r["p_adjusted"] == pytest.approx(1 - mvt.cdf([t, t], lower_limit=[-t, -t]), abs=1e-3)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path / "three", "baseline=cfg=a", "model=paired")}
    ref = ss.ttest_rel(list(data["b"].values()), list(data["a"].values()))
    ci = ref.confidence_interval(1 - 0.05 / 2)
    assert (rows["b"]["test"], rows["b"]["family"], rows["b"]["diff_ci_level"]) == ("paired", 2, 0.975)
    assert (rows["b"]["diff_ci_low"], rows["b"]["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    two = {k: data[k] for k in "ab"}
    sweep_of(tmp_path / "two", two)
    r = {r["cfg"]: r for r in records(capsys, tmp_path / "two", "baseline=cfg=a")}["b"]
    ref = ss.ttest_rel(list(two["b"].values()), list(two["a"].values()))
    ci = ref.confidence_interval(0.95)
    assert r["test"] == "block" and r["p_adjusted"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert (r["diff_ci_low"], r["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_against_the_best_every_pair_is_a_paired_t_at_bonferronis_level(tmp_path, capsys):
    a = {"1": 2.00, "2": 2.10, "3": 1.95, "4": 2.05}
    b = {"1": 1.90, "2": 2.02, "3": 1.80, "4": 1.99}
    sweep_of(tmp_path, {"a": a, "b": b})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=best")}
    ref = ss.ttest_rel(list(a.values()), list(b.values()))
    ci = ref.confidence_interval(0.95)
    r = rows["a"]
    assert (r["test"], r["pairs"], r["family"], r["diff_ci_level"]) == ("paired", 4, 1, 0.95)
    assert (r["diff_ci_low"], r["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert r["verdict"].startswith("worse (paired, n=4")


def test_arms_that_share_no_seed_are_compared_by_welch_as_a_whole_family(tmp_path, capsys):
    a, c = {"1": 2.00, "2": 2.10, "3": 1.95}, {"5": 2.30, "6": 2.10, "7": 2.45}
    sweep_of(tmp_path, {"a": a, "c": c})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    welch = ss.ttest_ind(list(c.values()), list(a.values()), equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert rows["c"]["test"] == "welch" and rows["c"]["p"] == pytest.approx(welch.pvalue, rel=1e-9)
    assert (rows["c"]["diff_ci_low"], rows["c"]["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_too_few_pairs_or_no_spread_give_no_verdict(tmp_path, capsys):
    # the block model reads a contrast from 2 pairs; every run additive (no residual spread) decides nothing
    sweep_of(tmp_path / "block", {"a": {"1": 2.1, "2": 2.2, "3": 2.0}, "b": {"1": 2.0, "2": 2.1, "3": 1.9},
                                  "c": {"1": 1.0, "4": 1.1}})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path / "block", "baseline=cfg=a")}
    assert rows["b"]["verdict"] == "no verdict: the runs have no spread to judge them by" and rows["b"]["p"] != 0
    assert rows["c"]["verdict"] == "no verdict: 1 shared seed: at least 2 pairs (and a residual df) decide"
    assert rows["b"]["family"] == 2  # the family is fixed before the data: both comparisons count
    # a paired t (baseline=best) needs 3 pairs and differences with spread
    sweep_of(tmp_path / "pairs", {"a": {"1": 2.1, "2": 2.2, "3": 2.0}, "b": {"1": 2.0, "2": 2.1, "3": 1.9},
                                  "c": {"1": 3.0, "2": 3.1}})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path / "pairs", "baseline=best")}
    assert rows["b"]["baseline"] and rows["a"]["p"] != 0
    assert rows["a"]["verdict"].startswith("no verdict: all 3 differences equal")
    assert rows["c"]["verdict"] == "no verdict: 2 shared seeds: at least 3 pairs decide"


def test_a_range_guessed_from_the_name_is_dropped_when_the_values_deny_it(tmp_path, capsys):
    arms = {"a": [50.0, 70.0, 90.0], "b": [52.0, 60.0, 95.0]}  # "acc" would say [0, 1]: these are percentages
    for cfg, xs in arms.items():
        for s, v in enumerate(xs, 1):
            d = fake_job(tmp_path, f"{cfg}{s}", [f"cfg={cfg}", f"seed={s}"], 1.0)
            m = json.loads((d / "metrics.json").read_text())
            m["val"]["val/acc_pct"] = v
            (d / "metrics.json").write_text(json.dumps(m))
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "metric=val/acc_pct", "baseline=cfg=a", "margin=2")}
    assert rows["b"]["diff_ci_high"] > 10 and rows["b"]["verdict_word"] == "inconclusive"  # not cut to ±1


def test_a_declared_margin_turns_a_tight_interval_into_equivalence(tmp_path, capsys):
    sweep_of(tmp_path, {"a": {"1": 2.00, "2": 2.10, "3": 1.95, "4": 2.05},
                        "b": {"1": 2.001, "2": 2.098, "3": 1.953, "4": 2.049}})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    assert rows["b"]["verdict_word"] == "inconclusive"
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a", "margin=0.01")}
    assert rows["b"]["verdict_word"] == "equivalent" and rows["b"]["verdict"].startswith("equivalent within ±0.01")
    assert -0.01 < rows["b"]["diff_ci_low"] < rows["b"]["diff_ci_high"] < 0.01


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
    assert [r["pos"] for r in rows[:3]] == ["sinusoidal", "rope", "learned"]  # acc = 1 - loss: highest first
    assert rows[1]["mean"] == pytest.approx(-0.6)
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
    assert lines[0].startswith("task,metric,pos,runs,collapsed,diverged,failed,interrupted,unfinished,")
    assert len(lines) == 6
    out = tmp_path / "rep"
    report.main([str(sweep), f"out={out}"])
    assert "wrote report.md, report.csv, report.json, val_loss_curves.png" in capsys.readouterr().out
    strict = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert strict["jobs"]["finished"] == 5
    for name in ("val_loss_curves", "val_loss_final"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / f"{name}.svg").stat().st_size > 1000
        assert matplotlib.image.imread(png)[..., :3].var() > 1e-3  # not blank


@pytest.mark.process  # an interpreter where matplotlib cannot be imported
def test_without_matplotlib_the_tables_still_print_with_a_hint(sweep, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            f"from modforge import report; report.main([{str(sweep)!r}, 'out={tmp_path / 'rep'}'])")
    p = python("-c", code, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "| rope |" in p.stdout and "no plots: matplotlib is not installed; for plots: pip install 'modforge[report]'" in p.stdout
    assert (tmp_path / "rep" / "report.md").exists()


@pytest.mark.parametrize("argv,msg", [([], "name the sweep directory"), (["metric=x"], "name the sweep directory"),
                                      (["/nonexistent"], "no such directory"), (["EMPTY"], "no jobs"),
                                      (["{d}", "metrc=x"], "'metrc=x': expected key=value with key one of metric, "),
                                      (["{d}", "sort=name", "sort=best"], "sort= given twice (sort=name, then sort=best)"),
                                      (["{d}", "best=low"], "best=low: allowed values are min, max."),
                                      (["{d}", "baseline=pos=nope"], "baseline=pos=nope: matches 0 configurations"),
                                      (["{d}", "level=95"], "level=95: a confidence level"),
                                      (["{d}", "margin=-0.1"], "margin=-0.1: a positive number"),
                                      (["{d}", "margin=nan"], "margin=nan: a positive number"),
                                      (["{d}", "collapse_tol=x"], "collapse_tol=x: a number of nats >= 0"),
                                      (["{d}", "study=maybe"], "study=maybe: allowed values are declared, ignore."),
                                      (["{d}", "at=flops:-1"], "at=flops:-1: use at=flops:<FLOPs>"),
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


def test_every_pair_is_the_family_when_the_baseline_is_the_best(tmp_path, capsys):
    """baseline=best picks the winner from the data: the family is all 3 pairs, so each interval is at 1 - 0.05/3."""
    vals = {"a": [1.00, 1.02, 0.98], "b": [1.10, 1.13, 1.08], "c": [1.30, 1.20, 1.25]}
    sweep_of(tmp_path, {k: {str(i): v for i, v in enumerate(xs, 1)} for k, xs in vals.items()})
    rows = {r["cfg"]: r for r in records(capsys, tmp_path)}
    assert rows["a"]["baseline"]
    for cfg in ("b", "c"):
        ref = ss.ttest_rel(vals[cfg], vals["a"])
        assert rows[cfg]["family"] == 3 and rows[cfg]["p_adjusted"] == pytest.approx(min(1, 3 * ref.pvalue))
        ci = ref.confidence_interval(1 - 0.05 / 3)
        assert (rows[cfg]["diff_ci_low"], rows[cfg]["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    report.main([str(tmp_path)])
    assert "the 3 pairs of configurations (the baseline is the best, chosen by the data) form one family" in \
        capsys.readouterr().out


def test_a_baseline_with_an_interval_is_preferred_and_a_short_one_is_named(tmp_path, capsys):
    fake_job(tmp_path, "a1", ["cfg=a", "seed=1"], 0.5)  # best, but n=1
    for s in (1, 2, 3):
        fake_job(tmp_path, f"b{s}", ["cfg=b", f"seed={s}"], 1.0 + s / 100)
        fake_job(tmp_path, f"c{s}", ["cfg=c", f"seed={s}"], 2.0 + s * s / 100)
    rows = {r["cfg"]: r for r in records(capsys, tmp_path)}
    assert rows["b"]["baseline"] and rows["a"]["verdict"] == "no verdict: 1 shared seed: at least 3 pairs decide"
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "baseline=cfg=a")}
    assert rows["b"]["verdict"] == "no verdict: 1 shared seed: at least 2 pairs (and a residual df) decide"


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


def test_a_key_every_cell_sets_alike_is_shared_and_one_the_cells_differ_in_is_varying(tmp_path, capsys):
    """A study's stage lists every override in each cell (its rung, its steps): only what the cells differ in
    labels the rows, including a key some cells leave out and one whose jobs never started."""
    fake_job(tmp_path, "0", ["pos=sinusoidal", "model.scale_embeddings=true", "model.d_model=96", "seed=1"], 1.0)
    fake_job(tmp_path, "1", ["pos=rope", "model.d_model=96", "seed=1"], 0.9)
    cells = [{"pos": "sinusoidal", "model.scale_embeddings": "true", "model.d_model": 96, "seed": 1},
             {"pos": "rope", "model.d_model": 96, "seed": 1}, {"pos": "alibi", "model.d_model": 96, "seed": 1}]
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"cells": cells}}}))
    report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("shared: model.d_model=96\n") and "| model.scale_embeddings | pos | runs |" in out


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


def test_loss_by_position_is_the_mean_curve_of_each_configuration(tmp_path, capsys):
    """by_position=val@8: each configuration's curve is the mean of its runs' (by position), shown in ranges of
    positions; a key no run recorded is one line naming what was recorded."""
    curves = {("rope", 1): [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], ("rope", 2): [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0],
              ("alibi", 1): [4.0] * 8, ("alibi", 2): [2.0] * 8}
    for i, ((pos, seed), c) in enumerate(curves.items()):
        fake_job(tmp_path, f"{i}", [f"pos={pos}", f"seed={seed}"], 1.0 + i / 10, extra={"by_position": {"val@8": c}})
    report.main([str(tmp_path), "by_position=val@8", "format=json"])
    doc = json.loads(capsys.readouterr().out)["by_position"][0]
    got = {c["label"]: c["values"] for c in doc["curves"]}
    assert got["pos=rope"] == [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0] and got["pos=alibi"] == [3.0] * 8
    report.main([str(tmp_path), "by_position=val@8"])
    out = capsys.readouterr().out
    assert "| configuration | runs | 0–0 | 1–1 |" in out and "| pos=rope [baseline] | 2 | 3.0000 | 2.0000 | 1.0000" in out
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "by_position=val@64"])
    err = capsys.readouterr().err
    assert "by_position=val@64: no run recorded it" in err and "recorded here: val@8" in err


def test_tasks_together_puts_one_pair_task_of_three_architectures_in_one_table(tmp_path, capsys):
    for i, (task, seed) in enumerate([(t, s) for t in ("seq2seq", "seq2seq_lm", "transduce") for s in (1, 2)]):
        fake_job(tmp_path, f"{i}", [f"task={task}", f"seed={seed}"], 0.5 + i / 20, task=task)
    report.main([str(tmp_path), "metric=val/acc"])
    assert capsys.readouterr().out.count(", metric val/acc in [0, 1], best first") == 3  # apart, by default
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


def test_collapsed_and_diverged_runs_are_outcomes_with_fishers_test(tmp_path, capsys):
    """A run no better than its unigram model is collapsed (not averaged); each arm's collapsed+diverged rate
    gets Wilson's interval, and Fisher's exact test against the baseline (scipy's, adjusted for the family)."""
    for s in range(1, 5):
        fake_job(tmp_path, f"pre{s}", ["residual=pre", f"seed={s}"], 2.0 + s / 100, extra={"unigram_val_loss": 3.3})
        loss = {1: 3.29, 2: 3.4, 3: float("nan")}.get(s, 2.5)  # collapsed twice (within 0.02 of 3.3, above it)
        fake_job(tmp_path, f"post{s}", ["residual=post", f"seed={s}"], loss, extra={"unigram_val_loss": 3.3})
        fake_job(tmp_path, f"deep{s}", ["residual=deep", f"seed={s}"], 3.31, extra={"unigram_val_loss": 3.3})
    rows = {r["residual"]: r for r in records(capsys, tmp_path, "baseline=residual=pre")}
    post, deep = rows["post"], rows["deep"]
    assert (post["runs"], post["collapsed"], post["diverged"], post["mean"]) == (1, 2, 1, 2.5)
    assert (post["bad_runs"], post["ended_runs"]) == (3, 4)
    # two Fisher tests (an arm that collapsed every time is still an arm: it counts, in both families)
    assert post["bad_fisher_p_adjusted"] == pytest.approx(2 * ss.fisher_exact([[3, 1], [0, 4]]).pvalue)
    assert deep["bad_fisher_p_adjusted"] == pytest.approx(2 * ss.fisher_exact([[4, 0], [0, 4]]).pvalue)
    assert deep["verdict"] == "no verdict: this arm has no finished run with val/loss"
    assert (post["bad_rate_low"], post["bad_rate_high"]) == pytest.approx(
        tuple(ss.binomtest(3, 4).proportion_ci(0.95, method="wilson")))
    report.main([str(tmp_path), "baseline=residual=pre"])
    out = capsys.readouterr().out
    assert "jobs: 5 finished, 6 collapsed, 1 diverged" in out and "| 3/4 [0.30, 0.95], Fisher p=0.29 |" in out
    assert "collapsed: post1 (val/loss 3.2900, unigram model 3.3000)" in out
    rows = {r["residual"]: r for r in records(capsys, tmp_path, "baseline=residual=pre", "collapse_tol=0")}
    assert rows["post"]["collapsed"] == 1  # 3.29 is below 3.3 by more than 0


def test_a_declared_study_sets_the_family_baseline_and_margin(tmp_path, capsys):
    study = {"question": "does b match a?", "baseline": "cfg=a", "compare": ["cfg=b"], "margin": 0.01, "level": 0.9}
    arms = {"a": [2.00, 2.10, 1.95, 2.05], "b": [2.001, 2.098, 1.953, 2.049], "c": [2.3, 2.4, 2.2, 2.35]}
    for cfg, xs in arms.items():
        for s, v in enumerate(xs, 1):
            d = fake_job(tmp_path, f"{cfg}{s}", [f"cfg={cfg}", f"seed={s}"], v)
            (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"task": {"name": "causal_lm"}, "study": study}))
    rows = {r["cfg"]: r for r in records(capsys, tmp_path)}
    assert rows["a"]["baseline"] and rows["b"]["family"] == 1 and rows["b"]["diff_ci_level"] == pytest.approx(0.9)
    assert rows["b"]["verdict"].startswith("equivalent within ±0.01") and rows["c"]["verdict"] == \
        "not in the study's family"
    report.main([str(tmp_path)])
    assert capsys.readouterr().out.startswith("jobs: 12 finished\n\nstudy: does b match a?\n")
    other = tmp_path.parent / (tmp_path.name + "_other")  # the experiment swept at other rates, not its arms
    for s, v in enumerate([2.0, 2.1], 1):
        d = fake_job(other, f"r{s}", ["optim.lr=0.1", f"seed={s}"] if s == 1 else ["optim.lr=0.2", "seed=1"], v)
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"task": {"name": "causal_lm"}, "study": study}))
    with pytest.raises(SystemExit):
        report.main([str(other)])
    assert "names no configuration by the overrides that vary in this sweep (optim.lr); a sweep that is not the " \
           "study's design is read with study=ignore" in capsys.readouterr().err
    report.main([str(other), "study=ignore"])
    assert "| 0.1 |" in capsys.readouterr().out
    rows = {r["cfg"]: r for r in records(capsys, tmp_path, "study=ignore")}  # a plain sweep: the best, all pairs
    assert rows["b"]["family"] == 3 and rows["b"]["margin"] is None  # NaN: null in strict JSON
    (tmp_path / "c1" / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"study": {**study, "margin": -1}}))
    with pytest.raises(SystemExit):
        report.main([str(tmp_path)])
    assert "c1: its study block differs from the other jobs'" in capsys.readouterr().err


def test_at_equal_compute_each_run_is_read_at_its_own_step_of_those_flops(tmp_path, capsys):
    """A wide arm spends 2e6 FLOPs a step, a narrow one 1e6: at=flops:4e8 reads the wide arm at step 200 and the
    narrow one at step 400 (the logged steps closest to it)."""
    curve = [(s, 3.0 - s / 1000) for s in (100, 200, 300, 400, 500)]
    for s in (1, 2, 3):
        for arm, per_step in (("wide", 2e6), ("narrow", 1e6)):
            fake_job(tmp_path, f"{arm}{s}", [f"arm={arm}", f"seed={s}"], 2.0 + s / 100, curve=curve,
                     extra={"train_flops": per_step * 500, "steps": 500})
    rows = {r["arm"]: r for r in records(capsys, tmp_path, "at=flops:4e8")}
    assert rows["wide"]["mean"] == pytest.approx(2.8) and rows["narrow"]["mean"] == pytest.approx(2.6)
    report.main([str(tmp_path), "at=step:300"])
    assert "at step 300 (each run's logged validation closest to it: step 300)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "at=tokens:5"])
    assert "at=tokens:5: use at=flops:<FLOPs>" in capsys.readouterr().err


def test_along_a_swept_key_each_line_has_its_best_and_edges_are_flagged(tmp_path, capsys):
    """x=optim.lr panel=param: a line per width in each panel, its best rate (the mean over seeds), flagged when
    it is the last rate swept; the plot is written."""
    pytest.importorskip("matplotlib")
    best = {("standard", "32"): 2, ("standard", "64"): 1, ("mup", "32"): 2, ("mup", "64"): 3}  # index of the best
    i = 0
    for (param, width), b in best.items():
        for k, lr in enumerate(("0.001", "0.002", "0.004", "0.008")):
            for seed in ("1", "2"):
                loss = 2.0 + 0.1 * abs(k - b) + 0.01 * int(seed)
                fake_job(tmp_path, f"{i}_j", ["experiment=x", f"param={param}", f"model.d_model={width}",
                                              f"optim.lr={lr}", f"seed={seed}"], loss)
                i += 1
    out = tmp_path / "out"
    report.main([str(tmp_path), "x=optim.lr", "panel=param", f"out={out}"])
    text = capsys.readouterr().out
    assert "val/loss along optim.lr" in text
    assert "| param=mup | model.d_model=64 | 2.3150 | 2.2150 | 2.1150 | **2.0150** | 0.008 (edge of the sweep) |" in text
    assert "| param=standard | model.d_model=64 | 2.1150 | **2.0150** | 2.1150 | 2.2150 | 0.002 |" in text
    doc = json.loads((out / "report.json").read_text())["along"][0]
    got = {(ln["panel"], ln["line"]): (ln["best"], ln["edge"]) for ln in doc["lines"]}
    assert got[("param=standard", "model.d_model=32")] == ("0.004", False)
    assert (out / "val_loss_along_optim.lr.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "panel=param"])
    assert "panel=param: panels split the lines of x=KEY; give x= too" in capsys.readouterr().err


def test_a_level_is_printed_as_given_not_rounded():
    """level=0.9875 (four tables holding 0.95 together) must not read as 99%."""
    from modforge.results.formats import percent

    assert (percent(0.95), percent(0.9875), percent(0.99), percent(0.999)) == ("95%", "98.75%", "99%", "99.9%")
