"""The statistics of a verdict: intervals over seeds, paired comparisons on shared seeds, equivalence against a
declared margin, the minimum detectable effect, rates of failed runs and Fisher's exact test between arms.

Built on ``scipy.stats`` (Student's t and its noncentral form, the binomial's Wilson interval, Fisher's exact
test): a library made for this, tested by its maintainers far beyond what a report could be. What is decided
here is which procedure answers which question:

* **A comparison** is ``x - baseline`` over the seeds both arms finished (pairs; how many is part of the
  answer). Pairing is what makes a seed worth having: with common random numbers two runs of one seed see the
  same batches, so the difference cancels what they share. When two arms share no seed at all, the family is
  compared by Welch's unpaired test instead, and says so; a family never mixes the two.
* **A family** of k comparisons is tested at level 1 - alpha as a whole: every printed interval is a
  simultaneous one and every verdict is read off that interval, so the two cannot disagree. Against one
  baseline the comparisons are the contrasts of one randomised-block model with Dunnett's critical value
  (:mod:`modforge.results.blocks`); here (:func:`compare`, a pair at a time) at 1 - alpha/k (Bonferroni), used
  where the baseline is the best (every pair is then in the family) or no seed is shared. (Holm's step-down
  rejects a little more often but has no intervals that match its decisions.)
* **Four verdicts.** *better* / *worse*: the interval excludes 0. *equivalent within ±m*: the interval lies
  inside (-m, m), which is two one-sided tests (TOST) each at alpha/(2k): stricter than Schuirmann's 1 - 2alpha
  interval, so that one printed interval carries every verdict. *inconclusive*: neither, stated with the
  minimum detectable effect (MDE): the true difference the test would find with 80% power at this number of
  pairs and this spread (the noncentral t's power, solved for the effect). No verdict at all, with the reason,
  under 3 pairs of a paired t (2 with the block model, whose residual df come from every arm) or when the
  differences have no spread (a p-value of 0 from two numbers is no evidence).
* **Bounded metrics** (an accuracy in [0, 1], a loss >= 0) get intervals inside their range: Wilson's score
  interval when every run sits at a bound (5 of 5 runs at exact match 1.0 is a rate, 5/5), else Student's t
  where it stays in range, else Student's t on the logit (two bounds) or log (one bound) scale, values at a
  bound pulled in by Smithson and Verkuilen's (x(n-1) + 1/2)/n (and the interval's ends pushed back out); a
  skewed sample whose transformed interval misses its own mean gets Student's t cut at the range.
"""
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

MIN_PAIRS = 3
POWER = 0.8


@dataclass
class Interval:
    """A mean over runs with its interval; ``kind`` says which ("" when there is none, ``why`` says why)."""

    estimate: float
    low: float = math.nan
    high: float = math.nan
    kind: str = ""  # "t", "logit-t", "log-t", "wilson"
    why: str = ""

    @property
    def width(self) -> float:
        return self.high - self.low


def _t():
    from scipy import stats

    return stats


def t_quantile(q: float, df: float) -> float:
    return float(_t().t.ppf(q, df))


def mean_interval(xs: Sequence[float], level: float = 0.95, low: float = -math.inf,
                  high: float = math.inf) -> Interval:
    """The mean of ``xs`` with a ``level`` interval that stays inside [low, high] (see the module's notes)."""
    xs = [x for x in xs if math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, why="no runs")
    m = statistics.fmean(xs)
    if n < 2:
        return Interval(m, why="one run")
    if any(not low <= x <= high for x in xs):  # the range was guessed from the name, wrongly: no range
        low, high = -math.inf, math.inf
    bounded = math.isfinite(low) and math.isfinite(high)
    if bounded and all(x in (low, high) for x in xs):  # every run at a bound: a rate
        lo, hi = wilson(sum(x == high for x in xs), n, level)
        span = high - low
        return Interval(m, low + lo * span, low + hi * span, "wilson")
    sd = statistics.stdev(xs)
    if sd == 0:
        return Interval(m, why=f"all {n} equal")
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    if low <= m - half and m + half <= high:
        return Interval(m, m - half, m + half, "t")
    ends, kind = None, ""
    if bounded:  # the logit scale of (x - low) / (high - low), values at a bound pulled in, and back out
        z = [math.log(u / (1 - u)) for u in (_squeeze((x - low) / (high - low), n) for x in xs)]
        ends = [low + (high - low) * _unsqueeze(1 / (1 + math.exp(-e)), n) for e in _t_bounds(z, level)]
        kind = "logit-t"
    elif math.isfinite(low) or math.isfinite(high):  # the log scale of the distance from the one bound
        sign, bound = (1, low) if math.isfinite(low) else (-1, high)
        dist = [sign * (x - bound) for x in xs]
        floor = min((d for d in dist if d > 0), default=1.0) / 2  # a run at the bound itself
        ends = sorted(bound + sign * math.exp(e) for e in _t_bounds([math.log(max(d, floor)) for d in dist], level))
        kind = "log-t"
    if ends is not None and ends[0] <= m <= ends[1]:
        return Interval(m, ends[0], ends[1], kind)
    # a skewed sample whose transformed interval misses its own mean: Student's t, cut at the range
    return Interval(m, max(m - half, low), min(m + half, high), "t, cut at the range")


def _squeeze(u: float, n: int) -> float:
    return (u * (n - 1) + 0.5) / n


def _unsqueeze(s: float, n: int) -> float:
    return min(1.0, max(0.0, (s * n - 0.5) / (n - 1)))


def _t_bounds(z: list, level: float) -> tuple:
    m, sd, n = statistics.fmean(z), statistics.stdev(z), len(z)
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return m - half, m + half


def wilson(k: int, n: int, level: float = 0.95) -> tuple:
    """Wilson's score interval for a rate of ``k`` in ``n`` (inside [0, 1] for 0/n and n/n too)."""
    if n == 0:
        return math.nan, math.nan
    ci = _t().binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def fisher(bad_a: int, n_a: int, bad_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test: do two arms fail (diverge, collapse) at different rates?"""
    if n_a == 0 or n_b == 0:
        return math.nan
    return float(_t().fisher_exact([[bad_a, n_a - bad_a], [bad_b, n_b - bad_b]]).pvalue)


@dataclass
class Comparison:
    """``x - y`` for two arms, as one member of a family of ``family`` comparisons at ``level``."""

    estimate: float
    n: int  # pairs used (paired), or the smaller arm's runs (welch)
    test: str  # "paired" | "welch" | "block" (every arm in one randomised-block model: modforge.results.blocks)
    level: float  # the family's level; the interval is at 1 - (1 - level) / family
    family: int
    low: float = math.nan
    high: float = math.nan
    df: float = math.nan
    se: float = math.nan
    p: float = math.nan  # two-sided, unadjusted
    corr: float = math.nan  # correlation of the two arms over the shared seeds (paired)
    removed: float = math.nan  # share of the unpaired variance the pairing removed (paired)
    why: str = ""  # why there is no decision ("" when there is one)
    n_x: int = 0
    n_y: int = 0
    tail: float = math.nan  # each interval's two-sided tail where the family's rule is not Bonferroni's (Dunnett's)
    p_family: float = math.nan  # the family-adjusted p where it is computed exactly (Dunnett's)

    @property
    def alpha(self) -> float:
        """Each comparison's two-sided level: Bonferroni's (1 - level) / family, or the family rule's ``tail``."""
        return self.tail if not math.isnan(self.tail) else (1 - self.level) / self.family

    @property
    def p_adjusted(self) -> float:
        if not math.isnan(self.p_family):
            return self.p_family
        return min(1.0, self.p * self.family) if not math.isnan(self.p) else math.nan

    @property
    def decided(self) -> bool:
        return not self.why

    @property
    def mde(self) -> float:
        """The smallest true |difference| found with 80% power by this test at this n, spread and level."""
        if not self.decided:
            return math.nan
        return minimum_detectable(self.se, self.df, self.alpha)


def minimum_detectable(se: float, df: float, alpha: float, power: float = POWER) -> float:
    """The effect d with P(two-sided t test at ``alpha`` rejects | true difference d) = ``power``, for a test
    with standard error ``se`` and ``df`` degrees of freedom (the noncentral t's power, solved for d)."""
    st = _t()
    from scipy.optimize import brentq

    crit = float(st.t.ppf(1 - alpha / 2, df))

    def shortfall(nc: float) -> float:
        lower = float(st.nct.sf(crit, df, -nc))  # P(T < -crit), by symmetry (scipy's cdf gives NaN far out)
        return float(st.nct.sf(crit, df, nc)) + (lower if math.isfinite(lower) else 0.0) - power

    hi = crit + 10.0
    while shortfall(hi) < 0:
        hi *= 2
    return brentq(shortfall, 0.0, hi, xtol=1e-10) * se


def compare(x: dict, y: dict, level: float = 0.95, family: int = 1, paired: bool = True,
            span: float = math.inf, extra_var: float = 0.0) -> Comparison:
    """``mean(x) - mean(y)`` for two arms given as {seed: value}: over their shared seeds (``paired``) or
    Welch's (every run of each). ``span``: the metric's range (high - low); the interval stays inside ±span.
    ``extra_var``: a variance the seeds cannot show, added to the estimate's (a study's: how much the arms'
    losses move when their learning rates are tuned again, :mod:`modforge.studies.lrfit`)."""
    family = max(1, family)
    x = {k: v for k, v in x.items() if math.isfinite(v)}
    y = {k: v for k, v in y.items() if math.isfinite(v)}
    if paired:
        keys = sorted(set(x) & set(y))
        d = [x[k] - y[k] for k in keys]
        n = len(d)
        c = Comparison(statistics.fmean(d) if d else math.nan, n, "paired", level, family, n_x=len(x), n_y=len(y))
        if n < MIN_PAIRS:
            c.why = f"{n} shared seed{'s' * (n != 1)}: at least {MIN_PAIRS} pairs decide"
            return c
        sd = statistics.stdev(d)
        if sd == 0:
            c.why = f"all {n} differences equal ({c.estimate:+.4g}): no spread to judge them by"
            return c
        c.se, c.df = math.sqrt(sd * sd / n + extra_var), n - 1
        c.corr, c.removed = pairing(x, y)
    else:
        xs, ys = list(x.values()), list(y.values())
        nx, ny = len(xs), len(ys)
        c = Comparison(statistics.fmean(xs) - statistics.fmean(ys) if xs and ys else math.nan, min(nx, ny),
                       "welch", level, family, n_x=nx, n_y=ny)
        if min(nx, ny) < MIN_PAIRS:
            c.why = f"an arm with {min(nx, ny)} run{'s' * (min(nx, ny) != 1)}: at least {MIN_PAIRS} in each decide"
            return c
        vx, vy = statistics.variance(xs) / nx, statistics.variance(ys) / ny
        if vx + vy == 0:
            c.why = "every run of both arms equal: no spread to judge the difference by"
            return c
        c.df = (vx + vy) ** 2 / (vx ** 2 / (nx - 1) + vy ** 2 / (ny - 1))
        c.se = math.sqrt(vx + vy + extra_var)
    st = _t()
    half = float(st.t.ppf(1 - c.alpha / 2, c.df)) * c.se
    c.low, c.high = max(c.estimate - half, -span), min(c.estimate + half, span)
    c.p = float(2 * st.t.sf(abs(c.estimate) / c.se, c.df))
    return c


def pairing(x: dict, y: dict) -> tuple:
    """(correlation of two arms over the seeds both finished, share of the unpaired variance the pairing removes);
    NaN for fewer than two pairs or an arm without spread."""
    keys = sorted(k for k in x if k in y and math.isfinite(x[k]) and math.isfinite(y[k]))
    xs, ys = [x[k] for k in keys], [y[k] for k in keys]
    if len(keys) < 2:
        return math.nan, math.nan
    vx, vy = statistics.variance(xs), statistics.variance(ys)
    if not (vx > 0 and vy > 0):
        return math.nan, math.nan
    return statistics.correlation(xs, ys), 1 - statistics.variance([a - b for a, b in zip(xs, ys)]) / (vx + vy)


def signed_rank_counts(n: int) -> list:
    """How many of the 2^n sign patterns of n untied paired differences give each value 0..n(n+1)/2 of
    Wilcoxon's signed-rank statistic T+ (the exact null law, by counting subsets of the ranks 1..n)."""
    counts = [1]
    for r in range(1, n + 1):
        grown = counts + [0] * r
        for s, c in enumerate(counts):
            grown[s + r] += c
        counts = grown
    return counts


def hodges_lehmann(d: Sequence[float], level: float = 0.95) -> tuple:
    """A robust location of paired differences: (Hodges-Lehmann estimate, low, high, the interval's exact
    coverage). The estimate is the median of the n(n+1)/2 Walsh averages (d_i + d_j)/2, i <= j; the interval is
    Wilcoxon's signed-rank one (Hollander and Wolfe 1999, sec. 3.3): the Walsh averages of ranks C and N + 1 - C,
    C the largest with P(T+ < C) <= (1 - level)/2 under the exact null law, so its coverage is at least ``level``
    when the differences are symmetric about their centre. A minority of outlying differences (a spike) moves it
    little: its breakdown point is 29%, where one spike moves a mean without bound. With too few pairs for the
    level (the smallest two-sided tail of n pairs is 2 / 2^n) the interval is (-inf, inf)."""
    xs = sorted(float(x) for x in d if math.isfinite(x))
    n = len(xs)
    if not n:
        return math.nan, math.nan, math.nan, math.nan
    walsh = sorted((xs[i] + xs[j]) / 2 for i in range(n) for j in range(i, n))
    est = statistics.median(walsh)
    counts, total = signed_rank_counts(n), 2.0 ** n
    below, c = 0.0, 0
    for s, k in enumerate(counts):  # P(T+ <= s), accumulated until it passes the tail
        if (below + k) / total > (1 - level) / 2:
            break
        below += k
        c = s + 1
    if c == 0:
        return est, -math.inf, math.inf, 1.0
    return est, walsh[c - 1], walsh[len(walsh) - c], 1 - 2 * below / total


def verdict(c: Comparison, better: str = "min", margin: Optional[float] = None, test: Optional[str] = None) -> tuple:
    """-> (word, what it rests on): ``better``, ``worse``, ``equivalent``, ``inconclusive`` or ``undecided``.
    ``better``: the direction in which the metric improves (min or max); ``margin``: the declared m of
    "equivalent within ±m" (None: none declared, so no equivalence can be claimed); ``test``: how the interval
    was made, as the reason says it (default: the test, its pairs and the family)."""
    if not c.decided:
        return "undecided", c.why
    if test is None and c.test == "block":
        test = f"block model, {c.n} pairs, df {c.df:g}" + (f", Dunnett over {c.family}" if c.family > 1 else "")
    test = test or f"{c.test}, n={c.n}" + (f", {c.family} in the family" if c.family > 1 else "")
    if c.low > 0 or c.high < 0:
        word = "better" if (c.estimate < 0) == (better == "min") else "worse"
        inside = margin is not None and -margin < c.low and c.high < margin
        return word, f"{test}, p={c.p_adjusted:.2g}{'; yet within ±' + format(margin, 'g') if inside else ''}"
    if margin is not None and -margin < c.low and c.high < margin:
        return "equivalent", f"within ±{margin:g}; {test}"
    return "inconclusive", f"MDE {c.mde:.3g}; {test}" + (f"; margin ±{margin:g}" if margin is not None else "")
