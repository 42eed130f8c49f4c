"""The report's pictures (optional extra ``report``: matplotlib): validation curves and the final metric.

* ``<metric>_curves``: the metric against the training step for every configuration,
  from each job's ``logs/metrics.csv``; the line is the mean over the seeds that
  reached that step, the band its Student-t interval (at the report's level) where
  two or more seeds did.
* ``<metric>_final``: each configuration's mean with its interval, best first,
  the baseline marked.

Both are written as PNG and SVG.
"""
import math
import re
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
except ImportError as e:  # the report still prints and writes its tables
    raise ImportError("matplotlib is not installed; for plots: pip install 'modforge[report]'") from e

from modforge.results import stats
from modforge.results.jobs import read_curve
from modforge.results.formats import label_of, percent


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def curves(t, out: Path, prefix: str) -> list[str]:
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    drawn = 0
    styles = ["-", "--", "-.", ":"]  # overlapping curves stay visible
    for r in t.rows:
        runs = [read_curve(j.dir, t.metric) for j in r.jobs if j.status == "finished"]
        runs = [c for c in runs if c]
        if not runs:
            continue
        steps = sorted({s for c in runs for s in c})
        mean, low, high = [], [], []
        for s in steps:
            vals = [c[s] for c in runs if s in c and math.isfinite(c[s])]
            iv = stats.mean_interval(vals, t.level, t.info.get("low", -math.inf), t.info.get("high", math.inf))
            mean.append(iv.estimate)
            low.append(iv.low if iv.kind else iv.estimate)
            high.append(iv.high if iv.kind else iv.estimate)
        line, = ax.plot(steps, mean, marker="o", markersize=3, linewidth=1.5, linestyle=styles[drawn % len(styles)],
                        label=f"{label_of(t, r)} (n={len(runs)})" + (" [baseline]" if r.is_baseline else ""))
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return []
    ax.set_xlabel("training step")
    ax.set_ylabel(f"{t.metric}" + (" (nats/token)" if t.metric.endswith("loss") else ""))
    ax.set_title(f"{t.task}: {t.metric} during training, mean over seeds, {percent(t.level)} t-interval band")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, f"{prefix}curves")


def final(t, out: Path, prefix: str) -> list[str]:
    sign = 1 if t.best == "min" else -1
    # best first whatever the table's order, rows with a diverged run after the others (as the table ranks them)
    rows = sorted((r for r in t.rows if r.n), key=lambda r: (r.count("diverged") > 0, sign * r.interval.estimate))
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(rows) + 1.6), dpi=120)
    ys = list(range(len(rows)))[::-1]  # best first, at the top
    for y, r in zip(ys, rows):
        iv = r.interval
        err = [[iv.estimate - iv.low], [iv.high - iv.estimate]] if iv.kind else None
        ax.errorbar([iv.estimate], [y], xerr=err, fmt="o", capsize=4, color="black" if r.is_baseline else "C0")
        ax.plot(list(r.values.values()), [y] * r.n, "x", color="grey", alpha=0.7, markersize=5)
    ax.set_yticks(ys)
    ax.set_yticklabels([label_of(t, r) + (" [baseline]" if r.is_baseline else "") + f"  n={r.n}" for r in rows],
                       fontsize=8)
    better = "lower" if t.best == "min" else "higher"
    ax.set_xlabel(f"final {t.metric} ({better} is better): mean with {percent(t.level)} t-interval; x = single runs")
    ax.set_title(f"{t.task}: final {t.metric}, best first")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out, f"{prefix}final")


def _save(fig, out: Path, stem: str) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        name = f"{stem}.{ext}"
        fig.savefig(out / name, bbox_inches="tight")
        names.append(name)
    plt.close(fig)
    return names


def prefix_of(t, tables: list) -> str:
    return (slug(f"{t.task}_{t.metric}") if len(tables) > 1 else slug(t.metric)) + "_"


def write_all(tables: list, out: Path) -> list[str]:
    written = []
    for t in tables:
        prefix = prefix_of(t, tables)
        written += curves(t, out, prefix) + final(t, out, prefix)
    return written


def along(t, panels: list, x: str, out: Path, prefix: str) -> list[str]:
    """``<metric>_along_<x>``: the metric against ``x``, a line per combination of the other keys (the mean over
    seeds, its interval as a band), each line's best point a star; one panel per value of the report's panel=."""
    numeric = [q[1] for p in panels for ln in p.lines for q in ln.points]
    is_num = all(math.isfinite(v) for v in numeric)
    log = is_num and min(numeric) > 0 and max(numeric) / min(numeric) > 10
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), dpi=120, sharey=True, squeeze=False)
    values = sorted({q[0] for p in panels for ln in p.lines for q in ln.points}, key=lambda v: (float(v) if is_num else 0, v))
    drawn = 0
    for ax, p in zip(axes[0], panels):
        for i, ln in enumerate(p.lines):
            pts = [q for q in ln.points if q[2].n and math.isfinite(q[2].interval.estimate)]
            if not pts:
                continue
            xs = [q[1] if is_num else values.index(q[0]) for q in pts]
            iv = [q[2].interval for q in pts]
            color = f"C{i % 10}"
            ax.plot(xs, [v.estimate for v in iv], marker="o", markersize=3, linewidth=1.4, color=color, label=ln.label)
            lo = [v.low if v.kind else v.estimate for v in iv]
            hi = [v.high if v.kind else v.estimate for v in iv]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
            if ln.best is not None:
                b = ln.points[ln.best]
                ax.plot([b[1] if is_num else values.index(b[0])], [b[2].interval.estimate], marker="*", markersize=13,
                        color=color, markeredgecolor="black", linestyle="none")
            drawn += 1
        if log:
            ax.set_xscale("log", base=2 if all(math.log2(v).is_integer() for v in numeric) else 10)
        if not is_num:
            ax.set_xticks(range(len(values)))
            ax.set_xticklabels(values, rotation=30, fontsize=8)
        ax.set_xlabel(x)
        ax.set_title(p.label or f"{t.metric} along {x}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return []
    axes[0][0].set_ylabel(f"final {t.metric}" + (" (nats/token)" if t.metric.endswith("loss") else "") +
                          f", mean over seeds, {percent(t.level)} band")
    fig.suptitle(f"{t.task}: {t.metric} along {x}; the best of each line starred", fontsize=11)
    fig.tight_layout()
    return _save(fig, out, f"{prefix}along_{slug(x)}")


def by_position(key: str, found: list, out: Path, prefix: str, trained: int = 0) -> list[str]:
    """``<metric>_by_position_<key>``: the mean loss at each position of the windows, a line per configuration;
    a dotted line at the training length when given."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    styles = ["-", "--", "-.", ":"]
    for i, c in enumerate(found):
        ax.plot(range(len(c.values)), c.values, linewidth=1.3, linestyle=styles[i % len(styles)],
                label=f"{c.label} (n={c.runs})" + (" [baseline]" if c.is_baseline else ""))
    if trained:
        ax.axvline(trained - 0.5, color="grey", linestyle=":", linewidth=1)
        ax.text(trained, ax.get_ylim()[1], " training length", va="top", fontsize=8, color="grey")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("loss (nats/token), mean over runs")
    ax.set_title(f"loss by position, windows of {key.split('@')[-1]}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below the axes, off the curves
    return _save(fig, out, f"{prefix}by_position_{slug(key)}")
