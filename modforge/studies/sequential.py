"""Adaptive seeds with the error rate held across the looks, by boundaries calibrated for the design.

A comparison is looked at after ``min`` pairs, then after every ``step`` more, up to ``max`` (the planned
looks n_1 < ... < n_L). At each look, a comparison not yet decided gets its four-word verdict; a decided one
(better, worse, equivalent) is final and gets no more seeds; the rest get ``step`` more, until every comparison
is decided, is futile, or ``max`` is reached.

**The model.** Each compared arm is read against its rung's baseline in one randomised-block model of the rung
(:func:`~modforge.results.blocks.block_fit`: seed as block, arm as treatment; common random numbers make a seed's runs share their
batches), its standard error from the model's residual variance: df (a - 1)(n - 1) for a rung of a arms at n
seeds, where a paired t has n - 1 (a 4-arm rung at 6 seeds has 15 df, not 5). Under y = mu_arm + beta_seed + e
with normal e of one variance per rung, these statistics are free of the variance and of the seed effects:
with two arms, it is the paired t.

**The boundaries** (:mod:`modforge.studies.boundaries`): the critical value of look j is calibrated by Monte
Carlo so that, under the global null, the chance that some comparison of the family is first claimed at look
j is what the spending function alpha t^rho (rho = 3) gives it; so the family's error over every look is alpha
(to Monte Carlo error), not bounded by a union. Each verdict is read off its interval est ± c_j se: *better* /
*worse* when it excludes 0, *equivalent within ±m* when it lies inside the margin, at the last look
*inconclusive* with its minimum detectable effect.

**Futility** (non-binding): a comparison whose chance of any decision by ``max`` is under 2% (its current
estimate taken as the truth, the rest of its seeds drawn around it) gets no more seeds and ends *inconclusive*
at that look, with its MDE. The boundaries do not count on it, so stopping cannot raise the error.

:mod:`modforge.studies.simulation` runs this procedure (vectorised, and checked against :func:`decide_rung` on the
same data) under the nulls the shipped runs show: normal noise, spikes, failed runs, heavy tails."""
import math
import statistics
from dataclasses import dataclass
from typing import Optional

from modforge.results import stats
from modforge.results.blocks import MIN_PAIRS, arrays, block_fit, contrast

FUTILITY = 0.02  # a comparison whose chance of a decision by max is below this stops adding seeds
# futility is read only once the variance it takes as the truth has this many degrees of freedom: on
# ladder_ffn's top rung a 3-df variance at the first look stopped two comparisons at 2 pairs (MDE ~0.5) whose
# arms' spread would have resolved +-0.02 by 12 (experiments/ladder_ffn.md)
MIN_FUTILITY_DF = 8


def looks(n_min: int, n_max: int, step: int) -> list[int]:
    """The planned numbers of pairs at which comparisons are looked at: min, min+step, ..., and max."""
    out = list(range(n_min, n_max + 1, step))
    if out[-1] != n_max:
        out.append(n_max)
    return out


def look_of(n: int, planned: list[int]) -> int:
    """The index of the last planned look reached with n pairs (-1: not even the first)."""
    return max((i for i, m in enumerate(planned) if n >= m), default=-1)


@dataclass
class Decision:
    """One comparison at one look: its interval and verdict at that look's critical value."""

    comparison: stats.Comparison
    word: str  # better | worse | equivalent | inconclusive | undecided | open
    why: str
    look: int  # index into the planned looks
    final: bool  # decided (better/worse/equivalent), futile, or at the last look
    futile: bool = False


def pool(s2: float, df: float, ss_borrowed: float, df_borrowed: int) -> tuple:
    """The block model's residual mean square pooled with a borrowed sum of squares: (s2, df)."""
    if not df_borrowed:
        return s2, df
    rss = s2 * df if df > 0 else 0.0
    return (rss + ss_borrowed) / (df + df_borrowed), df + df_borrowed


def futile(c: stats.Comparison, s2: float, n_max: int, crit_last: float, margin: Optional[float],
           extra_var: float = 0.0, df: float = math.inf) -> bool:
    """Whether a comparison's chance of any decision at the last look (``n_max`` pairs, critical value
    ``crit_last``) is under :data:`FUTILITY`, its current estimate and variance taken as the truth; never while
    that variance has fewer than :data:`MIN_FUTILITY_DF` degrees of freedom ``df``."""
    from scipy.stats import norm

    n = c.n
    if n >= n_max or not math.isfinite(c.estimate) or not s2 > 0 or df < MIN_FUTILITY_DF:
        return False
    se_last = math.sqrt(s2 / n_max + extra_var)
    spread = math.sqrt(s2 * (n_max - n)) / n_max  # sd of the final mean given what is seen
    e, h = c.estimate, crit_last * se_last
    p = float(norm.cdf((e - h) / spread) + norm.cdf((-h - e) / spread))
    if margin is not None and margin > h:
        p += max(0.0, float(norm.cdf((margin - h - e) / spread) - norm.cdf((-margin + h - e) / spread)))
    return p < FUTILITY


def at_df(crit: float, planned_df: float, df: float) -> float:
    """A look's critical value at the pooled df the runs give (fewer than planned where runs failed or arms
    stopped): the one with the same single-t tail probability as ``crit`` at the planned df."""
    if not math.isfinite(crit) or df == planned_df or not df >= 1:
        return crit
    st = stats._t()
    return float(st.t.isf(float(st.t.sf(crit, planned_df)), df))


def troubled(values: dict, spike: float, better: str = "min") -> tuple:
    """An arm's trouble at a rung: (failed, spiked, largest excess): runs that failed (NaN: diverged or
    collapsed), runs ``spike`` or more worse than the median of its finished runs (the tuning's definition of
    a spike, :mod:`modforge.studies.lrfit`), and how far the worst of those lies from that median."""
    fin = [v for v in values.values() if math.isfinite(v)]
    med = statistics.median(fin) if fin else math.nan
    sign = 1.0 if better == "min" else -1.0
    excess = [sign * (v - med) for v in fin if sign * (v - med) > spike]
    return sum(not math.isfinite(v) for v in values.values()), len(excess), max(excess, default=0.0)


def allowance(finished: int, spiked: int, size: float, alpha: float) -> float:
    """How far an arm's spikes that its runs have not shown could still move its mean: the exact one-sided
    upper bound on its spike rate at ``alpha`` (Clopper and Pearson) less the rate its ``finished`` runs show
    (those are in the mean already), times the spike ``size``."""
    from scipy.stats import beta

    if finished < 1:
        return size
    upper = float(beta.ppf(1 - alpha, spiked + 1, finished - spiked)) if spiked < finished else 1.0
    return max(0.0, upper - spiked / finished) * size


def decide_rung(values: dict, baseline: str, compared: list, open_: list, look: int, crit: list,
                better: str = "min", margin: Optional[float] = None, span: float = math.inf,
                extra_var: Optional[dict] = None, planned: Optional[list] = None, use_futility: bool = True,
                explain: bool = True, spike: float = 0.1, prone: Optional[dict] = None,
                family: Optional[int] = None, level: float = 0.95, borrowed: tuple = (0.0, 0)) -> dict:
    """The open comparisons of one rung at planned look ``look``: {arm: Decision}. ``values``: {arm: {seed:
    value}} for the baseline and every compared arm (every run so far: a decided arm's runs still inform the
    model; NaN: a failed run); ``crit``: the critical value of each planned look; ``extra_var``: {arm: variance}
    its tuning adds (both arms', :mod:`modforge.studies.lrfit`); ``planned``: the looks' pairs (the df each
    look's critical value was calibrated at, and the last look's pairs, for futility).

    Trouble (failed or spiked runs, :func:`troubled`): a failed run is missing from the model (the arm's trouble
    rate, an outcome of its own, is the report's: :mod:`modforge.studies.writeup`); a comparison where either arm has spiked is read by its own
    paired t (its own variance: the block model's one variance per rung is what spikes break), the spikes it
    saw in its mean. An arm with trouble, or *prone* to it (``prone``: {arm: spike size} for arms whose
    tuning failed within a grid step of their rate), has the interval widened on its side by
    :func:`allowance`: the spikes its runs may not have shown yet could only make it worse. ``borrowed``: (sum
    of squares, df) of the same noise from other runs (the tuning runs at the chosen rates), pooled into the
    block model's residual."""
    extra_var, prone = extra_var or {}, prone or {}
    family = family or len(compared)
    arms = [baseline, *compared]
    trouble = {a: troubled(values[a], spike, better) for a in arms}
    bad = {a: t[1] for a, t in trouble.items()}  # spikes: a failed run is only missing from the model
    y, m, _ = arrays(values, arms)
    m[0, [i for i, a in enumerate(arms) if bad[a]], :] = False  # the block model holds the arms without spikes
    est, factor, s2, df, pairs = (v[0] for v in block_fit(y, m))
    s2, df = pool(float(s2), float(df), *borrowed)
    last = look == len(crit) - 1
    planned_df = len(compared) * (planned[look] - 1) + borrowed[1] if planned else df
    alpha = (1 - level) / (2 * family)
    allow = {a: allowance(sum(map(math.isfinite, values[a].values())), trouble[a][1],
                          max(prone.get(a, 0.0), trouble[a][2]), alpha) if a in prone or bad[a] else 0.0
             for a in arms}  # an arm with failed runs only, not prone, has no spike size to allow
    out = {}
    for a in open_:
        i = compared.index(a)
        own = bad[a] + bad[baseline] > 0
        if own:  # its own paired differences
            d = [v for v in (values[a][k] - values[baseline][k] for k in values[a] if k in values[baseline])
                 if math.isfinite(v)]
            n = len(d)
            e_, f_, s2_, df_ = (statistics.fmean(d) if d else math.nan, 1 / max(n, 1),
                                statistics.variance(d) if n > 1 else math.nan, n - 1)
        else:
            e_, f_, s2_, df_, n = est[i], factor[i], s2, df, pairs[i]
        c_look = at_df(crit[look], planned_df, df_)
        c = contrast(values[a], values[baseline], e_, f_, s2_, df_, n, c_look, span, extra_var.get(a, 0.0))
        if own:
            c.test = "paired (trouble: its own variance)"
        if not c.decided:
            out[a] = Decision(c, "undecided" if last else "open", c.why, look, last)
            continue
        up, down = (allow[a], allow[baseline]) if better == "min" else (allow[baseline], allow[a])
        if up or down:  # unseen trouble could move a - baseline up by ``up`` or down by ``down``
            c.low, c.high = max(c.low - down, -span), min(c.high + up, span)
            c.test += f"; widened by {up + down:.3g} for trouble its tuning showed and its runs have not"
        differs = c.low > 0 or c.high < 0
        inside = margin is not None and -margin < c.low and c.high < margin
        if differs or inside or last:
            out[a] = Decision(c, *verdict(c, better, margin, c_look, explain), look, True)
        elif use_futility and planned and futile(c, s2_ * f_ * c.n, planned[-1], crit[-1], margin,
                                                 extra_var.get(a, 0.0), df_):
            word, why = verdict(c, better, margin, c_look, explain)
            out[a] = Decision(c, word, f"futile: no decision likely by {planned[-1]} pairs; {why}", look, True, True)
        else:
            out[a] = Decision(c, "open", f"interval [{c.low:+.4g}, {c.high:+.4g}] at look {look + 1}", look, False)
    return out


def verdict(c: stats.Comparison, better: str, margin: Optional[float], crit: float, explain: bool = True) -> tuple:
    """(word, why) of a decided comparison at critical value ``crit`` (:func:`modforge.results.stats.verdict`);
    without ``explain`` (a simulation) an inconclusive one's MDE is not computed."""
    if not explain and not (c.low > 0 or c.high < 0 or (margin is not None and -margin < c.low and c.high < margin)):
        return "inconclusive", ""
    return stats.verdict(c, better, margin, test=f"{'block model of the rung' if c.test == 'block' else c.test}, "
                                                 f"n={c.n}, df={c.df:g}, c={crit:.3g}")
