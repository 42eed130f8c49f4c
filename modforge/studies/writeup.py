"""A study's report: ``study.md`` (the question, what was declared, the plan as printed, the tuning curves, the
verdicts in four words with their numbers, the ladder and its fits, the runs spent against the fixed design, the
warnings), ``report.json`` (the same, as data) and the plots (``tuning.png``, ``ladder.png``; matplotlib, the
optional ``report`` extra)."""
import math
import statistics
from typing import Optional
from pathlib import Path

from modforge.results import jobs, stats
from modforge.results.formats import fmt_count, markdown_table
from modforge.studies import boundaries, ladder, lrfit, robust, sequential, simulation, tuning
from modforge.studies.design import Design
from modforge.studies.rounds import tuning_var
from modforge.utils.files import write_json, write_text


def gather(d: Design, p: dict, plan, tuned: dict, compared: dict, state: dict, draws: int) -> dict:
    """Everything the report says, as data."""
    values, decisions = compared["values"], compared["decisions"]
    arms_rows = []
    flops = {}
    bad = {}
    for (a, r), by_seed in values.items():
        runs = [res for res in compared["results"] if res["cell"].arm == a and res["cell"].rung == r]
        fin = [v for v in by_seed.values() if math.isfinite(v)]
        f = [res["metrics"].get("train_flops") for res in runs if res["status"] == "finished"
             and isinstance(res["metrics"].get("train_flops"), (int, float))]  # not a run that stopped early
        flops[(a, r)] = statistics.fmean(f) if f else plan.flops[(a, r)]
        n_bad = sum(res["status"] in ("diverged", "collapsed") for res in runs)
        spiked = sequential.troubled({k: v for k, v in by_seed.items() if math.isfinite(v)}, d.fit["spike"],
                                     d.better)[1]
        bad[(a, r)] = (n_bad + spiked, len(runs))  # trouble: an outcome of its own (diverged, collapsed, spiked)
        iv = arm_interval(fin, runs, d.metric, d.level)
        epochs = [res["metrics"].get("epochs") for res in runs if isinstance(res["metrics"].get("epochs"), (int, float))]
        dropout = [res["metrics"].get("dropout") for res in runs if isinstance(res["metrics"].get("dropout"), (int, float))]
        arms_rows.append({"arm": a, "rung": r, "setting": tuned["chosen"].get((a, r)), "steps": plan.steps[(a, r)],
                          "tokens": plan.steps[(a, r)] * p[(a, r)]["tokens_per_step"], "train_flops": flops[(a, r)],
                          "params_non_embedding": p[(a, r)]["params_non_embedding"], "n": len(fin),
                          "mean": iv.estimate, "low": iv.low, "high": iv.high,
                          "sd": statistics.stdev(fin) if len(fin) > 1 else math.nan,
                          "diverged_or_collapsed": n_bad, "spiked": spiked, "runs": len(runs),
                          "prone": a in ((compared.get("prone") or {}).get(r) or {}),
                          "values": {str(seed): v for seed, v in sorted(by_seed.items())},  # per fresh seed
                          "epochs": max(epochs) if epochs else math.nan, "dropout": max(dropout) if dropout else math.nan})
    planned = d.looks
    spent = boundaries.spending(d.level, planned)
    verdicts = []
    for r in d.rungs:
        for a in d.compared:
            dec = decisions.get((a, r))
            if dec is None or isinstance(dec, str):
                verdicts.append({"arm": a, "rung": r, "verdict": "undecided", "why": dec or "not run"})
                continue
            c = dec.comparison
            n_base, n_all = bad[(d.baseline, r)], bad[(a, r)]
            fits = tuned.get("fits") or {}
            tuning_sd = math.sqrt(tuning_var(fits, (a, r)) + tuning_var(fits, (d.baseline, r)))
            verdicts.append({"arm": a, "rung": r, "verdict": dec.word, "why": dec.why, "estimate": c.estimate,
                             "tuning_sd": tuning_sd,
                             "low": c.low, "high": c.high, "level": 1 - c.alpha, "pairs": c.n, "look": dec.look + 1,
                             "p": c.p, "p_adjusted": c.p_adjusted, "mde": c.mde if dec.word == "inconclusive" else math.nan,
                             "corr": c.corr, "outcome_p": stats.fisher(n_all[0], n_all[1], n_base[0], n_base[1]),
                             "model": c.test, "futile": dec.futile, "trouble": list(n_all),
                             "trouble_base": list(n_base),
                             "robust": robust.check(values[(a, r)], values[(d.baseline, r)], 1 - c.alpha)
                             if n_all[0] or n_base[0] else None})
    fixed_runs = len(d.arms) * len(d.rungs) * d.seeds["max"]
    out = {"experiment": d.experiment, "question": d.study.get("question"), "declared": d.study,
           "overrides": d.overrides, "metric": d.metric, "better": d.better, "level": d.level, "margin": d.margin,
           "family": d.family, "looks": planned, "alpha_per_look": spent, "critical": compared.get("critical"),
           "family_on_seeds": compared.get("family_on_seeds"),
           "borrowed_df": {r: b[1] for r, b in (compared.get("borrowed") or {}).items()}, "arms": arms_rows, "verdicts": verdicts,
           "tuning": tuning_record(d, tuned), "fits": fits_record(d, tuned),
           "carried": [{"arm": a, "rung": r, **v} for (a, r), v in (tuned.get("carried") or {}).items()], "runs": {"probe": len(p), "tune": tuned["runs"], "compare": compared["runs"],
                                                        "compare_fixed_design": fixed_runs,
                                                        "rounds": [[f"{a} @ {r or 'the config'}" for a, r in rnd]
                                                                   for rnd in compared["rounds"]]},
           "plan": {"runs": plan.runs, "hours": plan.hours, "flops": plan.total_flops},
           "wall_hours": sum(state.get("stage_seconds", {}).values()) / 3600, "jobs": d.jobs,
           "forced": state.get("forced"), "adopted": adopted_record(state.get("adopted") or {}),
           "machines": machines_of([*tuned.get("devices", []), *(res["metrics"].get("devices")
                                                                  for res in compared["results"])])}
    out["halving"] = tuned.get("halving")
    out["runs"]["against_fixed"] = against_fixed(d, verdicts, arms_rows)
    out["ladder"] = ladder.record(d, values, flops, verdicts, draws) if len(d.rungs) > 1 else None
    out["warnings"] = warnings(d, out)
    return out


# what decides a run's last digits on a machine (metrics.json's "devices"; modforge.utils.devices)
MACHINE_KEYS = ("accelerator", "gpus", "cpu", "cpu_capability", "cpu_threads", "cpu_kernel_env")


def against_fixed(d: Design, verdicts: list, arms_rows: list) -> Optional[dict]:
    """The comparison runs against the smallest fixed design that would make as many right decisions, both
    simulated at this study's own estimates (:func:`modforge.studies.simulation.plug_in`,
    :func:`modforge.studies.simulation.against_fixed`); None when nothing was compared on seeds."""
    rungs = simulation.plug_in(verdicts, arms_rows)
    if not rungs:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return simulation.against_fixed(rungs, d.looks, d.margin, d.level)


def machines_of(devices: list) -> list:
    """The machines the tuning and comparison runs ran on, as their metrics.json recorded them: one row per distinct
    (accelerator, GPUs, CPU, its kernels, threads, pinning variables), with how many runs it took."""
    rows: list = []
    for dev in devices:
        if not isinstance(dev, dict):
            continue  # a run that did not finish
        key = {k: dev.get(k) for k in MACHINE_KEYS}
        row = next((r for r in rows if r["machine"] == key), None)
        if row is None:
            rows.append(row := {"machine": key, "runs": 0})
        row["runs"] += 1
    return rows


def adopted_record(adopted: dict) -> dict:
    """{job directory: the run it copies} (each adopted.json under the study) in a report's terms: how many, per
    stage, and the studies they come from (the directory holding the run's stage); {} when nothing was adopted."""
    if not adopted:
        return {}

    def stage_of(run: Path) -> Path:  # <study>/probe/<job>, <study>/<stage>/<round, extend-i, carry...>/<job>
        return run.parent if run.parent.name == "probe" else run.parent.parent

    stages: dict = {}
    for job in adopted:
        s = Path(job).parent
        name = s.name if s.name == "probe" else f"{s.parent.name}/{s.name}"
        stages[name] = stages.get(name, 0) + 1
    sources = sorted({str(stage_of(Path(src)).parent) for src in adopted.values()})
    return {"runs": len(adopted), "stages": dict(sorted(stages.items())), "sources": sources}


def machine_text(m: dict) -> str:
    """One machine row in words; what a run's metrics.json did not record (runs made before modforge recorded
    the CPU or the pinning variables) is said to be not recorded, not guessed."""
    gpu = bool(m.get("gpus"))
    what = ", ".join(m["gpus"]) if gpu else m.get("cpu") or f"{m.get('accelerator') or 'device'}, model not recorded"
    env = m.get("cpu_kernel_env")
    bits = [f"{m['cpu_capability']} kernels" if m.get("cpu_capability") and not gpu else None,
            f"{m['cpu_threads']} thread{'s' * (m['cpu_threads'] != 1)}" if m.get("cpu_threads") else None,
            None if gpu else "kernel pinning not recorded" if env is None
            else " ".join(f"{k}={v}" for k, v in env.items()) or "kernels not pinned"]
    return f"{what} ({', '.join(b for b in bits if b)})"


def arm_interval(values: list, results: list, metric: str, level: float) -> "stats.Interval":
    """An arm's mean over its fresh seeds with its interval, inside the metric's range (as ``modforge.report``'s)."""
    if len(values) < 2:
        return stats.Interval(values[0] if values else math.nan)
    info = jobs.info_of([res["metrics"] for res in results], metric)
    return stats.mean_interval(values, level, info["low"], info["high"])


def tuning_record(d: Design, tuned: dict) -> list:
    rows = []
    for (a, r), results in tuned["curves"].items():
        for key, vals in results.items():
            fin = [v for v in vals if math.isfinite(v)]
            rows.append({"arm": a, "rung": r, "setting": tuned["settings"][key], "values": vals,
                         "mean": statistics.fmean(fin) if len(fin) == len(vals) and fin else math.nan,
                         "chosen": tuned["chosen"].get((a, r)) == tuned["settings"][key],
                         "edge": tuned["edges"].get((a, r)) if tuned["chosen"].get((a, r)) == tuned["settings"][key] else None,
                         "best_below_cliff": tuned.get("moved", {}).get((a, r)) == tuned["settings"][key]})
    return rows


def fit_section(d: Design, rec: dict) -> list:
    """rule: fit: each arm's chosen rate, its interval over re-tunings, its basin and its failure model, as a
    table (the learning-rate sensitivity: a narrow basin is a finding of its own)."""
    if not rec.get("fits"):
        return []
    head = ["rung", "arm", f"chosen {d.fit['key']}", "95% over re-tunings", f"basin (within {d.fit['delta']:g})",
            "basin width", "fitted minimum", "P(failure) there", "tuning sd", ""]
    body = []
    for f in rec["fits"]:
        notes = [n for n in ("carried up from the smallest rung" if f["carried"] else "",
                             "moved down by the failure model" if f["moved"] else "",
                             f"unbracketed ({f['edge']} end)" if not f["bracketed"] else "",
                             ", ".join(f"{k}={f['setting'][k]} unbracketed ({side} end)"
                                       for k, side in (f.get("slice_edges") or {}).items()),
                             "no stable rate" if not f["stable"] else "",
                             "no failure seen: P(failure) is the prior's" if f.get("failure_evidence", 1) < 0.5 else "",
                             f["note"]) if n]
        body.append([f["rung"] or "—", f["arm"], f"{f['lr']:.4g}", f"{f['low']:.4g} – {f['high']:.4g}",
                     f"{f['basin'][0]:.4g} – {f['basin'][1]:.4g}", f"{f['basin_width']:.2f}x",
                     f"{f['minimum']:.4f}", f"{f['p_fail']:.3f}", f"{f['tuning_sd']:.4f}", "; ".join(notes)])
    return ["", f"Each arm's `{d.fit['key']}` (rule: fit, docs/studies.md): a quadratic in log2 of the rate through "
            "the best rate and its neighbours (spikes down-weighted), its argmin moved down where the failure model "
            f"(diverged, collapsed or spiked runs against log2 of the rate) puts failure above {d.fit['fail_level']:g}; "
            "the tuning sd (the loss's sd over re-tunings) is added to each comparison's interval.", "",
            markdown_table(head, body)]


def halving_section(d: Design, rec: dict) -> list:
    """study.tune.halving: what each pause ranked and kept, and the steps it saved."""
    h = rec.get("halving")
    if not h:
        return []
    sv = h["saved"]
    lines = ["", f"Successive halving (`study.tune.halving`, at {h['at']} of each run's steps, docs/studies.md): "
             f"{sv['stopped']} of {sv['runs']} tuning runs stopped at a pause"
             + (f", {sv['revived']} continued after the fit because its best rate was beside them" if sv["revived"]
                else "")
             + f"; they trained {sv['steps']:,} of the {sv['full_steps']:,} steps that training every run to its "
             f"end takes ({sv['steps'] / sv['full_steps']:.0%}). The fit uses finished runs only.", ""]
    head = ["rung", "arm", "pause at step", f"mean {d.metric} there, by setting (kept in bold)"]
    body = []
    for p in h["pauses"]:
        for r in p["ranks"]:
            cells = [(f"**{k}**" if k in r["kept"] else k) + (f" {v:.4f}" if v is not None else " failed")
                     for k, v in r["settings"].items()]
            body.append([r["rung"] or "—", r["arm"], str(r["step"]), "; ".join(cells)])
    return lines + [markdown_table(head, body)]


def fits_record(d: Design, tuned: dict) -> list:
    """rule: fit: each arm-rung's fitted curve, basin, chosen rate and failure model (:func:`lrfit.record`). A rung
    whose rate ``study.carry`` predicted has no fit of its own (its entry would repeat the tuned rung's, rate
    included): the carry table gives what it ran."""
    return [{"arm": a, "rung": r, **lrfit.record(ch, d.fit["key"], d.better, carried=r not in d.tuned_rungs_of(a),
                                                 grid=d.grid_of(a))}
            for (a, r), ch in (tuned.get("fits") or {}).items()
            if not (d.carry and r not in d.tuned_rungs_of(a))]


def warnings(d: Design, out: dict) -> list:
    w = []
    for row in out["tuning"]:
        if row["chosen"] and row["edge"]:
            w.append(f"tuning: {row['arm']} at {row['rung'] or 'the config'} chose "
                     + ", ".join(f"{k}={row['setting'][k]} at the {side} edge of its grid" for k, side in row["edge"].items())
                     + ": the optimum was not bracketed")
    for row in out["arms"]:
        if row["epochs"] > 1 and row["dropout"] == 0:
            w.append(f"{row['arm']} at {row['rung'] or 'the config'}: {row['epochs']:.1f} epochs at dropout 0: the "
                     "metric measures memorisation as well as learning")
        if row["diverged_or_collapsed"]:
            lo, hi = stats.wilson(row["diverged_or_collapsed"], row["runs"], d.level)
            w.append(f"{row['arm']} at {row['rung'] or 'the config'}: {row['diverged_or_collapsed']} of {row['runs']} "
                     f"comparison runs diverged or collapsed (rate interval [{lo:.2f}, {hi:.2f}])")
    if out["ladder"]:
        for f in out["ladder"]["flips"]:
            w.append(f"ranking: {f['pair'][0]} and {f['pair'][1]} change order between {f['from']} and {f['to']} "
                     + ("(decided: better at one, worse at the other)" if f["decided"] else "(not decided by the verdicts)"))
        if out["ladder"]["extrapolated"]:
            w.append(f"the gap at target_flops={out['ladder']['target_flops']:.3g} is an extrapolation of the fits past "
                     "the largest rung")
        if (out["ladder"]["alternative"] or {}).get("preferred"):
            w.append("ladder: an exponent per arm fits better than one shared exponent; the compute multipliers assume "
                     "one and hold only near the rungs")
        h = out["ladder"]["held_out"] or {}
        missed = [a for a, v in (h.get("arms") or {}).items() if not v["inside"]]
        if missed:
            w.append(f"ladder: the top rung's measured mean lies outside its prediction from the rungs below for "
                     f"{', '.join(missed)}")
    return w


def to_markdown(d: Design, rec: dict, plan_text: str, plots: list) -> str:
    s = d.study
    fam = f"{len(d.compared)} comparison{'s' * (len(d.compared) != 1)} x {len(d.rungs)} rung{'s' * (len(d.rungs) != 1)}"
    lines = [f"# Study: {d.experiment}", "", f"**Question.** {rec['question'] or '(none declared)'}", "",
             "## Declared before the runs", "",
             f"- In `conf/experiment/{d.experiment}.yaml`'s `study:` block" + (f", with `{' '.join(d.overrides)}`"
                                                                              if d.overrides else "") + ".",
             f"- Metric `{d.metric}` ({'lower' if d.better == 'min' else 'higher'} is better); baseline `{d.baseline}`; "
             f"compared: {', '.join(f'`{a}`' for a in d.compared)}.",
             f"- Family: {fam} = {d.family}, at level {d.level:g} as a whole; "
             + (f"equivalence margin ±{d.margin:g}." if d.margin is not None else "no equivalence margin declared "
                                                                                   "(no equivalence can be claimed)."),
             f"- Seeds: fresh from {d.seeds['start']}, looks at {d.looks} pairs; the family's alpha spent over them "
             f"{', '.join(f'{a:.4f}' for a in rec['alpha_per_look'])} (power family, ρ = {boundaries.RHO:g}); "
             + (f"critical values {', '.join('—' if c is None or not math.isfinite(c) else f'{c:.3g}' for c in rec['critical'])} "
                f"for |Δ| / se at those looks, calibrated by simulation for the {rec.get('family_on_seeds') or d.family} "
                "comparisons run on seeds"
                + (f", with {sum(rec['borrowed_df'].values())} df of variance borrowed from the tuning runs"
                   if sum((rec.get("borrowed_df") or {}).values()) else "") + " (docs/studies.md)"
                if rec.get("critical") else "no comparison on seeds") + "."]
    if d.grid:
        lines.append(f"- Tuning, every arm alike: {', '.join(f'`{k}` in {v}' for k, v in d.grid.items())}, seeds "
                     f"{d.tune_seeds}, extended past an edge at most {d.extend} time(s)"
                     + "".join(f"; {a}'s grid in its own units: " + ", ".join(f"`{k}` x {f:g} = {d.grid_of(a)[k]}"
                                                                            for k, f in keys.items())
                               for a, keys in d.scales.items())
                     + (f"; below a cliff (the next-larger `{d.cliff['key']}` worse by more than {d.cliff['by']:g} or "
                        "failed), the next-smaller is chosen"
                        + (f" if within {d.cliff['within']:g} of the best" if "within" in d.cliff else "")
                        if d.cliff else "")
                     + (f"; each arm's `{d.fit['key']}` from a curve fitted to its runs (rule: fit; a spike: "
                        f"{d.fit['spike']:g} above another seed; failure level {d.fit['fail_level']:g}; basin within "
                        f"{d.fit['delta']:g} of the fitted minimum)" if d.rule == "fit" else "")
                     + (f"; tuned at the smallest rung, carried up by `transfer: {d.transfer}`." if d.transfer else
                        "; " + "; ".join(f"`{a}` tuned at the smallest rung, carried up by `transfer: {d.transfer_of(a)}`"
                                         for a in d.arms if d.transfer_of(a)) + "; the others tuned at every rung."
                        if isinstance(s.get("transfer"), dict) else "; tuned at every rung."))
    if len(d.rungs) > 1 or "tokens_per_param" in s:
        lines.append(f"- Ladder: {', '.join(f'`{r}`' for r in d.rungs if r) or 'one size'}"
                     + (f"; {s['tokens_per_param']:g} tokens per non-embedding parameter of the baseline, every arm "
                        f"matched on {s.get('match', 'tokens')}" if "tokens_per_param" in s else "")
                     + (f"; target compute {s['target_flops']:.3g} FLOPs" if "target_flops" in s else "") + ".")
    if "budget" in s:
        lines.append(f"- Budget: {', '.join(f'{v:g} {k}' for k, v in s['budget'].items())}.")
    lines += ["", "## Plan, as printed before the runs", "", "```text", plan_text, "```", ""]
    r = rec["runs"]
    fx = r.get("against_fixed")
    lines.append(f"Spent: {r['probe']} probe runs, {r['tune']} tuning runs, {r['compare']} comparison runs "
                 f"(the fixed design at {d.seeds['max']} seeds would have run {r['compare_fixed_design']}"
                 + (f"; simulated at this study's own estimates, the design spends {fx['runs']:.1f} comparison runs "
                    f"for {fx['decisions']:.2f} right decisions, where the smallest fixed design making as many needs "
                    + (f"{fx['fixed_seeds']} seeds, {fx['fixed_runs']} runs ({fx['ratio']:.2f}x)"
                       if math.isfinite(fx["fixed_seeds"]) else "more than 60 seeds") if fx else "")
                 + f"); {rec['wall_hours'] * 60:.1f} min of wall time, {rec['jobs']} job(s) side by side.")
    if rec.get("forced"):
        lines += ["", f"Started past its declared budget with force=true: {rec['forced']}."]
    if rec.get("adopted"):
        a = rec["adopted"]
        lines += ["", f"Adopted, not trained here: {a['runs']} runs ({', '.join(f'{k} {v}' for k, v in a['stages'].items())})"
                  f" are copies of ended runs of {', '.join(a['sources'])}, each adopted because its recorded config "
                  "is its job's (`reuse=`, `modforge/sweeps/adopt.py`; each copy's adopted.json names its run). They "
                  "were trained there, with the code of that study, not here."]
    if rec.get("machines"):
        lines += ["", "Ran on (tuning and comparison runs, as each run's metrics.json recorded): "
                  + "; ".join(f"{m['runs']} on {machine_text(m['machine'])}" for m in rec["machines"]) + "."]
    if d.grid:
        lines += ["", "## Tuning", ""]
        head = ["rung", "arm", *d.grid, f"mean {d.metric}", "per seed", ""]
        body = []
        for row in rec["tuning"]:
            vals = ", ".join("—" if not math.isfinite(v) else f"{v:.4f}" for v in row["values"])
            mark = ("**chosen**" + (" (edge: " + ", ".join(f"{k} {s_}" for k, s_ in row["edge"].items()) + ")"
                                    if row["edge"] else "")) if row["chosen"] else ""
            if row.get("best_below_cliff"):
                mark = "best mean; a cliff above it: the rule chose the next-smaller"
            body.append([row["rung"] or "—", row["arm"], *(str(row["setting"][k]) for k in d.grid),
                         "failed" if not math.isfinite(row["mean"]) else f"{row['mean']:.4f}", vals, mark])
        lines += [markdown_table(head, body), "", "A failed run (diverged, collapsed) makes its setting the worst."
                  + (f" A best setting whose next-larger `{d.cliff['key']}` is worse by more than {d.cliff['by']:g} (or "
                     "failed) gives way to its next-smaller one"
                     + (f", if that one is within {d.cliff['within']:g} of it" if "within" in d.cliff else "")
                     + " (the cliff rule, declared with the grid)." if d.cliff else "")]
        lines += fit_section(d, rec)
        lines += halving_section(d, rec)
        lines += ladder.carried_section(d, rec)
        if "tuning.png" in plots:
            lines += ["", "![tuning curves](tuning.png)"]
    lines += ["", "## Verdicts", ""]
    head = ["rung", "arm", f"Δ {d.metric}", "interval", "level", "verdict", "pairs", "look", "p (unadjusted)", "corr"]
    body = []
    for v in rec["verdicts"]:
        if "estimate" not in v:
            body.append([v["rung"] or "—", v["arm"], "", "", "", f"undecided: {v['why']}", "", "", "", ""])
            continue
        word = {"equivalent": f"equivalent within ±{d.margin:g}" if d.margin else "equivalent",
                "inconclusive": f"inconclusive (MDE {v['mde']:.3g})"}.get(v["verdict"], v["verdict"])
        body.append([v["rung"] or "—", v["arm"], f"{v['estimate']:+.4f}",
                     f"[{v['low']:+.4f}, {v['high']:+.4f}]" if math.isfinite(v["low"]) else "",
                     f"{v['level']:.4f}", word if v["verdict"] != "undecided" else f"undecided: {v['why']}",
                     str(v["pairs"]), str(v["look"]), f"{v['p']:.2g}" if math.isfinite(v["p"]) else "",
                     f"{v['corr']:.2f}" if math.isfinite(v["corr"]) else ""])
    lines += [markdown_table(head, body), "",
              "Δ is arm − baseline, from the rung's randomised-block model (seed as block) or, where an arm's runs "
              "spiked, its own paired differences; the interval is est ± c·se with the look's critical value c, "
              "calibrated by simulation so that the whole family, over every look, holds the declared level (an arm "
              "whose tuning failed near its rate gets its interval widened for the spikes its runs have not shown); "
              "the verdict is read off that interval, not off p, which is the single t test's own. A futile "
              "comparison stopped adding seeds (its chance of a decision by the last look was under 2%). "
              "Comparison rounds (arm-rungs run in each): " + "; ".join(
                  f"{i + 1}: {len(x)}" for i, x in enumerate(r["rounds"])) + "."]
    lines += robust.section(rec)
    lines += ["", "## Arms", ""]
    head = ["rung", "arm", "setting", "params (non-emb.)", "steps", "tokens", "train FLOPs", "n", "mean", "interval",
            "sd", "trouble: diverged or collapsed / spiked / runs"]
    body = [[a["rung"] or "—", a["arm"], tuning.key_of(a["setting"]) if a["setting"] else ("—" if a["setting"] == {} else "none trained"),
             fmt_count(a["params_non_embedding"]), str(a["steps"]), fmt_count(a["tokens"]), f"{a['train_flops']:.3g}",
             str(a["n"]), f"{a['mean']:.4f}" if math.isfinite(a["mean"]) else "",
             f"[{a['low']:.4f}, {a['high']:.4f}]" if math.isfinite(a["low"]) else "",
             f"{a['sd']:.4f}" if math.isfinite(a["sd"]) else "",
             f"{a['diverged_or_collapsed']} / {a.get('spiked', 0)} / {a['runs']}"
             + ("; its tuning failed near its rate" if a.get("prone") else "")]
            for a in rec["arms"]]
    lines += [markdown_table(head, body)]
    lines += ladder.section(d, rec, plots)
    if rec["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in rec["warnings"]]
    return "\n".join(lines) + "\n"


def write_report(d: Design, study_dir: Path, rec: dict, plan_text: str) -> list:
    plots = []
    try:
        from modforge.studies import figures

        plots = figures.write(d, rec, study_dir)
    except ImportError as e:
        print(f"[study] no plots: {e}", flush=True)
    write_text(study_dir / "study.md", to_markdown(d, rec, plan_text, plots))
    write_json(study_dir / "report.json", {**rec, "plan_text": plan_text}, indent=1)
    return ["study.md", "report.json", *plots]
