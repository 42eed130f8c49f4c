"""A sweep's results as tables: every job under a sweep directory with its status, jobs grouped into
configurations (pooled over seeds), each row's mean, interval, spread and its difference from the baseline
(paired over seeds when both configurations ran the same seeds, Welch's otherwise; Holm's adjustment over
the family), the cost table, and the formats (Markdown, CSV, JSON). No Lightning, no Hydra: the command is
:mod:`modforge.report`, the plots :mod:`modforge.results.plots`."""
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

from modforge.errors import ModforgeError
from modforge.registry import suggest
from modforge.results import stats
from modforge.run.dirs import read_state

LOWER_IS_BETTER = ("loss", "bpc", "ppl", "perplexity")

STATUSES = ("finished", "diverged", "failed", "interrupted", "unfinished", "unreadable")

class ReportError(ModforgeError):
    pass

@dataclass
class Job:
    dir: Path
    name: str  # path under the sweep directory
    overrides: dict
    status: str
    metrics: Optional[dict] = None
    task: str = "?"
    error: Optional[str] = None

def load_jobs(root: Path) -> list[Job]:
    """Every job under ``root``, whatever its status."""
    jobs = []
    for ov_file in sorted(root.rglob(".hydra/overrides.yaml")):
        d = ov_file.parent.parent
        name = str(d.relative_to(root)) if d != root else d.name
        try:
            listed = yaml.safe_load(ov_file.read_text(encoding="utf-8")) or []
            overrides = {k: canonical(v) for k, v in (str(o).lstrip("+~").split("=", 1) for o in listed
                                                       if "=" in str(o))}
        except (OSError, ValueError, yaml.YAMLError) as e:
            jobs.append(Job(d, name, {}, "unreadable", error=f"{type(e).__name__}: {e}".splitlines()[0]))
            continue
        job = Job(d, name, overrides, "unfinished", task=_task_of(d))
        state = read_state(d, owned=False)
        job.status = {"new": "unfinished", "foreign": "unreadable"}.get(state.status, state.status)
        job.metrics, job.error = state.metrics, state.error
        if state.metrics is not None:
            job.task = (state.metrics.get("config") or {}).get("task") or job.task
        if state.status == "interrupted" and not state.error:
            step = state.checkpoint_step()
            job.error = f"last checkpoint at step {step}" if step is not None else "no checkpoint"
        jobs.append(job)
    return jobs

def _task_of(d: Path) -> str:
    try:
        cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text(encoding="utf-8")) or {}
        return str((cfg.get("task") or {}).get("name") or "?")
    except (OSError, yaml.YAMLError, AttributeError):
        return "?"

def metric_value(metrics: Optional[dict], name: str) -> float:
    """The metric as a float (NaN when missing, null or non-numeric)."""
    if not metrics:
        return math.nan
    v = (metrics.get("val") or {}).get(name, metrics.get(name))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan

def natural(value: str) -> tuple:
    """Sort key under which seed=2 comes before seed=10."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", value))

@dataclass
class Row:
    label: tuple  # values of the varying keys
    jobs: list
    values: dict = field(default_factory=dict)  # {over-key values: metric} of the finished runs with a finite metric
    interval: stats.Interval = field(default_factory=lambda: stats.Interval(math.nan))
    diff: Optional[stats.Interval] = None  # self - baseline
    p_holm: float = math.nan
    is_baseline: bool = False

    def count(self, status: str) -> int:
        return sum(j.status == status for j in self.jobs)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def sd(self) -> float:
        v = list(self.values.values())
        return statistics.stdev(v) if len(v) > 1 else math.nan

    def mean_of(self, key: str) -> float:
        xs = [j.metrics.get(key) for j in self.jobs if j.metrics and isinstance(j.metrics.get(key), (int, float))]
        return sum(xs) / len(xs) if xs else math.nan

    @property
    def flops(self) -> float:
        """6·N·D (Kaplan et al. 2020): N non-embedding parameters, D tokens seen."""
        return 6 * self.mean_of("params_non_embedding") * self.mean_of("tokens_seen")

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
    family: int  # Holm's family size
    family_of: str = ""  # what the family is

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
        for cell in (h.get("sweeper") or {}).get("cells") or []:
            keys |= set(cell if isinstance(cell, dict) else {})
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
              baseline: str = "best", level: float = 0.95, task: str = "?") -> Table:
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
        r.interval = stats.mean_interval(list(r.values.values()), level)
    sign = 1 if best == "min" else -1

    def quality(r: Row) -> tuple:  # rows with results first, then those with a diverged run, then the empty ones
        return (r.n == 0, r.count("diverged") > 0, sign * r.interval.estimate if r.n else 0.0)

    by_name = sorted(rows, key=lambda r: tuple(natural(str(v)) for v in r.label))
    rows = by_name if sort == "name" else sorted(by_name, key=quality)
    base = pick_baseline(rows, by_name, varying, baseline, quality, metric)
    family, family_of = 0, ""
    if base is not None:
        base.is_baseline = True
        for r in rows:
            if r is not base and r.n and base.n:
                r.diff = stats.difference(r.values, base.values, level)
        compared = [r for r in rows if r.diff is not None and r.diff.kind]
        if baseline == "best":
            # the baseline was chosen by the data (the winner): Holm over every pair of configurations, so the
            # error rate holds for whichever pairs the selection makes us look at
            usable = [r for r in rows if r.n >= 2]
            pairs = [(a, b) for i, a in enumerate(usable) for b in usable[i + 1:]]
            ps = [stats.difference(a.values, b.values, level) for a, b in pairs]
            adjusted = stats.holm([d.p if d.kind else math.nan for d in ps])
            lookup = {(id(a), id(b)): p for (a, b), p in zip(pairs, adjusted)}
            for r in compared:
                r.p_holm = lookup.get((id(r), id(base)), lookup.get((id(base), id(r)), math.nan))
            family, family_of = sum(d.kind != "" for d in ps), "pairs of configurations (the baseline is the best, " \
                                                                "chosen by the data)"
        else:
            for r, p in zip(compared, stats.holm([r.diff.p for r in compared])):
                r.p_holm = p
            family, family_of = len(compared), "comparisons with the baseline"
    return Table(task, metric, best, sort, level, varying, rows, base, family, family_of)

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
    if not found[0].n:
        raise ReportError(f"baseline={spec}: that configuration has no finished run with a finite {metric}")
    return found[0]

def fmt(x: float, digits: int = 4) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"

def fmt_count(x: float, scientific: bool = False) -> str:
    if x is None or math.isnan(x):
        return ""
    return f"{x:.3g}" if scientific else f"{x:,.0f}"

def verdict(t: Table, r: Row) -> str:
    if r.is_baseline:
        return "baseline"
    if r.diff is None or not r.diff.kind:
        if not r.n:
            return ""
        return f"baseline has n={t.baseline.n}: no interval" if t.baseline and t.baseline.n < 2 else f"n={r.n}: no interval"
    p = r.p_holm if t.family >= 2 else r.diff.p
    alpha = 1 - t.level
    word = "better" if (r.diff.estimate < 0) == (t.best == "min") else "worse"
    tested = f"{r.diff.kind}, {'Holm ' if t.family >= 2 else ''}p={p:.3g}"
    if r.diff.excludes_zero and p < alpha:
        return f"{word} ({tested})"
    return f"not distinguishable at n={r.n} ({tested})"

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
    head = [*t.varying, "runs", f"{t.metric} mean", f"{pct} CI", "sd", "min", "max",
            "Δ vs baseline", f"Δ {pct} CI", "verdict", "not counted"]
    body = []
    for r in t.rows:
        vals = list(r.values.values())
        ci = f"[{fmt(r.interval.low)}, {fmt(r.interval.high)}]" if r.interval.kind else ""
        d = r.diff
        body.append([*r.label, r.n, fmt(r.interval.estimate), ci, fmt(r.sd), fmt(min(vals) if vals else math.nan),
                     fmt(max(vals) if vals else math.nan),
                     fmt(d.estimate) if d else ("0" if r.is_baseline else ""),
                     f"[{fmt(d.low)}, {fmt(d.high)}]" if d and d.kind else "", verdict(t, r), other_statuses(r, t.metric)])
    return head, body

def cost_rows(t: Table) -> tuple[list, list]:
    head = [*t.varying, "params", "non-embedding", "tokens/s", "wall s", "tokens seen", "≈ FLOPs (6ND)"]
    body = [[*r.label, fmt_count(r.mean_of("params")), fmt_count(r.mean_of("params_non_embedding")),
             fmt_count(r.mean_of("tokens_per_sec")), fmt(r.mean_of("wall_seconds"), 1),
             fmt_count(r.mean_of("tokens_seen")), fmt_count(r.flops, scientific=True)] for r in t.rows]
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
    holm = ""
    if t.family >= 2:
        holm = f"; verdicts use p-values Holm-adjusted over the {t.family} {t.family_of}; Δ intervals are per comparison"
    return (f"task {t.task}, metric {t.metric}, {order}; runs pooled over {', '.join(over) or 'nothing'}; "
            f"intervals are {t.level:.0%} Student-t; baseline {base or '(the only configuration)'}{holm}")

def to_markdown(tables: list[Table], shared: dict, counts: dict, over: tuple, problems: list[Job]) -> str:
    out = []
    if shared:
        out.append("shared: " + " ".join(f"{k}={v}" for k, v in shared.items()))
    out.append("jobs: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s)))
    for t in tables:
        out += ["", describe(t, over), "", markdown_table(*answer_rows(t)), "", markdown_table(*cost_rows(t))]
    if problems:
        out.append("")
        out += [f"{j.status}: {j.name}" + (f" ({j.error})" if j.error else "") for j in problems]
    return "\n".join(out)

def to_records(tables: list[Table]) -> list[dict]:
    recs = []
    for t in tables:
        for r in t.rows:
            d = r.diff
            rec = {"task": t.task, "metric": t.metric, **dict(zip(t.varying, r.label)), "runs": r.n,
                   **{s: r.count(s) for s in STATUSES[1:]},
                   "mean": r.interval.estimate, "ci_low": r.interval.low, "ci_high": r.interval.high, "sd": r.sd,
                   "min": min(r.values.values(), default=math.nan), "max": max(r.values.values(), default=math.nan),
                   "baseline": r.is_baseline, "diff": d.estimate if d else math.nan,
                   "diff_ci_low": d.low if d else math.nan, "diff_ci_high": d.high if d else math.nan,
                   "test": d.kind if d else "", "p": d.p if d else math.nan, "p_holm": r.p_holm,
                   "verdict": verdict(t, r),
                   "params": r.mean_of("params"), "params_non_embedding": r.mean_of("params_non_embedding"),
                   "tokens_per_sec": r.mean_of("tokens_per_sec"), "wall_seconds": r.mean_of("wall_seconds"),
                   "tokens_seen": r.mean_of("tokens_seen"), "flops_6nd": r.flops,
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

def to_json(tables: list[Table], shared: dict, counts: dict, jobs: list[Job]) -> str:
    from modforge.utils.files import finite

    doc = {"shared": shared, "jobs": counts, "rows": to_records(tables),
           "problems": [{"job": j.name, "status": j.status, "error": j.error} for j in jobs
                        if j.status not in ("finished",)]}
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
    tasks = sorted({j.task for j in jobs if j.status != "unreadable"})
    groups = [(t, [t]) for t in tasks] if a["tasks"] == "apart" else [("+".join(tasks), tasks)]
    tables = []
    for task, members in groups:
        mine = [j for j in jobs if j.task in members and j.status != "unreadable"]
        if not any(a["metric"] in ((j.metrics or {}).get("val") or {}) for j in mine):
            continue
        tables.append(summarise(mine, a["metric"], over, varying, a["sort"], a["best"], a["baseline"], a["level"], task))
    if not tables:
        have = sorted({k for j in jobs if j.metrics for k in (j.metrics.get("val") or {})})
        if not have:
            raise ReportError("no finished jobs (no */metrics.json next to a .hydra/overrides.yaml)"
                              + "".join(f"; {j.status}: {j.name} ({j.error})" for j in jobs if j.error)[:600])
        raise ReportError(f"metric={a['metric']}: no job reports it.{suggest(a['metric'], have)} "
                          f"Metrics that exist: {', '.join(have)}.")
    return tables, shared

def same_value(a: str, b: str) -> bool:
    """Override values as written (seed=2) or as Hydra rewrites a swept one (optim.lr=3e-3 -> 0.003)."""
    return canonical(a) == canonical(b)

def canonical(v: str) -> str:
    """One spelling per value, so that one configuration is one row: optim.lr=1e-3 and optim.lr=0.001 are the
    same number, sample=False and sample=false the same boolean; integers and words stay as written."""
    if v.lower() in ("true", "false"):
        return v.lower()
    if re.fullmatch(r"[+-]?\d+", v.strip()):
        return v
    try:
        f = float(v)
    except ValueError:
        return v
    return repr(f) if math.isfinite(f) else str(f)

def select(jobs: list[Job], a: dict) -> list[Job]:
    """``where=k=v,...``: the jobs whose overrides give every k its value v."""
    want = [p.split("=", 1) for p in a["where"].split(",")]
    if not all(len(kv) == 2 and kv[0] for kv in want):
        raise ReportError(f"where={a['where']}: give key=value pairs, comma-separated, e.g. where=model.n_layers=8")
    have = sorted({k for j in jobs for k in j.overrides}, key=natural)
    for k, _ in want:
        if k not in have:
            raise ReportError(f"where={a['where']}: no job has the key '{k}'.{suggest(k, have)} "
                              f"Keys of the jobs: {', '.join(have) or 'none'}.")
    kept = [j for j in jobs if all(k in j.overrides and same_value(j.overrides[k], v) for k, v in want)]
    if not kept:
        raise ReportError(f"where={a['where']}: no job has all of these overrides")
    a["where_keys"] = [k for k, _ in want]
    return kept
