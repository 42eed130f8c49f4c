"""Each arm's learning rate from a fitted curve, clear of the edge of stability (``study.tune.rule: fit``).

For every arm and rung, over every finished tuning run (x = log2 of the rate):

* **The valley.** A quadratic y = a (x - c)^2 + m by least squares through the runs of the best rate (the best
  mean, a failed run counting as the worst) and its neighbours: every rate within two doublings of it, and at
  least the nearest one on each side. A local quadratic, not a global curve: near its minimum any smooth loss
  is one, it needs three rates, and it moves little when one run moves (issue 47: at most 8% between two
  runs of one study, where the argmin jumped a whole 2x step). A spike weighs 1 - w in it, w being how surely
  it spiked; a rate where a run failed or spiked (w > 0.5) is never the best rate, and a rate where a run failed
  is left out of the fit (a twin that finished there ended on the cliff). Not convex (a <= 0) or fewer than three
  rates: no fit; the best mean's rate stands.
* **lr\\***: the valley's argmin c inside the rates it was fitted on; the **basin**: the rates where the valley is
  within ``basin`` (default: the study's margin, else 0.02) of its minimum; the **bracket**: the best mean's rate
  is neither the lowest nor the highest tested (else the optimum is not known to be inside the grid).
* **Spikes and failures.** A run that diverged or collapsed has failed; a finished run more than ``spike`` above
  another seed at its rate has (as likely as not: :func:`spike_weights`) spiked. Both are failures, at or above
  the arm's best rate (one that failed below it did not learn: a rate too small, not the edge of stability).
* **The stability model**: P(failure | x) = sigmoid(beta (x - x0)), one slope beta shared by every arm and rung
  (its prior: log beta ~ N(log 4, 0.3), a failure rate that rises from 12% to 88% over about a doubling), a
  location x0 for each (prior: one doubling above its highest tested rate, sd 1.5 doublings), fitted by the
  posterior mode. An arm whose own runs show failures has lr\\* moved down to where the model's posterior
  predictive failure probability (Laplace's approximation) is ``fail_level`` (default 0.05); a rate below every
  tested one there means the arm has no stable rate.
* **Tuning variance**: the valley re-fitted on parametric re-draws of its runs (the fitted values plus noise of
  the residual sd pooled over every fit of the study), lr\\* chosen again each time: the percentile interval of
  lr\\*, and ``tuning_sd``: the sd of the valley's loss at the re-chosen rates, which the comparison adds to its
  interval (a verdict between two arms is then about the arms, not about two noise-picked rates).

A grid of several keys (a rate and a warm-up) is fitted along the rate for each value of the others; the
slice with the lowest fitted loss at its chosen rate is the arm's. A chosen slice at an end of the others' values
(the longest warm-up tried) is not bracketed either (:meth:`Choice.slice_edges`): the runner extends it by a whole
slice and otherwise gives no verdict, as for the rate.
"""
import math
import random
from dataclasses import dataclass, field
from typing import Optional

SPIKE = 0.1  # metric units: a run this far above another seed at its rate spiked (as likely as not)
NOISE = 0.02  # the sd of two seeds' difference at one rate when the study has no replicate to measure it
NOISE_FLOOR = 0.005
MIN_PAIRS = 5  # seed pairs (each at most a spike apart) needed to measure the noise; fewer: NOISE
FAIL_LEVEL = 0.05
BOOTSTRAPS = 400
PREDICTIVE_DRAWS = 400  # draws of the failure model's parameters (its posterior, by Laplace's approximation)
WINDOW = 2.0  # doublings either side of the best rate that the valley is fitted on
SLOPE_PRIOR = (math.log(4.0), 0.3)  # log beta ~ N(mean, sd): a failure rate that rises over about one doubling
LOCATION_PRIOR = (1.0, 1.5)  # x0 ~ N(highest tested x + mean, sd)


@dataclass
class Valley:
    """One arm at one rung (one slice of the grid): its runs, its fit, its choice."""

    points: list  # [(x, y, status)], y in "lower is better" units, status ok | spike | failed
    best_x: float  # the best mean's rate (log2)
    bracketed: bool
    edge: Optional[str] = None  # "low" | "high" when not bracketed
    a: float = math.nan
    c: float = math.nan
    m: float = math.nan
    window: tuple = (math.nan, math.nan)
    x: float = math.nan  # the chosen rate (log2)
    fitted_x: float = math.nan  # the valley's argmin before the stability model
    low: float = math.nan
    high: float = math.nan  # lr*'s interval (log2)
    basin: tuple = (math.nan, math.nan)
    tuning_sd: float = 0.0
    p_fail: float = math.nan
    moved: bool = False  # moved down by the stability model
    stable: bool = True  # some tested rate is below the failure level
    note: str = ""
    resid: list = field(default_factory=list)  # [(residual, weight)] of the runs fitted
    weights: list = field(default_factory=list)  # each run's spike weight (points' order)
    caps: list = field(default_factory=list)  # a moved rate: where re-tunings would put its cap (posterior draws)
    evidence: float = 0.0  # its own runs' failures at or above its best rate (spikes by their weight)
    beta: float = math.nan  # the failure model at its posterior mode: P(fail | x) = sigmoid(beta (x - x0))
    x0: float = math.nan

    @property
    def fitted(self) -> bool:
        return math.isfinite(self.a)

    def value(self, x: float) -> float:
        return self.a * (x - self.c) ** 2 + self.m if self.fitted else math.nan

    @property
    def at_choice(self) -> float:
        """The valley's value at the chosen rate (the best mean's when there is no fit)."""
        if self.fitted:
            return self.value(self.x)
        ys = [y for x, y, s in self.points if s == "ok" and x == self.best_x]
        return sum(ys) / len(ys) if ys else math.inf


def quadratic(xs: list, ys: list, ws: Optional[list] = None) -> Optional[tuple]:
    """(a, c, m) of the (weighted) least-squares y = a (x - c)^2 + m, or None when it is not a valley (a <= 0,
    fewer than three distinct x of positive weight)."""
    import numpy as np

    ws = [1.0] * len(xs) if ws is None else ws
    if len({x for x, w in zip(xs, ws) if w > 1e-6}) < 3:
        return None
    r = np.sqrt(np.asarray(ws, float))
    A = np.vstack([np.square(xs), xs, np.ones(len(xs))]).T * r[:, None]
    (q, b, k), *_ = np.linalg.lstsq(A, np.asarray(ys, float) * r, rcond=None)
    if not q > 1e-12:
        return None
    c = -b / (2 * q)
    return float(q), float(c), float(k - q * c * c)


def valley(points: list, spike: float = SPIKE, noise: float = NOISE) -> Valley:
    """The valley of one arm-rung-slice from its runs [(x, y)] (y NaN: failed; lower is better); ``noise``: the sd
    of the difference between two seeds at one rate (pooled over the study: :func:`seed_noise`)."""
    pts = [(x, y, "ok" if math.isfinite(y) else "failed") for x, y in points]
    weights = spike_weights(pts, spike, noise)
    xs = sorted({x for x, _, _ in pts})
    # each rate's mean over its runs, a run that may have spiked by its weight (1 - w); a failed run, or one that
    # spiked as likely as not, makes the rate the worst (a rate that spikes is not the best, however low its twin)
    means = {x: _mean([(y if w <= 0.5 else math.nan, 1 - w) for (px, y, _), w in zip(pts, weights) if px == x])
             for x in xs}
    best = min(xs, key=lambda x: (means[x], x))
    v = Valley([(x, y, "spike" if w > 0.5 else st) for (x, y, st), w in zip(pts, weights)], best, bracketed=False,
               weights=weights)
    if not math.isfinite(means[best]):
        every = all(not math.isfinite(y) for _, y, _ in pts)
        v.note, v.stable = "every run failed" if every else "every rate tried had a failed run", False
        return v
    tested = [x for x in xs if x != best]
    v.bracketed = any(x < best for x in tested) and any(x > best for x in tested)
    if not v.bracketed:
        v.edge = "low" if not any(x < best for x in tested) else "high"
    _fit(v)
    return v


def _in_valley(v: Valley, lo: float = -math.inf, hi: float = math.inf) -> list:
    """[(x, y, weight)]: the runs the valley is fitted on, between ``lo`` and ``hi``. A rate where a run failed is
    not in it: the runs that finished there show the cliff (a twin of a collapsed run can end just short of the
    collapse threshold), not the floor; the failure model counts it."""
    failing = {x for x, y, _ in v.points if not math.isfinite(y)}
    return [(x, y, 1 - w) for (x, y, _), w in zip(v.points, v.weights)
            if math.isfinite(y) and x not in failing and lo <= x <= hi]


def _fit(v: Valley) -> None:
    ok = sorted({x for x, _, _ in _in_valley(v)})
    below, above = [x for x in ok if x < v.best_x], [x for x in ok if x > v.best_x]
    lo = min([x for x in below if x >= v.best_x - WINDOW] + below[-1:], default=v.best_x)
    hi = max([x for x in above if x <= v.best_x + WINDOW] + above[:1], default=v.best_x)
    use = _in_valley(v, lo, hi)
    got = quadratic([x for x, _, _ in use], [y for _, y, _ in use], [w for _, _, w in use])
    if got is None:
        v.note = v.note or "no valley through the best rate and its neighbours: the best mean's rate"
        v.x = v.best_x
        return
    v.a, v.c, v.m = got
    v.window = (lo, hi)
    v.resid = [(y - v.value(x), w) for x, y, w in use]
    v.fitted_x = min(max(v.c, lo), hi)
    v.x = v.fitted_x


def seed_noise(groups: list, spike: float = SPIKE) -> float:
    """The sd of the difference between two finished seeds at one rate, pooled over ``groups`` (lists of runs
    [(x, y)]) robustly: the median absolute difference / 0.6745 over the pairs at most ``spike`` apart (a spike
    is not noise), at least ``NOISE_FLOOR``; ``NOISE`` with fewer than ``MIN_PAIRS`` such pairs."""
    diffs = []
    for pts in groups:
        by_x: dict = {}
        for x, y in pts:
            if math.isfinite(y):
                by_x.setdefault(x, []).append(y)
        for ys in by_x.values():
            diffs += [abs(a - b) for i, a in enumerate(ys) for b in ys[i + 1:]]
    diffs = sorted(d for d in diffs if d <= spike)  # a spike is not noise (with few pairs it would be the noise)
    if len(diffs) < MIN_PAIRS:
        return NOISE
    mid = len(diffs) // 2
    med = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    return max(med / 0.6745, NOISE_FLOOR)


def spike_weights(points: list, spike: float, noise: float) -> list:
    """How surely each finished run spiked, in [0, 1]: Phi((its excess over the best other seed at its rate -
    ``spike``) / ``noise``). A run ``spike`` above its seed is a coin flip, well above it a spike for sure; a
    rate with one seed shows none (the docs recommend two seeds). Soft, so that a run 0.098 or 0.102 above its
    seed moves the choice a little, not across a threshold. A failed run: 0 here (it counts as failed)."""
    out = []
    for i, (x, y, s) in enumerate(points):
        others = [y2 for j, (x2, y2, _) in enumerate(points) if j != i and x2 == x and math.isfinite(y2)]
        if s != "ok" or not others:
            out.append(0.0)
            continue
        out.append(0.5 * (1 + math.erf((y - min(others) - spike) / (noise * math.sqrt(2)))))
    return out


def stability(valleys: dict, fail_level: float = FAIL_LEVEL) -> tuple:
    """The failure model over every valley ({key: Valley}): (beta, {key: x0}); each valley's ``p_fail`` and, where
    the model puts its rate above ``fail_level``, its rate moved down (``moved``)."""
    import numpy as np
    from scipy.optimize import minimize

    keys = list(valleys)
    # a run that failed below its arm's best rate did not learn (collapsed): an outcome of too small a rate, not
    # the edge of stability, so it is not a failure here
    obs = [(i, x, (1.0 if not math.isfinite(y) else w) if x >= valleys[k].best_x else 0.0)
           for i, k in enumerate(keys) for (x, y, _), w in zip(valleys[k].points, valleys[k].weights)
           if math.isfinite(y) or x >= valleys[k].best_x]
    top = [max(x for x, _, _ in valleys[k].points) for k in keys]
    X = np.array([x for _, x, _ in obs], float)
    F = np.array([f for _, _, f in obs], float)
    G = np.array([i for i, _, _ in obs], int)

    def loss(theta):
        beta, x0 = math.exp(theta[0]), theta[1:]
        z = beta * (X - x0[G])
        nll = np.sum(np.logaddexp(0, z) - F * z)
        prior = (theta[0] - SLOPE_PRIOR[0]) ** 2 / (2 * SLOPE_PRIOR[1] ** 2)
        prior += np.sum((x0 - np.array(top) - LOCATION_PRIOR[0]) ** 2) / (2 * LOCATION_PRIOR[1] ** 2)
        return nll + prior

    start = np.array([SLOPE_PRIOR[0], *(t + LOCATION_PRIOR[0] for t in top)])
    theta = minimize(loss, start, method="BFGS").x
    cov = laplace_covariance(theta, X, F, G, len(keys))
    draws = np.random.default_rng(0).multivariate_normal(theta, cov, size=PREDICTIVE_DRAWS)
    beta, x0 = math.exp(theta[0]), {k: float(theta[1 + i]) for i, k in enumerate(keys)}
    for i, (k, v) in enumerate(valleys.items()):
        b, loc = np.exp(draws[:, 0]), draws[:, 1 + i]

        def p_fail(x: float) -> float:  # the posterior predictive: the model's uncertainty widens it
            return float(np.mean(1 / (1 + np.exp(-b * (x - loc)))))

        if not math.isfinite(v.x):
            v.x = v.best_x
        v.evidence = sum(1.0 if not math.isfinite(y) else w for (x, y, _), w in zip(v.points, v.weights)
                         if x >= v.best_x)
        if v.evidence >= 0.5 and p_fail(v.x) > fail_level:  # moved only on its own runs' evidence, never the prior's
            lo, hi = min(x for x, _, _ in v.points) - 4.0, v.x
            if p_fail(lo) > fail_level:
                v.x, v.moved, v.stable = lo, True, False
            else:
                for _ in range(40):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if p_fail(mid) <= fail_level else (lo, mid)
                v.x, v.moved = lo, True
            if v.x < min(x for x, _, _ in v.points):
                v.stable = False
                v.note = "no tested rate is below the failure level: the arm is unstable across the grid"
            # where the cap would fall under each posterior draw (its own failure-level rate), centred on the cap
            # chosen: the spread a re-tuning's cap would have, for the tuning variance
            own = loc + math.log(fail_level / (1 - fail_level)) / b
            v.caps = [float(c) for c in own - np.median(own) + v.x]
        v.p_fail = p_fail(v.x)
        v.beta, v.x0 = beta, x0[k]
    return beta, x0


def laplace_covariance(theta, X, F, G, groups: int):
    """The inverse of the failure model's exact Hessian (negative log posterior) at ``theta`` = (log beta, x0...):
    Laplace's approximation of its posterior, symmetric, eigenvalues floored (no draw depends on an optimiser's
    running estimate, nor on the order of the arms)."""
    import numpy as np

    beta, x0 = math.exp(theta[0]), np.asarray(theta[1:])
    z = beta * (X - x0[G])
    p = 1 / (1 + np.exp(-z))
    w, r = p * (1 - p), p - F  # d2/dz2 and d/dz of each observation's negative log likelihood
    n = 1 + groups
    H = np.zeros((n, n))
    H[0, 0] = np.sum(w * z * z + r * z) + 1 / SLOPE_PRIOR[1] ** 2  # dz/ds = z, d2z/ds2 = z (s = log beta)
    for g in range(groups):
        m = G == g
        H[0, 1 + g] = H[1 + g, 0] = np.sum(-w[m] * z[m] * beta - r[m] * beta)  # dz/dx0 = -beta, d2z/(ds dx0) = -beta
        H[1 + g, 1 + g] = np.sum(w[m]) * beta ** 2 + 1 / LOCATION_PRIOR[1] ** 2
    vals, vecs = np.linalg.eigh((H + H.T) / 2)
    vals = np.maximum(vals, 1e-6)
    return (vecs / vals) @ vecs.T


def tuning_variance(valleys: dict, draws: int = BOOTSTRAPS, seed: int = 0, noise: float = NOISE) -> float:
    """lr*'s interval and ``tuning_sd`` of every fitted valley, by re-drawing its runs (the fitted values plus
    Normal noise of the pooled residual sd, or ``noise``, one run's sd from the seeds' differences (or its
    default, without two seeds at a rate), when no valley has a residual degree of freedom: three rates on one
    seed each) and choosing again (a rate the failure model moved: under a cap
    drawn from the model's posterior, centred on the cap chosen); -> the sd used."""
    rng = random.Random(seed)
    num = sum(w * r * r for v in valleys.values() if v.fitted for r, w in v.resid)
    df = sum(sum(w for _, w in v.resid) - 3 for v in valleys.values() if v.fitted)
    sd = math.sqrt(num / df) if df > 0.5 else noise
    for v in valleys.values():
        if not v.fitted:
            v.low = v.high = v.x
            continue
        lo, hi = v.window
        use = _in_valley(v, lo, hi)  # the runs the valley was fitted on
        xs, ws = [x for x, _, _ in use], [w for _, _, w in use]
        chosen, costs = [], []
        for _ in range(draws):
            got = quadratic(xs, [v.value(x) + rng.gauss(0.0, sd) for x in xs], ws)
            x = min(max(got[1], lo), hi) if got is not None else v.best_x
            x = min(x, rng.choice(v.caps) if v.moved and v.caps else v.x if v.moved else math.inf)
            x = max(x, lo)  # a re-tuning picks among the rates it tries: the valley is not extrapolated
            chosen.append(x)
            costs.append(v.value(x))
        chosen.sort()
        v.low, v.high = chosen[int(0.025 * draws)], chosen[min(draws - 1, int(0.975 * draws))]
        mean = sum(costs) / draws
        v.tuning_sd = math.sqrt(sum((c - mean) ** 2 for c in costs) / (draws - 1))
    return sd


def basin(v: Valley, delta: float) -> tuple:
    """The rates (log2) where the valley is within ``delta`` of its minimum, inside the rates it was fitted on."""
    if not v.fitted:
        return (v.x, v.x)
    w = math.sqrt(delta / v.a)
    return (max(v.c - w, v.window[0]), min(v.c + w, v.window[1]))


def _mean(pairs: list) -> float:
    """The weighted mean of [(y, weight)]; inf when a run failed (or no weight is left)."""
    total = sum(w for _, w in pairs)
    if not pairs or not all(math.isfinite(y) for y, _ in pairs) or total <= 0:
        return math.inf
    return sum(y * w for y, w in pairs) / total


@dataclass
class Choice:
    """An arm at a rung: the setting it is compared at (None: none trained stably), the valley it came from, and
    every slice's valley (a grid of several keys)."""

    setting: Optional[dict]
    valley: Valley
    slices: dict  # {slice key: (the other keys' values, Valley)}

    @property
    def lr(self) -> float:
        return 2 ** self.valley.x

    def tried(self, k: str, grid: Optional[dict] = None) -> list:
        """The values of the grid's key ``k`` tried (its slices', and ``grid``'s: {key: values}), sorted as
        numbers; [] when they are not numbers (or are booleans)."""
        values = [o.get(k) for o, _ in self.slices.values()] + list((grid or {}).get(k, ()))
        if any(isinstance(x, bool) for x in values):
            return []
        try:
            return sorted({float(x) for x in values})
        except (TypeError, ValueError):
            return []

    def slice_edges(self, grid: Optional[dict] = None) -> dict:
        """{key: "low" | "high"} for each key of the grid besides the rate (a warm-up) whose chosen value is at an
        end of the values tried (its slices', and ``grid``'s: {key: values}, so that a slice halving stopped whole
        still counts): that optimum is not bracketed either. A low end of 0 is the end of the key's range (no
        warm-up, no decay), not of a grid, and is not flagged; a key whose values are not numbers (or are
        booleans) has no ends."""
        if self.setting is None:
            return {}
        here = next((o for o, v in self.slices.values() if v is self.valley), {})
        out = {}
        for k, value in here.items():
            tried = self.tried(k, grid)
            if len(tried) < 2 or isinstance(value, bool):
                continue
            v = float(value)
            if math.isclose(v, tried[-1], rel_tol=1e-9):
                out[k] = "high"
            elif math.isclose(v, tried[0], rel_tol=1e-9) and v != 0:
                out[k] = "low"
        return out


def fit_all(curves: dict, known: dict, key: str, better: str = "min", spike: float = SPIKE,
            fail_level: float = FAIL_LEVEL, delta: float = 0.02, draws: int = BOOTSTRAPS) -> dict:
    """Every arm-rung's choice under the fit rule. ``curves``: {(arm, rung): {setting key: [values]}},
    ``known``: {setting key: setting}, ``key``: the rate's key (fitted in log2). -> {(arm, rung): Choice}."""
    valleys, slices = {}, {}
    for ar, results in curves.items():
        groups: dict = {}
        for skey, vals in results.items():
            s = known[skey]
            others = {k: v for k, v in s.items() if k != key}
            g = groups.setdefault(repr(sorted(others.items())), (others, []))
            rate = float(s[key])
            if rate <= 0:
                continue
            g[1].extend((math.log2(rate), (y if better == "min" else -y) if math.isfinite(y) else math.nan)
                        for y in vals)
        slices[ar] = groups
    noise = seed_noise([pts for groups in slices.values() for _, pts in groups.values()], spike)
    for ar, groups in slices.items():
        for gk, (_, pts) in groups.items():
            if pts:
                valleys[(ar, gk)] = valley(pts, spike, noise)
    if valleys:
        stability(valleys, fail_level)
        if draws >= 2:
            tuning_variance(valleys, draws, noise=noise / math.sqrt(2))  # one run's, not a difference's
    out = {}
    for ar, groups in slices.items():
        mine = {gk: (others, valleys[(ar, gk)]) for gk, (others, pts) in groups.items() if (ar, gk) in valleys}
        for _, v in mine.values():
            v.basin = basin(v, delta)
        usable = [(v.at_choice, i, others, v) for i, (others, v) in enumerate(mine.values())
                  if v.stable and math.isfinite(v.at_choice)]
        if not usable:
            first = next(iter(mine.values()))[1] if mine else Valley([], math.nan, False, note="no runs")
            out[ar] = Choice(None, first, mine)
            continue
        _, _, others, v = min(usable, key=lambda t: (t[0], t[1]))
        out[ar] = Choice({**others, key: float(f"{2 ** v.x:.4g}")}, v, mine)
    return out


def near(v: Valley) -> list:
    """The tested rates (log2) whose runs ``borrow_variance`` pools: the tested rate nearest the chosen one and
    that rate's neighbours, one grid step on each side. (A chosen rate is a continuous value, and grids are not always evenly
    spaced, 1e-3, 3e-3, 1e-2: a fixed window about it would often hold one side's neighbour and not the other's.)"""
    xs = sorted({x for x, _, _ in v.points})
    if not xs or not math.isfinite(v.x):
        return []
    i = xs.index(min(xs, key=lambda x: (abs(x - v.x), x)))
    return xs[max(0, i - 1):i + 2]


def trouble_near(v: Valley, spike: float = SPIKE) -> Optional[float]:
    """Whether an arm's tuning failed near the rate chosen for it: a failed or spiked run within one grid step
    of it (the grid's smallest spacing in log2; issue 48's definition, taken literally: a failure 1.7 doublings
    above a rate on a 1e-3, 3e-3, 1e-2 grid is not near it). -> the spike size its comparison is to allow for
    (the largest excess of such a spike over its rate's best run, at least ``spike``), or None when none failed
    there."""
    xs = sorted({x for x, _, _ in v.points})
    if not xs or not math.isfinite(v.x):
        return None
    step = min((b - a for a, b in zip(xs, xs[1:])), default=0.0)
    near_ = [(x, y, st) for x, y, st in v.points if st in ("spike", "failed") and abs(x - v.x) <= step + 1e-9]
    if not near_:
        return None
    size = spike
    for x, y, st in near_:
        twins = [yy for xx, yy, ss in v.points if xx == x and ss == "ok" and math.isfinite(yy)]
        if st == "spike" and twins and math.isfinite(y):
            size = max(size, y - min(twins))
    return size


def near_runs(v: Valley) -> list:
    """An arm's tuning runs at the rates of :func:`near`: one row per rate, its values in tuning-seed order, NaN
    for a failed or spiked run (what ``study.borrow_variance`` pools)."""
    return [[y if st == "ok" and math.isfinite(y) else math.nan for xx, y, st in v.points if xx == x]
            for x in near(v)]


def record(ch: Choice, key: str, better: str = "min", carried: bool = False, grid: Optional[dict] = None) -> dict:
    """One arm-rung's choice as data (``report.json``), in the metric's own direction; rates as rates."""
    v, sign = ch.valley, 1.0 if better == "min" else -1.0

    def rate(x: float) -> float:
        return float(f"{2 ** x:.4g}") if math.isfinite(x) else math.nan

    return {"setting": ch.setting, "key": key, "lr": rate(v.x), "low": rate(v.low), "high": rate(v.high),
            "fitted_lr": rate(v.fitted_x), "basin": [rate(v.basin[0]), rate(v.basin[1])],
            "basin_width": 2 ** (v.basin[1] - v.basin[0]) if v.fitted else math.nan,
            "minimum": sign * v.m, "at_lr": sign * v.value(v.x) if v.fitted else math.nan,
            "p_fail": v.p_fail, "failure_evidence": v.evidence, "moved": v.moved, "bracketed": v.bracketed, "edge": v.edge, "stable": v.stable,
            "slice_edges": ch.slice_edges(grid),
            "tuning_sd": v.tuning_sd, "note": v.note, "carried": carried,
            # the metric = m + a (log2 rate - c)^2 over the window of rates it was fitted on
            "valley": {"a": sign * v.a, "c": v.c, "m": sign * v.m, "window": [rate(v.window[0]), rate(v.window[1])]},
            "failure_model": {"beta": v.beta, "x0_lr": rate(v.x0)},
            "runs": [[rate(x), sign * y if math.isfinite(y) else math.nan, s, w]
                     for (x, y, s), w in zip(v.points, v.weights)]}
