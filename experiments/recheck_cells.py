"""Re-run one cell of each study and compare it with the value the study committed.

    python experiments/recheck_cells.py                  # every row of experiments/README.md's table
    python experiments/recheck_cells.py norms positions  # some rows
    python experiments/recheck_cells.py --check          # no runs: each quoted value is in a committed report

The cells are the rows of the "Reproducing a cell" table in experiments/README.md: a study (linked to the
report.json that holds its values), the command that re-runs the cell alone, and the values it gave. For each
row this script checks that every quoted value is a number in a committed report.json of that study, runs the
command (its output in a temporary directory), and compares what the run's metrics.json says with the quoted
value. It writes the comparison, with each row's date, CPU and SIMD kernels, to
experiments/results/recheck_cells.md, so "re-runs to its committed value" is shown by a file, not a sentence.
Re-running some rows replaces those rows there and keeps the others with their own dates.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TABLE_HEADING = "## Reproducing a cell"
ROW = re.compile(r"^\| \[(?P<study>[\w-]+)\]\((?P<report>[^)]+)\) \| `(?P<command>[^`]+)` \| (?P<values>.+) \|$")
VALUE = re.compile(r"(?P<metric>[\w/@.]+) (?P<value>-?\d+\.\d+(?:e-?\d+)?)")


def rows(readme: Path = HERE / "README.md") -> list[dict]:
    """The table's rows: {study, report (a path), command, values: {metric: quoted float text}}."""
    text = readme.read_text()
    if TABLE_HEADING not in text:
        raise SystemExit(f"{readme}: no '{TABLE_HEADING}' section")
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        m = ROW.match(line.strip())
        if m:
            values = {v["metric"]: v["value"] for v in VALUE.finditer(m["values"])}
            out.append({"study": m["study"], "report": (readme.parent / m["report"]).resolve(),
                        "command": m["command"], "values": values})
    if not out:
        raise SystemExit(f"{readme}: the '{TABLE_HEADING}' table has no rows of the form "
                         "| [study](path/report.json) | `command` | metric value |")
    return out


def numbers(obj) -> set[float]:
    """Every float anywhere in a JSON document."""
    if isinstance(obj, float):
        return {obj}
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list):
        return set().union(*(numbers(x) for x in obj)) if obj else set()
    return set()


def committed(row: dict) -> dict:
    """{metric: True/False}: is the quoted value a number in a report.json at or below the linked report's folder?"""
    folder = row["report"].parent
    found: set[float] = set()
    for path in sorted(folder.rglob("report.json")):
        found |= numbers(json.loads(path.read_text()))
    return {metric: float(text) in found for metric, text in row["values"].items()}


def run(row: dict, workdir: Path) -> dict:
    """Run the row's command (its `VAR=value` prefix as environment) with its output in workdir: metrics.json."""
    words = shlex.split(row["command"])
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if words[:3] != ["python", "-m", "modforge.train"]:
        raise SystemExit(f"{row['study']}: the command must be 'python -m modforge.train ...', got {row['command']!r}")
    cmd = [sys.executable, *words[1:], f"hydra.run.dir={workdir}", "trainer.enable_progress_bar=false"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
    metrics = workdir / "metrics.json"
    if proc.returncode != 0 or not metrics.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"{row['study']}: the run failed (exit {proc.returncode}):\n  " + "\n  ".join(tail))
    return json.loads(metrics.read_text())


def today(row: dict, metrics: dict) -> dict:
    """{metric: value the run gave}, from metrics.json's final evaluations (val/..., val@L/..., slideS@L/...)."""
    return {metric: metrics.get("val", {}).get(metric) for metric in row["values"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", nargs="*", help="rows to re-run (default: all)")
    ap.add_argument("--check", action="store_true", help="only check that each quoted value is in a committed report")
    ap.add_argument("--out", default=str(HERE / "results" / "recheck_cells.md"))
    args = ap.parse_args(argv)
    table = rows()
    names = [r["study"] for r in table]
    unknown = [s for s in args.studies if s not in names]
    if unknown:
        raise SystemExit(f"studies={unknown}: not rows of experiments/README.md's table; rows are {names}")
    chosen = [r for r in table if not args.studies or r["study"] in args.studies]
    bad = [(r["study"], m) for r in chosen for m, ok in committed(r).items() if not ok]
    for study, metric in bad:
        print(f"{study}: the quoted {metric} is not in any report.json under its linked report's folder")
    if args.check:
        print(f"{len(chosen)} rows, {sum(len(r['values']) for r in chosen)} values; {len(bad)} not committed")
        return 1 if bad else 0
    lines, worst = [], 0.0
    date = datetime.date.today().isoformat()
    for r in chosen:
        print(f"[recheck] {r['study']}: {r['command']}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            metrics = run(r, Path(tmp) / "run")
        devices = metrics.get("devices", {})
        kernels = devices.get("cpu_capability", "?") + "".join(
            f", {k}={v}" for k, v in devices.get("cpu_kernel_env", {}).items())
        for metric, value in today(r, metrics).items():
            quoted = float(r["values"][metric])
            delta = math.inf if value is None else abs(value - quoted)
            worst = max(worst, delta)
            verdict = "same to the last digit" if delta == 0 else ("within 1e-6" if delta <= 1e-6 else "differs")
            print(f"[recheck]   {metric}: committed {r['values'][metric]}, today {value!r} ({verdict})", flush=True)
            lines.append(f"| {r['study']} | {metric} | {r['values'][metric]} | {value!r} | {delta:.1e} | {verdict} "
                         f"| {kernels} | {date}, {devices.get('cpu', '?')}, torch {_torch_version()} |")
    out = Path(args.out)
    kept = [] if not args.studies or not out.exists() else table_rows(out.read_text())
    text = merged(kept, lines, table)
    out.write_text(text)
    print(f"[recheck] wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    print(f"[recheck] largest |Δ| {worst:.1e}; {len(bad)} quoted values not in a committed report")
    return 0 if worst <= 1e-6 and not bad else 1


HEAD = ["# One cell of each study, re-run", "",
        "Written by `python experiments/recheck_cells.py`: the commands of experiments/README.md's \"Reproducing a "
        "cell\" table, each run alone; the committed value is the one quoted there, which the script checked is in "
        "the study's committed report.json. A row re-run alone (`recheck_cells.py <study>`) replaces its own rows "
        "and leaves the others as they were, each with the date, CPU and torch it ran on.", "",
        "Kernels: the SIMD kernels torch used, and the variables that pinned them (experiments/README.md).", "",
        "| study | metric | committed | re-run | difference | | kernels | re-run on |",
        "|---|---|---|---|---|---|---|---|"]


def table_rows(text: str) -> list[str]:
    """The rows of a recheck_cells.md, each with its date and CPU (a file written before rows had their own takes
    them from its title and its CPU line)."""
    date = re.search(r"re-run on (\d{4}-\d{2}-\d{2})", text)
    cpu = re.search(r"^CPU: ([^;]+);", text, re.M)
    torch = re.search(r"^CPU: [^;]+; torch (\S+?)\.(?:\s|$)", text, re.M)
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] == "study":
            continue
        if len(cells) == 7:
            line = (f"{line.rstrip()} {date[1] if date else '?'}, {cpu[1].strip() if cpu else '?'}, "
                    f"torch {torch[1] if torch else '?'} |")
        out.append(line)
    return out


def merged(kept: list[str], new: list[str], table: list[dict]) -> str:
    """recheck_cells.md from the rows kept and the rows re-run now (which replace a kept row of their study), in
    the order of experiments/README.md's table (``table``: :func:`rows`). A kept row whose study left the table, or
    whose committed value is no longer the one the table quotes, is dropped: it re-checked something else."""
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    quoted = {(r["study"], metric): text for r in table for metric, text in r["values"].items()}
    fresh = {cells(line)[0] for line in new}
    rows_ = [line for line in kept if cells(line)[0] not in fresh
             and quoted.get((cells(line)[0], cells(line)[1])) == cells(line)[2]]
    rows_ += new
    rank = {r["study"]: i for i, r in enumerate(table)}
    rows_.sort(key=lambda line: rank.get(cells(line)[0], len(rank)))  # stable: a study's metrics keep their order
    return "\n".join(HEAD + rows_) + "\n"


def _torch_version() -> str:
    import torch
    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
