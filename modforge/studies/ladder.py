"""A ladder of sizes in a study's report: every arm at every rung, the joint fit of loss against compute
(:mod:`modforge.studies.scaling`: shared E and exponent, each arm's compute multiplier with its interval, the
per-arm-exponent alternative, lack of fit, the held-out top rung), each rung's ranking and its agreement with the
top rung's, and the changes of ranking between rungs.

* **The gap** at the largest rung is that rung's comparison (its verdict); at a declared ``target_flops`` it is
  the joint fit's, with its interval, said to be an extrapolation past the largest rung, and *inconclusive at
  target* where the interval holds 0.
* **Ranking**: the arms ordered by their mean at each rung over the seeds every arm run there finished; a rung's
  agreement with the top rung is the share of arm pairs ordered alike (the question DataDecide asks of
  small-scale experiments), *stable from* the lowest rung from which every rung orders them as the top does;
  every pair whose order differs between two rungs is a change of ranking, marked *decided* when the verdicts against the
  baseline at those rungs say so in opposite directions (better at one, worse at the other).
"""
import math
from typing import Optional

from modforge.results.formats import markdown_table
from modforge.studies import scaling


def shared_seeds(values: dict) -> dict:
    """{arm: {rung: {seed: value}}} restricted, at each rung, to the seeds every arm finished there: the ladder's
    means, fits and gaps are then paired, as the comparisons are (arms decided early have fewer seeds). An arm
    with no run at a rung (its comparison never ran there: an unbracketed rate) is left out of that rung, not
    allowed to empty it for the others; an arm whose runs there all failed still empties it (a failure is an
    outcome, not an absence)."""
    rungs = {r for by_rung in values.values() for r in by_rung}
    done = {r: [{s for s, v in by_rung[r].items() if math.isfinite(v)} for by_rung in values.values()
                if by_rung.get(r)] for r in rungs}
    common = {r: set.intersection(*done[r]) if done[r] else set() for r in rungs}
    return {arm: {r: {s: v for s, v in by_seed.items() if s in common[r]} for r, by_seed in by_rung.items()}
            for arm, by_rung in values.items()}


def rung_means(values: dict, seeds: Optional[list] = None) -> dict:
    """{rung: mean} of {rung: {seed: value}}, over ``seeds`` (with repeats: a bootstrap draw) or every seed."""
    out = {}
    for rung, by_seed in values.items():
        xs = [by_seed[s] for s in (seeds if seeds is not None else by_seed) if s in by_seed and math.isfinite(by_seed[s])]
        out[rung] = sum(xs) / len(xs) if xs else math.nan
    return out


def record(d, values: dict, flops: dict, verdicts: list, draws: int) -> dict:
    """The ladder's part of ``report.json``: the joint fit and its checks, each rung's means and ranking."""
    rung_order = list(d.rungs)
    by_arm = shared_seeds({a: {r: values[(a, r)] for r in rung_order} for a in d.arms})
    compute = {a: {r: flops[(a, r)] for r in rung_order} for a in d.arms}
    target = d.study.get("target_flops")
    means = {r: {a: rung_means({r: by_arm[a][r]})[r] for a in d.arms} for r in rung_order}
    words = {(v["arm"], v["rung"]): v["verdict"] for v in verdicts}
    largest = max(max(compute[a].values()) for a in d.arms)
    arms = [d.baseline] + [a for a in d.arms if a != d.baseline]
    joint = None
    note = ""
    if d.better == "min":
        lad = scaling.Ladder(arms, rung_order, {(a, r): dict(by_arm[a][r]) for a in d.arms for r in rung_order},
                             {(a, r): flops[(a, r)] for a in d.arms for r in rung_order})  # paired, as the verdicts
        joint = scaling.joint_fit(lad, d.level, draws=min(draws, 1000), target=target)
        note = joint.why
    else:  # L = E + A C^-alpha describes a metric that falls with compute
        note = (f"no fit: {d.metric} rises with compute (better: max), and the power law describes a metric that "
                "falls with it")
    fit = joint.fit if joint else None
    return {"fit_note": note,
            "shared_seeds": {r: max(len(by_arm[a][r]) for a in d.arms) for r in rung_order},
            "fit": None if fit is None else {"E": fit.E, "alpha": fit.alpha, "A": fit.A, "c_ref": fit.c0,
                                             "at_edge": fit.at_edge, "sse": fit.sse},
            "multipliers": {a: {"m": m[0], "low": m[1], "high": m[2]} for a, m in (joint.multipliers if joint
                                                                                    else {}).items()},
            "alternative": joint.alternative if joint else {}, "lack_of_fit": joint.lack_of_fit if joint else {},
            "held_out": joint.held_out if joint else {}, "draws": joint.draws if joint else 0,
            "target_flops": target, "extrapolated": bool(target and target > largest),
            "gaps_at_target": {a: {"gap": g[0], "low": g[1], "high": g[2], "word": g[3]}
                               for a, g in (joint.target if joint else {}).items()},
            "means": means, "compute": compute,
            "intervals": {a: {r: _interval(list(by_arm[a][r].values()), d.level) for r in rung_order}
                          for a in d.arms},
            "ranking": rankings(means, d.better), "agreement": agreement(means, rung_order, d.better),
            "flips": flips(means, rung_order, words, d.baseline, d.better), "largest_rung": rung_order[-1]}


def _interval(xs: list, level: float) -> tuple:
    from modforge.results import stats

    xs = [x for x in xs if math.isfinite(x)]
    if len(xs) < 2:
        return (math.nan, math.nan)
    iv = stats.mean_interval(xs, level)
    return (iv.low, iv.high)


def carried_section(d, rec: dict) -> list:
    """The report's table of the rates carried up the ladder (``study.carry``)."""
    rows = rec.get("carried") or []
    if not rows:
        return []
    body = []
    for c in rows:
        if "law" not in c:
            body.append([c["rung"], c["arm"], "", "", "", "", c["why"]])
            continue
        law = c["law"]
        body.append([c["rung"], c["arm"], f"log2 lr* = {law['a']:.3f} {law['b']:+.4f}·log2 C"
                     + (f" (scatter sd {law['extra_sd']:.2f})" if law["extra_sd"] else ""),
                     f"{c['predicted']:.4g} (±{c['sd_doublings']:.2f} doublings)",
                     ", ".join(f"{x:g}" for x in c["rates"]), "" if c["rate"] is None else f"{c['rate']:g}",
                     ("accepted: " if c["accepted"] else "**flagged**: ") + c["why"]])
    saved = sum(c.get("saved_runs", 0) for c in rows)
    return ["", "### Rates carried up the ladder", "",
            f"Tuned fully on the lowest {d.carry['tuned']} rungs; at each rung above, each arm's rate predicted by a "
            "power law in training compute through its fitted optima and checked at the predicted rate and its "
            f"neighbours ({', '.join(f'{o:+g}' for o in d.carry['check'])} doublings) on the tuning seeds: the "
            f"predicted rate is compared when it lies within {d.fit['delta']:g} of the best of the check"
            + (f"; where the best lay at the check's end, up to {d.carry['extend']} doubling(s) more were run past "
               "it, one at a time" if d.carry.get("extend") else "") + ". "
            f"{saved} tuning runs fewer than the full grid at those rungs.", "",
            markdown_table(["rung", "arm", "law", "predicted rate", "checked", "compared at", "check"], body)]


def section(d, rec: dict, plots: list) -> list:
    """The report's "Ladder" section."""
    lad = rec["ladder"]
    if not lad:
        return []
    f = lad["fit"]
    lines = ["", "## Ladder", ""]
    if f is None:
        return lines + [f"No joint fit: {lad['fit_note']}."]
    lines += [f"Joint fit of the rung means (over the seeds every arm run at the rung finished there), weighted by each mean's seeds over the pooled "
              f"residual variance: L(C) = E + A_arm·(C / C₀)^(−α) with E = {f['E']:.4f} and α = {f['alpha']:.3f} "
              f"shared, C₀ = {f['c_ref']:.3g} FLOPs" + (" (at a bound of its search: read with care)" if f["at_edge"]
                                                       else "")
              + f"; intervals from {lad['draws']} parametric bootstrap draws that keep the design (seed effects "
              f"shared within a rung, each rung's variance drawn from its chi-square), at {d.level:g}.", ""]
    head = ["arm", "A", "compute multiplier (baseline needs m× to match)", "interval", "own exponent (alternative)"]
    body = [[a, f"{A:.4f}", f"{lad['multipliers'][a]['m']:.3g}" if a in lad["multipliers"] else "baseline",
             "[{:.3g}, {:.3g}]".format(lad["multipliers"][a]["low"], lad["multipliers"][a]["high"])
             if a in lad["multipliers"] else "", f"{lad['alternative'].get('alpha', {}).get(a, math.nan):.3f}"]
            for a, A in f["A"].items()]
    lines += [markdown_table(head, body), ""]
    alt, lof = lad["alternative"], lad["lack_of_fit"]
    if alt:
        lines.append(f"An exponent per arm instead of one: F test p = {alt['p']:.3g} ({alt['df'][0]:g} and "
                     f"{alt['df'][1]:g} df): " + ("**preferred**: the gaps change with scale" if alt["preferred"]
                                                  else "not preferred: one exponent describes the arms")
                     + ("; curves cross the baseline's at " + ", ".join(f"{a} {c:.3g} FLOPs" for a, c in
                                                                      alt["crossings"].items()) if alt.get("crossings")
                        else "") + ".")
    if lof:
        lines.append(f"Lack of fit (the shared model against the rung means' noise, by simulation): p = {lof['p']:.3g}"
                     + (": the model misses the means by more than their noise." if lof["p"] < 1 - d.level else "."))
    h = lad["held_out"]
    if h.get("arms"):
        lines += ["", f"Held out: the top rung `{h['rung']}` predicted from the rungs below it (prediction intervals "
                      "include the top rung's own noise):", ""]
        rows = [[a, f"{v['predicted']:.4f}", f"[{v['low']:.4f}, {v['high']:.4f}]", f"{v['measured']:.4f}",
                 "yes" if v["inside"] else "**no**"] for a, v in h["arms"].items()]
        rows += [[f"{a} − baseline", f"{v['predicted']:+.4f}", f"[{v['low']:+.4f}, {v['high']:+.4f}]",
                  f"{v['measured']:+.4f}", "yes" if v["inside"] else "**no**"] for a, v in h["gaps"].items()]
        lines += [markdown_table(["", "predicted", "interval", "measured", "inside"], rows)]
    elif h.get("why"):
        lines.append(f"Held-out top rung: {h['why']}.")
    big = [v for v in rec["verdicts"] if v["rung"] == lad["largest_rung"]]
    lines += ["", "Gap at the largest rung (`" + lad["largest_rung"] + "`): " + "; ".join(
        f"{v['arm']} {v['estimate']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}], {v['verdict']}" if "estimate" in v
        and math.isfinite(v.get("low", math.nan)) else f"{v['arm']} {v['verdict']}" for v in big) + "."]
    if lad["target_flops"]:
        lines += ["", f"Gap at the target compute {lad['target_flops']:.3g} FLOPs (the joint fit"
                  + (", an extrapolation" if lad["extrapolated"] else "") + "): " + "; ".join(
                      f"{a} {g['gap']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}], {g['word']}"
                      for a, g in lad["gaps_at_target"].items()) + "."]
    agree = lad["agreement"]
    lines += ["", "Ranking, best first: " + "; ".join(f"`{r}`: {' > '.join(order)}" for r, order in
                                                      lad["ranking"].items()) + ".",
              "Agreement with the top rung's ranking (share of arm pairs ordered alike): " + "; ".join(
                  f"`{r}` {v:.2f}" for r, v in agree["agreement"].items() if math.isfinite(v))
              + f"; the ranking is the top rung's from `{agree['stable_from']}` on."]
    lines += ["", ("Changes of ranking: " + "; ".join(
        f"{x['pair'][0]} / {x['pair'][1]} between `{x['from']}` and `{x['to']}`"
        + (" (decided)" if x["decided"] else " (not decided)") for x in lad["flips"]) + ".") if lad["flips"]
              else "No change of ranking across the rungs."]
    if "ladder.png" in plots:
        lines += ["", "![loss against compute](ladder.png)"]
    return lines


def rankings(means: dict, better: str = "min") -> dict:
    """{rung: [arms, best first]} from {rung: {arm: mean}}."""
    sign = 1 if better == "min" else -1
    return {rung: [a for a, m in sorted(((a, m) for a, m in by_arm.items() if math.isfinite(m)),
                                        key=lambda kv: (sign * kv[1], kv[0]))]
            for rung, by_arm in means.items()}


def flips(means: dict, rung_order: list, verdicts: Optional[dict] = None, baseline: Optional[str] = None,
          better: str = "min") -> list[dict]:
    """Every pair of arms whose order changes between two rungs: {"pair", "from", "to", "decided"}.
    ``verdicts``: {(arm, rung): word} against ``baseline``: a flip of an arm against the baseline is decided when
    the words at the two rungs are better and worse."""
    arms = sorted({a for by_arm in means.values() for a in by_arm})
    out = []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            signs = [(r, math.copysign(1, means[r][a] - means[r][b])) for r in rung_order
                     if a in means[r] and b in means[r] and math.isfinite(means[r][a] - means[r][b])
                     and means[r][a] != means[r][b]]
            for (r1, s1), (r2, s2) in zip(signs, signs[1:]):
                if s1 != s2:
                    decided = False
                    if verdicts is not None and baseline in (a, b):
                        other = b if a == baseline else a
                        words = {verdicts.get((other, r1)), verdicts.get((other, r2))}
                        decided = words == {"better", "worse"}
                    out.append({"pair": (a, b), "from": r1, "to": r2, "decided": decided,
                                "ahead_at_from": a if (s1 < 0) == (better == "min") else b})
    return out


def agreement(means: dict, rungs: list, better: str = "min") -> dict:
    """Per rung, the share of the arm pairs the top rung orders that it orders alike (over the pairs it has both
    arms of; NaN with none), and the lowest rung from which every rung's ordering is the top's (the top itself
    when the rung below it already disagrees). ``means``: {rung: {arm: mean}}."""
    top = rungs[-1]
    sign = 1 if better == "min" else -1
    arms = sorted(a for a in means[top] if math.isfinite(means[top][a]))
    pairs = [(a, b) for i, a in enumerate(arms) for b in arms[i + 1:]]

    def order(r, a, b):
        d = sign * (means[r].get(a, math.nan) - means[r].get(b, math.nan))
        return 0 if not math.isfinite(d) or d == 0 else (1 if d > 0 else -1)

    share = {}
    for r in rungs:
        judged = [order(r, a, b) == order(top, a, b) for a, b in pairs if order(r, a, b) != 0]
        share[r] = sum(judged) / len(judged) if judged else math.nan
    stable = top
    for r in reversed(rungs):
        if share[r] == 1.0:
            stable = r
        else:
            break
    return {"agreement": share, "stable_from": stable}
