"""Adaptive seeds with the error rate held across the looks, by boundaries calibrated for the design.

A comparison is looked at after ``min`` pairs, then after every ``step`` more, up to ``max`` (the planned
looks n_1 < ... < n_L). At each look, a comparison not yet decided gets its four-word verdict; a decided one
(better, worse, equivalent) is final and gets no more seeds; the rest get ``step`` more, until every comparison
is decided, is futile, or ``max`` is reached.

**The model.** Each compared arm is read against its rung's baseline in one randomised-block model of the rung
(:func:`block_fit`: seed as block, arm as treatment; common random numbers make a seed's runs share their
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

:func:`simulate` runs this procedure (vectorised, and checked against :func:`decide_rung` on the same data) under
the nulls the shipped runs show: normal noise, spikes, failed runs, heavy tails."""
import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Optional

from modforge.results import stats
from modforge.studies import boundaries
from modforge.studies.boundaries import RHO, Layout, critical_values, spending  # noqa: F401 (RHO: the docs')

FUTILITY = 0.02  # a comparison whose chance of a decision by max is below this stops adding seeds
MIN_PAIRS = 2  # a comparison is read from this many pairs (its rung's pooled variance has df >= 1)


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


def block_fit(y, m) -> tuple:
    """The randomised-block model of a rung (seed as block, arm as treatment), for F families at once (the
    intra-block analysis; Cochran and Cox 1957, ch. 9). ``y``, ``m``: (F, a, n) values and which runs count (arm
    0 the baseline; a failed run, NaN, never counts). -> (est, factor, s2, df, pairs): each compared arm's
    estimate minus the baseline's (F, a - 1), its variance as s2 x factor, the residual mean square and its df
    (F,), and the seeds it shares with the baseline (F, a - 1). With every run present it is each arm's mean
    minus the baseline's, over sqrt(2 s2 / n), df (a - 1)(n - 1); with two arms, the paired t."""
    import numpy as np

    m = np.asarray(m, bool) & np.isfinite(y)
    w = m.astype(float)
    y = np.where(m, y, 0.0)
    k = w.sum(axis=1)  # (F, n): arms run at each seed
    inv_k = np.divide(1.0, k, out=np.zeros_like(k), where=k > 0)
    dev = (y - (y.sum(axis=1) * inv_k)[:, None, :]) * w  # within each seed
    q = dev.sum(axis=2)[:, 1:]
    c = -np.einsum("fis,fjs,fs->fij", w, w, inv_k)
    idx = np.arange(w.shape[1])
    c[:, idx, idx] += w.sum(axis=2)
    c = c[:, 1:, 1:]
    inv = np.linalg.pinv(c, hermitian=True)
    est = np.einsum("fij,fj->fi", inv, q)
    rss = (dev * dev).sum(axis=(1, 2)) - (est * q).sum(axis=1)
    df = w.sum(axis=(1, 2)) - (k > 0).sum(axis=1) - np.linalg.matrix_rank(c, hermitian=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(df > 0, np.maximum(rss, 0.0) / np.maximum(df, 1), np.nan)
    pairs = (w[:, 1:, :] * w[:, :1, :]).sum(axis=2)
    return est, np.einsum("fii->fi", inv), s2, df, pairs


def pool(s2: float, df: float, ss_borrowed: float, df_borrowed: int) -> tuple:
    """The block model's residual mean square pooled with a borrowed sum of squares: (s2, df)."""
    if not df_borrowed:
        return s2, df
    rss = s2 * df if df > 0 else 0.0
    return (rss + ss_borrowed) / (df + df_borrowed), df + df_borrowed


def rung_arrays(values: dict, arms: list) -> tuple:
    """``values`` ({arm: {seed: value}}) of ``arms`` (baseline first) as (1, a, n) values and mask over the
    union of their seeds, and the seeds."""
    import numpy as np

    seeds = sorted({s for a in arms for s in values[a]})
    y = np.array([[[values[a].get(s, math.nan) for s in seeds] for a in arms]], float)
    return y, np.isfinite(y), seeds


def comparison(x: dict, y: dict, est: float, factor: float, s2: float, df: float, pairs: int, crit: float,
               span: float = math.inf, extra_var: float = 0.0) -> stats.Comparison:
    """One contrast of the rung's block model as a :class:`~modforge.results.stats.Comparison`: its interval
    est ± crit se (se from s2 x factor plus ``extra_var``; cut at ±span), at the level ``crit`` has for a single
    t with ``df``; the correlation of the two arms over the seeds they share."""
    pairs = int(pairs)
    c = stats.Comparison(float(est), pairs, "block", 0.95, 1, n_x=sum(map(math.isfinite, x.values())),
                         n_y=sum(map(math.isfinite, y.values())))
    if pairs < MIN_PAIRS or not df >= 1:
        c.why = f"{pairs} shared seed{'s' * (pairs != 1)}: at least {MIN_PAIRS} pairs (and a residual df) decide"
        return c
    if not s2 > 0:
        c.why = "the rung's runs have no spread to judge them by"
        return c
    st = stats._t()
    c.se, c.df = math.sqrt(s2 * factor + extra_var), float(df)
    c.level = 1 - 2 * float(st.t.sf(crit, df)) if math.isfinite(crit) else 1.0
    half = crit * c.se
    c.low, c.high = max(c.estimate - half, -span), min(c.estimate + half, span)
    c.p = float(2 * st.t.sf(abs(c.estimate) / c.se, df))
    keys = sorted(k for k in x if k in y and math.isfinite(x[k]) and math.isfinite(y[k]))
    xs, ys = [x[k] for k in keys], [y[k] for k in keys]
    if len(keys) >= 2 and statistics.variance(xs) > 0 and statistics.variance(ys) > 0:
        c.corr = statistics.correlation(xs, ys)
        d = [a - b for a, b in zip(xs, ys)]
        c.removed = 1 - statistics.variance(d) / (statistics.variance(xs) + statistics.variance(ys))
    return c


def futile(c: stats.Comparison, s2: float, n_max: int, crit_last: float, margin: Optional[float],
           extra_var: float = 0.0) -> bool:
    """Whether a comparison's chance of any decision at the last look (``n_max`` pairs, critical value
    ``crit_last``) is under :data:`FUTILITY`, its current estimate taken as the truth."""
    from scipy.stats import norm

    n = c.n
    if n >= n_max or not math.isfinite(c.estimate) or not s2 > 0:
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
    y, m, _ = rung_arrays(values, arms)
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
        c = comparison(values[a], values[baseline], e_, f_, s2_, df_, n, c_look, span, extra_var.get(a, 0.0))
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
                                                 extra_var.get(a, 0.0)):
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


# --------------------------------------------------------------------------- simulation

@dataclass
class Rung:
    """One rung's truth for :func:`simulate`: each compared arm's true mean difference from the baseline, the
    runs' noise (sd; ``tails``: normal or t3, scaled to that sd), spikes (arm index -> rate q: a run lands
    U(0.1, 0.3) high with probability q, its arm's bulk shifted by -0.2 q so its mean stays), failed runs (each
    missing with probability ``missing``) and a seed effect shared by the rung's arms (sd ``seed_sd``). A spiky
    arm is *prone* (its tuning failed near its rate) when ``prone`` says so, or, with ``prone=None``, when one of
    its ``tune_runs`` tuning runs near its rate spiked (each with its probability q); its unseen trouble is
    allowed ``spike_size``."""

    effects: list
    sd: float = 1.0
    spikes: dict = field(default_factory=dict)  # 0 = the baseline, i = compared arm i
    missing: float = 0.0
    tails: str = "normal"
    seed_sd: float = 0.0
    prone: Optional[bool] = None
    tune_runs: int = 4
    spike_size: float = 0.2
    borrowed_df: int = 0  # a variance of the same noise with this many df, pooled in (the tuning runs')


@dataclass
class Simulated:
    """What :func:`simulate` measured over its families."""

    any_false: float = 0.0  # share of families with a false claim
    claims: dict = field(default_factory=dict)  # verdict word -> share of comparisons ending so
    power: float = 0.0  # share of comparisons ending in a true verdict (a difference of its sign; equivalent)
    runs: float = 0.0  # comparison runs per family, on average (baselines included)
    families: int = 0

    @property
    def se(self) -> float:
        """The Monte Carlo standard error of ``any_false``."""
        p = self.any_false
        return math.sqrt(max(p * (1 - p), 1e-12) / self.families) if self.families else math.nan


def draw(rungs: list, n_max: int, families: int, rng) -> list:
    """Each rung's runs for ``families`` families: (values, prone, borrowed), values (families, arms, n_max)
    with NaN where a run failed, prone (families, arms) the arms whose tuning showed trouble near their rate,
    borrowed (sums of squares (families,), df) of the same noise from other runs."""
    import numpy as np

    out = []
    for r in rungs:
        a = len(r.effects) + 1
        if r.tails == "t3":
            e = rng.standard_t(3, (families, a, n_max)) * r.sd / math.sqrt(3.0)
        else:
            e = rng.standard_normal((families, a, n_max)) * r.sd
        y = e + np.asarray([0.0, *r.effects])[None, :, None] + rng.standard_normal((families, 1, n_max)) * r.seed_sd
        for i, q in r.spikes.items():
            hit = rng.random((families, n_max)) < q
            y[:, i, :] += np.where(hit, rng.uniform(0.1, 0.3, (families, n_max)), 0.0) - 0.2 * q
        if r.missing:
            y[rng.random(y.shape) < r.missing] = np.nan
        prone = np.zeros((families, a), bool)
        for i, q in r.spikes.items():
            prone[:, i] = r.prone if r.prone is not None else rng.random(families) < 1 - (1 - q) ** r.tune_runs
        borrowed = (rng.chisquare(r.borrowed_df, families) * r.sd ** 2 if r.borrowed_df else np.zeros(families),
                    r.borrowed_df)
        out.append((y, prone, borrowed))
    return out


def run_vectorised(ys: list, planned: list, crit: list, margin: Optional[float], better: str = "min",
                   use_futility: bool = True, spike: float = 0.1, sizes: Optional[list] = None,
                   level: float = 0.95) -> list:
    """The procedure on drawn runs (:func:`draw`), every family at once: per rung, (words, looks, runs) with
    words an int array (families, arms - 1): 0 open/inconclusive, 1 better, 2 worse, 3 equivalent, 4 undecided.
    ``sizes``: each rung's allowed spike size for its prone arms."""
    import numpy as np
    from scipy.stats import beta, norm
    from scipy.stats import t as tdist

    out = []
    L, n_max = len(planned), planned[-1]
    sign = 1.0 if better == "min" else -1.0
    family = max(1, sum(y[0].shape[1] - 1 for y in ys))
    alpha = (1 - level) / (2 * family)
    for r_i, (y, prone, (ss_b, df_b)) in enumerate(ys):
        F, a, _ = y.shape
        k = a - 1
        if not k:  # a rung with only its baseline compares nothing
            out.append((np.zeros((F, 0), int), np.zeros((F, 0), int), np.zeros(F)))
            continue
        size = (sizes or [0.2] * len(ys))[r_i]
        word = np.zeros((F, k), int)
        done = np.zeros((F, k), bool)
        stop = np.full((F, k), n_max)  # the seeds each comparison ran to
        at = np.full((F, k), L - 1)
        col = np.arange(n_max)
        fin = np.isfinite(y)
        for j, n in enumerate(planned):
            open_ = ~done
            ran = np.where(open_[:, :, None], col[None, None, :] < n, col[None, None, :] < stop[:, :, None])
            base = col[None, None, :] < np.where(open_, n, stop).max(axis=1)[:, None, None]  # while any is open
            m = np.concatenate([base, ran], axis=1)
            with np.errstate(all="ignore"), warnings.catch_warnings():  # trouble: failed runs, and spikes
                warnings.simplefilter("ignore", RuntimeWarning)  # an arm with no finished run: its median is NaN
                med = np.nanmedian(np.where(m & fin, y, np.nan), axis=2)
                excess = np.where(m & fin, sign * (y - med[:, :, None]), -np.inf)
                spiked = (excess > spike).sum(axis=2)
                worst = np.where(spiked > 0, excess.max(axis=2), 0.0)
                bad = spiked  # a failed run is only missing from the model
            est, factor, s2, df, pairs = block_fit(y, m & (bad == 0)[:, :, None])
            if df_b:
                s2, df = (np.where(df > 0, s2 * df, 0.0) + ss_b) / (df + df_b), df + df_b
            with np.errstate(all="ignore"):
                own = (bad[:, 1:] + bad[:, :1]) > 0
                pm = m[:, 1:, :] & m[:, :1, :] & fin[:, 1:, :] & fin[:, :1, :]
                d = np.where(pm, y[:, 1:, :] - y[:, :1, :], 0.0)
                n_own = pm.sum(axis=2)
                mean_own = d.sum(axis=2) / n_own
                var_own = np.where(pm, (d - mean_own[:, :, None]) ** 2, 0.0).sum(axis=2) / (n_own - 1)
                e = np.where(own, mean_own, est)
                se2 = np.where(own, var_own / n_own, s2[:, None] * factor)
                dfc = np.where(own, n_own - 1, df[:, None])
                nc = np.where(own, n_own, pairs)
            planned_df = k * (n - 1) + df_b
            cj = np.full((F, k), crit[j])
            short = (dfc != planned_df) & (dfc >= 1)
            if math.isfinite(crit[j]) and short.any():
                cj[short] = tdist.isf(tdist.sf(crit[j], planned_df), dfc[short])
            done_a = (m & fin).sum(axis=2)
            with np.errstate(all="ignore"):
                upper = np.where(spiked < done_a, beta.ppf(1 - alpha, spiked + 1, np.maximum(done_a - spiked, 1)),
                                 1.0)
                allow = np.where(prone | (bad > 0), np.where(done_a >= 1, np.maximum(
                    0.0, upper - spiked / np.maximum(done_a, 1)), 1.0) * np.maximum(np.where(prone, size, 0.0),
                                                                                     worst), 0.0)
                up, down = (allow[:, 1:], allow[:, :1]) if better == "min" else (allow[:, :1], allow[:, 1:])
                se = np.sqrt(se2)
                low, high = e - cj * se - down, e + cj * se + up
            valid = (nc >= MIN_PAIRS) & (dfc >= 1) & (se2 > 0)
            differs = valid & ((low > 0) | (high < 0))
            inside = valid & ~differs & (margin is not None) & (low > -(margin or 0)) & (high < (margin or 0))
            new = open_ & (differs | inside)
            w = np.where(differs, np.where((e < 0) == (better == "min"), 1, 2), np.where(inside, 3, 0))
            if j == L - 1:
                w = np.where(valid, w, 4)
                new = open_
            elif use_futility:
                v1 = se2 * nc  # one difference's variance
                h = crit[-1] * np.sqrt(v1 / n_max)
                with np.errstate(all="ignore"):
                    spread = np.sqrt(v1 * np.maximum(n_max - nc, 0)) / n_max
                    p = norm.cdf((e - h) / spread) + norm.cdf((-h - e) / spread)
                    if margin is not None:
                        p = p + np.where(margin > h, np.maximum(0.0, norm.cdf((margin - h - e) / spread) -
                                                                  norm.cdf((-margin + h - e) / spread)), 0.0)
                fut = open_ & valid & ~(differs | inside) & (nc < n_max) & (p < FUTILITY)
                new = new | fut
            word = np.where(new, w, word)
            at = np.where(new, j, at)
            stop = np.where(new, n, stop)
            done = done | new
        runs = stop.sum(axis=1) + (stop.max(axis=1) if k else 0)
        out.append((word, at, runs))
    return out


def run_reference(ys: list, planned: list, crit: list, margin: Optional[float], better: str = "min",
                  use_futility: bool = True, spike: float = 0.1, sizes: Optional[list] = None,
                  level: float = 0.95, families: Optional[int] = None) -> list:
    """The same as :func:`run_vectorised`, family by family through :func:`decide_rung` (the code a study
    runs): the check that the simulation simulates the procedure."""
    import numpy as np

    codes = {"open": 0, "inconclusive": 0, "better": 1, "worse": 2, "equivalent": 3, "undecided": 4}
    family = sum(y[0].shape[1] - 1 for y in ys)
    out = []
    for r_i, (y, prone, (ss_b, df_b)) in enumerate(ys):
        F = y.shape[0] if families is None else families
        k = y.shape[1] - 1
        size = (sizes or [0.2] * len(ys))[r_i]
        word, at, runs = np.zeros((F, k), int), np.zeros((F, k), int), np.zeros(F)
        for f in range(F):
            arms = ["b", *[f"a{i}" for i in range(k)]]
            values = {name: {} for name in arms}
            flags = {name: size for i, name in enumerate(arms) if prone[f, i]}
            open_ = arms[1:]
            have = 0
            for j, n in enumerate(planned):
                for name in [arms[0], *open_]:
                    i = arms.index(name)
                    for s in range(have, n):
                        values[name][s] = float(y[f, i, s])
                have = n
                dec = decide_rung(values, "b", arms[1:], open_, j, crit, better, margin, planned=planned,
                                  use_futility=use_futility, explain=False, spike=spike, prone=flags,
                                  family=family, level=level, borrowed=(float(ss_b[f]), df_b))
                for name, dd in dec.items():
                    if dd.final:
                        i = arms.index(name) - 1
                        word[f, i], at[f, i] = codes[dd.word], j
                open_ = [name for name in open_ if not dec[name].final]
                if not open_:
                    break
            runs[f] = sum(len(v) for v in values.values())
        out.append((word, at, runs))
    return out


def simulate(rungs: list, planned: list, level: float = 0.95, margin: Optional[float] = None,
             families: int = 20_000, seed: int = 0, rho: float = RHO, use_futility: bool = True,
             crit: Optional[list] = None, spike: float = 0.1, draws: int = boundaries.DRAWS) -> Simulated:
    """The procedure on ``families`` simulated families (:class:`Rung` each), its boundaries calibrated for the
    design (or ``crit``). A claim is false when it says better/worse of a true mean difference of 0 (or of the
    other sign), or equivalent of one not inside the margin."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if crit is None:
        crit = critical_values(Layout(tuple(len(r.effects) + 1 for r in rungs), tuple(planned), level, rho, draws,
                                      borrowed=tuple(r.borrowed_df for r in rungs)))
    ys = draw(rungs, planned[-1], families, rng)
    res = run_vectorised(ys, planned, crit, margin, use_futility=use_futility, sizes=[r.spike_size for r in rungs],
                         level=level, spike=spike)
    wrong = np.zeros(families, bool)
    hits = total = 0
    counts: dict = {}
    names = {0: "inconclusive", 1: "better", 2: "worse", 3: "equivalent", 4: "undecided"}
    runs = np.zeros(families)
    for r, (word, _, n_runs) in zip(rungs, res):
        runs += n_runs
        for i, e in enumerate(r.effects):
            w = word[:, i]
            inside = margin is not None and abs(e) < margin
            false = ((w == 1) & (e >= 0)) | ((w == 2) & (e <= 0))
            if not inside:
                false |= w == 3
            wrong |= false
            right = ((w == 1) & (e < 0)) | ((w == 2) & (e > 0))  # a true difference, of its sign (inside the
            if inside:  # margin too: "better, yet within the margin"), or a true equivalence
                right |= w == 3
            hits += int(right.sum())
            total += families
            for code, name in names.items():
                counts[name] = counts.get(name, 0) + int((w == code).sum())
    return Simulated(float(wrong.mean()), {k: v / total for k, v in counts.items() if v}, hits / total,
                     float(runs.mean()), families)


def against_fixed(rungs: list, looks: list, margin: Optional[float], level: float = 0.95, families: int = 2000,
                  n_most: int = 60, paired: bool = False) -> dict:
    """What the sequential design spends against the smallest fixed design that makes as many right decisions,
    both simulated at the same truths (``rungs``): {"decisions", "runs", "fixed_seeds", "fixed_runs", "ratio",
    "false"} (``fixed_seeds`` inf when no fixed design up to ``n_most`` seeds makes as many). The fixed design is
    one look, the block model at Dunnett's critical value, nothing borrowed; ``paired``: instead each comparison's
    own paired t (n - 1 df), exact for the family as if its comparisons were independent (Sidak), as a sweep's
    report reads them today."""
    k = sum(len(r.effects) for r in rungs)
    arms = sum(len(r.effects) + 1 for r in rungs)
    seq = simulate(rungs, looks, level, margin, families, seed=1, draws=50_000)
    want = seq.power * k
    plain = [Rung([e], sd=r.sd) for r in rungs for e in r.effects] if paired else [Rung(r.effects, sd=r.sd)
                                                                                     for r in rungs]
    n = math.inf
    for m in range(2, n_most + 1):
        if simulate(plain, [m], level, margin, families, seed=2, use_futility=False, draws=50_000).power * k >= \
                want - 1e-9:
            n = m
            break
    return {"decisions": want, "runs": seq.runs, "fixed_seeds": n, "fixed_runs": n * arms,
            "ratio": seq.runs / (n * arms), "false": seq.any_false}

