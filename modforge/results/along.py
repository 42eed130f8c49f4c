"""A metric along one swept key (the report's ``x=KEY``, optionally ``panel=KEY``): a learning-rate curve per
width, the classic picture of hyperparameter transfer.

Each line is one combination of the other varying keys (without ``panel``), its points the rows at each value
of ``x`` (the mean over seeds, with the row's interval); each line's best point is marked, and flagged when it
lies at the end of the values swept (the optimum is not bracketed). ``panel`` splits the lines into panels by
that key's value (e.g. ``panel=param``: standard and µP side by side).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from modforge.results.jobs import ReportError, natural
from modforge.registry import suggest


@dataclass
class Line:
    label: str
    points: list = field(default_factory=list)  # (x value as text, x as a number or nan, row)
    best: Optional[int] = None  # index into points
    edge: bool = False  # the best point is the first or the last value swept


@dataclass
class Panel:
    label: str
    lines: list


def number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def along(t, x: str, panel: Optional[str] = None) -> list[Panel]:
    """The table's rows as lines along ``x`` (a key that varies in it), split by ``panel``."""
    for key, opt in ((x, "x"), (panel, "panel")):
        if key is not None and key not in t.varying:
            raise ReportError(f"{opt}={key}: not a key that varies in this sweep.{suggest(key, t.varying)} "
                              f"Varying: {', '.join(t.varying) or 'none'}")
    if panel == x:
        raise ReportError(f"panel={panel}: the same key as x=; panel by another key")
    xi, pi = t.varying.index(x), (t.varying.index(panel) if panel else None)
    rest = [i for i in range(len(t.varying)) if i not in (xi, pi)]
    panels: dict[str, dict[str, Line]] = {}
    for r in t.rows:
        p = f"{panel}={r.label[pi]}" if panel else ""
        name = ", ".join(f"{t.varying[i]}={r.label[i]}" for i in rest if r.label[i] != "") or "all runs"
        panels.setdefault(p, {}).setdefault(name, Line(name)).points.append((str(r.label[xi]), number(r.label[xi]), r))
    sign = 1 if t.best == "min" else -1
    out = []
    for p in sorted(panels, key=natural):
        lines = []
        for name in sorted(panels[p], key=natural):
            line = panels[p][name]
            line.points.sort(key=lambda q: (math.isnan(q[1]), q[1], natural(q[0])))
            scored = [(sign * q[2].interval.estimate, i) for i, q in enumerate(line.points)
                      if q[2].n and math.isfinite(q[2].interval.estimate)]
            if scored:
                line.best = min(scored)[1]
                line.edge = len(line.points) > 2 and line.best in (0, len(line.points) - 1)
            lines.append(line)
        out.append(Panel(p, lines))
    return out


def markdown(t, x: str, panels: list[Panel]) -> list[str]:
    """One table per sweep: a row per line, a column per value of ``x`` (the mean over seeds), the best last."""
    values = sorted({q[0] for p in panels for ln in p.lines for q in ln.points}, key=lambda v: (number(v), natural(v)))
    head = ["panel", "line", *values, f"best {x}"]
    body = []
    for p in panels:
        for ln in p.lines:
            at = {q[0]: q[2] for q in ln.points}
            cells = [f"{at[v].interval.estimate:.4f}" if v in at and at[v].n else "" for v in values]
            if ln.best is not None:
                bx = ln.points[ln.best][0]
                cells[values.index(bx)] = f"**{cells[values.index(bx)]}**"
                best = bx + (" (edge of the sweep)" if ln.edge else "")
            else:
                best = "none finished"
            body.append([p.label or "-", ln.label, *cells, best])
    lines = [f"{t.metric} along {x}, the mean over {', '.join(t.over) or 'runs'} (best of each line in bold):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def records(t, x: str, panels: list[Panel]) -> list[dict]:
    return [{"panel": p.label, "line": ln.label, "best": ln.points[ln.best][0] if ln.best is not None else None,
             "edge": ln.edge, "points": [{"x": q[0], "mean": q[2].interval.estimate, "low": q[2].interval.low,
                                          "high": q[2].interval.high, "n": q[2].n} for q in ln.points]}
            for p in panels for ln in p.lines]
