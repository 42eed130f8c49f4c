"""experiments/recheck_cells.py: the "Reproducing a cell" table quotes only values its studies committed."""
import importlib.util

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recheck():
    spec = importlib.util.spec_from_file_location("recheck_cells", ROOT / "experiments" / "recheck_cells.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_value_in_the_reproducing_table_is_in_a_committed_report():
    recheck = _recheck()
    rows = recheck.rows()
    assert {"norms", "ffn_variants", "prepost_ln", "positions", "norm_quick"} <= {r["study"] for r in rows}
    for r in rows:
        assert r["report"].exists(), r["report"]
        assert r["values"] and all(recheck.committed(r).values()), (r["study"], r["values"])


def test_a_value_off_by_one_digit_is_caught(tmp_path):
    recheck = _recheck()
    row = next(r for r in recheck.rows() if r["study"] == "norms")
    metric, text = next(iter(row["values"].items()))
    i = text.index(".") + 6  # the sixth decimal: a difference the 1e-6 promise is about (the 17th digit may round away)
    wrong = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{recheck.TABLE_HEADING}\n\n| study | cell | value |\n|---|---|---|\n"
                      f"| [norms]({row['report']}) | `{row['command']}` | {metric} {wrong} |\n")
    (tampered,) = recheck.rows(readme)
    assert tampered["values"] == {metric: wrong}
    assert recheck.committed(tampered) == {metric: False}
    assert recheck.committed(row) == {metric: True}


def test_rows_re_run_alone_replace_their_own_and_keep_the_others_with_their_dates():
    """recheck_cells.py <study>: the rows re-run replace that study's rows in recheck_cells.md; the others stay,
    each with its date, CPU and torch (a file written before rows had their own gives them from its header)."""
    recheck = _recheck()
    old = ("# One cell of each study, re-run on 2026-11-20\n\nCPU: Intel Xeon; torch 2.13.0+cpu. Kernels: ...\n\n"
           "| study | metric | committed | today | difference | | kernels |\n|---|---|---|---|---|---|---|\n"
           "| norms | val/loss | 2.5 | 2.5 | 0.0e+00 | same to the last digit | AVX512 |\n"
           "| positions | val/loss | 1.5 | 1.6 | 1.0e-01 | differs | AVX512 |\n"
           "| positions | slide16@256/loss | 1.4 | 1.5 | 1.0e-01 | differs | AVX512 |\n")
    kept = recheck.table_rows(old)
    assert kept[0] == ("| norms | val/loss | 2.5 | 2.5 | 0.0e+00 | same to the last digit | AVX512 "
                       "| 2026-11-20, Intel Xeon, torch 2.13.0+cpu |")
    fresh = ["| positions | val/loss | 1.5 | 1.5 | 0.0e+00 | same to the last digit | AVX512 | 2026-11-29, AMD EPYC, "
             "torch 2.13.0+cpu |", "| qk | val/loss | 1.9 | 1.9 | 0.0e+00 | same to the last digit | AVX512 | "
             "2026-11-29, AMD EPYC, torch 2.13.0+cpu |"]
    table = [{"study": "qk", "values": {"val/loss": "1.9"}}, {"study": "norms", "values": {"val/loss": "2.5"}},
             {"study": "positions", "values": {"val/loss": "1.5"}}]
    text = recheck.merged(kept, fresh, table)
    assert recheck.table_rows(text) == [fresh[1], kept[0], fresh[0]]  # the README's order; both old positions rows gone
    assert recheck.table_rows(recheck.merged(recheck.table_rows(text), [], table)) == recheck.table_rows(text)
    # a kept row whose study left the table, or whose committed value the table no longer quotes, is dropped
    table[1]["values"] = {"val/loss": "2.6"}
    assert recheck.table_rows(recheck.merged(recheck.table_rows(text), [], table)) == [fresh[1], fresh[0]]
    assert recheck.table_rows(recheck.merged(recheck.table_rows(text), [], table[:1])) == [fresh[1]]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_saved_study_keeps_its_ended_runs_records_and_nothing_else_and_restores_them(tmp_path):
    """experiments/study_state.py: of a run that ended, its config, metrics and markers (what the sweep reads to
    skip it); no checkpoints or logs; a run that did not end is left out (it trains again); the same runs give
    the same bytes; restore refuses a directory that holds anything."""
    st = _script("study_state")
    s = tmp_path / "s"
    stage = s / "tune" / "round-0"
    for name, ended in (("0_a", True), ("1_b", False)):
        run = stage / name
        (run / ".hydra").mkdir(parents=True)
        (run / "checkpoints").mkdir()
        (run / ".modforge-run").write_text('{"format": "modforge-run-1"}')
        (run / "config.yaml").write_text("seed: 1\n")
        (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x" * 1000)
        (run / "train.log").write_text("...")
        if ended:
            (run / "metrics.json").write_text('{"status": "finished"}')
    (stage / "cells.json").write_text('{"cells": []}')
    (s / "study.json").write_text("{}")
    assert [str(p) for p in st.kept(s)] == ["study.json", "tune/round-0/0_a/.hydra/overrides.yaml",
                                           "tune/round-0/0_a/.modforge-run", "tune/round-0/0_a/config.yaml",
                                           "tune/round-0/0_a/metrics.json", "tune/round-0/cells.json"]
    assert st.save(s, tmp_path / "a.tar.xz") == 1 and st.save(s, tmp_path / "b.tar.xz") == 1
    assert (tmp_path / "a.tar.xz").read_bytes() == (tmp_path / "b.tar.xz").read_bytes()
    back = tmp_path / "back"
    assert st.restore(tmp_path / "a.tar.xz", back) == 1
    assert (back / "tune/round-0/0_a/metrics.json").read_text() == '{"status": "finished"}'
    assert not (back / "tune/round-0/1_b").exists() and not (back / "tune/round-0/0_a/checkpoints").exists()
    import pytest

    with pytest.raises(SystemExit, match="not empty; restore into a new directory"):
        st.restore(tmp_path / "a.tar.xz", back)


def test_the_committed_decision_accuracy_table_is_what_its_script_writes_from_the_committed_reports():
    """experiments/results/decision_accuracy.md is generated: a report committed or changed without re-running
    the script fails here. The same model at a rung (µP at its base) is left out; a flipped verdict counts."""
    da = _script("decision_accuracy")
    rows = da.rows()
    assert (ROOT / "experiments" / "results" / "decision_accuracy.md").read_text() == da.markdown(rows)
    assert not any(r["study"] == "mup_ladder" and r["rung"].startswith("model.d_model=64,") for r in rows)
    swiglu = [r for r in rows if r["study"] == "ffn_variants" and r["arm"] == "ffn=swiglu"]
    assert swiglu and not any(r["same_verdict"] or r["same_sign"] for r in swiglu)  # worse small, better at d96
    readme = (ROOT / "experiments" / "README.md").read_text()
    assert "\n".join(da.groups_table(rows)) in readme  # the summary quoted there, line for line



def test_a_study_amended_after_its_results_counts_once_as_its_amendment(tmp_path, monkeypatch):
    import json

    da = _script("decision_accuracy")
    rec = {"verdicts": [{"arm": "norm=rms", "rung": r, "verdict": "inconclusive"} for r in ("a", "b")]}
    for study in ("ladder_norms", "other"):
        (tmp_path / study / "study").mkdir(parents=True)
        (tmp_path / study / "study" / "report.json").write_text(json.dumps(rec))
    monkeypatch.setattr(da, "RESULTS", tmp_path)
    assert set(da.reports()) == {"ladder_norms", "other"}  # no amendment committed: the first design counts
    (tmp_path / "ladder_norms_bracket" / "study").mkdir(parents=True)
    (tmp_path / "ladder_norms_bracket" / "study" / "report.json").write_text(json.dumps(rec))
    assert set(da.reports()) == {"ladder_norms_bracket", "other"}

@pytest.mark.slow
def test_the_checked_write_ups_quote_only_figures_found_in_committed_files():
    """experiments/check_numbers.py (issue 51, item 7) on the write-ups it holds: every precise figure (three or
    more decimals) equals a number of the committed results at its digits, or is derived from such numbers by a
    check comment that evaluates to it."""
    cn = _script("check_numbers")
    for stem in cn.CHECKED:
        assert cn.misses(ROOT / "experiments" / f"{stem}.md") == [], stem


def test_the_number_checker_catches_a_figure_no_file_holds_and_a_wrong_derivation():
    cn = _script("check_numbers")
    text = ("## Claim and its source\n\nThe paper: 1.997.\n\n## Verdicts\n\n**Claims.** Shazeer: 1.983.\n\n"
            "Δ −0.0342 and 0.056 and 0.0119.\n"
            "<!-- check: 0.056 = 2.3081 - 2.2518 -->\n<!-- check: 0.0119 = sd(2.3597, 2.3770) -->\n"
            "<!-- check: 0.5 = 9.8765 - 9.3765 -->\n")
    assert [f for _, f in cn.quoted(text)] == ["-0.0342", "0.056", "0.0119"]  # the paper's figure is exempt
    ok, bad = cn.derived(text, {2.3081, 2.2518, 2.3597, 2.377, 9.8765})
    assert ok == {"0.056"}
    assert [fig for fig, _ in bad] == ["0.0119", "0.5"]
    assert "not 0.0119" in bad[0][1] and "9.3765 not in a committed file" in bad[1][1]
    assert cn.found("-0.0342", {0.03421}) and not cn.found("0.0342", {0.0343})
    with pytest.raises(ValueError):
        cn.evaluate("__import__('os')")


def _fake_study(root: Path, runs: dict) -> dict:
    """A study directory whose comparison runs are ``runs``: {(arm overrides, seed): successes of 512}; returns a
    report.json of its arms as the runner writes one (arm, rung, setting)."""
    import json

    arms = {}
    for i, ((arm, seed), k) in enumerate(sorted(runs.items())):
        run = root / "compare" / "round-1" / f"{i}_{arm.replace(',', '_')}-{seed}"
        (run / ".hydra").mkdir(parents=True)
        over = arm.split(",") + ["optim.lr=0.001", f"seed={seed}"]
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in over))
        (run / "config.yaml").write_text("data:\n  n_val: 512\nseed: 0\n")
        (run / ".modforge-run").write_text("{}")
        (run / "metrics.json").write_text(json.dumps({"status": "finished", "val": {"val/exact_match": k / 512}}))
        arms.setdefault(arm, {"arm": arm, "rung": "", "setting": {"optim.lr": 0.001}})
    (root / "study.json").write_text("{}")
    base = "model=encoder_decoder"
    return {"level": 0.95, "arms": [arms[base]] + [a for n, a in sorted(arms.items()) if n != base]}


def test_rates_are_tested_over_seeds_exactly_and_a_bimodal_arm_gets_no_mean(tmp_path):
    """experiments/rates.py: each arm's pooled rate has scipy's Wilson interval; runs at 0.0 and 1.0 are bimodal
    and get no mean; the test against the baseline is the exact permutation test over every split of the runs
    (checked by enumerating the splits here), Holm-adjusted; a saved state reads as the directory does."""
    import itertools
    import math

    from scipy import stats as sps

    rt, st = _script("rates"), _script("study_state")
    ed, do, eo = "model=encoder_decoder", "model=decoder_only,task=seq2seq_lm", "model=encoder_only,task=transduce"
    counts = {ed: [500, 505, 498, 502, 499], do: [0, 512, 510, 3, 511], eo: [480, 470, 490, 485, 477]}
    runs = {(a, 1000 + i): k for a, ks in counts.items() for i, k in enumerate(ks)}
    report = _fake_study(tmp_path / "s", runs)
    t = rt.table(tmp_path / "s", report)
    rows = {r["arm"]: r for r in t["rows"]}
    assert rows[do]["bimodal"] and "mean" not in rows[do]
    assert not rows[eo]["bimodal"] and rows[eo]["mean"][0] == sum(counts[eo]) / 5 / 512
    K, N = sum(counts[eo]), 5 * 512
    z, ph = sps.norm.ppf(0.975), K / N  # Wilson's score interval, by its formula
    low = (ph + z * z / (2 * N) - z * math.sqrt(ph * (1 - ph) / N + z * z / (4 * N * N))) / (1 + z * z / N)
    assert rows[eo]["pooled"] == (K, N) and math.isclose(rows[eo]["pooled_wilson"][0], low, rel_tol=1e-9)

    def by_enumeration(a, b):
        x = [k / 512 for k in a + b]
        obs = abs(sum(a) / len(a) - sum(b) / len(b)) / 512
        splits = list(itertools.combinations(range(len(x)), len(a)))
        hits = sum(abs(sum(x[i] for i in s) / len(a) - sum(x[i] for i in range(len(x)) if i not in s) / len(b))
                   >= obs - 1e-12 for s in splits)
        return hits / len(splits)

    tests = {x["arm"]: x for x in t["tests"]}
    for arm in (do, eo):
        assert math.isclose(tests[arm]["p"], by_enumeration(counts[arm], counts[ed]), rel_tol=1e-9)
    p = sorted([tests[do]["p"], tests[eo]["p"]])
    assert sorted(x["p_holm"] for x in t["tests"]) == [min(1, 2 * p[0]), max(min(1, 2 * p[0]), p[1])]
    assert tests[eo]["verdict"] == "worse" and tests[do]["verdict"] == "inconclusive" and tests[do]["mde"] > 0
    assert tests[eo]["p"] == 2 / 252  # 5 runs against 5 all apart: the most an exact test can say
    st.save(tmp_path / "s", tmp_path / "state.tar.xz")
    assert rt.table(tmp_path / "state.tar.xz", report) == t
    assert "| — | model=decoder_only,task=seq2seq_lm | 0/512, 512/512, 510/512, 3/512, 511/512 |" in rt.markdown(t)
    # unequal groups: the p is the share of splits at least as far apart, not twice a one-sided p
    for a, b in (([500, 505, 498], [480, 470, 490, 485, 477, 499]), ([0, 512, 3], [500, 505, 498, 502, 499])):
        assert math.isclose(rt.exact_permutation_p([k / 512 for k in a], [k / 512 for k in b]), by_enumeration(a, b),
                            rel_tol=1e-9)
    assert rt.smallest_p(3, 6) == 1 / 84 and rt.smallest_p(5, 5) == 2 / 252


def test_rates_count_a_failed_run_as_nothing_solved_and_say_when_too_few_runs_could_decide(tmp_path):
    """A diverged run counts as 0 of its pairs (dropping it would flatter an unstable arm); a comparison whose
    runs could not reach the family's level whatever they showed is inconclusive with "too few runs", no MDE;
    a run matching two arms' overrides belongs to the arm that names more of them."""
    import json

    rt = _script("rates")
    ed, do = "model=encoder_decoder", "model=encoder_decoder,model.n_layers=4"
    runs = {(ed, 1000): 500, (ed, 1001): 505, (do, 1000): 100, (do, 1001): 90}
    report = _fake_study(tmp_path / "s", runs)
    report["verdicts"] = [{"arm": do}]
    bad = next(p for p in (tmp_path / "s").rglob("metrics.json") if "n_layers=4-1001" in str(p.parent))
    bad.write_text(json.dumps({"status": "diverged", "val": {}}))
    t = rt.table(tmp_path / "s", report)
    rows = {r["arm"]: r for r in t["rows"]}
    assert rows[ed]["k"] == [500, 505] and rows[do]["k"] == [100, 0]
    assert t["failed_counted_as_0"] == [f"{do} seed 1001 (diverged)"]
    assert (t["tests"][0]["verdict"], t["tests"][0]["why"]) == ("inconclusive", "too few runs for this test")
    assert t["tests"][0]["smallest_p"] == 2 / 6


def test_the_ladder_refit_gives_a_committed_ladder_its_own_fit_again():
    """experiments/ladder_fit.py: from ladder_ffn's report.json alone, the same multipliers, alternative, lack of
    fit, held-out rung and ranking that the study's own code wrote."""
    import json

    lf = _script("ladder_fit")
    rep = json.loads((ROOT / "experiments/results/ladder_ffn/study/report.json").read_text())
    again = json.loads(json.dumps(lf._plain(lf.refit(rep))))
    for key in ("multipliers", "alternative", "lack_of_fit", "held_out", "fit", "ranking", "agreement", "flips"):
        assert again[key] == rep["ladder"][key], key


def test_the_interaction_is_paired_by_seed_over_the_seeds_all_four_arms_finished():
    """experiments/interaction.py (positions_2x2's third family): (a1 - a0) - (b1 - b0) per seed, a t interval by
    hand, a seed one arm lacks left out, and the reading's sign."""
    import math

    from scipy import stats as sps

    ix = _script("interaction")
    base = {"1000": 2.0, "1001": 2.1, "1002": 1.9, "1003": 2.05}
    arms = {"a1": {s: v - 0.10 + 0.01 * i for i, (s, v) in enumerate(base.items())},
            "a0": dict(base), "b1": {s: v - 0.02 for s, v in base.items()}, "b0": dict(base)}
    arms["a0"]["1004"] = 2.0  # a seed the other arms lack
    arms["b1"]["1001"] = float("nan")  # a run that failed: its seed is left out too
    report = {"metric": "val/loss", "arms": [{"arm": k, "values": v} for k, v in arms.items()]}
    x = ix.interaction(report, "a1", "a0", "b1", "b0")
    assert x["seeds"] == ["1000", "1002", "1003"]
    d = [(-0.10 + 0.01 * i) - (-0.02) for i in (0, 2, 3)]
    assert x["differences"] == pytest.approx(d)
    m, sd = sum(d) / 3, math.sqrt(sum((v - sum(d) / 3) ** 2 for v in d) / 2)
    half = sps.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert (x["low"], x["high"]) == pytest.approx((m - half, m + half))
    assert x["reading"] == "a1 - a0 is smaller than b1 - b0"  # the factor lowers the loss more under a than b
    from modforge.results.stats import minimum_detectable

    assert x["mde"] == pytest.approx(minimum_detectable(sd / math.sqrt(3), 2, 0.05))
    report["arms"][0]["values"] = {s: base[s] + 0.01 + (-1) ** i * 0.002 for i, s in enumerate(base)}  # about as
    report["arms"][2]["values"] = {s: base[s] + 0.01 for s in base}  # b1 - b0: no interaction, some noise
    z = ix.interaction(report, "a1", "a0", "b1", "b0")
    assert z["reading"].startswith("inconclusive (MDE ") and z["low"] < 0 < z["high"]
    with pytest.raises(SystemExit, match="no spread, so no interval"):
        ix.interaction(report, "b1", "b0", "b1", "b0")
    with pytest.raises(SystemExit, match="arm='c': not in the report"):
        ix.interaction(report, "c", "a0", "b1", "b0")
