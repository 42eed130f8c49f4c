"""A sweep's results as tables: the jobs (:mod:`modforge.results.jobs`) grouped into
configurations (pooled over seeds), each row's mean and interval (inside the metric's range), spread, its
difference from the baseline (every arm against one baseline in one randomised-block model of the seeds,
:mod:`modforge.results.blocks`, with Dunnett's simultaneous intervals; against a baseline chosen as the best,
every pair's paired t; Welch's where no seed is shared), and one of four verdicts
(:mod:`modforge.results.stats`), its rate of diverged and collapsed runs with Fisher's test, and the
cost figures; written out by :mod:`modforge.results.formats` (Markdown, CSV, JSON). A sweep whose experiment declared a ``study:`` block is reported
as it declared. No Lightning, no Hydra: the command is :mod:`modforge.report`, the plots
:mod:`modforge.results.plots`."""
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from modforge.registry import suggest
from modforge.results import blocks, stats
from modforge.results.jobs import (OUTCOMES, Job, ReportError, at_point, metric_info, metric_value,
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
              compare: Optional[list] = None, info: Optional[dict] = None, model: str = "block") -> Table:
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
    if t.test == "paired" and model == "block" and baseline != "best" and pairs and all(b is base for _, b in pairs):
        t.test = "block"  # against one fixed baseline: every arm in one randomised-block model, as a study reads it
    for r in members:
        r.in_family = True
    have = [r for r in members if r.n] if base.n else []
    if t.test == "block" and have:
        got = blocks.against_baseline({id(r): r.values for r in [base, *have]}, id(base), [id(r) for r in have],
                                      level, hi - lo, family=t.family)
        for r in have:
            r.diff = got[id(r)]
    else:
        for r in have:
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
                                  f"this sweep ({', '.join(varying) or 'none vary'}); a sweep that is not the study's "
                                  "design is read with study=ignore")
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
                      a["level"], task, a.get("margin"), compare, info, a.get("model", "block"))
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
