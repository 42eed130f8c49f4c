"""Summarise a sweep: ``python -m modforge.report <multirun dir> [metric=val/loss] [over=seed] [sort=mean]``.

Reads every job's ``metrics.json`` and ``.hydra/overrides.yaml`` under the
directory, groups the jobs by their overrides leaving out the ``over`` keys
(by default ``seed``, so repeats of one configuration are pooled), and prints
a Markdown table with one row per configuration: the overrides that vary
across the sweep, the number of runs, and the mean, standard deviation
(n-1), minimum and maximum of ``metric``. Overrides shared by every job are
printed once above the table. Jobs without ``metrics.json`` (failed or still
running) are counted and named.
"""
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Optional

import yaml

USAGE = "usage: python -m modforge.report <multirun dir> [metric=val/loss] [over=seed[,other]] [sort=mean|name]"


class ReportError(Exception):
    pass


def load_jobs(root: Path) -> tuple[list[dict], list[Path]]:
    """[{overrides: {key: value}, metrics: {...}, dir: Path}], and the job directories with no metrics.json."""
    jobs, unfinished = [], []
    for ov_file in sorted(root.rglob(".hydra/overrides.yaml")):
        job = ov_file.parent.parent
        overrides = dict(o.split("=", 1) for o in yaml.safe_load(ov_file.read_text()) or [] if "=" in o)
        m = job / "metrics.json"
        if m.exists():
            jobs.append({"overrides": overrides, "metrics": json.loads(m.read_text()), "dir": job})
        else:
            unfinished.append(job)
    return jobs, unfinished


def metric_value(metrics: dict, name: str) -> Optional[float]:
    v = metrics.get("val", {}).get(name, metrics.get(name))
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def summarise(jobs: list[dict], metric: str, over: tuple[str, ...], sort: str = "mean") -> tuple[list[str], dict, list[list]]:
    """(varying keys, shared overrides, rows); a row is [*values of the varying keys, n, mean, sd, min, max]."""
    keys = sorted({k for j in jobs for k in j["overrides"] if k not in over})
    shared = {k: jobs[0]["overrides"].get(k) for k in keys
              if len({j["overrides"].get(k) for j in jobs}) == 1}
    varying = [k for k in keys if k not in shared]
    groups: dict[tuple, list[float]] = {}
    for j in jobs:
        v = metric_value(j["metrics"], metric)
        groups.setdefault(tuple(j["overrides"].get(k, "") for k in varying), [])
        if v is not None:
            groups[tuple(j["overrides"].get(k, "") for k in varying)].append(v)
    rows = []
    for key, vals in groups.items():
        n = len(vals)
        mean = statistics.fmean(vals) if vals else math.nan
        sd = statistics.stdev(vals) if n > 1 else math.nan
        rows.append([*key, n, mean, sd, min(vals, default=math.nan), max(vals, default=math.nan)])
    rows.sort(key=(lambda r: (math.isnan(r[-4]), r[-4])) if sort == "mean" else (lambda r: r[: len(varying)]))
    return varying, shared, rows


def markdown(varying: list[str], rows: list[list], metric: str) -> str:
    fmt = lambda x: "" if isinstance(x, float) and math.isnan(x) else f"{x:.4f}" if isinstance(x, float) else str(x)
    head = [*varying, "runs", f"{metric} mean", "sd", "min", "max"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> dict:
    if not argv or "=" in argv[0]:
        raise ReportError(f"name the sweep directory first. {USAGE}")
    args = {"dir": argv[0], "metric": "val/loss", "over": "seed", "sort": "mean"}
    for a in argv[1:]:
        key, eq, value = a.partition("=")
        if not eq or key not in ("metric", "over", "sort"):
            raise ReportError(f"unknown argument '{a}'. {USAGE}")
        args[key] = value
    if args["sort"] not in ("mean", "name"):
        raise ReportError(f"sort={args['sort']}: use sort=mean or sort=name")
    return args


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        a = parse_args(argv)
        root = Path(a["dir"])
        if not root.is_dir():
            raise ReportError(f"{root}: no such directory (give a sweep directory, e.g. multirun/<date>/<time>)")
        jobs, unfinished = load_jobs(root)
        if not jobs:
            raise ReportError(f"{root}: no finished jobs (no */metrics.json next to a .hydra/overrides.yaml)")
        over = tuple(k for k in a["over"].split(",") if k)
        varying, shared, rows = summarise(jobs, a["metric"], over, a["sort"])
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if shared:
        print("shared: " + " ".join(f"{k}={v}" for k, v in shared.items()))
    print(f"{len(jobs)} finished jobs, grouped over {', '.join(over) or 'nothing'}\n")
    print(markdown(varying, rows, a["metric"]))
    if unfinished:
        print(f"\n{len(unfinished)} unfinished (no metrics.json): " + ", ".join(p.name for p in unfinished))


if __name__ == "__main__":
    main()
