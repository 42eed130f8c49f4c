"""A report's tables written out: numbers and counts as text, each row's verdict in words, the answer, pairing
and cost tables, and the formats (Markdown, CSV, JSON records). The tables themselves (rows, grouping, the
family, the baseline) are :mod:`modforge.results.tables`'."""
import csv
import io
import json
import math
from typing import Optional

from modforge.results import stats
from modforge.results.jobs import STATUSES, Job
from modforge.results.tables import Row, Table


def percent(level: float) -> str:
    """A confidence level as a reader writes it: 0.95 as 95%, 0.9875 as 98.75% (never rounded to 99%)."""
    return f"{level * 100:.10g}%"


def fmt(x: float, digits: int = 4) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"

def fmt_count(x: float, scientific: bool = False) -> str:
    if x is None or math.isnan(x):
        return ""
    return f"{x:.3g}" if scientific else f"{x:,.0f}"

def verdict(t: Table, r: Row) -> str:
    """The row's verdict in words, with the numbers it rests on."""
    if r.is_baseline:
        return "baseline"
    if r.diff is None:
        if r.in_family:
            return f"no verdict: {'the baseline has' if r.n else 'this arm has'} no finished run with {t.metric}"
        return "not in the study's family" if t.declared and r.jobs else ""
    word, why = stats.verdict(r.diff, t.best, t.margin)
    if word == "equivalent":  # the word carries the margin; the reason need not repeat it
        word, why = f"equivalent within ±{t.margin:g}", why.removeprefix(f"within ±{t.margin:g}; ")
    return f"{word} ({why})" if word != "undecided" else f"no verdict: {why}"

def verdict_word(t: Table, r: Row) -> str:
    if r.is_baseline or r.diff is None:
        return ""
    return stats.verdict(r.diff, t.best, t.margin)[0]

def outcome_cell(t: Table, r: Row) -> str:
    """This row's collapsed and diverged runs out of those that ended, with Wilson's interval of the rate and,
    against the baseline, Fisher's exact test (adjusted for the family like the verdicts)."""
    if not r.ended:
        return ""
    lo, hi = stats.wilson(r.bad, r.ended, t.level)
    cell = f"{r.bad}/{r.ended} [{lo:.2f}, {hi:.2f}]"
    if not math.isnan(r.outcome_p) and (r.bad or (t.baseline and t.baseline.bad)):
        cell += f", Fisher p={r.outcome_p:.2g}"
    return cell

def not_applicable(j: Job, metric: str) -> Optional[str]:
    """Why ``metric`` cannot exist for this run (``metrics.json`` -> ``not_applicable``, e.g. ``val@128`` for
    val@128/loss of a learned positions table), or None."""
    reasons = (j.metrics or {}).get("not_applicable") or {}
    return next((why for what, why in reasons.items() if metric == what or metric.startswith(what + "/")), None)

def other_statuses(r: Row, metric: str = "") -> str:
    parts = [f"{r.count(s)} {s}" for s in STATUSES[1:] if r.count(s)]
    finished = [j for j in r.jobs if j.status == "finished"]
    reasons = [why for j in finished if (why := not_applicable(j, metric)) is not None]
    if reasons:
        parts.append(f"{len(reasons)} not applicable ({reasons[0]})")
    no_metric = len(finished) - r.n - len(reasons)
    if no_metric:
        parts.append(f"{no_metric} without the metric")
    return ", ".join(parts)

def answer_rows(t: Table) -> tuple[list, list]:
    pct = percent(t.level)
    simultaneous = f"Δ {pct} CI" + (" (simultaneous)" if t.family > 1 else "")
    head = [*t.varying, "runs", f"{t.metric} mean", f"{pct} CI", "sd", "min", "max",
            "Δ vs baseline", simultaneous, "pairs", "verdict", "collapsed+diverged", "not counted"]
    body = []
    for r in t.rows:
        vals = list(r.values.values())
        ci = f"[{fmt(r.interval.low)}, {fmt(r.interval.high)}]" if r.interval.kind else r.interval.why
        d = r.diff
        body.append([*r.label, r.n, fmt(r.interval.estimate), ci, fmt(r.sd), fmt(min(vals) if vals else math.nan),
                     fmt(max(vals) if vals else math.nan),
                     fmt(d.estimate) if d else ("0" if r.is_baseline else ""),
                     f"[{fmt(d.low)}, {fmt(d.high)}]" if d and d.decided else "",
                     (d.n if d.test in ("paired", "block") else f"{d.n_x} vs {d.n_y}") if d else "",
                     verdict(t, r), outcome_cell(t, r), other_statuses(r, t.metric)])
    return head, body

def pairing_rows(t: Table) -> tuple[list, list]:
    """What the pairing bought: the correlation of each arm with the baseline over their shared seeds, and the
    share of the unpaired variance of the difference it removed (1 - var(d) / (var(x) + var(y)))."""
    head = [*t.varying, "pairs", "correlation", "variance removed", "MDE (80% power)", "p (unadjusted)",
            "same batches"]
    body = []
    for r in t.rows:
        d = r.diff
        if d is None or not d.decided or d.test not in ("paired", "block"):
            continue
        body.append([*r.label, d.n, fmt(d.corr, 2), f"{d.removed:.0%}" if not math.isnan(d.removed) else "",
                     fmt(d.mde), f"{d.p:.3g}" if not math.isnan(d.p) else "", same_batches(t, r)])
    return head, body

def same_batches(t: Table, r: Row) -> str:
    """How many of the shared seeds trained on the very same batches (equal ``data_checksum``): common random
    numbers at work; "" for runs from before the checksum."""
    def sums(row: Row) -> dict:
        return {tuple(j.overrides.get(k, "") for k in t.over): j.metrics.get("data_checksum")
                for j in row.jobs if j.status == "finished" and j.metrics and j.metrics.get("data_checksum")}

    mine, theirs = sums(r), sums(t.baseline)
    shared = [k for k in mine if k in theirs]
    return f"{sum(mine[k] == theirs[k] for k in shared)}/{len(shared)}" if shared and t.over else ""

def cost_rows(t: Table) -> tuple[list, list]:
    head = [*t.varying, "params", "non-embedding", "tokens/s", "wall s", "tokens seen", "training FLOPs"]
    body = [[*r.label, fmt_count(r.mean_of("params")), fmt_count(r.mean_of("params_non_embedding")),
             fmt_count(r.mean_of("tokens_per_sec")), fmt(r.mean_of("wall_seconds"), 1),
             fmt_count(r.mean_of("tokens_seen")),
             fmt_count(r.flops, scientific=True) + (" (6ND)" if r.flops_estimated and r.n else "")] for r in t.rows]
    return head, body

def markdown_table(head: list, body: list) -> str:
    def cell(x) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in body]
    return "\n".join(lines)

def describe(t: Table, over: tuple) -> str:
    order = "by name" if t.sort == "name" else f"best first ({'lower' if t.best == 'min' else 'higher'} is better)"
    base = ",".join(f"{k}={v}" for k, v in zip(t.varying, t.baseline.label)) if t.baseline else "none"
    lo, hi = t.info.get("low", -math.inf), t.info.get("high", math.inf)
    rng = f" in [{lo:g}, {hi:g}]" if math.isfinite(lo) or math.isfinite(hi) else ""
    text = (f"task {t.task}, metric {t.metric}{rng}{', ' + t.at if t.at else ''}, {order}; runs pooled over {', '.join(over) or 'nothing'}; "
            f"means over finished runs only, with {percent(t.level)} intervals inside the metric's range; "
            f"baseline {base or '(the only configuration)'}")
    if t.study:
        text = f"study: {t.study.get('question', '(no question written)')}\n" + text
        if t.overridden:
            text += f"; the command line replaced the study's {', '.join(t.overridden)}"
    if t.family:
        text += (f"; Δ = row - baseline, {family_rule(t)}, and the verdict is read off it: better/worse when it "
                 "excludes 0, "
                 + (f"equivalent when it lies inside ±{t.margin:g} (the declared margin), " if t.margin is not None
                    else "no equivalence without a declared margin (margin=), ")
                 + "else inconclusive with the minimum detectable effect at 80% power")
    return text

def family_rule(t: Table) -> str:
    """How the table's Δ intervals are made and held to the family's level."""
    head = f"the {t.family} {t.family_of} form one family at {percent(t.level)}"
    if t.test == "block":
        read = [r.diff for r in t.rows if r.diff is not None and r.diff.decided]
        crit = (f"c = {stats.t_quantile(1 - read[0].tail / 2, read[0].df):.4g} at the model's {read[0].df:g} "
                "residual df" if read else "c")
        return ("every arm in one randomised-block model of the runs (seed as block, arm as treatment: the "
                f"residual df come from every arm); {head}: each Δ interval is Δ ± c·se with Dunnett's critical "
                f"value {crit}")
    pairing = "paired over the seeds both arms finished" if t.test == "paired" else \
        "Welch's unpaired test (the arms share no seed)"
    return f"{pairing}; {head}: each Δ interval is at {1 - (1 - t.level) / t.family:.4g} (Bonferroni)"

def to_markdown(tables: list[Table], shared: dict, counts: dict, over: tuple, problems: list[Job]) -> str:
    out = []
    if shared:
        out.append("shared: " + " ".join(f"{k}={v}" for k, v in shared.items()))
    out.append("jobs: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s)))
    for t in tables:
        out += ["", describe(t, over), "", markdown_table(*answer_rows(t))]
        head, body = pairing_rows(t)
        if body:
            out += ["", markdown_table(head, body)]
        out += ["", markdown_table(*cost_rows(t))]
        out += [f"\nnote: {n}" for n in t.notes]
    if problems:
        out.append("")
        out += [f"{j.status}: {j.name}" + (f" ({j.error})" if j.error else "") for j in problems]
    return "\n".join(out)

def to_records(tables: list[Table]) -> list[dict]:
    recs = []
    for t in tables:
        for r in t.rows:
            d = r.diff
            rate = stats.wilson(r.bad, r.ended, t.level) if r.ended else (math.nan, math.nan)
            rec = {"task": t.task, "metric": t.metric, **dict(zip(t.varying, r.label)), "runs": r.n,
                   **{s: r.count(s) for s in STATUSES[1:]},
                   "mean": r.interval.estimate, "ci_low": r.interval.low, "ci_high": r.interval.high,
                   "ci_kind": r.interval.kind, "sd": r.sd,
                   "min": min(r.values.values(), default=math.nan), "max": max(r.values.values(), default=math.nan),
                   "baseline": r.is_baseline, "diff": d.estimate if d else math.nan,
                   "diff_se": d.se if d else math.nan, "diff_df": d.df if d else math.nan,
                   "diff_ci_low": d.low if d else math.nan, "diff_ci_high": d.high if d else math.nan,
                   "diff_ci_level": 1 - d.alpha if d else math.nan, "test": d.test if d else "",
                   "pairs": d.n if d else 0, "p": d.p if d else math.nan,
                   "p_adjusted": d.p_adjusted if d else math.nan, "family": t.family if d else 0,
                   "correlation": d.corr if d else math.nan, "variance_removed": d.removed if d else math.nan,
                   "mde": d.mde if d else math.nan, "margin": t.margin if t.margin is not None else math.nan,
                   "verdict_word": verdict_word(t, r), "verdict": verdict(t, r),
                   "bad_runs": r.bad, "ended_runs": r.ended, "bad_rate_low": rate[0], "bad_rate_high": rate[1],
                   "bad_fisher_p_adjusted": r.outcome_p,
                   "params": r.mean_of("params"), "params_non_embedding": r.mean_of("params_non_embedding"),
                   "tokens_per_sec": r.mean_of("tokens_per_sec"), "wall_seconds": r.mean_of("wall_seconds"),
                   "tokens_seen": r.mean_of("tokens_seen"), "train_flops": r.flops,
                   "values": {",".join(k): v for k, v in r.values.items()}}
            recs.append(rec)
    return recs

def to_csv(tables: list[Table]) -> str:
    recs = [{k: v for k, v in r.items() if k != "values"} for r in to_records(tables)]
    fields = list(dict.fromkeys(k for r in recs for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in recs:
        w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    return buf.getvalue()

def label_of(t: "Table", r: Row) -> str:
    """The row's overrides; a key its cell does not set (blank in the table) is left out."""
    return ", ".join(f"{k}={v}" for k, v in zip(t.varying, r.label) if v != "") or "all runs"


def to_json(tables: list[Table], shared: dict, counts: dict, jobs: list[Job], along: Optional[list] = None,
            by_position: Optional[list] = None) -> str:
    from modforge.utils.files import finite

    doc = {"shared": shared, "jobs": counts, "rows": to_records(tables),
           "problems": [{"job": j.name, "status": j.status, "error": j.error} for j in jobs
                        if j.status not in ("finished",)]}
    if along is not None:
        doc["along"] = along  # the report's x=: the metric along one swept key (modforge.results.along)
    if by_position is not None:
        doc["by_position"] = by_position  # the report's by_position=: loss by position (modforge.results.positions)
    return json.dumps(finite(doc), indent=2, allow_nan=False) + "\n"
