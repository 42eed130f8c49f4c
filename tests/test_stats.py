"""The verdict's statistics (modforge.results.stats) against independent computations: closed forms by hand,
exhaustive enumeration, and simulations of a few thousand synthetic experiments with a known truth."""
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as ss

from modforge.results import stats
from modforge.results.jobs import Job
from modforge.results.tables import summarise

LEVEL = 0.95


def verdict_word(x: dict, y: dict, family: int = 1, margin=None) -> str:
    return stats.verdict(stats.compare(x, y, LEVEL, family), "min", margin)[0]


def as_arm(values) -> dict:
    return {(str(i),): float(v) for i, v in enumerate(values)}


def test_the_family_wise_error_stays_under_the_level_when_nothing_differs():
    """3 arms against a baseline, 5 seeds, a shared seed effect (what pairing cancels), no true difference:
    the chance that any of the 3 verdicts says better or worse is at most 5% (Bonferroni: about 5% or less)."""
    rng = np.random.default_rng(0)
    runs, errors = 800, 0
    for _ in range(runs):
        seed_effect = rng.normal(0, 1.0, 5)
        base = as_arm(seed_effect + rng.normal(0, 0.1, 5))
        words = [verdict_word(as_arm(seed_effect + rng.normal(0, 0.1, 5)), base, family=3) for _ in range(3)]
        errors += any(w in ("better", "worse") for w in words)
    assert errors / runs <= LEVEL and errors / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_the_block_models_family_holds_its_level_with_runs_missing_at_random():
    """The fixed design a sweep's report reads against one baseline (modforge.results.blocks: every arm in one
    block model, Dunnett's critical value at the model's df): 4 arms, 6 seeds, a seed effect, 15% of the compared
    arms' runs missing, nothing differs; 20,000 families. Missing runs move the contrasts' correlation off 1/2,
    yet the family's error stays at 5% (3 Monte Carlo standard errors either side; Bonferroni's bound spends
    about 4.6% here)."""
    from modforge.results import blocks

    rng = np.random.default_rng(11)
    families, arms, seeds = 20_000, 4, 6
    y = rng.normal(0, 1.0, (families, 1, seeds)) + rng.normal(0, 0.1, (families, arms, seeds))
    keep = rng.random((families, arms, seeds)) >= 0.15
    keep[:, 0, :] = True
    est, factor, s2, df, _ = blocks.block_fit(y, keep)
    crit = np.array([blocks.dunnett_critical(arms - 1, float(d)) for d in df])
    t = np.abs(est) / np.sqrt(s2[:, None] * factor)
    rate = float(np.mean((t > crit[:, None]).any(axis=1)))
    se = math.sqrt(0.05 * 0.95 / families)
    assert 0.05 - 3 * se <= rate <= 0.05 + 3 * se, rate


def test_with_the_best_chosen_by_the_data_the_error_rate_still_holds():
    """baseline=best: the winner is picked from the data, then compared with the rest (all 6 pairs of 4 arms are
    the family). Seeds are missing at random (partial pairing: each comparison uses the seeds both finished)."""
    rng = np.random.default_rng(1)
    runs, errors = 400, 0
    for _ in range(runs):
        seed_effect = rng.normal(0, 1.0, 6)
        jobs = []
        for arm in "abcd":
            for s in range(6):
                if rng.random() < 0.15:  # a run that did not finish
                    continue
                v = float(seed_effect[s] + rng.normal(0, 0.1))
                jobs.append(Job(Path(arm), f"{arm}{s}", {"arm": arm, "seed": str(s)}, "finished",
                                metrics={"val": {"val/loss": v}}))
        t = summarise(jobs, "val/loss", ("seed",), ["arm"], info={"low": 0.0 - 1e9, "high": 1e9, "better": "min"})
        words = [stats.verdict(r.diff, "min")[0] for r in t.rows if r.diff is not None]
        errors += any(w in ("better", "worse") for w in words)
    assert errors / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)


def test_equivalence_at_the_margin_is_claimed_at_most_at_the_level():
    """A true difference exactly at the margin: "equivalent" would be wrong; it may be said at most 5% of the
    time (each one-sided test is at 2.5% here, so about 2.5%). Well inside the margin it is found."""
    rng = np.random.default_rng(2)
    m, sd, n, runs = 0.05, 0.04, 8, 2000
    base = as_arm(np.zeros(n))
    wrong = sum(verdict_word(as_arm(m + rng.normal(0, sd, n)), base, margin=m) == "equivalent" for _ in range(runs))
    assert wrong / runs <= 0.05
    found = sum(verdict_word(as_arm(rng.normal(0, sd / 4, n)), base, margin=m) == "equivalent" for _ in range(200))
    assert found / 200 > 0.9


def test_the_minimum_detectable_effect_is_found_with_80_percent_power():
    """A true difference equal to the MDE computed for the true spread is detected in ~80% of experiments."""
    rng = np.random.default_rng(3)
    n, sd, runs = 5, 0.02, 3000
    alpha = (1 - LEVEL) / 3  # one of a family of 3
    mde = stats.minimum_detectable(sd / math.sqrt(n), n - 1, alpha)
    # the textbook approximation (z quantiles) is smaller than the exact t-based MDE at n = 5
    from statistics import NormalDist
    z = NormalDist().inv_cdf
    assert mde > (z(1 - alpha / 2) + z(0.8)) * sd / math.sqrt(n)
    base = as_arm(np.zeros(n))
    hits = sum(verdict_word(as_arm(-mde + rng.normal(0, sd, n)), base, family=3) == "better" for _ in range(runs))
    assert abs(hits / runs - 0.8) < 3 * math.sqrt(0.16 / runs)


def test_no_verdict_from_two_pairs_or_from_differences_without_spread():
    assert verdict_word({"1": 2.0, "2": 2.1}, {"1": 2.1, "2": 2.2}) == "undecided"  # was "better (p=0)"
    same = stats.compare({"1": 2.0, "2": 2.1, "3": 2.3}, {"1": 2.1, "2": 2.2, "3": 2.4})
    assert not same.decided and "differences equal" in same.why and math.isnan(same.p)
    welch = stats.compare({"1": 1.0, "2": 1.0, "3": 1.0}, {"4": 2.0, "5": 2.0, "6": 2.0}, paired=False)
    assert not welch.decided and math.isnan(welch.df)  # no df = inf, p = 0


def wilson_by_hand(k: int, n: int, level: float) -> tuple:
    from statistics import NormalDist
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 5), (5, 5), (1, 3), (0, 1), (7, 10)])
def test_rates_get_wilson_intervals_inside_0_1(k, n):
    lo, hi = stats.wilson(k, n, LEVEL)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert (lo, hi) == pytest.approx(wilson_by_hand(k, n, LEVEL), abs=1e-12)


def test_bounded_means_stay_inside_their_range():
    five_of_five = stats.mean_interval([1.0] * 5, LEVEL, 0.0, 1.0)  # was [1.0, 1.0]
    assert five_of_five.kind == "wilson" and five_of_five.high == 1.0 and five_of_five.low < 0.6
    wide = stats.mean_interval([0.6, 0.9, 1.0, 1.0, 0.95, 0.4], LEVEL, 0.0, 1.0)  # Student's t would pass 1
    assert wide.kind == "logit-t" and 0.0 < wide.low < wide.estimate < wide.high <= 1.0
    for xs in ([1, 1, 1, 1, 0.95], [0.02, 0, 0, 0, 0], [0.99, 0.2, 0.98, 0.97, 0.99]):  # skewed, at a bound
        iv = stats.mean_interval(xs, LEVEL, 0.0, 1.0)
        assert 0.0 <= iv.low <= iv.estimate <= iv.high <= 1.0, (xs, iv)
    loss = stats.mean_interval([0.01, 0.5], LEVEL, 0.0, math.inf)  # Student's t would go below 0
    assert loss.kind == "log-t" and 0.0 < loss.low < loss.estimate < loss.high
    skewed = stats.mean_interval([0.5, 1e-4, 1e-4, 2e-4, 1e-4], LEVEL, 0.0, math.inf)  # log scale misses the mean
    assert 0.0 <= skewed.low <= skewed.estimate <= skewed.high
    plain = stats.mean_interval([2.0, 2.1, 2.05], LEVEL, 0.0, math.inf)
    assert plain.kind == "t"
    assert stats.mean_interval([0.7, 0.7, 0.7], LEVEL, 0.0, 1.0).why == "all 3 equal"


def fisher_by_hand(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided: the probability of every table with these margins no more likely than the one seen."""
    total, bad = n_a + n_b, a + b

    def prob(x: int) -> float:
        return math.comb(n_a, x) * math.comb(n_b, bad - x) / math.comb(total, bad)

    seen = prob(a)
    return sum(prob(x) for x in range(max(0, bad - n_b), min(bad, n_a) + 1) if prob(x) <= seen * (1 + 1e-7))


@pytest.mark.parametrize("cells", [(6, 6, 0, 6), (1, 5, 0, 5), (2, 6, 3, 6), (0, 3, 0, 3)])
def test_fishers_exact_test_by_enumeration(cells):
    assert stats.fisher(*cells) == pytest.approx(fisher_by_hand(*cells), rel=1e-9)


def test_dunnetts_critical_value_and_adjusted_p_agree_with_scipy_and_the_published_table():
    """Dunnett's two-sided critical values at 95% (Dunnett 1964's table, two decimals) and, on one-way data of
    equal groups (the same correlation 1/2; df = N - a), the adjusted p of scipy's ``dunnett``."""
    import numpy as np
    from modforge.results import blocks

    table = {(2, 10): 2.57, (3, 10): 2.76, (4, 10): 2.89, (5, 10): 2.99, (2, math.inf): 2.21, (3, math.inf): 2.35,
             (4, math.inf): 2.44, (5, math.inf): 2.51}
    for (k, df), c in table.items():
        assert round(blocks.dunnett_critical(k, df), 2) == c
    assert blocks.dunnett_critical(1, 7) == pytest.approx(ss.t.isf(0.025, 7), rel=1e-12)
    rng = np.random.default_rng(0)
    for a, n in ((3, 5), (4, 6), (5, 4)):
        groups = [rng.normal(size=n) + 0.6 * (i == 1) for i in range(a)]
        ref = ss.dunnett(*groups[1:], control=groups[0], random_state=1)
        s2 = sum(((g - g.mean()) ** 2).sum() for g in groups) / (a * n - a)
        mine = [blocks.dunnett_p((g.mean() - groups[0].mean()) / math.sqrt(2 * s2 / n), a - 1, a * n - a)
                for g in groups[1:]]
        assert mine == pytest.approx(list(ref.pvalue), abs=1e-3)


def test_the_robust_check_is_wilcoxons_interval_inverted_and_shrugs_off_a_spike():
    """Hodges-Lehmann with the signed-rank interval: just inside each end scipy's exact Wilcoxon test does not
    reject at 5%, just outside it does; too few pairs for the level give no interval; a spike moves the mean,
    not the estimate."""
    rng = np.random.default_rng(4)
    assert stats.signed_rank_counts(3) == [1, 1, 1, 2, 1, 1, 1]
    for n in (6, 8, 11):
        d = rng.normal(0.05, 0.03, n)
        est, lo, hi, coverage = stats.hodges_lehmann(d, 0.95)
        assert 0.95 <= coverage < 1 and lo < est < hi
        for theta, rejects in ((lo + 1e-9, False), (hi - 1e-9, False), (lo - 1e-9, True), (hi + 1e-9, True)):
            assert (ss.wilcoxon(d - theta, method="exact").pvalue <= 0.05) == rejects
    assert stats.hodges_lehmann([0.1, 0.2, 0.3, 0.4, 0.5], 0.95)[1:] == (-math.inf, math.inf, 1.0)  # p >= 1/16
    clean = rng.normal(0.0, 0.01, 9)
    spiked = clean.copy()
    spiked[0] += 0.3
    moved = stats.hodges_lehmann(spiked)[0] - stats.hodges_lehmann(clean)[0]
    assert abs(moved) < 0.01 < 0.3 / 9 == pytest.approx(np.mean(spiked) - np.mean(clean))


def test_a_baseline_the_data_chose_is_never_read_with_dunnetts_law():
    """baseline=best with a declared family: the comparisons are against the winner the data picked, so each is
    a paired t at Bonferroni's level; Dunnett's value is for a baseline fixed before the data."""
    rng = np.random.default_rng(2)
    jobs = [Job(Path(a), f"{a}{s}", {"arm": a, "seed": str(s)}, "finished",
                metrics={"val": {"val/loss": float(2 + 0.1 * i + rng.normal(0, 0.01))}})
            for i, a in enumerate("abc") for s in range(4)]
    info = {"low": -1e9, "high": 1e9, "better": "min"}
    best = summarise(jobs, "val/loss", ("seed",), ["arm"], baseline="best", compare=["arm=b", "arm=c"], info=info)
    fixed = summarise(jobs, "val/loss", ("seed",), ["arm"], baseline="arm=a", compare=["arm=b", "arm=c"], info=info)
    assert best.test == "paired" and fixed.test == "block"
