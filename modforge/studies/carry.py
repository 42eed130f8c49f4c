"""Learning rates carried up a ladder (``study.carry``; issue 49, item 5): tune fully on the lower rungs, fit
each arm's optimal rate as a power law in compute, and at the upper rungs only check the predicted rate.

* **The law**: log2 lr*(C) = a + b log2 C per arm, by weighted least squares through the fitted optima of the
  tuned rungs (:mod:`modforge.studies.lrfit`: each with its interval over re-tunings, whose half-width / 1.96 is
  its sd). Where the optima scatter more than their own sds say, the excess variance (a moment estimate) is
  added to every point (the law is then not trusted beyond its scatter). DeepSeek LLM (2024) fits the optimal
  rate as a power law of compute this way and carries it up; a width rule (µP, ``transfer``) is the other way.
* **The check**: at each upper rung the arm runs the predicted rate and its neighbours at ``check`` (log2
  offsets, default -1, 0, +1: half and double) on the tuning seeds. The prediction is **accepted** when the
  predicted rate's mean is within ``tol`` (the fit rule's basin tolerance) of the best of the check and none of
  its runs failed: it lies inside the basin, and it is the rate compared (not the check's own argmin, which is a
  noisier pick). Otherwise it is **flagged**: the best of the check is compared instead, marked at the check's
  edge when it is there (the rung's optimum may lie beyond it; tune that rung).
* **What it saves**: an upper rung runs len(check) rates instead of the grid's, and upper rungs cost the most.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from modforge.studies import tuning

CHECK = (-1.0, 0.0, 1.0)


@dataclass
class Law:
    """log2 lr* = a + b log2 C, with the covariance of (a, b) and the points it was fitted on."""

    a: float
    b: float
    cov: list  # 2x2
    points: list = field(default_factory=list)  # [(log2 C, log2 lr*, sd)]
    extra_sd: float = 0.0

    def predict(self, c: float) -> tuple:
        """(log2 lr*, its sd) at compute ``c``: the sd of where that rung's optimum lies, the law's own uncertainty
        and the optima's excess scatter about it."""
        z = math.log2(c)
        var = self.cov[0][0] + 2 * z * self.cov[0][1] + z * z * self.cov[1][1] + self.extra_sd ** 2
        return self.a + self.b * z, math.sqrt(max(var, 0.0))


def fit_law(points: list) -> Optional[Law]:
    """The weighted power law through ``points`` [(compute, log2 lr*, sd)]; None for fewer than 2 distinct
    computes."""
    import numpy as np

    pts = [(math.log2(c), x, s) for c, x, s in points if c > 0 and math.isfinite(x)]
    if len({p[0] for p in pts}) < 2:
        return None
    z = np.array([p[0] for p in pts])
    x = np.array([p[1] for p in pts])
    sd = np.array([p[2] if math.isfinite(p[2]) and p[2] > 0 else 0.1 for p in pts])
    design = np.stack([np.ones_like(z), z], axis=1)

    def solve(var):
        w = 1.0 / var
        xtwx = design.T @ (design * w[:, None])
        cov = np.linalg.inv(xtwx)
        beta = cov @ (design.T @ (w * x))
        return beta, cov, float((w * (x - design @ beta) ** 2).sum())

    extra = 0.0
    beta, cov, chi2 = solve(sd ** 2)
    dof = len(pts) - 2
    if dof > 0 and chi2 > dof:  # more scatter than the optima's own sds: a common excess variance
        lo, hi = 0.0, float(np.var(x)) + 1.0
        while solve(sd ** 2 + hi)[2] > dof:  # a bracket that holds the root
            hi *= 2
        for _ in range(60):  # the excess at which the weighted residuals match their df (Paule and Mandel 1982)
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if solve(sd ** 2 + mid)[2] > dof else (lo, mid)
        extra = hi
        beta, cov, _ = solve(sd ** 2 + extra)
    return Law(float(beta[0]), float(beta[1]), cov.tolist(), [(float(a), float(b), float(c)) for a, b, c in
                                                               zip(z, x, sd)], math.sqrt(extra))


def check_rates(x_pred: float, offsets=CHECK) -> list:
    """The rates an upper rung runs: 2^(predicted + offset), four significant digits."""
    return [float(f"{2 ** (x_pred + o):.4g}") for o in offsets]


def judge(results: dict, predicted: float, tol: float, better: str = "min") -> dict:
    """The check at one upper rung. ``results``: {rate: [values over tuning seeds]} (NaN: a failed run);
    ``predicted``: the predicted rate (one of them). -> {"accepted", "rate" (the one compared), "gap" (the
    predicted rate's mean minus the best), "edge" (None | "low" | "high": the best at the check's end, not
    accepted), "why"}."""
    rates = sorted(results)
    scored = {r: tuning.score(results[r], better) for r in rates}  # a failed run: the worst
    pred = min(rates, key=lambda r: abs(math.log2(r) - math.log2(predicted)))
    best = min(rates, key=lambda r: (scored[r], abs(math.log2(r) - math.log2(pred))))
    gap = scored[pred] - scored[best]
    if not math.isfinite(scored[best]):
        return {"accepted": False, "rate": None, "gap": math.nan, "edge": None,
                "why": "every run of the check failed: no stable rate near the prediction"}
    if math.isfinite(scored[pred]) and gap <= tol:
        return {"accepted": True, "rate": pred, "gap": gap, "edge": None,
                "why": f"within {tol:g} of the best of the check: inside the basin"}
    edge = "low" if best == rates[0] else "high" if best == rates[-1] else None
    why = ("a run at the predicted rate failed" if not math.isfinite(scored[pred]) else
           f"{gap:.3g} worse than the best of the check (more than {tol:g}): outside the basin")
    if edge:
        why += f"; the best is at the check's {edge} end, so the optimum may lie beyond it: tune this rung"
    return {"accepted": False, "rate": best, "gap": gap, "edge": edge, "why": why}
