"""A study's declared hypotheses and design: the ``study:`` block of an experiment config.

Written before any run, carried in every job's config, read by ``python -m modforge.report`` (the hypotheses)
and ``python -m modforge.study`` (the design: tuning grid, seeds, ladder, budget). The hypotheses: the
question, the metric and its direction, the baseline, the comparisons that form the family, the equivalence
margin, the level and the collapse tolerance. The design: ``tune`` (a grid every arm gets alike), ``seeds``
(fresh seeds for the comparison, added adaptively), ``sizes`` with ``tokens_per_param`` / ``match`` /
``target_flops`` / ``transfer`` (a ladder), ``budget`` and ``jobs``. Checked here, once, at the pre-flight of
``train`` (before any work) and again by ``report`` and ``study``.
"""
import math
from typing import Any

from modforge.errors import ConfigError

HYPOTHESES = {"question": "the question, in words", "metric": "a val metric, e.g. val/loss",
              "better": "min or max", "baseline": "the baseline's overrides, e.g. norm=layer (or a mapping, {norm: layer})",
              "compare": "the family: a list of configurations by their overrides, e.g. [norm=rms, norm=batch] "
                         "(an arm of several overrides as a mapping, {ffn: mlp, ffn.activation: silu})",
              "margin": "the equivalence margin, a positive number in the metric's units",
              "level": "the family's confidence level in [0.5, 1)",
              "collapse_tol": "nats >= 0: a final val/loss this close to the unigram model's is a collapse"}
DESIGN = {"tune": "a mapping: params ({key: [values] or {from, to, points}}, every arm alike), seeds (a list of "
                  "integers), extend (grid steps added past an edge optimum, an integer >= 0), rule (fit: a curve "
                  "fitted along key, with spike, fail_level, basin and halving: {at, keep, least}; or best: the best "
                  "mean, with cliff: {key, by, within}), scale ({arm: {key: factor}}: that arm's grid in its own "
                  "units, the same points times the factor)",
          "seeds": "a mapping of integers: min (>= 2: the first look), max (>= min), step (>= 1), start (the first fresh seed, "
                   "above every tuning seed)",
          "sizes": "a list of mappings of overrides, one per rung of the ladder, smallest first, e.g. "
                   "[{model.d_model: 64}, {model.d_model: 128}]",
          "tokens_per_param": "a positive number: each rung trains on this many tokens per non-embedding "
                              "parameter of its baseline",
          "match": "tokens (every arm of a rung trains on the same tokens) or flops (on the same training FLOPs)",
          "target_flops": "a positive number of training FLOPs at which the fitted gap is also given",
          "transfer": "null (tune at every rung), the rule that carries the smallest rung's setting up (same, "
                      "inverse_width, mup), or a mapping {arm: rule} for the arms so carried (the others are tuned "
                      "at every rung)",
          "width_key": "the key whose value is a rung's width for transfer=inverse_width (default model.d_model)",
          "carry": "a mapping: tuned (the lower rungs tuned fully, an integer >= 2, fewer than the rungs; default 3), "
                   "check (log2 offsets from the predicted rate run at each upper rung, numbers including 0; "
                   "default [-1, 0, 1]) and extend (doublings run past the check's end, one at a time, while its "
                   "best is there; an integer >= 0, default 0): each arm's rate carried up by a power law in "
                   "compute (rule: fit)",
          "budget": "a mapping: hours and/or runs, positive numbers; the study refuses a plan that could exceed "
                    "it unless started with force=true",
          "jobs": "an integer >= 1: jobs run side by side, each with its share of the cores",
          "borrow_variance": "true or false: the comparison pools the between-seed variance of the tuning runs "
                             "near each arm's chosen rate with its own (valid when their noise is the comparison "
                             "runs': same steps and data; spiked runs left out)"}
STUDY_KEYS = {**HYPOTHESES, **DESIGN}


def check_study(block: Any) -> dict:
    """The block as a plain dict, or one line naming the key, its value and what is allowed."""
    if not isinstance(block, dict):
        raise ConfigError(f"study={block!r}: a mapping of {', '.join(STUDY_KEYS)}")
    out = dict(block)
    for key in ("baseline", "compare"):  # an arm may be written as a mapping of overrides: its spec string
        if isinstance(out.get(key), dict):
            out[key] = _as_spec(out[key])
        elif key == "compare" and isinstance(out.get(key), (list, tuple)):
            out[key] = [_as_spec(v) if isinstance(v, dict) else v for v in out[key]]
    for key, value in out.items():
        if key not in STUDY_KEYS:
            raise ConfigError(f"study.{key}: not a key of a study block; keys: {', '.join(STUDY_KEYS)}")

        def bad() -> ConfigError:
            return ConfigError(f"study.{key}={value!r}: {STUDY_KEYS[key]}")

        if key in ("question", "metric") and not (isinstance(value, str) and value.strip()):
            raise bad()
        if key == "better" and value not in ("min", "max"):
            raise bad()
        if key == "baseline" and not _spec(value):
            raise bad()
        if key == "compare":
            value = [value] if isinstance(value, str) else value
            if not (isinstance(value, (list, tuple)) and value and all(_spec(v) for v in value)):
                raise bad()
            out[key] = [str(v) for v in value]
        if key in ("margin", "level", "collapse_tol", "tokens_per_param", "target_flops"):
            if not _number(value):
                raise bad()
            if (key in ("margin", "tokens_per_param", "target_flops") and value <= 0) or \
                    (key == "level" and not 0.5 <= value < 1) or (key == "collapse_tol" and value < 0):
                raise bad()
        if key == "match" and value not in ("tokens", "flops"):
            raise bad()
        if key in ("transfer", "width_key") and not (value is None or (isinstance(value, str) and value.strip())
                                                      or (key == "transfer" and isinstance(value, dict) and value
                                                          and all(isinstance(v, str) and v.strip()
                                                                  for v in value.values()))):
            raise bad()
        if key == "jobs" and not (_integer(value) and value >= 1):
            raise bad()
        if key == "borrow_variance" and not isinstance(value, bool):
            raise bad()
        if key == "sizes" and not (isinstance(value, (list, tuple)) and value and
                                   all(isinstance(r, dict) and r for r in value)):
            raise bad()
        if key == "budget":
            if not (isinstance(value, dict) and value and set(value) <= {"hours", "runs"} and
                    all(_number(v) and v > 0 for v in value.values())):
                raise bad()
        if key == "seeds":
            out[key] = _seeds(value, bad)
        if key == "tune":
            out[key] = _tune(value, bad)
        if key == "carry":
            if not (isinstance(value, dict) and set(value) <= {"tuned", "check", "extend"}):
                raise bad()
            c = {"tuned": 3, "check": [-1.0, 0.0, 1.0], "extend": 0, **value}
            if not (_integer(c["tuned"]) and c["tuned"] >= 2 and isinstance(c["check"], (list, tuple))
                    and all(_number(v) for v in c["check"]) and 0 in c["check"] and len(set(c["check"])) >= 3
                    and _integer(c["extend"]) and c["extend"] >= 0):
                raise bad()
            out[key] = {"tuned": int(c["tuned"]), "check": sorted(float(v) for v in c["check"])}
            if int(c["extend"]):  # (absent when 0: the designs declared before the key keep their identity)
                out[key]["extend"] = int(c["extend"])
    if "seeds" in out and "tune" in out and max(out["tune"]["seeds"]) >= out["seeds"]["start"]:
        raise ConfigError(f"study.seeds.start={out['seeds']['start']}: the comparison's seeds must be fresh, above "
                          f"every tuning seed (study.tune.seeds={out['tune']['seeds']})")
    if out.get("match") == "flops" and "tokens_per_param" not in out:
        raise ConfigError("study.match=flops: give study.tokens_per_param too (the baseline's tokens set the FLOPs "
                          "every arm of a rung trains on)")
    if out.get("carry"):
        rungs = len(out.get("sizes") or [])
        if rungs <= out["carry"]["tuned"]:
            raise ConfigError(f"study.carry.tuned={out['carry']['tuned']}: fewer than the ladder's rungs "
                              f"(study.sizes has {rungs}); the rungs above it are the ones carried to")
        if out.get("transfer"):
            raise ConfigError(f"study.carry: and study.transfer={out['transfer']} both carry rates up; give one")
        if "tune" not in out or out["tune"].get("rule", "fit" if not out["tune"].get("cliff") else "best") != "fit":
            raise ConfigError("study.carry: needs study.tune with rule: fit (the fitted optima the law is fitted to)")
    if out.get("transfer") and "tune" not in out:
        raise ConfigError(f"study.transfer={out['transfer']}: there is nothing to transfer without study.tune")
    if out.get("borrow_variance") is False:  # the default, said: the same design as not saying it
        del out["borrow_variance"]
    return out


def _seeds(value: Any, bad) -> dict:
    if not (isinstance(value, dict) and set(value) <= {"min", "max", "step", "start"} and
            all(_integer(v) for v in value.values())):
        raise bad()
    s = {"min": 3, "step": 1, "start": 1000, **value}
    s.setdefault("max", s["min"])
    if not (s["min"] >= 2 and s["max"] >= s["min"] and s["step"] >= 1 and s["start"] >= 0):
        raise bad()
    return s


TUNE_KEYS = ("params", "seeds", "extend", "cliff", "rule", "key", "spike", "fail_level", "basin", "halving", "scale")
HALVING = ("study.tune.halving={value!r}: true, or a mapping of at (fractions of a run's steps at which the worse "
           "settings stop, increasing, each in (0, 1); default [0.25, 0.5]), keep (the share that trains on, in "
           "(0, 1); default 0.5), least (the fewest settings of an arm kept, an integer >= 3; default 3)")


def _tune(value: Any, bad) -> dict:
    if not (isinstance(value, dict) and set(value) <= set(TUNE_KEYS) and "params" in value):
        raise bad()
    params = value["params"]
    if not (isinstance(params, dict) and params and all(_spec(f"{k}=x") for k in params)):
        raise bad()
    grid = {str(k): _values(str(k), v) for k, v in params.items()}
    seeds = value.get("seeds", [1])
    if not (isinstance(seeds, (list, tuple)) and seeds and all(_integer(s) and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise bad()
    extend = value.get("extend", 0)
    if not (_integer(extend) and extend >= 0):
        raise bad()
    cliff = value.get("cliff")
    if cliff is not None and not (isinstance(cliff, dict) and {"key", "by"} <= set(cliff) <= {"key", "by", "within"}
                                  and cliff["key"] in params and all(_number(cliff[k]) and cliff[k] >= 0
                                                                     for k in ("by", "within") if k in cliff)):
        raise bad()
    out = {"params": grid, "seeds": list(seeds), "extend": extend}
    if cliff is not None:
        out["cliff"] = {"key": str(cliff["key"]), **{k: float(cliff[k]) for k in ("by", "within") if k in cliff}}
    rates = [k for k in grid if k.split(".")[-1].endswith("lr")]
    key = value.get("key", rates[0] if len(rates) == 1 else None)
    fittable = key in grid and len([v for v in grid[key] if _number(v) and v > 0]) >= 3
    rule = value.get("rule", "fit" if cliff is None and fittable else "best")
    if rule not in ("fit", "best"):
        raise ConfigError(f"study.tune.rule={rule!r}: fit (each arm's rate from a fitted curve, clear of the edge of "
                          "stability) or best (the best mean, then the cliff rule: configs from before)")
    if rule == "fit" and cliff is not None:
        raise ConfigError("study.tune.cliff: the cliff rule goes with rule: best; rule: fit moves a rate down by "
                          "its failure model (study.tune.fail_level) instead")
    out["rule"] = rule
    for opt, ok, what in (("spike", lambda v: v > 0, "a positive number in the metric's units: a run this far "
                           "above another seed at its rate has spiked (default 0.1)"),
                          ("fail_level", lambda v: 0 < v < 0.5, "the failure probability a chosen rate may have, in "
                           "(0, 0.5) (default 0.05)"),
                          ("basin", lambda v: v > 0, "a positive number in the metric's units: the basin holds the "
                           "rates within it of the fitted minimum (default: the margin, else 0.02)")):
        if opt in value:
            if not (_number(value[opt]) and ok(value[opt])):
                raise ConfigError(f"study.tune.{opt}={value[opt]!r}: {what}")
            if rule != "fit":
                raise ConfigError(f"study.tune.{opt}: a setting of rule: fit (this block's rule is {rule})")
            out[opt] = float(value[opt])
    if value.get("scale") is not None:
        out["scale"] = _scale(value["scale"], grid)
    if "halving" in value and value["halving"] not in (None, False):
        if rule != "fit":
            raise ConfigError(f"study.tune.halving: goes with rule: fit (a fitted best beside a stopped rate "
                              f"continues that rate); this block's rule is {rule}")
        out["halving"] = _halving(value["halving"])
    if rule == "fit":
        if not fittable:
            raise ConfigError(f"study.tune.key={key!r}: rule: fit fits a curve along one tuned key, a rate of at "
                              f"least three positive values in study.tune.params (name it with key: when the grid "
                              f"has {'none' if not rates else 'several'} ending in lr)")
        out["key"] = str(key)
    return out


def _scale(value: Any, grid: dict) -> dict:
    """``study.tune.scale``: {arm: {key: factor}}: that arm's values of that key are the grid's times the factor,
    the same points in the same ratios (for an arm whose key has other units, as u-µP's rate has). Whether each
    name is an arm is checked with the arms (:func:`modforge.studies.design.design_of`)."""
    what = ("study.tune.scale={!r}: a mapping {{arm: {{key: factor}}}}, each key one of study.tune.params ("
            + ", ".join(grid) + ") and each factor a positive number: that arm's grid of the key is the declared "
            "one times the factor")
    if not (isinstance(value, dict) and value):
        raise ConfigError(what.format(value))
    out = {}
    for arm, keys in value.items():
        if not (isinstance(keys, dict) and keys and all(str(k) in grid and _number(f) and f > 0
                                                         for k, f in keys.items())):
            raise ConfigError(what.format({arm: keys}))
        out[str(arm)] = {str(k): float(f) for k, f in keys.items()}
    return out


def _halving(value: Any) -> dict:
    """``study.tune.halving`` as {at, keep, least} (``true``: the defaults), or one line."""
    h = {} if value is True else value
    bad = ConfigError(HALVING.format(value=value))
    if not (isinstance(h, dict) and set(h) <= {"at", "keep", "least"}):
        raise bad
    at = h.get("at", [0.25, 0.5])
    at = [at] if _number(at) else at
    if not (isinstance(at, (list, tuple)) and at and all(_number(f) and 0 < f < 1 for f in at) and
            all(a < b for a, b in zip(at, at[1:]))):
        raise bad
    keep, least = h.get("keep", 0.5), h.get("least", 3)
    if not (_number(keep) and 0 < keep < 1 and _integer(least) and least >= 3):
        raise bad
    return {"at": [float(f) for f in at], "keep": float(keep), "least": int(least)}


def _values(key: str, v: Any) -> list:
    """A grid's values: a list, or for a rate ``{from: a, to: b, points: n}``, n rates spaced evenly in log from a
    to b (four significant digits)."""
    if isinstance(v, dict):
        if not (set(v) == {"from", "to", "points"} and _number(v["from"]) and _number(v["to"]) and
                0 < v["from"] < v["to"] and _integer(v["points"]) and 3 <= v["points"] <= 64):
            raise ConfigError(f"study.tune.params.{key}={v!r}: a list of values, or {{from: a, to: b, points: n}} "
                              "with 0 < a < b and 3 <= n <= 64 (n rates evenly spaced in log)")
        a, b, n = float(v["from"]), float(v["to"]), int(v["points"])
        return [float(f"{a * (b / a) ** (i / (n - 1)):.4g}") for i in range(n)]
    if not (isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float, str)) for x in v)):
        raise ConfigError(f"study.tune.params.{key}={v!r}: a list of values, or {{from: a, to: b, points: n}} (a "
                          "rate's log-spaced grid)")
    return list(v)


def _as_spec(arm: dict) -> Any:
    """``{ffn: mlp, ffn.activation: silu}`` -> ``"ffn=mlp,ffn.activation=silu"`` (an empty mapping stays one, refused)."""
    if not arm:
        return arm
    return ",".join(f"{k}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}" for k, v in arm.items())


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def _spec(v: Any) -> bool:
    """``key=value[,key2=value2]``: a configuration named by its overrides."""
    return isinstance(v, str) and all("=" in p and p.split("=", 1)[0] for p in v.split(","))
