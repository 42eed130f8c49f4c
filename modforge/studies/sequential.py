"""Adaptive seeds with the error rate held across the looks.

A comparison is looked at after ``min`` pairs, then after every ``step`` more, up to ``max`` (the planned
looks n_1 < ... < n_L). At each look, a comparison not yet decided gets its four-word verdict
(:func:`modforge.results.stats.verdict`); a decided one (better, worse, equivalent) is final and gets no more
seeds; the rest get ``step`` more, until every comparison is decided or ``max`` is reached.

**The rule: alpha spent over the planned looks, each look's share by Bonferroni.** The family's alpha is split
over the looks by a spending function of the information fraction t_j = n_j / n_L, Kim and DeMets' power
family alpha(t) = alpha * t^2 (between Pocock's flat and O'Brien-Fleming's steep rule); look j may spend
alpha_j = alpha(t_j) - alpha(t_{j-1}), shared by the k comparisons of the family (alpha_j / k each), and each
verdict at look j is read off the interval at level 1 - alpha_j / k. The probability that any false claim
(a difference that is not there, or an equivalence that is not there) is made at any look is at most
sum_j alpha_j = alpha by the union bound, whatever the dependence between looks.

Why not the exact group-sequential boundaries (Lan-DeMets with the joint normal law of the statistics): they
assume a known variance or many pairs; at 3-10 pairs the statistics are Student's t with a variance estimated
anew at every look, and the joint law the boundaries need does not hold. The union bound needs nothing but each
look's own t interval being exact, which it is; the price is a little conservatism (the looks are positively
correlated, so the true error is below alpha: :func:`simulate` measures it). Spending more at later looks
keeps the last look's power close to the fixed design's, while early looks still stop the easy comparisons.
"""
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

from modforge.results import stats

RHO = 2.0  # the spending function's power: alpha(t) = alpha * t**RHO


def looks(n_min: int, n_max: int, step: int) -> list[int]:
    """The planned numbers of pairs at which comparisons are looked at: min, min+step, ..., and max."""
    out = list(range(n_min, n_max + 1, step))
    if out[-1] != n_max:
        out.append(n_max)
    return out


def spent(level: float, planned: list[int]) -> list[float]:
    """Alpha each look may spend (the family's, before it is shared by the k comparisons); sums to 1 - level."""
    alpha, last = 1 - level, planned[-1]
    cum = [alpha * (n / last) ** RHO for n in planned]
    return [c - (cum[i - 1] if i else 0.0) for i, c in enumerate(cum)]


def look_of(n: int, planned: list[int]) -> int:
    """The index of the last planned look reached with n pairs (-1: not even the first)."""
    return max((i for i, m in enumerate(planned) if n >= m), default=-1)


@dataclass
class Decision:
    """One comparison at one look: its interval and verdict at that look's level."""

    comparison: stats.Comparison
    word: str  # better | worse | equivalent | inconclusive | undecided
    why: str
    look: int  # index into the planned looks
    final: bool  # decided (better/worse/equivalent) or at the last look


def decide(x: dict, y: dict, planned: list[int], level: float, family: int, better: str = "min",
           margin: Optional[float] = None, span: float = math.inf, explain: bool = True,
           look: Optional[int] = None, extra_var: float = 0.0) -> Decision:
    """The verdict of ``x - y`` (each {seed: value}) at planned look ``look`` (its index; None: the look its
    number of shared seeds has reached). The interval is at the level that look may spend: (1 - level) spent
    over the looks, shared by ``family``. A study passes its round's look, so that each look's alpha is spent
    once even when failed runs left fewer pairs than planned; at the last look what is not decided is
    inconclusive. ``extra_var``: the variance of the difference that the arms' tuning adds (both arms'
    ``tuning_sd`` squared, :mod:`modforge.studies.lrfit`), added to the seeds' in the interval."""
    n = len(set(k for k, v in x.items() if math.isfinite(v)) & set(k for k, v in y.items() if math.isfinite(v)))
    j = max(look_of(n, planned), 0) if look is None else look
    alpha_j = spent(level, planned)[j]
    c = stats.compare(x, y, level=1 - alpha_j, family=family, paired=True, span=span, extra_var=extra_var)
    at_last = j == len(planned) - 1
    decided = c.decided and (c.low > 0 or c.high < 0 or (margin is not None and -margin < c.low and c.high < margin))
    if not (decided or at_last):  # no verdict yet, and more seeds may come: the MDE is not worth computing
        return Decision(c, "open", c.why or f"interval [{c.low:+.4g}, {c.high:+.4g}] at look {j + 1}", j, False)
    if not explain:  # the word alone (a simulation): the MDE of an inconclusive one is not computed
        if not c.decided:
            return Decision(c, "undecided", c.why, j, True)
        word = ("better" if (c.estimate < 0) == (better == "min") else "worse") if (c.low > 0 or c.high < 0) else \
            "equivalent" if decided else "inconclusive"
        return Decision(c, word, "", j, True)
    word, why = stats.verdict(c, better, margin)
    return Decision(c, word, why, j, True)


@dataclass
class Simulated:
    """What :func:`simulate` measured over its trials."""

    claims: dict = field(default_factory=dict)  # verdict word -> share of trials whose comparison ended so
    any_false: float = 0.0  # share of trials with a false claim in the family
    mean_pairs: float = 0.0  # pairs per comparison, on average
    power: float = 0.0  # share of comparisons ending in the true verdict (better / worse / equivalent)


def simulate(effects: list[float], sd: float, n_min: int, n_max: int, step: int, level: float = 0.95,
             margin: Optional[float] = None, trials: int = 2000, seed: int = 0, fixed: Optional[int] = None) -> Simulated:
    """The adaptive procedure (or, with ``fixed=n``, the fixed design of n pairs at level 1 - alpha/k) on
    simulated paired differences: comparison i's differences are Normal(effects[i], sd). A claim is false when
    it says better/worse of a true difference of 0 (or of the other sign), or equivalent of one not inside
    the margin. Lower is better."""
    rng = random.Random(seed)
    k = len(effects)
    planned = [fixed] if fixed else looks(n_min, n_max, step)
    counts: dict = {}
    false_any = pairs = true_hits = 0
    for _ in range(trials):
        wrong = False
        for e in effects:
            d = {}
            for j, n in enumerate(planned):
                while len(d) < n:
                    d[len(d)] = rng.gauss(e, sd)
                dec = decide(d, {s: 0.0 for s in d}, planned, level, k, "min", margin, explain=False, look=j)
                if dec.final:
                    break
            pairs += len(d)
            counts[dec.word] = counts.get(dec.word, 0) + 1
            inside = margin is not None and abs(e) < margin
            truth = "better" if e < 0 and not inside else "worse" if e > 0 and not inside else \
                "equivalent" if inside else "none"
            if dec.word in ("better", "worse") and (e == 0 or dec.word != ("better" if e < 0 else "worse")):
                wrong = True
            if dec.word == "equivalent" and not inside:
                wrong = True
            true_hits += dec.word == truth
        false_any += wrong
    total = trials * k
    return Simulated({w: c / total for w, c in sorted(counts.items())}, false_any / trials, pairs / total,
                     true_hits / total)


def fixed_pairs_for(power: float, effect: float, sd: float, level: float, family: int, n_max: int = 200) -> int:
    """The fewest pairs a fixed design (one look at level 1 - alpha/k, paired t) needs for ``power`` at ``effect``:
    the noncentral t's power, exactly."""
    from scipy import stats as st

    alpha, power = (1 - level) / family, min(power, 0.999)
    for n in range(stats.MIN_PAIRS, n_max + 1):
        df, nc = n - 1, abs(effect) / (sd / math.sqrt(n))
        crit = float(st.t.ppf(1 - alpha / 2, df))
        if float(st.nct.sf(crit, df, nc)) >= power:
            return n
    return n_max


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else math.nan
