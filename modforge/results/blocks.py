"""Every arm of a comparison in one model: seed as block, arm as treatment, contrasts against the baseline with
Dunnett's simultaneous intervals.

With common random numbers two runs of one seed see the same batches and start from the same draws, so a seed
is a block: y = mu + alpha_arm + beta_seed + e. The intra-block least-squares fit (Cochran and Cox 1957, ch. 9)
estimates each arm's difference from the baseline from every run of the comparison at once, and its residual
variance has (a - 1)(n - 1) degrees of freedom for a arms at n seeds, where each arm's own paired t has n - 1:
15 instead of 5 for four arms at six seeds. With two arms it *is* the paired t.

The family of the a - 1 contrasts against the baseline is read with Dunnett's critical value (Dunnett 1955):
the quantile of max |T_i| over the contrasts, whose joint law (a multivariate t with correlation 1/2 between
contrasts that share the baseline, on complete data) does not depend on the unknown variance or the seed
effects. It is computed here by quadrature (deterministic, to about 1e-9), not by Bonferroni's bound, which
spends less than the family's alpha. With runs missing the correlations move a little from 1/2; the critical
value is then the complete design's at the model's residual df (the same rule as the study's sequential
boundaries, :mod:`modforge.studies.boundaries`). A sweep's report (:mod:`modforge.results.tables`) and a
study's comparison (:mod:`modforge.studies.sequential`) both read their contrasts from :func:`block_fit`, so
they never disagree on the model; the study's critical values also account for its looks.

The model's premise is one noise level for every arm. Where one arm is much noisier it is judged by a variance
too small for it (simulated, 3 arms at 6 seeds, nothing differs: one compared arm 5x noisier, 7.1% false claims;
the baseline 5x noisier, 9.4%). A pre-test of equal spread (Brown-Forsythe) catches too few such tables at a
few seeds to help (7.1% to 6.7%), so none is made: a study reads an arm with spiked runs on its own pairs
(:mod:`modforge.studies.sequential`), and a sweep's report offers ``model=paired``."""
import math
from functools import lru_cache

from modforge.results import stats

HERMITE_NODES = 96
MIN_PAIRS = 2  # a contrast is read from this many pairs (the model's residual has df >= 1)


def block_fit(y, m) -> tuple:
    """The randomised-block model of a comparison (seed as block, arm as treatment), for F families at once (the
    intra-block analysis). ``y``, ``m``: (F, a, n) values and which runs count (arm 0 the baseline; a failed run,
    NaN, never counts). -> (est, factor, s2, df, pairs): each compared arm's estimate minus the baseline's
    (F, a - 1), its variance as s2 x factor, the residual mean square and its df (F,), and the seeds it shares
    with the baseline (F, a - 1). With every run present it is each arm's mean minus the baseline's, over
    sqrt(2 s2 / n), df (a - 1)(n - 1); with two arms, the paired t."""
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
    within = (dev * dev).sum(axis=(1, 2))
    rss = within - (est * q).sum(axis=1)
    rss = np.where(rss <= 1e-12 * within, 0.0, rss)  # an additive fit leaves rounding, not spread
    df = w.sum(axis=(1, 2)) - (k > 0).sum(axis=1) - np.linalg.matrix_rank(c, hermitian=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(df > 0, np.maximum(rss, 0.0) / np.maximum(df, 1), np.nan)
    pairs = (w[:, 1:, :] * w[:, :1, :]).sum(axis=2)
    return est, np.einsum("fii->fi", inv), s2, df, pairs


def arrays(values: dict, arms: list) -> tuple:
    """``values`` ({arm: {seed: value}}) of ``arms`` (baseline first) as (1, a, n) values and mask over the
    union of their seeds, and the seeds."""
    import numpy as np

    seeds = sorted({s for a in arms for s in values[a]})
    y = np.array([[[values[a].get(s, math.nan) for s in seeds] for a in arms]], float)
    return y, np.isfinite(y), seeds


def dunnett_cdf(c: float, k: int, df: float) -> float:
    """P(max_i |T_i| < c) for k contrasts against one baseline on complete data (correlation 1/2), with ``df``
    residual degrees of freedom (inf: a known variance). Given the baseline's standardised value z and the
    scale S = sqrt(chi2_df / df), the k contrasts are independent: the chance is
    E_S E_z [Phi(z + sqrt2 c S) - Phi(z - sqrt2 c S)]^k, by Gauss-Hermite over z and adaptive quadrature over
    S."""
    import numpy as np
    from scipy import integrate, special

    if not c > 0:
        return 0.0
    z, wz = _hermite()

    def given(s: float) -> float:
        h = math.sqrt(2.0) * c * s
        inside = special.ndtr(z + h) - special.ndtr(z - h)
        return float(np.dot(wz, inside ** k))

    if not math.isfinite(df):
        return min(1.0, given(1.0))
    log_norm, pieces = _scale_law(df)

    def density(s: float) -> float:  # S = sqrt(chi2_df / df): 2 (df/2)^(df/2) / Gamma(df/2) s^(df-1) e^(-df s^2/2)
        return math.exp(log_norm + (df - 1) * math.log(s) - df * s * s / 2)

    total = sum(integrate.quad(lambda s: density(s) * given(s), a, b, epsabs=1e-11, epsrel=1e-10, limit=200)[0]
                for a, b in pieces)
    return min(1.0, total)


@lru_cache(maxsize=1024)
def _scale_law(df: float) -> tuple:
    """log of the density's constant, and the two halves (split at the median) of S's range to 1e-13 in each
    tail."""
    chi = stats._t().chi(df, scale=1.0 / math.sqrt(df))
    lo, mid, hi = (float(chi.ppf(q)) for q in (1e-13, 0.5, 1 - 1e-13))
    return math.log(2) + (df / 2) * math.log(df / 2) - math.lgamma(df / 2), ((lo, mid), (mid, hi))


@lru_cache(maxsize=None)
def _hermite() -> tuple:
    import numpy as np

    x, w = np.polynomial.hermite_e.hermegauss(HERMITE_NODES)
    return x, w / math.sqrt(2 * math.pi)


@lru_cache(maxsize=4096)
def dunnett_critical(k: int, df: float, level: float = 0.95) -> float:
    """Dunnett's two-sided critical value: the c with P(max |T| < c) = ``level`` for ``k`` contrasts at ``df``
    (k = 1: Student's t quantile)."""
    from scipy.optimize import brentq

    if k < 1 or not df > 0:
        return math.inf
    t1 = float(stats._t().t.isf((1 - level) / 2, df))
    if k == 1:
        return t1
    bonf = float(stats._t().t.isf((1 - level) / (2 * k), df))  # Dunnett's value lies between the two
    return brentq(lambda c: dunnett_cdf(c, k, df) - level, t1, bonf + 1e-9, xtol=1e-10)


def dunnett_p(t: float, k: int, df: float) -> float:
    """The family-adjusted two-sided p of a contrast's |t| among ``k`` (Dunnett's): P(max |T| >= |t|)."""
    if not math.isfinite(t):
        return math.nan
    if k == 1:
        return float(2 * stats._t().t.sf(abs(t), df))
    return max(0.0, 1.0 - dunnett_cdf(abs(t), k, df))


def contrast(x: dict, y: dict, est: float, factor: float, s2: float, df: float, pairs: int, crit: float,
             span: float = math.inf, extra_var: float = 0.0) -> stats.Comparison:
    """One contrast of the block model as a :class:`~modforge.results.stats.Comparison`: its interval est ± crit
    se (se from s2 x factor plus ``extra_var``; cut at ±span), each at the two-sided tail ``crit`` has for a
    single t with ``df``; the correlation of the two arms over the seeds they share."""
    pairs = int(pairs)
    c = stats.Comparison(float(est), pairs, "block", 0.95, 1, n_x=sum(map(math.isfinite, x.values())),
                         n_y=sum(map(math.isfinite, y.values())))
    if pairs < MIN_PAIRS or not df >= 1:
        c.why = f"{pairs} shared seed{'s' * (pairs != 1)}: at least {MIN_PAIRS} pairs (and a residual df) decide"
        return c
    if not s2 > 0:
        c.why = "the runs have no spread to judge them by"
        return c
    st = stats._t()
    c.se, c.df = math.sqrt(s2 * factor + extra_var), float(df)
    c.level = 1 - 2 * float(st.t.sf(crit, df)) if math.isfinite(crit) else 1.0
    half = crit * c.se
    c.low, c.high = max(c.estimate - half, -span), min(c.estimate + half, span)
    c.p = float(2 * st.t.sf(abs(c.estimate) / c.se, df))
    c.corr, c.removed = stats.pairing(x, y)
    return c


def against_baseline(values: dict, base, members: list, level: float = 0.95, span: float = math.inf,
                     family: int = 0) -> dict:
    """The fixed design: every member against ``base`` in one block model of their runs ({arm: {seed: value}},
    failed runs absent or NaN), Dunnett's critical value for the family at the model's df. ``family``: the
    family's size when it declared more comparisons than have runs (they count). -> {member: Comparison} with
    ``family`` the number of contrasts, ``level`` the family's, ``tail`` each interval's two-sided tail and
    ``p_family`` Dunnett's adjusted p."""
    arms = [base] + [a for a in members if a != base]
    y, m, _ = arrays(values, arms)
    est, factor, s2, df, pairs = (v[0] for v in block_fit(y, m))
    k = max(len(arms) - 1, family)
    crit = dunnett_critical(k, float(df), level) if df >= 1 else math.inf
    out = {}
    for i, a in enumerate(arms[1:]):
        c = contrast(values[a], values[base], est[i], factor[i], s2, df, pairs[i], crit, span)
        c.level, c.family = level, k
        if c.decided:
            c.tail = 2 * float(stats._t().t.sf(crit, c.df))
            c.p_family = dunnett_p(c.estimate / c.se, k, c.df)
        out[a] = c
    return out

