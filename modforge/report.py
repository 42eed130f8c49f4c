"""Summarise a sweep: ``python -m modforge.report <sweep dir> [key=value ...]``.

  metric=val/loss        the metric to compare (any key of metrics.json's "val"); an unknown one lists those that exist
  over=seed              keys whose runs are pooled into one configuration (comma-separated; empty: every job a row)
  best=min|max           which direction is better (default: min for a metric named like a loss, bpc or ppl)
  sort=best|name         row order: best first (default) or by the overrides
  baseline=best          the configuration every other is compared with: best (default), first (first by name),
                         or its overrides, e.g. baseline=norm=layer,residual=pre
  level=0.95             confidence level of every interval
  where=k=v[,k2=v2]      only the jobs with these overrides (a slice of the sweep, e.g. where=model.n_layers=8)
  tasks=apart|together   jobs of different tasks in separate tables (default), or in one, for a metric that means
                         the same in each (val/exact_match of one pair task learnt by seq2seq, seq2seq_lm, transduce)
  format=md|csv|json     what is printed (default md)
  out=DIR                also write DIR/report.md, report.csv, report.json and the plots (PNG and SVG; plots need
                         the optional extra: pip install 'modforge[report]')

Examples:
  python -m modforge.report multirun/<date>/<time>
  python -m modforge.report multirun/<date>/<time> baseline=norm=layer out=experiments/results/my_study
  python -m modforge.report multirun/<date>/<time> metric=val/bpc format=csv

Every job directory under the sweep directory (one with ``.hydra/overrides.yaml``)
counts, with the status its records give (:func:`modforge.run.dirs.read_state`):
``finished`` (a ``metrics.json``), ``diverged`` (stopped on a non-finite loss, or a
non-finite validation metric), ``failed`` (a ``status.json`` that says so, with its
error), ``interrupted`` (killed or stopped: it has a config and no final record;
re-running the sweep resumes it), ``unfinished`` (nothing of its own yet: just
started) and ``unreadable`` (a record that does not parse). Jobs are grouped by their overrides without the ``over`` keys; each
group is one configuration and one row: its finished runs, the mean of the
metric with a Student-t interval over seeds, sd, min and max, and the
difference of its mean from the baseline's with an interval, paired over seeds
when both configurations ran the same seeds, Welch's otherwise. With three or
more configurations the comparisons with the baseline are a family: their
p-values are adjusted with Holm's step-down method, and a row is called
distinguishable only when its adjusted p is below 1 - level. A second table
gives the cost of each configuration: parameters (all, and without embeddings),
tokens/s, wall time, tokens seen and the training compute estimate 6·N·D.
Jobs of different tasks are reported in separate tables unless ``tasks=together``.
"""
from math import nan
from pathlib import Path
from typing import Optional

from modforge.cli.command import command
from modforge.registry import suggest
from modforge.results.tables import (LOWER_IS_BETTER, STATUSES, ReportError, build_tables, load_jobs, select,
                                     to_csv, to_json, to_markdown)

OPTIONS = ("metric", "over", "sort", "best", "baseline", "level", "format", "out", "tasks", "where")


def parse_args(argv: list[str]) -> dict:
    if not argv or argv[0].split("=", 1)[0] in OPTIONS:
        raise ReportError("name the sweep directory first: python -m modforge.report <sweep dir> [key=value ...] "
                          "(python -m modforge.report --help)")
    args = {"dir": argv[0], "metric": "val/loss", "over": "seed", "sort": "best", "best": None, "baseline": "best",
            "level": "0.95", "format": "md", "out": None, "tasks": "apart", "where": ""}
    for a in argv[1:]:
        key, eq, value = a.partition("=")
        if not eq or key not in OPTIONS:
            raise ReportError(f"unknown argument '{a}'.{suggest(key, list(OPTIONS))} Arguments: {', '.join(OPTIONS)}.")
        args[key] = value
    if args["out"] is not None and not args["out"].strip():
        raise ReportError("out=: an empty path; give the directory to write the report into, or leave out= out")
    args["over_given"] = any(a.startswith("over=") for a in argv[1:])
    for key, allowed in (("sort", ("best", "name")), ("format", ("md", "csv", "json")), ("tasks", ("apart", "together"))):
        if args[key] not in allowed:
            raise ReportError(f"{key}={args[key]}: use {' or '.join(f'{key}={v}' for v in allowed)}")
    if args["best"] is None:
        args["best"] = "min" if any(w in args["metric"].lower() for w in LOWER_IS_BETTER) else "max"
    if args["best"] not in ("min", "max"):
        raise ReportError(f"best={args['best']}: use best=min (lower is better) or best=max")
    try:
        level = float(args["level"])
    except ValueError:
        level = nan
    if not 0.5 <= level < 1:
        raise ReportError(f"level={args['level']}: a confidence level in [0.5, 1), e.g. level=0.95")
    args["level"] = level
    return args

def report_command(argv: list) -> None:
    a = parse_args(argv)
    root = Path(a["dir"])
    if not root.is_dir():
        raise ReportError(f"{root}: no such directory (give a sweep directory, e.g. multirun/<date>/<time>)")
    jobs = load_jobs(root)
    if not jobs:
        raise ReportError(f"{root}: no jobs (no .hydra/overrides.yaml below it)")
    if a["where"]:
        jobs = select(jobs, a)
    tables, shared = build_tables(jobs, a)
    over = tuple(k for k in a["over"].split(",") if k)
    counts = {s: sum(j.status == s for j in jobs) for s in STATUSES}
    problems = [j for j in jobs if j.status != "finished"]
    text = {"md": lambda: to_markdown(tables, shared, counts, over, problems), "csv": lambda: to_csv(tables),
            "json": lambda: to_json(tables, shared, counts, jobs)}
    print(text[a["format"]]().rstrip("\n"))
    if a["out"] is not None:
        out = Path(a["out"])
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ReportError(f"out={out}: cannot create it ({e.strerror})") from None
        from modforge.utils.files import write_text

        write_text(out / "report.md", text["md"]() + "\n")
        write_text(out / "report.csv", text["csv"]())
        write_text(out / "report.json", text["json"]())
        written = ["report.md", "report.csv", "report.json"]
        try:
            from modforge.results import plots
        except ImportError as e:
            print(f"\nwrote {', '.join(written)} to {out}; no plots: {e}")
            return
        written += plots.write_all(tables, out)
        print(f"\nwrote {', '.join(written)} to {out}")

def main(argv: Optional[list] = None) -> None:
    command(__doc__, report_command, argv)


if __name__ == "__main__":
    main()
