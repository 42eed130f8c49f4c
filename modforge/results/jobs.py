"""A sweep's jobs as the report reads them: every job directory under a sweep with its overrides (one spelling
per value), its status and records; collapsed runs; the study a sweep declared; each metric's range and
direction; a run's logged curve, and its value at equal compute (``at=``). No Lightning, no Hydra: the tables
built from them are :mod:`modforge.results.tables`."""
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from modforge.errors import ModforgeError
from modforge.registry import suggest
from modforge.run.dirs import read_state

LOWER_IS_BETTER = ("loss", "bpc", "ppl", "perplexity")
RATES = ("acc", "exact_match", "accuracy", "rate")  # names of metrics in [0, 1], for runs that did not record it

STATUSES = ("finished", "collapsed", "diverged", "failed", "interrupted", "unfinished", "unreadable")
OUTCOMES = ("collapsed", "diverged")  # what an arm's runs can end as, besides finished: counted, never dropped
COLLAPSE_TOL = 0.02  # nats: a final val/loss within this of the unigram model's (or above it) is a collapse

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
    pause: Optional[dict] = None  # paused by pause_at: {"step", "val"} (modforge.run.dirs.pause_of)

def load_jobs(root: Path) -> list[Job]:
    """Every job under ``root``, whatever its status."""
    jobs = []
    for ov_file in sorted(root.rglob(".hydra/overrides.yaml")):
        d = ov_file.parent.parent
        if any(part.startswith(".adopting-") for part in d.relative_to(root).parts):  # a copy under way
            continue  # (modforge.sweeps.adopt.PARTIAL: a run is read once it is renamed into place)
        name = str(d.relative_to(root)) if d != root else d.name
        try:
            listed = yaml.safe_load(ov_file.read_text(encoding="utf-8")) or []
            if not isinstance(listed, list) or not all(isinstance(o, str) for o in listed):
                raise ValueError("not Hydra's record of a job's overrides (a list of key=value strings)")
            overrides = {k: canonical(v) for k, v in (str(o).lstrip("+~").split("=", 1) for o in listed
                                                       if "=" in str(o))}
        except (OSError, ValueError, yaml.YAMLError) as e:
            jobs.append(Job(d, name, {}, "unreadable", error=f".hydra/overrides.yaml: {type(e).__name__}: {e}"
                            .splitlines()[0]))
            continue
        job = Job(d, name, overrides, "unfinished", task=_task_of(d))
        state = read_state(d, owned=False)
        job.status = {"new": "unfinished", "foreign": "unreadable"}.get(state.status, state.status)
        job.metrics, job.error, job.pause = state.metrics, state.error, state.pause
        if state.metrics is not None:
            recorded = state.metrics.get("config")
            job.task = str((recorded if isinstance(recorded, dict) else {}).get("task") or job.task)
            outside = malformed(state.metrics) or out_of_range(state.metrics)
            if outside:  # a record no run of its task could write: counted as unreadable, never ranked
                job.status, job.error = "unreadable", f"metrics.json: {outside}"
        if state.status == "interrupted" and not state.error:
            step = state.checkpoint_step()
            job.error = f"last checkpoint at step {step}" if step is not None else "no checkpoint"
        jobs.append(job)
    return jobs

def mark_collapsed(jobs: list[Job], tol: float = COLLAPSE_TOL) -> None:
    """A finished run whose final ``val/loss`` is no better than its data's unigram model by ``tol`` becomes
    ``collapsed``: it learnt no more than token frequencies."""
    for j in jobs:
        if j.status == "finished" and collapsed(j.metrics or {}, tol):
            j.status = "collapsed"
            j.error = f"val/loss {j.metrics['val']['val/loss']:.4f}, unigram model {j.metrics['unigram_val_loss']:.4f}"


def collapsed(metrics: dict, tol: float) -> bool:
    loss, unigram = (metrics.get("val") or {}).get("val/loss"), metrics.get("unigram_val_loss")
    nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (loss, unigram))
    return nums and loss > unigram - tol


def study_of(jobs: list[Job]) -> Optional[dict]:
    """The ``study:`` block the sweep's experiment declared (every job's config carries the same one), or None."""
    found = None
    for j in jobs:
        try:
            cfg = yaml.safe_load((j.dir / ".hydra" / "config.yaml").read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(cfg, dict) and isinstance(cfg.get("study"), dict):
            if found is not None and cfg["study"] != found:
                raise ReportError(f"{j.name}: its study block differs from the other jobs'; report one study at a time")
            found = cfg["study"]
    return found


def metric_info(jobs: list[Job], metric: str) -> dict:
    """{"low", "high", "better"} of ``metric``, as the task that logged it recorded it (``metrics.json``'s
    ``metric_info``); for runs from before that record, from its name (losses >= 0 and lower is better,
    accuracies and exact match in [0, 1] and higher is better, anything else unbounded)."""
    return info_of([j.metrics or {} for j in jobs], metric)


def info_of(records: list, metric: str) -> dict:
    """``metric_info`` from runs' ``metrics.json`` records (dicts), as above."""
    short = metric.split("/", 1)[-1]
    for m in records:
        info = (m.get("metric_info") or {})
        rec = info.get(metric) or info.get(short)
        if rec is not None and declaration_fault(rec) is None:
            lo, hi = rec.get("low"), rec.get("high")
            return {"low": -math.inf if lo is None else float(lo), "high": math.inf if hi is None else float(hi),
                    "better": rec.get("better", "min")}
        # a record of another shape: read as a run from before the record (by the metric's name)
    name = short.lower()
    if any(w in name for w in LOWER_IS_BETTER):
        return {"low": 0.0, "high": math.inf, "better": "min"}
    if any(w in name for w in RATES):
        return {"low": 0.0, "high": 1.0, "better": "max"}
    return {"low": -math.inf, "high": math.inf, "better": "max"}


def malformed(metrics: dict) -> Optional[str]:
    """The first field of a ``metrics.json`` record that no run writes in that shape (the run's config not a
    mapping, a metric's declaration, the step count), as ``field=value: what it must be``; None when all fit."""
    if "config" in metrics and not isinstance(metrics["config"], dict):
        return f"config={str(metrics['config'])[:40]!r}: the run's config, a mapping"
    steps = metrics.get("steps")
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        return f"steps={str(steps)[:40]!r}: a whole number of steps >= 0"
    declared = metrics.get("metric_info")
    if declared is None:
        return None
    if not isinstance(declared, dict):
        return "metric_info: a mapping of metric -> {low, high, better}"
    for name, rec in declared.items():
        fault = declaration_fault(rec)
        if fault:
            return f"metric_info.{name}{fault}"
    return None


def declaration_fault(rec: Any) -> Optional[str]:
    """What is wrong with one metric's declaration in ``metric_info`` (``{low, high, better}``), as the rest of a
    message after its name; None when it is one a task writes."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if not isinstance(rec, dict):
        return ": a mapping of low, high, better"
    for end in ("low", "high"):
        if rec.get(end) is not None and not number(rec[end]):
            return f".{end}={str(rec[end])[:40]!r}: a number or null"
    if rec.get("better", "min") not in ("min", "max"):
        return f".better={str(rec['better'])[:40]!r}: min or max"
    return None


def out_of_range(metrics: dict) -> Optional[str]:
    """The first validation value outside its metric's range as the record declares it (``metric_info``; for a
    record without one, a loss's: at least 0), as ``name=value outside [low, high]``; None when all are in it."""
    declared = metrics.get("metric_info") if isinstance(metrics.get("metric_info"), dict) else {}
    for name, v in (metrics.get("val") or {}).items():
        short = str(name).split("/", 1)[-1]
        known = name in declared or short in declared or any(w in short.lower() for w in LOWER_IS_BETTER)
        if known and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            info = info_of([metrics], name)
            if not info["low"] <= v <= info["high"]:
                return f"{name}={v} outside its range [{info['low']}, {info['high']}]"
    return None


def _task_of(d: Path) -> str:
    try:
        cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text(encoding="utf-8")) or {}
        return str((cfg.get("task") or {}).get("name") or "?")
    except (OSError, yaml.YAMLError, AttributeError):
        return "?"

def read_curve(job_dir: Path, metric: str) -> dict[int, float]:
    """{step: value} of ``metric`` in a job's CSV log (the last value logged at a step wins)."""
    path = job_dir / "logs" / "metrics.csv"
    out: dict[int, float] = {}
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                v, step = row.get(metric), row.get("step")
                if v not in (None, "") and step not in (None, ""):
                    s_ = float(step)
                    if math.isfinite(s_):  # a step that is no number is not a point of the curve
                        out[int(s_)] = float(v)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error):
        return {}
    return out


def at_point(jobs: list[Job], metric: str, spec: str) -> str:
    """``at=flops:<F>`` or ``at=step:<N>``: each finished run's ``metric`` replaced by its value at the logged
    validation step closest to that point (FLOPs: the run's own FLOPs per step, from ``metrics.json``), so that
    arms are compared at equal compute rather than at the end. -> a phrase for the table's description."""
    kind, _, value = spec.partition(":")
    try:
        target = float(value)
    except ValueError:
        target = math.nan
    if kind not in ("flops", "step") or not (target > 0 and math.isfinite(target)) or \
            (kind == "step" and not target.is_integer()):
        raise ReportError(f"at={spec}: use at=flops:<FLOPs>, e.g. at=flops:1e12, or at=step:<step>, e.g. at=step:500")
    steps_used, short = [], []
    for j in jobs:
        if j.status != "finished" or not j.metrics:
            continue
        step = target
        if kind == "flops":
            total, steps = j.metrics.get("train_flops"), j.metrics.get("steps")
            if not (isinstance(total, (int, float)) and total > 0 and isinstance(steps, int)
                    and not isinstance(steps, bool) and steps > 0):
                raise ReportError(f"at={spec}: {j.name} recorded no train_flops (a run from before FLOPs were "
                                  "counted); compare such runs at=step:<step>")
            step = target / (total / steps)
        curve = read_curve(j.dir, metric)
        if not curve:
            raise ReportError(f"at={spec}: {j.name} has no {metric} in logs/metrics.csv")
        best = min(curve, key=lambda s: (abs(s - step), s))
        j.metrics = {**j.metrics, "val": {**(j.metrics.get("val") or {}), metric: curve[best]}}
        steps_used.append(best)
        if step > max(curve) * 1.01:
            short.append(j.name)
    span = f"step {min(steps_used)}" if steps_used and min(steps_used) == max(steps_used) else \
        f"steps {min(steps_used, default=0)}-{max(steps_used, default=0)}"
    text = f"at {kind} {target:.3g} (each run's logged validation closest to it: {span})"
    if short:
        text += (f"; {len(short)} runs never trained that far ({short[0]}{', ...' if len(short) > 1 else ''}): "
                 f"they are read at their last validation, beyond which at={spec} asks")
    return text


def metric_value(metrics: Optional[dict], name: str) -> float:
    """The metric as a float (NaN when missing, null or non-numeric)."""
    if not metrics:
        return math.nan
    v = (metrics.get("val") or {}).get(name, metrics.get(name))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan

def natural(value: str) -> tuple:
    """Sort key under which seed=2 comes before seed=10."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", value))

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
