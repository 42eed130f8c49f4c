"""Summarise a sweep: ``python -m modforge.report <multirun dir> [metric=val/loss] [over=seed] [sort=best] [best=min|max]``.

Reads every job's ``metrics.json`` and ``.hydra/overrides.yaml`` under the
directory, groups the jobs by their overrides leaving out the ``over`` keys
(by default ``seed``, so repeats of one configuration are pooled), and prints
a Markdown table with one row per configuration: the overrides that vary
across the sweep, the number of runs, how many of them ended non-finite
(diverged, NaN), and the mean, standard deviation (n-1), minimum and maximum
of ``metric`` over the finite ones. Rows are sorted best first: lower is
better for losses (a metric named ``*loss*``, ``*bpc*``, ``*ppl*``), higher
for anything else (accuracy, exact match), or as ``best=`` says; rows with a
non-finite run come last. Overrides shared by every job are printed once
above the table. Jobs without ``metrics.json`` (failed or still running) are
counted and named.
"""
import json
import math
import re
import statistics
from pathlib import Path
from typing import Optional

import yaml

from modforge.cli import command
from modforge.registry import ModforgeError

USAGE = ("usage: python -m modforge.report <multirun dir> [metric=val/loss] [over=seed[,other]] [sort=best|name] "
         "[best=min|max]")
OPTIONS = ("metric", "over", "sort", "best")
LOWER_IS_BETTER = ("loss", "bpc", "ppl", "perplexity")


class ReportError(ModforgeError):
    pass


def load_jobs(root: Path) -> tuple[list[dict], list[Path]]:
    """[{overrides: {key: value}, metrics: {...}, dir: Path}], and the job directories with no metrics.json."""
    jobs, unfinished = [], []
    for ov_file in sorted(root.rglob(".hydra/overrides.yaml")):
        job = ov_file.parent.parent
        try:
            overrides = dict(o.split("=", 1) for o in yaml.safe_load(ov_file.read_text()) or [] if "=" in o)
            m = job / "metrics.json"
            metrics = json.loads(m.read_text()) if m.exists() else None
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise ReportError(f"{job}: unreadable job record ({type(e).__name__}: {e})") from None
        if metrics is None:
            unfinished.append(job)
        else:
            jobs.append({"overrides": overrides, "metrics": metrics, "dir": job})
    return jobs, unfinished


def metric_value(metrics: dict, name: str) -> float:
    """The metric as a float (NaN when missing, non-numeric or non-finite)."""
    v = metrics.get("val", {}).get(name, metrics.get(name))
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def natural(value: str) -> tuple:
    """Sort key under which seed=2 comes before seed=10."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", value))


def summarise(jobs: list[dict], metric: str, over: tuple[str, ...], sort: str = "best",
              best: str = "min") -> tuple[list[str], dict, list[list]]:
    """(varying keys, shared overrides, rows); a row is [*values of the varying keys, n, non-finite, mean, sd, min, max]."""
    keys = sorted({k for j in jobs for k in j["overrides"] if k not in over})
    shared = {k: jobs[0]["overrides"].get(k) for k in keys
              if len({j["overrides"].get(k) for j in jobs}) == 1}
    varying = [k for k in keys if k not in shared]
    groups: dict[tuple, list[float]] = {}
    for j in jobs:
        groups.setdefault(tuple(j["overrides"].get(k, "") for k in varying), []).append(metric_value(j["metrics"], metric))
    rows = []
    for key, vals in groups.items():
        ok = [v for v in vals if not math.isnan(v)]
        mean = statistics.fmean(ok) if ok else math.nan
        sd = statistics.stdev(ok) if len(ok) > 1 else math.nan
        rows.append([*key, len(vals), len(vals) - len(ok), mean, sd, min(ok, default=math.nan), max(ok, default=math.nan)])
    if sort == "name":
        rows.sort(key=lambda r: tuple(natural(str(v)) for v in r[: len(varying)]))
    else:
        sign = 1 if best == "min" else -1
        rows.sort(key=lambda r: (r[-5] > 0 or math.isnan(r[-4]), sign * r[-4] if not math.isnan(r[-4]) else 0.0))
    return varying, shared, rows


def markdown(varying: list[str], rows: list[list], metric: str) -> str:
    def cell(x) -> str:
        if isinstance(x, float):
            return "" if math.isnan(x) else f"{x:.4f}"
        return str(x).replace("|", "\\|")

    head = [*varying, "runs", "non-finite", f"{metric} mean", "sd", "min", "max"]
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> dict:
    if not argv or argv[0].split("=", 1)[0] in OPTIONS:
        raise ReportError(f"name the sweep directory first. {USAGE}")
    args = {"dir": argv[0], "metric": "val/loss", "over": "seed", "sort": "best", "best": None}
    for a in argv[1:]:
        key, eq, value = a.partition("=")
        if not eq or key not in OPTIONS:
            raise ReportError(f"unknown argument '{a}'. {USAGE}")
        args[key] = value
    if args["sort"] not in ("best", "name"):
        raise ReportError(f"sort={args['sort']}: use sort=best or sort=name")
    if args["best"] is None:
        args["best"] = "min" if any(w in args["metric"].lower() for w in LOWER_IS_BETTER) else "max"
    if args["best"] not in ("min", "max"):
        raise ReportError(f"best={args['best']}: use best=min (lower is better) or best=max")
    return args


def report_command(argv: list) -> None:
    a = parse_args(argv)
    root = Path(a["dir"])
    if not root.is_dir():
        raise ReportError(f"{root}: no such directory (give a sweep directory, e.g. multirun/<date>/<time>)")
    jobs, unfinished = load_jobs(root)
    if not jobs:
        raise ReportError(f"{root}: no finished jobs (no */metrics.json next to a .hydra/overrides.yaml)")
    over = tuple(k for k in a["over"].split(",") if k)
    varying, shared, rows = summarise(jobs, a["metric"], over, a["sort"], a["best"])
    if shared:
        print("shared: " + " ".join(f"{k}={v}" for k, v in shared.items()))
    order = "by name" if a["sort"] == "name" else f"best first ({'lower' if a['best'] == 'min' else 'higher'} is better)"
    print(f"{len(jobs)} finished jobs, grouped over {', '.join(over) or 'nothing'}, {order}\n")
    print(markdown(varying, rows, a["metric"]))
    if unfinished:
        print(f"\n{len(unfinished)} unfinished (no metrics.json): " + ", ".join(str(p.relative_to(root)) for p in unfinished))


def main(argv: Optional[list] = None) -> None:
    command(__doc__, report_command, argv)


if __name__ == "__main__":
    main()
