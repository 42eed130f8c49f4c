"""The loss at each position of the evaluation windows (the report's ``by_position=val@N``): where in a window a
configuration loses, e.g. past the length it was trained at.

Runs record it with ``eval_by_position=true`` (``metrics.json``'s ``by_position["val@N"]``: the mean loss at
each of the N positions of the non-overlapping windows). Per configuration (a row of the report's table) the
curve is the mean over its finished runs that recorded it; the table gives it in ``buckets`` equal ranges of
positions, and the plot draws the whole curve.
"""
import math
from dataclasses import dataclass

from modforge.results.jobs import ReportError
from modforge.results.formats import label_of


@dataclass
class Curve:
    label: str
    values: list  # the mean at each position over the runs
    runs: int
    is_baseline: bool = False


def curves(t, key: str) -> list[Curve]:
    """Every row's mean curve at ``key`` (e.g. ``val@256``); rows with no run that recorded it are left out."""
    out, lengths = [], set()
    for r in t.rows:
        got = [j.metrics["by_position"][key] for j in r.jobs
               if j.status == "finished" and (j.metrics or {}).get("by_position", {}).get(key)]
        if not got:
            continue
        lengths.update(len(g) for g in got)
        n = len(got[0])
        mean = [_mean([g[i] for g in got if i < len(g)]) for i in range(n)]
        out.append(Curve(label_of(t, r), mean, len(got), r.is_baseline))
    if not out:
        known = sorted({k for r in t.rows for j in r.jobs for k in ((j.metrics or {}).get("by_position") or {})})
        raise ReportError(f"by_position={key}: no run recorded it (runs record by_position with "
                          f"eval_by_position=true and eval_block_sizes); recorded here: {', '.join(known) or 'none'}")
    if len(lengths) > 1:
        raise ReportError(f"by_position={key}: runs recorded curves of different lengths {sorted(lengths)}")
    return out


def trained_length(jobs: list) -> int:
    """The runs' training window (``data.block_size`` in the first readable ``.hydra/config.yaml``), 0 if unknown."""
    import yaml

    for j in jobs:
        try:
            cfg = yaml.safe_load((j.dir / ".hydra" / "config.yaml").read_text(encoding="utf-8")) or {}
            return int(cfg["data"]["block_size"])
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
            continue
    return 0


def _mean(xs: list) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def buckets(n: int, k: int = 8) -> list[tuple[int, int]]:
    """``k`` equal ranges [a, b) of positions 0..n-1 (fewer when n < k)."""
    k = max(1, min(k, n))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]


def markdown(key: str, found: list[Curve], k: int = 8) -> list[str]:
    n = len(found[0].values)
    spans = buckets(n, k)
    head = ["configuration", "runs", *[f"{a}–{b - 1}" for a, b in spans]]
    lines = [f"Mean {key.split('@')[0]} loss at each range of positions of the windows of {key.split('@')[-1]} "
             "(position 0 predicts a window's second token from its first; mean over runs):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in found:
        cells = [f"{_mean(c.values[a:b]):.4f}" for a, b in spans]
        lines.append(f"| {c.label}{' [baseline]' if c.is_baseline else ''} | {c.runs} | " + " | ".join(cells) + " |")
    return lines


def records(key: str, found: list[Curve]) -> dict:
    return {"key": key, "curves": [{"label": c.label, "runs": c.runs, "baseline": c.is_baseline,
                                    "values": [round(v, 6) for v in c.values]} for c in found]}
