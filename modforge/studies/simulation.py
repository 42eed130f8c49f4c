"""The comparison stage simulated (:mod:`modforge.studies.sequential`'s procedure on drawn families, every family at
once): its error under the nulls the shipped runs show (normal noise, spikes, failed runs, heavy tails), its
power and the runs it spends, against the smallest fixed design making as many right decisions. The vectorised
path is checked against :func:`run_reference`, which runs :func:`~modforge.studies.sequential.decide_rung` (the
code a study calls) family by family on the same runs."""
import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

from modforge.studies import boundaries
from modforge.studies.boundaries import RHO, Layout, critical_values
from modforge.results.blocks import MIN_PAIRS, block_fit
from modforge.studies.sequential import FUTILITY, MIN_FUTILITY_DF, decide_rung

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
                fut = open_ & valid & ~(differs | inside) & (nc < n_max) & (p < FUTILITY) & (dfc >= MIN_FUTILITY_DF)
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


def plug_in(verdicts: list, arms: list, borrowed: int = 0) -> list:
    """A study's own estimates as the truths to simulate (``report.json``'s verdicts and arms, or the report's rows
    as it writes them): per rung, each compared arm's Δ and the rung's sd of a run, pooled over its arms."""
    import statistics

    rungs = []
    for rung in dict.fromkeys(v["rung"] for v in verdicts):
        effects = [v["estimate"] for v in verdicts if v["rung"] == rung and math.isfinite(v.get("estimate", math.nan))]
        sds = [a["sd"] for a in arms if a["rung"] == rung and math.isfinite(a.get("sd", math.nan))]
        if effects and sds:
            rungs.append(Rung(effects, sd=math.sqrt(statistics.fmean(x * x for x in sds)), borrowed_df=borrowed))
    return rungs

