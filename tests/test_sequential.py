"""The comparison stage (modforge.studies.sequential, modforge.studies.boundaries): the block model against an
independent least-squares fit, the calibrated boundaries against Dunnett's multivariate t, the simulation
against the code a study runs, and the family's error under the nulls the shipped runs show (20,000 families
each). No training. The figures are quoted in docs/studies.md."""
import math
import warnings

import numpy as np
import pytest

from modforge.results import blocks
from modforge.studies import boundaries, sequential, simulation
from modforge.studies.simulation import Rung

LOOKS = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
SD = 0.01  # a run's noise, as in the shipped studies (median fresh-seed sd 0.011)
FAMILIES = 20_000


def test_looks_and_spending():
    assert sequential.looks(3, 6, 1) == [3, 4, 5, 6] and sequential.looks(3, 8, 2) == [3, 5, 7, 8]
    spent = boundaries.spending(0.95, (3, 4, 5, 6))
    assert math.isclose(sum(spent), 0.05) and math.isclose(spent[0], 0.05 * (3 / 6) ** 3)  # rho = 3


def test_the_block_model_is_the_two_way_least_squares_fit_with_missing_runs():
    """Each arm's contrast, its standard error and the residual df against numpy's least squares of
    y = mu + arm + seed on the runs present (an independent computation: the design matrix written out)."""
    rng = np.random.default_rng(0)
    a, n = 4, 7
    y = rng.normal(size=(1, a, n)) + np.arange(a)[None, :, None] * 0.3 + rng.normal(size=(1, 1, n))
    y[0, 2, 3] = y[0, 0, 5] = y[0, 3, 1] = np.nan
    est, factor, s2, df, pairs = (v[0] for v in blocks.block_fit(y, np.ones_like(y, bool)))
    rows = [(i, s) for i in range(a) for s in range(n) if np.isfinite(y[0, i, s])]
    X = np.zeros((len(rows), 1 + (a - 1) + (n - 1)))
    for r, (i, s) in enumerate(rows):
        X[r, 0] = 1
        if i:
            X[r, i] = 1
        if s:
            X[r, a - 1 + s] = 1
    yy = np.array([y[0, i, s] for i, s in rows])
    beta, rss, rank, _ = np.linalg.lstsq(X, yy, rcond=None)
    dof = len(rows) - rank
    cov = float(rss[0]) / dof * np.linalg.inv(X.T @ X)
    assert df == dof and s2 == pytest.approx(float(rss[0]) / dof)
    assert est == pytest.approx(beta[1:a]) and s2 * factor == pytest.approx(np.diag(cov)[1:a])
    assert list(pairs) == [6, 5, 5]
    # complete, two arms: the paired t
    y2 = rng.normal(size=(1, 2, 6))
    e2, f2, s22, df2, _ = (v[0] for v in blocks.block_fit(y2, np.ones_like(y2, bool)))
    d = y2[0, 1] - y2[0, 0]
    assert df2 == 5 and e2[0] == pytest.approx(d.mean()) and s22 * f2[0] == pytest.approx(d.var(ddof=1) / 6)


@pytest.mark.parametrize("arms, n", [((2,), 6), ((4,), 6), ((3, 3), 5)])
def test_one_look_s_critical_value_is_dunnett_s(arms, n):
    """At a single look the calibrated value is the max-|t| quantile of the contrasts against a shared control:
    Dunnett's multivariate t (correlation 1/2 within a rung, independent rungs, df (a - 1)(n - 1)), by scipy."""
    from scipy.stats import multivariate_t

    (c,) = boundaries.calibrate(boundaries.Layout(arms, (n,), 0.95, draws=200_000))
    p = 1.0
    for a in arms:
        k = a - 1
        shape = np.full((k, k), 0.5) + 0.5 * np.eye(k)
        p *= multivariate_t(np.zeros(k), shape, df=(a - 1) * (n - 1)).cdf(np.full(k, c), lower_limit=np.full(k, -c),
                                                                          random_state=1)
    assert p == pytest.approx(0.95, abs=0.003), (c, p)


def scenario(rungs, margin=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return simulation.simulate(rungs, LOOKS, margin=margin, families=FAMILIES, seed=1, **kw)


@pytest.mark.parametrize("rungs, margin", [
    ([Rung([0.0, 0.02, -0.03], sd=SD, missing=0.05, spikes={1: 0.2, 0: 0.1})], 0.02),
    ([Rung([0.0], sd=SD, spikes={1: 0.33}, prone=True)], 0.02),
    ([Rung([0.0, 0.0], sd=SD, spikes={1: 0.1}), Rung([0.01], sd=SD, missing=0.2)], None),
    ([Rung([0.0, 0.015], sd=SD, borrowed_df=8, missing=0.1)], 0.02),
])
def test_the_simulation_runs_the_code_a_study_runs(rungs, margin):
    """The vectorised simulation and :func:`decide_rung` (what a study calls), family by family on the same runs:
    the same verdict, at the same look, on the same number of runs, in every family."""
    crit = boundaries.critical_values(boundaries.Layout(tuple(len(r.effects) + 1 for r in rungs), tuple(LOOKS),
                                                        borrowed=tuple(r.borrowed_df for r in rungs)))
    ys = simulation.draw(rungs, LOOKS[-1], 200, np.random.default_rng(5))
    sizes = [r.spike_size for r in rungs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fast = simulation.run_vectorised(ys, LOOKS, crit, margin, sizes=sizes)
    slow = simulation.run_reference(ys, LOOKS, crit, margin, sizes=sizes)
    for (w1, a1, r1), (w2, a2, r2) in zip(fast, slow):
        assert (w1 == w2).all() and (a1 == a2).all() and (r1 == r2).all()


NULLS = {
    "normal, 1 comparison": ([Rung([0.0], sd=SD)], None),
    "normal, 3 in a rung": ([Rung([0.0] * 3, sd=SD)], None),
    "normal, 9 over 3 rungs": ([Rung([0.0] * 3, sd=SD)] * 3, None),
    "at the margin, 3": ([Rung([0.02, -0.02, 0.02], sd=SD)], 0.02),
    "10% failed runs, 3": ([Rung([0.0] * 3, sd=SD, missing=0.1)], None),
    "t3 noise, 3": ([Rung([0.0] * 3, sd=SD, tails="t3")], None),
    "spikes q=0.1": ([Rung([0.0], sd=SD, spikes={1: 0.1}, prone=True)], 0.02),
    "spikes q=0.2": ([Rung([0.0], sd=SD, spikes={1: 0.2}, prone=True)], 0.02),
    "spikes q=0.33": ([Rung([0.0], sd=SD, spikes={1: 0.33}, prone=True)], 0.02),
    "spikes q=0.2, a family of 6": ([Rung([0.0] * 3, sd=SD, spikes={1: 0.2}, prone=True)] * 2, 0.02),
    "normal, 3, 8 df borrowed": ([Rung([0.0] * 3, sd=SD, borrowed_df=8)], None),
}


@pytest.mark.parametrize("name", list(NULLS))
def test_the_family_s_error_holds_under_the_nulls_the_runs_show(name):
    """At most 5% (plus 3 Monte Carlo standard errors) false claims in a family, over 20,000 families: normal
    noise; a difference exactly at the margin (a false equivalence); failed runs; heavy tails; an arm whose runs
    spike 0.1-0.3 with probability q, its bulk better by 0.2 q so that the means are equal, and whose tuning
    failed near its rate (as the shipped arms at the edge of stability did)."""
    rungs, margin = NULLS[name]
    s = scenario(rungs, margin)
    assert s.any_false <= 0.05 + 3 * s.se, (name, s.any_false, s.se)


def test_without_its_trouble_rule_the_spiky_null_breaks_the_guarantee():
    """The same spiky arm read as the block model alone reads it (no spike seen as trouble, no allowance): the
    clean-looking bulk is called better far more often than 5%, as the union-bound design did (44% and 18%)."""
    for q in (0.1, 0.33):
        s = simulation.simulate([Rung([0.0], sd=SD, spikes={1: q}, prone=False)], LOOKS, margin=0.02,
                                families=4000, seed=2, spike=math.inf)
        assert s.any_false > 0.15, (q, s.any_false)


@pytest.mark.parametrize("k", [1, 3])
def test_power_against_the_fixed_design_of_the_same_maximum(k):
    """Δ / sd of a pair's difference = 1, 2, 3, for one comparison and for three in a rung: the sequential
    design's power against a single look at its maximum (12 pairs, the paired t at alpha / k, the fixed design the
    report's intervals are). With three arms in a rung the block model's df pay for the looks: never below; alone,
    the early looks cost power at Δ/sd = 1 (0.81 against 0.88, measured), for 70% of the runs."""
    from scipy.stats import nct
    from scipy.stats import t as tdist

    n = LOOKS[-1]
    for effect in (1.0, 2.0, 3.0):
        s = scenario([Rung([effect * SD * math.sqrt(2)] * k, sd=SD)])
        fixed = float(nct.sf(tdist.ppf(1 - 0.025 / k, n - 1), n - 1, effect * math.sqrt(n)))
        assert s.power >= fixed - (0.08 if k == 1 and effect == 1 else 0.005), (k, effect, s.power, fixed)
        assert s.runs < (k + 1) * n * (0.75 if effect >= 2 else 0.8), (k, effect, s.runs)


def test_a_rung_s_decisions_read_trouble():
    """A spike in an arm's runs: its comparison is read on its own variance, the spike in its mean; an arm whose
    tuning failed near its rate and that shows no trouble gets its interval widened on its side; the same arm
    can then be neither better nor equivalent on clean-looking runs."""
    crit = boundaries.critical_values(boundaries.Layout((3,), (3, 4, 5, 6)))
    base = {s: 2.0 + 0.001 * s for s in range(6)}
    calm = {s: 1.97 + 0.0012 * s for s in range(6)}
    spiky = {**calm, 4: 2.2}
    got = sequential.decide_rung({"b": base, "calm": calm, "spiky": spiky}, "b", ["calm", "spiky"],
                                 ["calm", "spiky"], 3, crit, margin=0.02, planned=[3, 4, 5, 6])
    assert got["calm"].word == "better" and got["calm"].comparison.test == "block"
    assert got["spiky"].comparison.test.startswith("paired (trouble: its own variance)")
    assert got["spiky"].word != "better"
    prone = sequential.decide_rung({"b": base, "calm": calm}, "b", ["calm"], ["calm"], 3, crit, margin=0.02,
                                   planned=[3, 4, 5, 6], prone={"calm": 0.3})
    c = prone["calm"].comparison
    assert "widened by" in c.test and c.high > got["calm"].comparison.high
    assert sequential.allowance(6, 0, 0.3, 0.0125) == pytest.approx((1 - 0.0125 ** (1 / 6)) * 0.3)



def test_the_borrowed_variance_is_the_tuning_runs_block_residual():
    """``borrow_variance``: an arm's tuning runs within a grid step of its rate, rates as treatments and tuning
    seeds as blocks (a seed's own effect is not noise: the comparison's model removes it too); a spiked run is
    left out. Three rates on two seeds, one spike: 1 df."""
    from modforge.studies import lrfit, rounds
    from modforge.studies.design import design_of

    seed_effect = {0: 0.0, 1: 0.05}  # shared by a seed's runs at every rate
    points = []
    for x, base in ((-11, 2.30), (-10, 2.20), (-9, 2.15), (-8, 2.20), (-7, 2.32)):
        for s_ in (0, 1):
            spiked = (x, s_) == (-10, 1)
            points.append((x, base + seed_effect[s_] + 0.001 * s_ * (x % 3) + 0.3 * spiked,
                           "spike" if spiked else "ok"))
    v = lrfit.Valley(points, -9, True)
    v.x = -9.0
    table = lrfit.near_runs(v)
    assert len(table) == 3 and sum(math.isnan(y) for row in table for y in row) == 1, table  # the spike
    d = design_of("x", [], {"question": "q?", "baseline": "norm=layer", "compare": ["norm=rms"],
                            "borrow_variance": True, "tune": {"params": {"optim.lr": [1e-3, 2e-3, 4e-3]}}})
    ss, df = rounds.borrowed_variance(d, {("norm=layer", ""): lrfit.Choice({"optim.lr": 2 ** -9}, v, {})},
                                      ["norm=layer"], "")
    assert df == 1 and ss / df < 1e-4
    v.x = -8.6  # a chosen rate between the grid's: the nearest tested rate and its neighbours, both sides
    assert [len(row) for row in lrfit.near_runs(v)] == [2, 2, 2]  # the seeds' 0.05 apart is their block effect, not noise

if __name__ == "__main__":  # the tables docs/studies.md quotes: python tests/test_sequential.py
    from scipy.stats import nct
    from scipy.stats import t as tdist

    print("| null | false claims in a family (20,000 families) | comparison runs, mean |\n|---|---|---|")
    for name, (rungs, margin) in NULLS.items():
        s = scenario(rungs, margin)
        print(f"| {name} | {s.any_false:.4f} ± {s.se:.4f} | {s.runs:.1f} |")
    print("\n| comparisons | Δ / sd of a pair | power | runs, mean | fixed design at 12: power | runs |\n|---|---|---|---|---|---|")
    for k in (1, 3):
        for effect in (0.0, 1.0, 2.0, 3.0):
            s = scenario([Rung([effect * SD * math.sqrt(2)] * k, sd=SD)])
            fixed = float(nct.sf(tdist.ppf(1 - 0.025 / k, 11), 11, effect * math.sqrt(12))) if effect else math.nan
            print(f"| {k} | {effect:g} | {s.power if effect else math.nan:.3f} | {s.runs:.1f} | "
                  f"{fixed:.3f} | {12 * (k + 1)} |")


def test_a_comparison_with_trouble_gets_its_robust_check_and_only_it():
    """The report's robust reading (modforge.studies.robust): the Hodges-Lehmann estimate of the paired
    differences with the signed-rank interval, for comparisons where an arm had trouble; it says when the two
    readings tell different stories."""
    from modforge.studies import robust

    base = {s: 2.0 + 0.01 * s for s in range(1, 10)}
    spiky = {s: v - 0.02 + (0.4 if s == 3 else 0.0) + 0.002 * (s % 2) for s, v in base.items()}
    r = robust.check(spiky, base, 0.95)
    assert r["pairs"] == 9 and r["estimate"] == pytest.approx(-0.019, abs=0.002) and r["low"] < 0 < r["high"]
    mean = sum(spiky[s] - base[s] for s in base) / 9
    assert mean > 0.02  # the spike turned the mean's sign; the robust estimate kept it
    clean = {"arm": "a", "rung": None, "verdict": "better", "estimate": -0.02, "low": -0.03, "high": -0.01,
             "robust": None}
    worse = {"arm": "b", "rung": None, "verdict": "worse", "estimate": mean, "low": 0.001, "high": 0.09,
             "trouble": [1, 9], "trouble_base": [0, 9], "robust": r}
    lines = robust.section({"verdicts": [clean, worse], "margin": 0.02})
    table = [x for x in "\n".join(lines).splitlines() if x.startswith("| — | b |")]
    assert len(table) == 1 and "no: it does not exclude 0 on the verdict's side" in table[0]
    assert "| — | a |" not in "\n".join(lines)
    assert robust.section({"verdicts": [clean], "margin": 0.02}) == []
    below = {"estimate": -0.02, "low": -0.03, "high": -0.01, "coverage": 0.96, "pairs": 9}
    assert robust.agrees({**worse, "verdict": "better", "low": -0.05, "high": -0.01, "robust": below}, 0.02) == "yes"
    assert robust.agrees({**worse, "verdict": "inconclusive", "robust": below}, 0.02) == "no: it excludes 0"


def test_futility_waits_for_a_variance_with_degrees_of_freedom():
    """ladder_ffn's top rung: four arms, 2 seeds each, the first look. The rung's variance then has 3 df; one
    noisy pair made it large, and futility stopped two comparisons whose spread would have resolved +-0.02 by 12
    pairs. Futility now waits for MIN_FUTILITY_DF; with that many df (borrowed here) the same runs stop."""
    looks = list(range(2, 13))
    crit = boundaries.critical_values(boundaries.Layout((4,), tuple(looks)))
    values = {"b": {0: 1.50, 1: 1.62}, "a1": {0: 1.55, 1: 1.57}, "a2": {0: 1.49, 1: 1.63},
              "a3": {0: 1.56, 1: 1.56}}
    arms = ["a1", "a2", "a3"]
    got = sequential.decide_rung(values, "b", arms, arms, 0, crit, margin=0.02, planned=looks)
    assert not any(d.futile for d in got.values()) and {d.word for d in got.values()} == {"open"}
    crit_b = boundaries.critical_values(boundaries.Layout((4,), tuple(looks), borrowed=(9,)))
    ss = 9 * 0.0045  # 9 borrowed df of the same large variance: the rule now has its df and reads it
    borrowed = sequential.decide_rung(values, "b", arms, arms, 0, crit_b, margin=0.02, planned=looks,
                                      borrowed=(ss, 9))
    assert any(d.futile for d in borrowed.values())
