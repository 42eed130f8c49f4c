"""A ladder's arms fitted jointly: one data term and one exponent, an arm's own scale, and the gap as a compute
multiplier with an interval that holds its level at a few seeds (issue 49).

**The model.** At rung r an arm's mean metric (a loss: lower is better) is

    L_a(C) = E + A_a (C / C0)^(-alpha)

with C the runs' counted training FLOPs and C0 the smallest rung's. E (what no compute removes: a property of
the data) and alpha (how fast compute helps) are shared by every arm; each arm has its own A_a. Under this model
an arm's advantage is a constant **compute multiplier**: the baseline needs m_a = (A_base / A_a)^(1 / alpha)
times the compute to match the arm at any C (m > 1: the arm is better; Marin reports optimizer gains this way).
The alternative, an exponent per arm (a gap that grows or shrinks with scale, and rankings that can flip), is
fitted too and compared by an F test on the weighted residuals (the noise variance comes from the seeds, not
the fit); the report says which the data prefer, not which is assumed. A lack-of-fit F test says whether the
shared model passes through the rung means within their noise.

**The fit.** Weighted least squares on the rung means, each weighted by n / s^2: its seeds over the residual
variance of the block model of each rung's runs (:func:`modforge.results.blocks.block_fit`), pooled over the
rungs (one rung's variance from 3-6 seeds is too noisy to weigh by: its inverse is biased up by df / (df - 2)).
The means are over the seeds every arm run at that rung finished there (the caller's choice, :mod:`modforge.studies.
ladder`), so a rung's seed effects are shared by its arms' means, as the bootstrap draws them. For a fixed
alpha the model is linear in E and the A's, so they are solved in closed form (E kept in [0, min of the means])
and only alpha is searched: a grid on log alpha refined by a parabola (variable projection; Golub and Pereyra
2003). Vectorised over bootstrap draws.

**The intervals.** A parametric bootstrap that keeps the design: each draw re-simulates every run as the fitted
mean plus a seed effect shared by the rung's arms (common random numbers) plus noise, each rung's noise
variance itself drawn from its scaled inverse chi-square (s^2 df / chi2_df), so that a variance estimated from
3-6 seeds widens the interval as Student's t does; each draw keeps the runs that exist (missing runs stay
missing) and is refitted. Intervals are the draws' percentiles. A percentile bootstrap over seeds (what the
ladder used before) covered a mean 73% / 80% / 85% of the time at 3 / 4 / 6 seeds; this one's coverage is
measured on planted ladders in ``tests/test_scaling.py`` and quoted in docs/studies.md.

**The prediction check.** The top rung is held out: the lower rungs' fit predicts each arm's mean there and the
gap to the baseline; the prediction interval adds the top rung's own measurement noise to the fit's draws, so
"the ladder predicted it" means the measured value lies inside it.

(Each rung's ranking and its agreement with the top rung's: :mod:`modforge.studies.ladder`.)
"""
import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

from modforge.results import blocks

ALPHA_RANGE = (0.01, 3.0)  # the exponents searched (per C / C0); a fit at either end is flagged
GRID = 240


@dataclass
class Ladder:
    """The data of a ladder: arms, rungs (smallest compute first), and per (arm, rung) the runs by seed and the
    training compute."""

    arms: list  # baseline first
    rungs: list
    values: dict  # {(arm, rung): {seed: value}} (NaN or absent: a run that failed)
    compute: dict  # {(arm, rung): FLOPs}

    @property
    def points(self) -> list:
        return [(a, r) for a in self.arms for r in self.rungs if self.finished(a, r)]

    def finished(self, a, r) -> list:
        return [v for v in (self.values.get((a, r)) or {}).values() if math.isfinite(v)]


@dataclass
class Noise:
    """Per rung: the residual variance of the block model of its runs and its df, and the variance of a seed's
    effect shared by the rung's arms (moment estimate, at least 0)."""

    s2: dict
    df: dict
    tau2: dict

    @property
    def pooled(self) -> float:
        """The residual variance pooled over the rungs (what the fit weighs by: one rung's, from 3-6 seeds, is
        too noisy to weigh by, its inverse biased up by df / (df - 2))."""
        have = [r for r in self.s2 if self.df[r] > 0 and math.isfinite(self.s2[r])]
        df = sum(self.df[r] for r in have)
        return sum(self.s2[r] * self.df[r] for r in have) / df if df else math.nan


@dataclass
class Fit:
    E: float
    alpha: float
    A: dict  # {arm: A}
    c0: float
    sse: float  # weighted residual sum of squares
    at_edge: bool = False  # alpha at an end of ALPHA_RANGE, or E at a bound

    def __call__(self, arm, c: float) -> float:
        return self.E + self.A[arm] * (c / self.c0) ** (-self.alpha)

    def multiplier(self, arm, base) -> float:
        """How many times the baseline's compute matches the arm's: (A_base / A_arm)^(1 / alpha)."""
        a, b = self.A.get(arm, math.nan), self.A.get(base, math.nan)
        if not (a > 0 and b > 0):
            return math.nan
        return (b / a) ** (1 / self.alpha)


def noise(ladder: Ladder) -> Noise:
    """Each rung's noise from the block model of its arms' runs (seed as block). A rung with no residual df
    borrows the pooled variance of the others."""
    import numpy as np

    s2, df, tau2 = {}, {}, {}
    for r in ladder.rungs:
        vals = {a: {s: v for s, v in (ladder.values.get((a, r)) or {}).items()} for a in ladder.arms}
        y, m, seeds = blocks.arrays(vals, ladder.arms)
        est, _, s2_, df_, _ = blocks.block_fit(y, m)
        s2[r], df[r] = float(s2_[0]), float(df_[0])
        # the seed effect: the variance of the seed means, each arm's effect (the block model's) taken out first so
        # that a seed missing an arm is not moved by that arm's level, beyond what the residual puts there
        effect = np.concatenate([[0.0], np.nan_to_num(est[0])])[:, None]
        adjusted = np.where(m[0], y[0] - effect, np.nan)
        means = [np.nanmean(adjusted[:, j]) for j in range(len(seeds)) if m[0][:, j].any()]
        per = np.mean(m[0].sum(axis=0)[m[0].any(axis=0)]) if m[0].any() else 1.0
        v = float(np.var(means, ddof=1)) if len(means) > 1 else 0.0
        tau2[r] = max(0.0, v - (s2[r] if math.isfinite(s2[r]) else 0.0) / per)
    out = Noise(s2, df, tau2)
    fill = out.pooled
    if math.isfinite(fill):
        for r in ladder.rungs:
            if not (df[r] > 0 and s2[r] > 0):
                s2[r], df[r] = fill, 0.0
    return out


def _design(ladder: Ladder, n: Noise, points: list):
    import numpy as np

    c0 = min(ladder.compute[p] for p in points)
    x = np.log(np.array([ladder.compute[p] for p in points]) / c0)
    arm_of = np.array([ladder.arms.index(a) for a, _ in points])
    w = np.array([len(ladder.finished(a, r)) for a, r in points]) / n.pooled
    return c0, x, arm_of, w


def fit_shared(y, x, arm_of, w, k: int, grid: int = GRID) -> tuple:
    """The shared-exponent model fitted to ``y`` (B, P): the rung means of B data sets at P points (log compute
    ``x``, arm index ``arm_of``, weights ``w``). -> (E, alpha, A, sse): (B,), (B,), (B, k), (B,)."""
    import numpy as np

    y = np.atleast_2d(y)
    alphas = np.exp(np.linspace(*np.log(ALPHA_RANGE), grid))
    onehot = np.eye(k)[arm_of]  # (P, k)
    ymin = y.min(axis=1)

    def solve(g):  # g: (1 or B, G, P), each exponent's factor at each point -> E, A, sse: (B, G), (B, G, k), (B, G)
        s_gg = (w * g * g) @ onehot
        s_g = (w * g) @ onehot
        s_yg = ((y * w)[:, None, :] * g) @ onehot
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_y = s_yg / s_gg  # A at E = 0
            ratio_1 = s_g / s_gg  # how A falls per unit of E
        u = y[:, None, :] - g * ratio_y[..., arm_of]
        v = 1.0 - g * ratio_1[..., arm_of]
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.clip((w * u * v).sum(axis=-1) / (w * v * v).sum(axis=-1), 0.0, ymin[:, None])
        r = u - e[..., None] * v
        return e, ratio_y - e[..., None] * ratio_1, (w * r * r).sum(axis=-1)

    e, a, sse = solve(np.exp(-np.multiply.outer(alphas, x))[None])  # every draw at every exponent of the grid
    best = np.nanargmin(sse, axis=1)
    j = np.clip(best, 1, grid - 2)
    b = np.arange(len(y))
    la = np.log(alphas)
    s0, s1, s2 = sse[b, j - 1], sse[b, j], sse[b, j + 1]
    curv = s0 - 2 * s1 + s2
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(curv > 0, 0.5 * (s0 - s2) / curv, 0.0)
    step = np.clip(np.nan_to_num(step), -1.0, 1.0)
    fine = np.exp(la[j] + step * (la[1] - la[0]))
    fine = np.where((best == 0) | (best == grid - 1), alphas[best], fine)
    # each draw at its own refined exponent, kept where it fits at least as well as the grid's best
    e2, a2, s2 = (v[:, 0] for v in solve(np.exp(-np.multiply.outer(fine, x))[:, None, :]))
    keep = s2 <= sse[b, best]
    return (np.where(keep, e2, e[b, best]), np.where(keep, fine, alphas[best]),
            np.where(keep[:, None], a2, a[b, best]), np.where(keep, s2, sse[b, best]))


def fit_separate(y, x, arm_of, w, k: int) -> tuple:
    """The alternative: an exponent per arm (shared E). -> (E, {arm index: (A, alpha)}, sse). E is searched on a
    grid over [0, min y] refined by a parabola; for each E each arm's (A, alpha) is a one-exponent fit (A in
    closed form, alpha on a grid refined by a parabola), so that the larger model never fits worse than the
    shared one for want of resolution."""
    import numpy as np

    alphas = np.exp(np.linspace(*np.log(ALPHA_RANGE), GRID))
    la = np.log(alphas)

    def arm_fit(e: float, i: int) -> tuple:
        sel = arm_of == i
        ww, yy = w[sel], y[sel] - e

        def sse_at(al):
            g = np.exp(-np.multiply.outer(np.atleast_1d(al), x[sel]))
            a = (ww * yy * g).sum(axis=1) / (ww * g * g).sum(axis=1)
            return a, (ww * (yy - a[:, None] * g) ** 2).sum(axis=1)

        a, sse = sse_at(alphas)
        j = int(np.argmin(sse))
        best = (float(sse[j]), float(a[j]), float(alphas[j]))
        if 0 < j < GRID - 1:
            c = sse[j - 1] - 2 * sse[j] + sse[j + 1]
            if c > 0:
                al = math.exp(la[j] + 0.5 * (sse[j - 1] - sse[j + 1]) / c * (la[1] - la[0]))
                a2, s2 = sse_at(al)
                if s2[0] < best[0]:
                    best = (float(s2[0]), float(a2[0]), al)
        return best

    def total(e: float) -> tuple:
        per = {i: arm_fit(e, i) for i in range(k)}
        return sum(v[0] for v in per.values()), {i: (v[1], v[2]) for i, v in per.items()}

    es = np.linspace(0.0, float(np.min(y)) * (1 - 1e-9), 121)
    sses = [total(float(e))[0] for e in es]
    j = int(np.argmin(sses))
    e_best = float(es[j])
    if 0 < j < len(es) - 1:
        c = sses[j - 1] - 2 * sses[j] + sses[j + 1]
        if c > 0:
            e_try = float(es[j] + 0.5 * (sses[j - 1] - sses[j + 1]) / c * (es[1] - es[0]))
            if total(e_try)[0] < sses[j]:
                e_best = e_try
    sse, per = total(e_best)
    return e_best, per, sse


@dataclass
class Joint:
    """The ladder's joint fit and what it says."""

    fit: Optional[Fit]
    multipliers: dict = field(default_factory=dict)  # {arm: (m, low, high)}
    alternative: dict = field(default_factory=dict)  # the per-arm exponents: {"alpha": {arm: a}, "p": F test}
    lack_of_fit: dict = field(default_factory=dict)  # {"sse", "dof", "p"}
    held_out: dict = field(default_factory=dict)  # the top rung predicted from the others
    target: dict = field(default_factory=dict)  # {arm: (gap, low, high, word)} at target compute
    draws: int = 0
    noise_df: float = 0.0
    why: str = ""  # why there is no fit


def simulate_means(ladder: Ladder, n: Noise, points: list, mean_of, draws: int, rng,
                   draw_variance: bool = True) -> "np.ndarray":
    """``draws`` re-simulations of the rung means at ``points`` (each with its own seeds, missing runs kept
    missing): fitted mean + a seed effect shared by the rung's arms + noise, each rung's noise variance drawn from
    its scaled inverse chi-square (``draw_variance``; else the estimate itself)."""
    import numpy as np

    out = np.empty((draws, len(points)))
    for r in ladder.rungs:
        idx = [i for i, (a, rr) in enumerate(points) if rr == r]
        if not idx:
            continue
        seeds = sorted({s for i in idx for s, v in ladder.values[points[i]].items() if math.isfinite(v)})
        df = n.df[r]
        s2 = n.s2[r] * (df / rng.chisquare(df, draws) if df > 0 and draw_variance else np.ones(draws))
        eff = rng.normal(0.0, math.sqrt(n.tau2[r]), (draws, len(seeds)))
        for i in idx:
            have = [j for j, s in enumerate(seeds) if math.isfinite(ladder.values[points[i]].get(s, math.nan))]
            e = rng.standard_normal((draws, len(have))) * np.sqrt(s2)[:, None]
            out[:, i] = mean_of(points[i]) + (eff[:, have] + e).mean(axis=1)
    return out


def joint_fit(ladder: Ladder, level: float = 0.95, draws: int = 400, seed: int = 0,
              target: Optional[float] = None, hold_out: bool = True) -> Joint:
    """The joint fit of a ladder (see the module's text), its multipliers with intervals, the per-arm-exponent
    alternative and its test, the lack-of-fit test, the held-out top rung and, with ``target``, each arm's gap to
    the baseline there."""
    import numpy as np
    from scipy import stats as st

    points = ladder.points
    k = len(ladder.arms)
    if len({r for _, r in points}) < 3 or len(points) < k + 3:
        return Joint(None, why=f"{len({r for _, r in points})} rungs with finished runs: a ladder fit needs 3")
    n = noise(ladder)
    noise_df = sum(n.df.values())
    if not n.pooled > 0:
        return Joint(None, why="the runs have no spread within a rung to weigh the fit by (one seed, or identical runs)")
    c0, x, arm_of, w = _design(ladder, n, points)
    y = np.array([statistics.fmean(ladder.finished(*p)) for p in points])
    E, alpha, A, sse = (v[0] for v in fit_shared(y[None], x, arm_of, w, k))
    fit = Fit(float(E), float(alpha), {a: float(A[i]) for i, a in enumerate(ladder.arms)}, c0, float(sse))
    fit.at_edge = bool(alpha <= ALPHA_RANGE[0] * 1.0001 or alpha >= ALPHA_RANGE[1] * 0.9999 or E <= 0.0
                       or E >= y.min() - 1e-12)
    out = Joint(fit, draws=draws, noise_df=noise_df)
    rng = np.random.default_rng(seed)
    q = (1 - level) / 2
    fitted = {p: fit(p[0], ladder.compute[p]) for p in points}
    sims = simulate_means(ladder, n, points, fitted.get, draws, rng)
    bE, bA_alpha, bA, _ = fit_shared(sims, x, arm_of, w, k)
    base = ladder.arms[0]
    for i, a in enumerate(ladder.arms[1:], start=1):
        with np.errstate(divide="ignore", invalid="ignore"):
            logm = np.where((bA[:, i] > 0) & (bA[:, 0] > 0), np.log(bA[:, 0] / bA[:, i]) / bA_alpha, np.nan)
        ok = logm[np.isfinite(logm)]
        lo, hi = (float(np.exp(np.quantile(ok, q))), float(np.exp(np.quantile(ok, 1 - q)))) if len(ok) else (
            math.nan, math.nan)
        out.multipliers[a] = (fit.multiplier(a, base), lo, hi)
    # the alternative: an exponent per arm
    dof = len(points) - (k + 2)
    e_sep, per, sse_sep = fit_separate(y, x, arm_of, w, k)
    gain = max(0.0, fit.sse - sse_sep)
    dfn = k - 1
    p_alt = float(st.f.sf(gain / dfn, dfn, noise_df)) if dfn > 0 and noise_df > 0 else math.nan
    out.alternative = {"E": e_sep, "alpha": {ladder.arms[i]: v[1] for i, v in per.items()},
                       "A": {ladder.arms[i]: v[0] for i, v in per.items()}, "sse": sse_sep, "gain": gain,
                       "df": [dfn, noise_df], "p": p_alt, "preferred": bool(p_alt < 1 - level)}
    top_c = max(ladder.compute[p] for p in points)
    out.alternative["crossings"] = crossings(out.alternative, base, c0, top_c if target is None else
                                             max(top_c, target)) if out.alternative["preferred"] else {}
    if dof > 0 and noise_df > 0:
        # lack of fit: the weighted residual sum of squares against its law under the fitted model, by simulation
        # (seed effects shared within a rung make the means' errors correlated, so it is not an F); the pooled
        # variance in the weights is re-estimated in each draw as it was from the runs
        null = simulate_means(ladder, n, points, fitted.get, draws, rng, draw_variance=False)
        _, _, _, sse_null = fit_shared(null, x, arm_of, w, k)
        sse_null = sse_null * noise_df / rng.chisquare(noise_df, draws)
        out.lack_of_fit = {"sse": fit.sse, "dof": dof, "p": float((1 + np.sum(sse_null >= fit.sse)) / (1 + draws))}
    if hold_out:
        out.held_out = held_out(ladder, n, level, draws, seed + 1)
    if target is not None:
        gaps = {}
        for i, a in enumerate(ladder.arms[1:], start=1):
            t = (target / c0) ** (-bA_alpha)
            g = (bA[:, i] - bA[:, 0]) * t
            ok = g[np.isfinite(g)]
            lo, hi = (float(np.quantile(ok, q)), float(np.quantile(ok, 1 - q))) if len(ok) else (math.nan, math.nan)
            gap = fit(a, target) - fit(base, target)
            word = ("no interval at target" if not len(ok) else "inconclusive at target" if lo <= 0 <= hi
                    else ("better" if hi < 0 else "worse") + " at target")
            gaps[a] = (gap, lo, hi, word)
        out.target = gaps
    return out


def crossings(alt: dict, base, c0: float, c_max: float) -> dict:
    """Under the per-arm-exponent model, where each arm's curve crosses the baseline's between C0 and ``c_max``
    (a ranking that flips with scale): {arm: C}. With a shared E the difference A_a x^-a_a - A_b x^-a_b is zero at
    x = (A_a / A_b)^(1 / (a_a - a_b))."""
    out = {}
    ab, al_b = alt["A"][base], alt["alpha"][base]
    for arm, aa in alt["A"].items():
        al_a = alt["alpha"][arm]
        if arm == base or al_a == al_b or not (aa > 0 and ab > 0):
            continue
        log_x = math.log(aa / ab) / (al_a - al_b)  # in logs: nearly equal exponents put it far out
        if 0.0 < log_x <= math.log(c_max / c0):
            out[arm] = c0 * math.exp(log_x)
    return out


def held_out(ladder: Ladder, n: Noise, level: float, draws: int, seed: int) -> dict:
    """The top rung predicted from the rungs below it: per arm the predicted mean with a prediction interval (the
    lower fit's draws plus the top rung's own measurement noise) against the measured mean, and the same for each
    arm's gap to the baseline."""
    import numpy as np

    top = ladder.rungs[-1]
    lower = Ladder(ladder.arms, ladder.rungs[:-1], ladder.values, ladder.compute)
    points = lower.points
    k = len(ladder.arms)
    if len({r for _, r in points}) < 3 or len(points) < k + 3:
        return {"why": "fewer than 3 rungs below the top: nothing to predict it from"}
    nl = noise(lower)
    if not nl.pooled > 0:
        return {"why": "the rungs below the top have no spread within a rung to weigh a fit by"}
    c0, x, arm_of, w = _design(lower, nl, points)
    y = np.array([statistics.fmean(lower.finished(*p)) for p in points])
    E, alpha, A, _ = (v[0] for v in fit_shared(y[None], x, arm_of, w, k))
    fit = Fit(float(E), float(alpha), {a: float(A[i]) for i, a in enumerate(ladder.arms)}, c0, 0.0)
    rng = np.random.default_rng(seed)
    sims = simulate_means(lower, nl, points, {p: fit(p[0], ladder.compute[p]) for p in points}.get, draws, rng)
    bE, bal, bA, _ = fit_shared(sims, x, arm_of, w, k)
    q = (1 - level) / 2
    nt = noise(Ladder(ladder.arms, [top], ladder.values, ladder.compute))
    s2_top, df_top, tau2_top = nt.s2[top], nt.df[top], nt.tau2[top]
    if not (s2_top > 0 and df_top > 0):
        s2_top, df_top = nl.pooled, max(sum(nl.df.values()), 1.0)
    s2_top = s2_top * df_top / rng.chisquare(df_top, draws)  # its own uncertainty, as Student's t has it
    shared = rng.normal(0.0, 1.0, draws) * math.sqrt(tau2_top)  # the top rung's seeds, shared by its arms
    out = {"rung": top, "arms": {}, "gaps": {}}
    pred = {}
    for i, a in enumerate(ladder.arms):
        c = ladder.compute.get((a, top))
        m = len(ladder.finished(a, top))
        if not c or not m:
            continue
        pred[a] = bE + bA[:, i] * (c / c0) ** (-bal) + rng.standard_normal(draws) * np.sqrt(s2_top / m) \
            + shared / math.sqrt(m)
        lo, hi = np.nanquantile(pred[a], [q, 1 - q])
        meas = statistics.fmean(ladder.finished(a, top))
        out["arms"][a] = {"predicted": fit(a, c), "low": float(lo), "high": float(hi), "measured": meas,
                          "inside": bool(lo <= meas <= hi)}
    base = ladder.arms[0]
    if base in pred:
        for a in ladder.arms[1:]:
            if a not in pred:
                continue
            g = pred[a] - pred[base]
            lo, hi = np.nanquantile(g, [q, 1 - q])
            meas = out["arms"][a]["measured"] - out["arms"][base]["measured"]
            out["gaps"][a] = {"predicted": out["arms"][a]["predicted"] - out["arms"][base]["predicted"],
                              "low": float(lo), "high": float(hi), "measured": meas, "inside": bool(lo <= meas <= hi)}
    return out
