"""A sweep's results as tables: the jobs (:mod:`modforge.results.jobs`) grouped into
configurations (pooled over seeds), each row's mean and interval (inside the metric's range), spread, its
difference from the baseline over the seeds both finished, with a simultaneous interval and one of four
verdicts (:mod:`modforge.results.stats`), its rate of diverged and collapsed runs with Fisher's test, the cost
table, and the formats (Markdown, CSV, JSON). A sweep whose experiment declared a ``study:`` block is reported
as it declared. No Lightning, no Hydra: the command is :mod:`modforge.report`, the plots
:mod:`modforge.results.plots`."""
import csv
import io
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from modforge.registry import suggest
from modforge.results import stats
from modforge.results.jobs import (OUTCOMES, STATUSES, Job, ReportError, at_point, metric_info, metric_value,
                                   natural, same_value)

@dataclass
class Row:
    label: tuple  # values of the varying keys
    jobs: list
    values: dict = field(default_factory=dict)  # {over-key values: metric} of the finished runs with a finite metric
    interval: stats.Interval = field(default_factory=lambda: stats.Interval(math.nan))
    diff: Optional[stats.Comparison] = None  # self - baseline
    is_baseline: bool = False
    in_family: bool = False  # one of the comparisons the family (the study, or every row) is made of
    outcome_p: float = math.nan  # Fisher's test of this row's collapsed+diverged rate against the baseline's

    def count(self, status: str) -> int:
        return sum(j.status == status for j in self.jobs)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def ended(self) -> int:
        """Runs with an outcome of the arm's own: finished, collapsed or diverged (not failed or cut short)."""
        return sum(j.status in ("finished", *OUTCOMES) for j in self.jobs)

    @property
    def bad(self) -> int:
        return sum(j.status in OUTCOMES for j in self.jobs)

    @property
    def sd(self) -> float:
        v = list(self.values.values())
        return statistics.stdev(v) if len(v) > 1 else math.nan

    def mean_of(self, key: str) -> float:
        xs = [j.metrics.get(key) for j in self.jobs if j.metrics and isinstance(j.metrics.get(key), (int, float))]
        return sum(xs) / len(xs) if xs else math.nan

    @property
    def flops(self) -> float:
        """Training FLOPs as the runs counted them from their shapes (``metrics.json``'s ``train_flops``);
        6·N·D (Kaplan et al. 2020, N non-embedding parameters) for runs from before that count."""
        counted = self.mean_of("train_flops")
        if not math.isnan(counted):
            return counted
        return 6 * self.mean_of("params_non_embedding") * self.mean_of("tokens_seen")

    @property
    def flops_estimated(self) -> bool:
        return math.isnan(self.mean_of("train_flops"))

@dataclass
class Table:
    task: str
    metric: str
    best: str
    sort: str
    level: float
    varying: list
    rows: list
    baseline: Optional[Row]
    family: int  # the number of comparisons tested together
    family_of: str = ""  # what the family is
    test: str = "paired"  # the family's test: paired over shared seeds, or welch
    margin: Optional[float] = None  # the declared equivalence margin
    info: dict = field(default_factory=dict)  # the metric's range and direction
    study: Optional[dict] = None  # the declared study this table answers
    notes: list = field(default_factory=list)  # warnings about the comparison's fairness
    over: tuple = ()  # the keys pooled into a row (the seeds)
    at: str = ""  # where the runs are compared, when not at their end (at=)
    declared: bool = False  # the family is the one a study declared
    overridden: list = field(default_factory=list)  # the study's settings the command line replaced

def group(jobs: list[Job], keys: list[str], over: tuple) -> list[Row]:
    rows: dict[tuple, Row] = {}
    for j in jobs:
        label = tuple(j.overrides.get(k, "") for k in keys)
        rows.setdefault(label, Row(label, [])).jobs.append(j)
    return list(rows.values())

def swept_keys(root: Path) -> set:
    """Keys a sweep under ``root`` was asked to vary (its ``multirun.yaml``): varying even where the jobs that
    would show it never started."""
    keys: set = set()
    for f in root.rglob("multirun.yaml"):
        try:
            h = (yaml.safe_load(f.read_text(encoding="utf-8")) or {}).get("hydra") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        keys |= set(((h.get("sweeper") or {}).get("params") or {}))
        cells = [c for c in (h.get("sweeper") or {}).get("cells") or [] if isinstance(c, dict)]
        # a key the cells set alike (a study's rung, its shared steps) is not swept; one they differ in, or that
        # some cells leave out, is
        keys |= {k for c in cells for k in c if len({str(d.get(k, "\0")) for d in cells}) > 1}
        for o in (h.get("overrides") or {}).get("task") or []:
            k, _, v = str(o).partition("=")
            if "," in v or re.match(r"\s*(glob|range|choice|interval)\(", v):
                keys.add(k.lstrip("+~"))
    return keys

def shared_overrides(jobs: list[Job], over: tuple, swept: set = frozenset()) -> tuple[dict, list]:
    """(overrides every job shares, the keys that vary), over every job whatever its status."""
    keys = sorted({k for j in jobs for k in j.overrides if k not in over}, key=natural)
    shared = {k: jobs[0].overrides.get(k) for k in keys if k not in swept
              and all(k in j.overrides for j in jobs) and len({j.overrides[k] for j in jobs}) == 1}
    return shared, [k for k in keys if k not in shared]

def summarise(jobs: list[Job], metric: str, over: tuple, varying: list, sort: str = "best", best: str = "min",
              baseline: str = "best", level: float = 0.95, task: str = "?", margin: Optional[float] = None,
              compare: Optional[list] = None, info: Optional[dict] = None) -> Table:
    """One table: rows, the baseline, and the family of comparisons (``compare``: the rows a study declared, by
    their overrides; None: every other row)."""
    info = info or metric_info(jobs, metric)
    lo, hi = info["low"], info["high"]
    rows = group(jobs, varying, over)
    for r in rows:
        for j in r.jobs:
            if j.status == "finished":
                v = metric_value(j.metrics, metric)
                if not math.isnan(v):
                    key = tuple(j.overrides.get(k, "") for k in over) or (j.name,)
                    if key in r.values:
                        other = next(o.name for o in r.jobs if o is not j and o.status == "finished" and
                                     tuple(o.overrides.get(k, "") for k in over) == key)
                        raise ReportError(
                            f"two runs of one configuration with {', '.join(f'{k}={v}' for k, v in zip(over, key))}: "
                            f"{other} and {j.name}; report one sweep at a time, or pool them with over=")
                    r.values[key] = v
    if any(not lo <= v <= hi for r in rows for v in r.values.values()):  # a range guessed from the name, wrongly
        lo, hi = -math.inf, math.inf
        info = {**info, "low": lo, "high": hi}
    for r in rows:
        r.interval = stats.mean_interval(list(r.values.values()), level, lo, hi)
    sign = 1 if best == "min" else -1

    def quality(r: Row) -> tuple:  # rows with results first, by their mean; the empty ones last
        return (r.n == 0, sign * r.interval.estimate if r.n else 0.0)

    by_name = sorted(rows, key=lambda r: tuple(natural(str(v)) for v in r.label))
    rows = by_name if sort == "name" else sorted(by_name, key=quality)
    base = pick_baseline(rows, by_name, varying, baseline, quality, metric)
    t = Table(task, metric, best, sort, level, varying, rows, base, 0, margin=margin, info=info, over=over)
    if base is None:
        return t
    base.is_baseline = True
    # the family is fixed before any metric is looked at: the comparisons a study declared, or every arm with a
    # run that ended (finished, collapsed or diverged) against the baseline, or every pair of them when the
    # baseline is the best (chosen by the data: the error rate then holds for whichever pair the choice shows)
    arms = [r for r in rows if r.ended]
    members = [r for r in rows if r is not base and (any(matches(r, varying, c) for c in compare)
                                                      if compare is not None else r.ended)]
    t.declared = compare is not None
    if baseline == "best" and compare is None:
        pairs = [(a, b) for i, a in enumerate(arms) for b in arms[i + 1:]]
        t.family_of = "pairs of configurations (the baseline is the best, chosen by the data)"
    else:
        pairs = [(r, base) for r in members]
        t.family_of = "comparisons with the baseline" + (" the study declared" if compare is not None else "")
    t.family = max(1, len(pairs))
    t.test = "paired" if over and any(set(a.values) & set(b.values) for a, b in pairs) else "welch"
    for r in members:
        r.in_family = True
        if r.n and base.n:
            r.diff = stats.compare(r.values, base.values, level, t.family, t.test == "paired", hi - lo)
    tested = [r for r in members if r.ended and base.ended]  # Fisher's tests form their own family
    for r in tested:
        r.outcome_p = min(1.0, len(tested) * stats.fisher(r.bad, r.ended, base.bad, base.ended))
    return t

def matches(r: Row, varying: list, spec: str) -> bool:
    want = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    return bool(want) and all(same_value(str(dict(zip(varying, r.label)).get(k)), v) for k, v in want.items())

def pick_baseline(rows: list[Row], by_name: list[Row], varying: list, spec: str, quality, metric: str) -> Optional[Row]:
    usable = [r for r in rows if r.n >= 2] or [r for r in rows if r.n]  # one with an interval, if any has one
    if not usable:
        return None
    if spec == "best":
        return min(usable, key=quality)
    if spec == "first":
        return next(r for r in by_name if r in usable)
    want = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    bad = [k for k in want if k not in varying]
    if bad or not want:
        raise ReportError(f"baseline={spec}: name the baseline by the overrides that vary in this sweep "
                          f"({', '.join(varying) or 'none vary'}), e.g. baseline={varying[0] if varying else 'k'}=..., "
                          "or use baseline=best or baseline=first")
    found = [r for r in rows if all(same_value(str(dict(zip(varying, r.label)).get(k)), v) for k, v in want.items())]
    if len(found) != 1:
        options = "; ".join(",".join(f"{k}={v}" for k, v in zip(varying, r.label)) for r in rows)
        raise ReportError(f"baseline={spec}: matches {len(found)} configurations; it must match one of: {options}")
    return found[0]  # with no finished run it still anchors the outcome rates; its comparisons say why no verdict

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
    word = f"equivalent within ±{t.margin:g}" if word == "equivalent" else word
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
    pct = f"{t.level:.0%}"
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
                     (d.n if d.test == "paired" else f"{d.n_x} vs {d.n_y}") if d else "",
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
        if d is None or not d.decided or d.test != "paired":
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
            f"means over finished runs only, with {t.level:.0%} intervals inside the metric's range; "
            f"baseline {base or '(the only configuration)'}")
    if t.study:
        text = f"study: {t.study.get('question', '(no question written)')}\n" + text
        if t.overridden:
            text += f"; the command line replaced the study's {', '.join(t.overridden)}"
    if t.family:
        pairing = "paired over the seeds both arms finished" if t.test == "paired" else \
            "Welch's unpaired test (the arms share no seed)"
        text += (f"; Δ = row - baseline, {pairing}; the {t.family} {t.family_of} form one family at "
                 f"{t.level:.0%}: each Δ interval is at {1 - (1 - t.level) / t.family:.4g} (Bonferroni), and the "
                 "verdict is read off it: better/worse when it excludes 0, "
                 + (f"equivalent when it lies inside ±{t.margin:g} (the declared margin), " if t.margin is not None
                    else "no equivalence without a declared margin (margin=), ")
                 + "else inconclusive with the minimum detectable effect at 80% power")
    return text

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

def build_tables(jobs: list[Job], a: dict) -> tuple[list[Table], dict]:
    over = tuple(k for k in a["over"].split(",") if k)
    if a["over_given"]:
        have = sorted({k for j in jobs for k in j.overrides}, key=natural)
        for k in over:
            if k not in have:
                raise ReportError(f"over={a['over']}: no job has the key '{k}'.{suggest(k, have)} "
                                  f"Keys of the jobs: {', '.join(have) or 'none'}.")
    shared, varying = shared_overrides(jobs, over, swept_keys(Path(a["dir"])) - set(a.get("where_keys", ())))
    study = a.get("study")
    compare = None
    if study and study.get("compare") is not None:
        compare = [str(c) for c in study["compare"]]
        for spec in compare:
            keys = [p.split("=", 1)[0] for p in spec.split(",")]
            if not all("=" in p for p in spec.split(",")) or any(k not in varying for k in keys):
                raise ReportError(f"study.compare: '{spec}' names no configuration by the overrides that vary in "
                                  f"this sweep ({', '.join(varying) or 'none vary'})")
    tasks = sorted({j.task for j in jobs if j.status != "unreadable"})
    groups = [(t, [t]) for t in tasks] if a["tasks"] == "apart" else [("+".join(tasks), tasks)]
    tables = []
    for task, members in groups:
        mine = [j for j in jobs if j.task in members and j.status != "unreadable"]
        if not any(a["metric"] in ((j.metrics or {}).get("val") or {}) for j in mine):
            continue
        info = metric_info(mine, a["metric"])
        at = at_point(mine, a["metric"], a["at"]) if a.get("at") else ""
        t = summarise(mine, a["metric"], over, varying, a["sort"], a["best"] or info["better"], a["baseline"],
                      a["level"], task, a.get("margin"), compare, info)
        t.study, t.notes, t.at = study, fairness_notes(t), at
        t.overridden = list(a.get("study_overridden", ()))
        if at and "beyond" in at:
            t.notes.append(at.split("; ", 1)[1])
        tables.append(t)
    if not tables:
        readable = [j for j in jobs if j.status != "unreadable"]
        have = sorted({k for j in readable if j.metrics for k in (j.metrics.get("val") or {})})
        unreadable = [j for j in jobs if j.status == "unreadable"]
        if not have and unreadable:
            raise ReportError("no job can be reported: " + "; ".join(f"unreadable: {j.name} ({j.error})"
                                                                     for j in unreadable)[:600])
        if not have:
            raise ReportError("no finished jobs (no */metrics.json next to a .hydra/overrides.yaml)"
                              + "".join(f"; {j.status}: {j.name} ({j.error})" for j in jobs if j.error)[:600])
        raise ReportError(f"metric={a['metric']}: no job reports it.{suggest(a['metric'], have)} "
                          f"Metrics that exist: {', '.join(have)}.")
    return tables, shared

def fairness_notes(t: Table) -> list:
    """Warnings a careful reader wants before believing a comparison: repeated epochs without dropout (the
    arms may be memorising), and arms that did not see the same number of tokens."""
    notes = []
    repeated = [j for r in t.rows for j in r.jobs if j.metrics and (j.metrics.get("epochs") or 0) > 1
                and not (j.metrics.get("dropout") or 0)]
    if repeated:
        most = max(j.metrics["epochs"] for j in repeated)
        notes.append(f"{len(repeated)} runs trained for more than one epoch of their data (up to {most:.3g}) with "
                     "dropout 0: differences may be in memorising the training split")
    seen = {r.label: r.mean_of("tokens_seen") for r in t.rows if r.n}
    finite = [v for v in seen.values() if not math.isnan(v)]
    if finite and max(finite) != min(finite):
        notes.append(f"the arms did not see the same number of training tokens ({min(finite):,.0f} to "
                     f"{max(finite):,.0f}): compare them at equal tokens or compute, not only at the end")
    return notes
