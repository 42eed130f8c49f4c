"""Small-sample statistics for the report: Student-t intervals, paired and Welch differences, Holm's correction.

Pure Python (no scipy, no numpy), so ``python -m modforge.report`` needs nothing
beyond modforge's own dependencies; the tests check every function against
``scipy.stats``. The t distribution's CDF is the regularized incomplete beta
function I_x(a, b), evaluated by its continued fraction (Lentz's method), and
its quantile by bisection on the CDF, which is monotone: slow by the standards
of a numerics library, exact to ~1e-12 and fast enough for a table.
"""
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df may be fractional: Welch)."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (bisection on :func:`t_cdf`)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} outside (0, 1)")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|), computed from the tail directly (no 1 - x cancellation for tiny p)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass
class Interval:
    """A mean (or a difference of means) with its two-sided confidence interval."""

    estimate: float
    low: float = math.nan
    high: float = math.nan
    df: float = math.nan
    p: float = math.nan  # two-sided p-value of "the true value is 0" (for differences)
    kind: str = ""  # "t", "paired", "welch"; "" when there is too little data for an interval

    @property
    def excludes_zero(self) -> bool:
        return not (math.isnan(self.low) or self.low <= 0.0 <= self.high)


def mean_interval(xs: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with its Student-t interval: mean ± t_{(1+level)/2, n-1} · sd / sqrt(n); no interval for n < 2."""
    n = len(xs)
    if n == 0:
        return Interval(math.nan)
    m = statistics.fmean(xs)
    if n < 2:
        return Interval(m)
    half = t_ppf((1 + level) / 2, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return Interval(m, m - half, m + half, n - 1, kind="t")


def paired_difference(xs: Sequence[float], ys: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of x_i - y_i over pairs (the same seed in both configurations), with its t interval and p-value."""
    d = [x - y for x, y in zip(xs, ys)]
    n = len(d)
    m = statistics.fmean(d) if d else math.nan
    if n < 2:
        return Interval(m, kind="")
    sd = statistics.stdev(d)
    se = sd / math.sqrt(n)
    half = t_ppf((1 + level) / 2, n - 1) * se
    p = two_sided_p(m / se, n - 1) if se > 0 else (0.0 if m != 0 else 1.0)
    return Interval(m, m - half, m + half, n - 1, p, "paired")


def welch_difference(xs: Sequence[float], ys: Sequence[float], level: float = 0.95) -> Interval:
    """mean(x) - mean(y) with Welch's interval (unequal variances, Welch–Satterthwaite degrees of freedom)."""
    nx, ny = len(xs), len(ys)
    m = (statistics.fmean(xs) - statistics.fmean(ys)) if nx and ny else math.nan
    if nx < 2 or ny < 2:
        return Interval(m, kind="")
    vx, vy = statistics.variance(xs) / nx, statistics.variance(ys) / ny
    se = math.sqrt(vx + vy)
    if se == 0:
        return Interval(m, m, m, math.inf, 0.0 if m != 0 else 1.0, "welch")
    df = (vx + vy) ** 2 / (vx ** 2 / (nx - 1) + vy ** 2 / (ny - 1))
    half = t_ppf((1 + level) / 2, df) * se
    return Interval(m, m - half, m + half, df, two_sided_p(m / se, df), "welch")


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (step-down, monotone), in the input's order; NaN stays NaN."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    k = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (k - rank) * pvalues[i]))
        out[i] = running
    return out


def difference(xs: dict, ys: dict, level: float = 0.95) -> Optional[Interval]:
    """x - y for two configurations given as {seed: value}: paired when both ran the same seeds, Welch otherwise."""
    if xs and set(xs) == set(ys) and len(xs) >= 2:
        keys = sorted(xs)
        return paired_difference([xs[k] for k in keys], [ys[k] for k in keys], level)
    return welch_difference(list(xs.values()), list(ys.values()), level)
