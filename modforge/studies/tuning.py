"""Stage one of a study: every arm tuned alike on the same grid and seeds, its setting chosen on those runs.

* **The grid** (``study.tune.params``, e.g. ``{optim.lr: [3e-4, 1e-3, 3e-3, 1e-2]}``) is crossed into settings;
  every arm runs every setting on every tuning seed, at each rung of the ladder it is tuned at.
* **The choice**: the setting with the best mean of the study's metric over the tuning seeds; a run that
  diverged or collapsed counts as the worst possible value (a setting that fails on one seed in two is not
  chosen over one that never fails). Ties go to the earlier setting in grid order.
* **Cliffs** (``cliff: {key: optim.lr, by: 0.1}``, declared with the grid): a best setting whose next-larger
  neighbour along ``key`` failed or is worse by more than ``by`` sits at the edge of stability, where two tuning
  seeds can agree and fresh seeds diverge; the next-smaller neighbour along ``key`` is chosen instead (once; when
  it exists and did not fail, and, with ``within: w``, only when it is within ``w`` of the best: a step down
  that costs more than that keeps the best). Every arm gets the same rule.
* **Edges**: a chosen value at the end of its dimension's grid is flagged; the optimum was not bracketed.
  With ``extend: n``, the grid is extended one step past that edge (a geometric step, the ratio of the two
  values nearest it; a value of 0 or a non-number is not extended) and tuned again, at most n times.
* **Transfer** (``study.transfer``): tune at the smallest rung only and carry the setting to the others by a
  declared rule (:data:`TRANSFER`).
"""
import itertools
import math
from typing import Callable, Optional

INF = math.inf


def settings(grid: dict) -> list[dict]:
    """Every combination of the grid's values, in order (the first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def key_of(setting: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


def score(values: list[float], better: str) -> float:
    """A setting's score over its tuning runs, lower is better: the mean (negated for better=max); a failed
    run (NaN: diverged, collapsed, no metric) makes it the worst."""
    if not values or any(not math.isfinite(v) for v in values):
        return INF
    m = sum(values) / len(values)
    return m if better == "min" else -m


def choose(results: dict, better: str, known: Optional[dict] = None, cliff: Optional[dict] = None) -> Optional[str]:
    """The best setting's key among ``results`` ({setting key: [values over seeds]}, in grid order), stepped down
    below a cliff when ``cliff`` ({key, by}) is given (``known``: {setting key: setting}); None when every setting
    failed."""
    scored = [(score(v, better), i, k) for i, (k, v) in enumerate(results.items())]
    best = min(scored)
    if not math.isfinite(best[0]):
        return None
    if cliff:
        below = below_cliff(best[2], results, better, known, cliff)
        if below is not None:
            return below
    return best[2]


def neighbour(key: str, known: dict, along: str, side: str, among) -> Optional[str]:
    """The setting key among ``among`` equal to ``known[key]`` except for the next value of ``along`` on ``side``
    ("up" or "down")."""
    here = known[key]
    same = [k for k in among if k in known and all(_same(known[k][o], here[o]) for o in here if o != along)]
    try:
        v = float(here[along])
        vals = [(float(known[k][along]), k) for k in same]
    except (TypeError, ValueError):
        return None
    vals = [(x, k) for x, k in vals if (x > v if side == "up" else x < v)]
    if not vals:
        return None
    return (min(vals) if side == "up" else max(vals))[1]


def below_cliff(best: str, results: dict, better: str, known: dict, cliff: dict) -> Optional[str]:
    """The next-smaller neighbour of ``best`` along ``cliff["key"]`` when its next-larger one failed or is worse
    by more than ``cliff["by"]`` and the smaller one did not fail (nor is worse than ``best`` by more than
    ``cliff["within"]``, when given); else None."""
    along, by = cliff["key"], float(cliff["by"])
    up = neighbour(best, known, along, "up", results)
    if up is None:
        return None
    gap = score(results[up], better) - score(results[best], better)
    if not gap > by:
        return None
    down = neighbour(best, known, along, "down", results)
    if down is None or not math.isfinite(score(results[down], better)):
        return None
    if cliff.get("within") is not None and score(results[down], better) - score(results[best], better) > cliff["within"]:
        return None
    return down


def edges(chosen: dict, grid: dict) -> dict:
    """{key: "low" | "high"} for each dimension whose chosen value is at an end of its (sorted) values."""
    out = {}
    for k, v in chosen.items():
        values = sorted(grid[k], key=_order)
        if len(values) > 1 and _same(v, values[0]):
            out[k] = "low"
        elif len(values) > 1 and _same(v, values[-1]):
            out[k] = "high"
    return out


def beyond(values: list, side: str) -> Optional[float]:
    """The next grid value past the ``side`` end: a geometric step by the ratio of the two values nearest it;
    None when the values are not positive numbers."""
    nums = sorted(values, key=_order)
    try:
        a, b = (float(nums[0]), float(nums[1])) if side == "low" else (float(nums[-1]), float(nums[-2]))
    except (TypeError, ValueError):
        return None
    if a <= 0 or b <= 0:
        return None
    nxt = a * a / b
    if all(float(v) == int(float(v)) for v in values):  # an integer grid (warm-up steps) stays integer
        nxt = int(round(nxt))
        return None if nxt in (int(a), 0) else nxt
    return float(f"{nxt:.6g}")


def _order(v):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _same(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(a) == str(b)


def same_rule(setting: dict, small: dict, rung: dict, width_key: str) -> dict:
    """The setting as chosen at the smallest rung (right under a parametrisation whose optimum does not move with
    size, e.g. µP)."""
    return dict(setting)


def inverse_width_rule(setting: dict, small: dict, rung: dict, width_key: str) -> dict:
    """Learning rates (every key ending in ``lr``) scaled by w_small / w: the standard parametrisation's rule for
    Adam on hidden matrices (Yang et al. 2022, Table 3, applied to every parameter), the width being the rung's
    ``width_key``."""
    w0, w = small.get(width_key), rung.get(width_key)
    if w0 is None or w is None:
        raise ValueError(f"transfer=inverse_width: every rung must set {width_key} (study.width_key)")
    return {k: (float(f"{float(v) * float(w0) / float(w):.6g}") if k.split(".")[-1].endswith("lr") else v)
            for k, v in setting.items()}


def mup_rule(setting: dict, small: dict, rung: dict, width_key: str) -> dict:
    """The setting as chosen at the smallest rung, trained under ``param=mup`` with the smallest rung's model keys
    as the base shape (modforge.models.param): there µP computes what the standard parametrisation does, so the
    setting was tuned for µP, and it holds at every larger rung."""
    sizes = [f"model.{k}" for k in MUP_SIZE_KEYS]
    if "model.d_model" not in small:
        raise ValueError("transfer=mup: the smallest rung must set model.d_model (its shape is µP's base shape)")
    for k in sizes:
        if k in rung and k not in small:
            raise ValueError(f"transfer=mup: a rung sets {k}, so the smallest rung must set it too (its value is the "
                             "base shape's)")
    base = {k.split(".", 1)[1]: small[k] for k in sizes if k in small}
    return {**setting, "param": "mup", **{f"param.base.{k}": v for k, v in base.items()}}


MUP_SIZE_KEYS = ("d_model", "n_heads", "head_dim", "d_ff", "n_layers", "enc_layers", "dec_layers")  # param.base's


TRANSFER: dict[str, Callable] = {"same": same_rule, "inverse_width": inverse_width_rule, "mup": mup_rule}
