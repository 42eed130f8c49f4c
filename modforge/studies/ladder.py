"""A ladder of sizes: each arm's final metric against its training compute, fitted as a power law, and whether the
arms' ranking changes with size.

* **The fit**: L(C) = E + A * C^(-alpha) (Kaplan et al. 2020; Hoffmann et al. 2022 fit the same form in N and D),
  by least squares (``scipy.optimize.curve_fit``) on the mean over seeds at each rung, with C the runs' counted
  training FLOPs. E is kept in [0, min L) and alpha in (0, 5]. Three rungs determine three parameters exactly,
  so the fit's own residuals say nothing: its uncertainty is the **bootstrap over seeds** (seed numbers
  resampled with replacement, the same draw for every arm and rung, so the arms' gaps stay paired), percentile
  intervals.
* **The gap** between an arm and the baseline at the largest rung is the comparison's verdict there (paired t,
  :mod:`modforge.studies.sequential`); at a declared target compute it is the difference of the two fits there,
  with its bootstrap interval: an extrapolation, and said to be one when the target is past the largest rung.
* **Ranking**: the arms ordered by their mean at each rung; every pair whose order differs between two rungs is
  a change of ranking, marked *decided* when the verdicts against the baseline at those rungs say so in opposite
  directions (better at one, worse at the other).
"""
import math
import random
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Fit:
    E: float
    A: float
    alpha: float
    c_ref: float  # C is fitted as C / c_ref, for the numbers' sake: A is in those units
    intervals: dict = field(default_factory=dict)  # "E" / "alpha" -> (low, high) over the bootstrap
    draws: int = 0  # bootstrap draws whose fit converged

    def __call__(self, c: float) -> float:
        return self.E + self.A * (c / self.c_ref) ** (-self.alpha)


def fit_power(compute: list[float], loss: list[float]) -> Optional[Fit]:
    """L = E + A (C / c_ref)^-alpha through the points, or None when it cannot be fitted (fewer than 3 rungs, a
    non-finite point, or no convergence)."""
    pts = [(c, l) for c, l in zip(compute, loss) if math.isfinite(c) and math.isfinite(l) and c > 0]
    if len(pts) < 3 or len({c for c, _ in pts}) < 3:
        return None
    import numpy as np
    from scipy.optimize import curve_fit

    c = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    c_ref = float(c.min())
    x = np.log(c / c_ref)

    def f(x, E, a, alpha):
        return E + np.exp(a - alpha * x)

    lo = float(y.min())
    p0 = [max(0.0, 0.5 * lo), math.log(max(float(y.max()) - 0.5 * lo, 1e-6)), 0.3]
    import warnings

    from scipy.optimize import OptimizeWarning

    try:
        with warnings.catch_warnings():  # three rungs fit three parameters exactly: no covariance, by design
            warnings.simplefilter("ignore", OptimizeWarning)
            (E, a, alpha), _ = curve_fit(f, x, y, p0=p0, bounds=([0.0, -50.0, 1e-4], [max(lo, 1e-9), 50.0, 5.0]),
                                         maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (E, a, alpha)):
        return None
    return Fit(float(E), float(math.exp(a)), float(alpha), c_ref)


def shared_seeds(values: dict) -> dict:
    """{arm: {rung: {seed: value}}} restricted, at each rung, to the seeds every arm finished there: the ladder's
    means, fits and gaps are then paired, as the comparisons are (arms decided early have fewer seeds)."""
    rungs = {r for by_rung in values.values() for r in by_rung}
    common = {r: set.intersection(*({s for s, v in by_rung.get(r, {}).items() if math.isfinite(v)}
                                    for by_rung in values.values())) for r in rungs}
    return {arm: {r: {s: v for s, v in by_seed.items() if s in common[r]} for r, by_seed in by_rung.items()}
            for arm, by_rung in values.items()}


def rung_means(values: dict, seeds: Optional[list] = None) -> dict:
    """{rung: mean} of {rung: {seed: value}}, over ``seeds`` (with repeats: a bootstrap draw) or every seed."""
    out = {}
    for rung, by_seed in values.items():
        xs = [by_seed[s] for s in (seeds if seeds is not None else by_seed) if s in by_seed and math.isfinite(by_seed[s])]
        out[rung] = sum(xs) / len(xs) if xs else math.nan
    return out


def fit_arms(values: dict, compute: dict, level: float = 0.95, draws: int = 1000, target: Optional[float] = None,
             baseline: Optional[str] = None, seed: int = 0) -> dict:
    """Per arm, its fit with bootstrap intervals; with ``target`` and ``baseline``, each arm's fitted gap to the
    baseline at ``target`` with its interval. ``values``: {arm: {rung: {seed: metric}}}; ``compute``: {arm:
    {rung: training FLOPs}}. -> {"fits": {arm: Fit | None}, "gaps": {arm: (gap, low, high, draws)}}."""
    rungs = {arm: sorted(by_rung, key=lambda r: compute[arm][r]) for arm, by_rung in values.items()}
    fits = {}
    for arm, by_rung in values.items():
        means = rung_means(by_rung)
        fits[arm] = fit_power([compute[arm][r] for r in rungs[arm]], [means[r] for r in rungs[arm]])
    all_seeds = sorted({s for by_rung in values.values() for v in by_rung.values() for s in v})
    rng = random.Random(seed)
    boot: dict = {arm: [] for arm in values}
    gaps: dict = {arm: [] for arm in values}
    for _ in range(draws if all_seeds else 0):
        sample = [rng.choice(all_seeds) for _ in all_seeds]
        drawn = {}
        for arm, by_rung in values.items():
            means = rung_means(by_rung, sample)
            drawn[arm] = fit_power([compute[arm][r] for r in rungs[arm]], [means[r] for r in rungs[arm]])
            if drawn[arm] is not None:
                boot[arm].append(drawn[arm])
        if target is not None and baseline in drawn and drawn[baseline] is not None:
            for arm, fit in drawn.items():
                if fit is not None and arm != baseline:
                    gaps[arm].append(fit(target) - drawn[baseline](target))
    q = (1 - level) / 2
    for arm, fit in fits.items():
        if fit is not None and boot[arm]:
            fit.draws = len(boot[arm])
            fit.intervals = {"E": percentile([b.E for b in boot[arm]], q), "alpha": percentile([b.alpha for b in boot[arm]], q)}
    out_gaps = {}
    if target is not None and baseline in fits and fits[baseline] is not None:
        for arm, fit in fits.items():
            if arm != baseline and fit is not None:
                lo, hi = percentile(gaps[arm], q) if gaps[arm] else (math.nan, math.nan)
                out_gaps[arm] = (fit(target) - fits[baseline](target), lo, hi, len(gaps[arm]))
    return {"fits": fits, "gaps": out_gaps}


def percentile(xs: list[float], q: float) -> tuple:
    s = sorted(xs)
    if not s:
        return (math.nan, math.nan)

    def at(p: float) -> float:
        i = p * (len(s) - 1)
        lo, hi = math.floor(i), math.ceil(i)
        return s[lo] + (s[hi] - s[lo]) * (i - lo)

    return (at(q), at(1 - q))


def rankings(means: dict, better: str = "min") -> dict:
    """{rung: [arms, best first]} from {rung: {arm: mean}}."""
    sign = 1 if better == "min" else -1
    return {rung: [a for a, m in sorted(((a, m) for a, m in by_arm.items() if math.isfinite(m)),
                                        key=lambda kv: (sign * kv[1], kv[0]))]
            for rung, by_arm in means.items()}


def flips(means: dict, rung_order: list, verdicts: Optional[dict] = None, baseline: Optional[str] = None,
          better: str = "min") -> list[dict]:
    """Every pair of arms whose order changes between two rungs: {"pair", "from", "to", "decided"}.
    ``verdicts``: {(arm, rung): word} against ``baseline``: a flip of an arm against the baseline is decided when
    the words at the two rungs are better and worse."""
    arms = sorted({a for by_arm in means.values() for a in by_arm})
    out = []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            signs = [(r, math.copysign(1, means[r][a] - means[r][b])) for r in rung_order
                     if a in means[r] and b in means[r] and math.isfinite(means[r][a] - means[r][b])
                     and means[r][a] != means[r][b]]
            for (r1, s1), (r2, s2) in zip(signs, signs[1:]):
                if s1 != s2:
                    decided = False
                    if verdicts is not None and baseline in (a, b):
                        other = b if a == baseline else a
                        words = {verdicts.get((other, r1)), verdicts.get((other, r2))}
                        decided = words == {"better", "worse"}
                    out.append({"pair": (a, b), "from": r1, "to": r2, "decided": decided,
                                "ahead_at_from": a if (s1 < 0) == (better == "min") else b})
    return out
