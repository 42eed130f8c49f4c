"""The verdict's statistics (modforge.results.stats) against independent computations: closed forms by hand,
exhaustive enumeration, and simulations of a few thousand synthetic experiments with a known truth."""
import math
from pathlib import Path

import numpy as np
import pytest

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
