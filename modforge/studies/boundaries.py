"""Group-sequential critical values, calibrated by Monte Carlo under the model the comparison uses.

The comparison (:mod:`modforge.studies.sequential`) reads each compared arm against its rung's baseline in one
randomised-block model of the rung (seed as block, arm as treatment: y = mu + alpha_arm + beta_seed + e), its
variance from the model's residuals (df (a - 1)(n - 1) for a rung of a arms at n seeds, where a paired t has
n - 1). Under that model with e ~ Normal(0, sigma^2), every contrast's t statistic is free of sigma and of the
seed effects, so the joint law of the family's statistics at every planned look is known once the design is (the
arms per rung and the looks): Jennison and Turnbull (2000), ch. 11. At one look it is Dunnett's multivariate t.
A variance borrowed from other runs of the same noise (``borrowed`` df per rung: the study's tuning runs at the
chosen rates) is pooled into the residual's, as an independent chi-square. Its critical values are computed here once per
design, by simulation, and kept.

**Spending.** The family's alpha is spent over the looks by alpha(t) = alpha t^rho, t = n_j / n_max (Kim and
DeMets' power family; rho = 3 by default: less early than the union-bound design's rho = 2, whose first looks
stopped comparisons on three pairs). The critical value c_j of look j is the one at which the chance, under
the global null, that max |T| over the family first exceeds c at look j (and at no earlier look) is exactly
alpha(t_j) - alpha(t_{j-1}) (to Monte Carlo error): the looks' correlation is used, not bounded away.

**What it guarantees.** Under the model (normal noise, equal variance within a rung), the chance of any false
claim (better or worse of a true difference of zero, or of the other sign; equivalent of a difference outside
the margin), at any look, in the whole family, is at most alpha: a decided comparison stops, which only
removes chances to err; futility stops are non-binding (the boundaries do not count on them). Under noise the
model does not have (spikes, heavy tails, runs that fail), the error is measured by simulation
(:func:`modforge.studies.simulation.simulate`), not assumed."""
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

RHO = 3.0
DRAWS = 200_000
CHUNK = 20_000


@dataclass(frozen=True)
class Layout:
    """A comparison design as the boundaries see it: the arms of each rung (baseline included), the planned
    looks (pairs of seeds at each), the family's level, the spending shape, and the Monte Carlo's size."""

    arms: tuple  # arms per rung, e.g. (3,) or (4, 4, 4)
    looks: tuple  # e.g. (2, 4, 6, 8, 10, 12)
    level: float = 0.95
    rho: float = RHO
    draws: int = DRAWS
    seed: int = 0
    borrowed: tuple = ()  # per rung: df of a variance estimate from other runs pooled in (0: none)

    @property
    def family(self) -> int:
        return sum(a - 1 for a in self.arms)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def spending(level: float, looks: tuple, rho: float = RHO) -> list:
    """Alpha each look may spend: alpha (n_j / n_max)^rho - alpha (n_{j-1} / n_max)^rho; the sum is 1 - level."""
    alpha, last = 1 - level, looks[-1]
    cum = [alpha * (n / last) ** rho for n in looks]
    return [c - (cum[i - 1] if i else 0.0) for i, c in enumerate(cum)]


def null_maxima(layout: Layout, draws: int, rng) -> "np.ndarray":
    """max |T| over the family at each look, for ``draws`` families under the global null: shape (draws, looks).
    Each rung's statistics are the block model's (:func:`modforge.results.blocks.block_fit`) on complete
    data: arm mean minus baseline mean, over sqrt(2 s^2 / n), s^2 the two-way residual mean square."""
    import numpy as np

    looks = np.asarray(layout.looks)
    out = np.zeros((draws, len(looks)))
    n = looks.astype(float)
    for r, a in enumerate(layout.arms):
        y = rng.standard_normal((draws, a, looks[-1]))
        b = layout.borrowed[r] if r < len(layout.borrowed) else 0
        arm = np.cumsum(y, axis=2)[:, :, looks - 1]  # (draws, a, looks): each arm's sum over the first n seeds
        sq = np.cumsum((y * y).sum(axis=1), axis=1)[:, looks - 1]
        blocks = np.cumsum(y.sum(axis=1) ** 2, axis=1)[:, looks - 1]
        ss = sq - blocks / a - (arm ** 2).sum(axis=1) / n + arm.sum(axis=1) ** 2 / (a * n)
        df = (a - 1) * (n - 1) + b
        if b:
            ss = ss + rng.chisquare(b, (draws, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.abs(arm[:, 1:, :] - arm[:, :1, :]) / n / np.sqrt(2 * ss[:, None, :] / df / n)
        out = np.maximum(out, np.nan_to_num(t.max(axis=1), nan=0.0))
    return out


def calibrate(layout: Layout) -> list:
    """Each look's critical value (see the module's text). A look with fewer than 1 df is given inf (it cannot
    decide)."""
    import numpy as np

    rng = np.random.default_rng(layout.seed)
    maxima = np.concatenate([null_maxima(layout, min(CHUNK, layout.draws - i), rng)
                             for i in range(0, layout.draws, CHUNK)])
    alive = np.ones(len(maxima), bool)
    out = []
    for j, alpha_j in enumerate(spending(layout.level, layout.looks, layout.rho)):
        if min((a - 1) * (layout.looks[j] - 1) + (layout.borrowed[r] if r < len(layout.borrowed) else 0)
               for r, a in enumerate(layout.arms)) < 1:
            out.append(math.inf)
            continue
        m = np.where(alive, maxima[:, j], -np.inf)
        k = int(math.floor(alpha_j * len(m)))  # crossings this look may have
        if k < 1:
            c = float(m.max()) + 1e-9
        else:
            c = float(np.partition(m, len(m) - k)[len(m) - k])  # the k-th largest: k at or above it
        out.append(c)
        alive &= maxima[:, j] < c
    return out


def critical_values(layout: Layout, cache: Optional[Path] = None) -> list:
    """The layout's critical values, from ``cache`` (a JSON file of {layout key: {"layout", "c"}}) when it holds
    them, else calibrated and kept there."""
    if cache is not None and cache.is_file():
        try:
            kept = json.loads(cache.read_text(encoding="utf-8"))
            got = kept.get(layout.key()) if isinstance(kept, dict) else None
            if isinstance(got, dict) and got.get("layout") == json.loads(json.dumps(asdict(layout))) and \
                    isinstance(got.get("c"), list) and len(got["c"]) == len(layout.looks):
                return [math.inf if c is None else float(c) for c in got["c"]]
        except (OSError, ValueError):
            pass
    c = calibrate(layout)
    if cache is not None:
        kept = {}
        if cache.is_file():
            try:
                kept = json.loads(cache.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                kept = {}
        kept = kept if isinstance(kept, dict) else {}
        kept[layout.key()] = {"layout": asdict(layout), "c": [c_ if math.isfinite(c_) else None for c_ in c]}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(kept, indent=1), encoding="utf-8")
    return c
