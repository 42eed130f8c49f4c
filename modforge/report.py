"""Summarise a sweep: ``python -m modforge.report <sweep dir> [key=value ...]``.

Examples:
  python -m modforge.report multirun/<date>/<time>
  python -m modforge.report multirun/<date>/<time> baseline=norm=layer out=experiments/results/my_study
  python -m modforge.report multirun/<date>/<time> metric=val/bpc format=csv
  python -m modforge.report multirun/mup_transfer over=seed x=optim.lr panel=param out=experiments/results/mup_transfer

Every job directory under the sweep directory (one with ``.hydra/overrides.yaml``)
counts, with the status its records give (:func:`modforge.run.dirs.read_state`):
``finished`` (a ``metrics.json``), ``collapsed`` (finished, but its val/loss is no
better than its data's unigram model by ``collapse_tol``), ``diverged`` (stopped on a
non-finite loss, or a non-finite validation metric), ``failed`` (a ``status.json``
that says so, with its error), ``interrupted`` (killed or stopped: re-running the
sweep resumes it), ``unfinished`` (nothing of its own yet) and ``unreadable``.
Jobs are grouped by their overrides without the ``over`` keys; each group is one
configuration (an arm) and one row: the mean of the metric over its finished runs
with an interval inside the metric's range, sd, min and max; its difference from
the baseline, with a simultaneous interval and one of four verdicts (better, worse,
equivalent within the margin, inconclusive with the minimum detectable effect; no
verdict without enough pairs or spread). Against one baseline every arm is in one
randomised-block model of the seeds with Dunnett's intervals, the model a study's
comparison uses (:mod:`modforge.results.blocks`); against ``baseline=best`` every
pair is a paired t at Bonferroni's level; arms that share no seed, Welch's. Its
collapsed and diverged runs as a rate with Fisher's test against the baseline.
A second table says what pairing bought (correlation over seeds, variance removed,
and whether paired runs trained on the same batches), a third the cost: parameters,
tokens/s, wall time, tokens seen and training FLOPs. The statistics are
:mod:`modforge.results.stats`. Jobs of different tasks are reported in separate
tables unless ``tasks=together``.
"""
from math import isfinite, nan
from pathlib import Path
from typing import Optional

from modforge.cli.command import command
from modforge.cli.options import Option, Options
from modforge.results.jobs import STATUSES, ReportError, load_jobs, mark_collapsed, select, study_of
from modforge.results.formats import to_csv, to_json, to_markdown
from modforge.results.tables import build_tables

OPTIONS = Options("python -m modforge.report", (
    Option("metric", "the metric to compare (any key of metrics.json's \"val\"); an unknown one lists those that "
           "exist", "val/loss", metavar="name"),
    Option("over", "keys whose runs are pooled into one configuration (comma-separated; empty: every job a row)",
           "seed", metavar="keys"),
    Option("best", "which direction is better (default: as the runs declare it, else min for a metric named like a "
           "loss, bpc or ppl)",
           type="choice", choices=("min", "max")),
    Option("sort", "row order: best first, or by the overrides", "best", "choice", ("best", "name")),
    Option("baseline", "the configuration every other is compared with: best, first (first by name), or its "
           "overrides, e.g. baseline=norm=layer,residual=pre", "best", metavar="best|first|overrides"),
    Option("model", "against one baseline: block (every arm in one randomised-block model of the seeds, Dunnett's "
           "intervals: more degrees of freedom, one noise level assumed for every arm) or paired (each comparison "
           "on its own pairs at Bonferroni's level: for arms of very different noise)", "block", "choice",
           ("block", "paired")),
    Option("level", "confidence level of every interval, and of the family of comparisons as a whole", "0.95",
           metavar="number"),
    Option("format", "what is printed", "md", "choice", ("md", "csv", "json")),
    Option("out", "also write DIR/report.md, report.csv, report.json and the plots (PNG and SVG; plots need the "
           "optional extra: pip install 'modforge[report]')", metavar="dir"),
    Option("tasks", "jobs of different tasks in separate tables, or in one, for a metric that means the same in "
           "each (val/exact_match of one pair task learnt by seq2seq, seq2seq_lm, transduce)", "apart", "choice",
           ("apart", "together")),
    Option("where", "only the jobs with these overrides (a slice of the sweep, e.g. where=model.n_layers=8)", "",
           metavar="k=v[,k2=v2]"),
    Option("margin", "the equivalence margin: a row whose simultaneous Δ interval lies inside ±M is \"equivalent "
           "within ±M\" (in the metric's units; none by default: no equivalence claimed)", metavar="M"),
    Option("collapse_tol", "a finished run whose val/loss is not below its unigram model's by this much (nats) "
           "counts as collapsed, an outcome like diverged, not a result to average", "0.02", metavar="nats"),
    Option("study", "a sweep whose experiment declared a study: block is reported as it declared (question, "
           "metric, direction, baseline, the family of comparisons, margin, level; options given here override "
           "it, and the report says so); ignore: as a plain sweep", "declared", "choice", ("declared", "ignore")),
    Option("at", "compare every run at the logged validation closest to F training FLOPs (each run's own FLOPs per "
           "step) or to step N, instead of at the end: arms at equal compute", metavar="flops:F|step:N"),
    Option("x", "also the metric along one swept key (e.g. x=optim.lr): a table with a line per combination of the "
           "other varying keys, each line's best value, flagged at the end of the sweep; and a plot (with out=), "
           "log-scaled where the values span more than 10x", metavar="key"),
    Option("panel", "with x=: the lines split into panels by this key (e.g. panel=param)", metavar="key"),
    Option("by_position", "also the loss at each position of the windows of N, as runs with eval_by_position=true "
           "recorded it: a table in ranges of positions and a plot (with out=), a line per configuration",
           metavar="val@N"),
), positional=Option("dir", "the sweep's directory, e.g. multirun/<date>/<time>", metavar="sweep directory"))


def parse_args(argv: list[str]) -> dict:
    values, _ = OPTIONS.parse(argv)
    args = {**values, "given": set(values.given), "over_given": "over" in values.given}
    if args["out"] is not None and not args["out"].strip():
        raise ReportError("out=: an empty path; give the directory to write the report into, or leave out= out")
    if args["panel"] is not None and args["x"] is None:
        raise ReportError(f"panel={args['panel']}: panels split the lines of x=KEY; give x= too")
    return check_numbers(args)


def check_numbers(args: dict, where: str = "") -> dict:
    """best, level, margin and collapse_tol as values (from the command line, or a study block: ``where``)."""
    if args["best"] not in (None, "min", "max"):
        raise ReportError(f"{where or 'best='}{args['best']}: use best=min (lower is better) or best=max")
    level = number(args["level"])
    if not 0.5 <= level < 1:
        raise ReportError(f"{where or 'level='}{args['level']}: a confidence level in [0.5, 1), e.g. level=0.95")
    args["level"] = level
    if args["margin"] is not None:
        margin = number(args["margin"])
        if not (margin > 0 and isfinite(margin)):
            raise ReportError(f"{where or 'margin='}{args['margin']}: a positive number in the metric's units, "
                              "e.g. margin=0.01")
        args["margin"] = margin
    tol = number(args["collapse_tol"])
    if not (tol >= 0 and isfinite(tol)):
        raise ReportError(f"{where or 'collapse_tol='}{args['collapse_tol']}: a number of nats >= 0, e.g. 0.02")
    args["collapse_tol"] = tol
    return args


def number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return nan


def with_study(a: dict, study: dict) -> dict:
    """The declared study's settings, except where the command line gave its own."""
    from modforge.config.study import check_study

    study = check_study(study)
    a["study_overridden"] = []
    for key, option in (("metric", "metric"), ("better", "best"), ("baseline", "baseline"), ("margin", "margin"),
                        ("level", "level"), ("collapse_tol", "collapse_tol")):
        if key in study and option not in a["given"]:
            a[option] = str(study[key]) if key in ("metric", "baseline") else study[key]
        elif key in study:
            a["study_overridden"].append(f"{key} ({study[key]} -> {a[option]})")
    a["study"] = study
    return check_numbers(a, "study: ")

def check_out(out: Path) -> None:
    """``out=``: a new directory, or one whose report files a modforge report wrote (its report.json one); a
    user's own report.md, report.csv or report.json there is never replaced. Checked before any work."""
    from modforge.utils.files import read_json

    if out.exists() and not out.is_dir():
        raise ReportError(f"out={out}: cannot create it (a file is there, not a directory)")
    ours = read_json(out / "report.json")
    ours = isinstance(ours, dict) and {"jobs", "rows"} <= set(ours)
    theirs = [n for n in ("report.md", "report.csv", "report.json") if (out / n).exists() and not ours]
    if theirs:
        raise ReportError(f"out={out}: it already holds {', '.join(theirs)}, not written by a modforge report; "
                          "choose a new directory (a report replaces only its own files)")


def report_command(argv: list) -> None:
    a = parse_args(argv)
    if a["out"] is not None:
        check_out(Path(a["out"]))
    root = Path(a["dir"])
    if not root.is_dir():
        raise ReportError(f"{root}: no such directory (give a sweep directory, e.g. multirun/<date>/<time>)")
    if (root / "study.json").is_file() and (root / "probe").is_dir():
        raise ReportError(f"{root}: a study's directory (python -m modforge.study), whose stages would be pooled "
                          f"here; its report is {root / 'study.md'}; to read its comparison runs as one sweep: "
                          f"python -m modforge.report {root / 'compare'}")
    study_root = next((p for p in (root.parent, root.parent.parent) if (p / "study.json").is_file()), None)
    if study_root is not None and (study_root / "probe").is_dir():
        import sys

        why = ("a study's tuning runs, on which each arm's setting was chosen: an arm's best setting here is "
               "favoured by its own noise" if root.relative_to(study_root).parts[0] == "tune"  # fixed seeds there
               else "seeds were added to these runs adaptively by a study; the intervals below are a fixed "
               "design's, too narrow after its looks")
        print(f"note: {why}; the study's verdicts: {study_root / 'study.md'}", file=sys.stderr)
    jobs = load_jobs(root)
    if not jobs:
        raise ReportError(f"{root}: no jobs (no .hydra/overrides.yaml below it)")
    study = study_of(jobs) if a["study"] == "declared" else None
    a["study"] = None
    if study:
        a = with_study(a, dict(study))
    mark_collapsed(jobs, a["collapse_tol"])
    if a["where"]:
        jobs = select(jobs, a)
    tables, shared = build_tables(jobs, a)
    over = tuple(k for k in a["over"].split(",") if k)
    counts = {s: sum(j.status == s for j in jobs) for s in STATUSES}
    problems = [j for j in jobs if j.status != "finished"]
    lines, extra = {}, []
    if a["x"] is not None:
        from modforge.results import along

        lines = {id(t): along.along(t, a["x"], a["panel"]) for t in tables}
        extra += [row for t in tables for row in ["", *along.markdown(t, a["x"], lines[id(t)])]]
        alongs = [{"task": t.task, "metric": t.metric, "x": a["x"], "panel": a["panel"],
                   "lines": along.records(t, a["x"], lines[id(t)])} for t in tables]
    positions = {}
    if a["by_position"] is not None:
        from modforge.results import positions as by_pos
        positions = {id(t): by_pos.curves(t, a["by_position"]) for t in tables}
        extra += [row for t in tables for row in ["", "", *by_pos.markdown(a["by_position"], positions[id(t)])]]
    text = {"md": lambda: to_markdown(tables, shared, counts, over, problems)
            + "\n".join(extra),
            "csv": lambda: to_csv(tables),
            "json": lambda: to_json(tables, shared, counts, jobs, alongs if lines else None,
                                    [by_pos.records(a["by_position"], positions[id(t)]) for t in tables]
                                    if positions else None)}
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
        for t in tables if lines else []:
            written += plots.along(t, lines[id(t)], a["x"], out, plots.prefix_of(t, tables))
        for t in tables if positions else []:
            trained = by_pos.trained_length([j for r in t.rows for j in r.jobs])
            written += plots.by_position(a["by_position"], positions[id(t)], out, plots.prefix_of(t, tables), trained)
        print(f"\nwrote {', '.join(written)} to {out}")

def main(argv: Optional[list] = None) -> None:
    command(__doc__, report_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
