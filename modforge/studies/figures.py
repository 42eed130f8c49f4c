"""A study's plots (matplotlib, the optional ``report`` extra): each arm's tuning curve at each tuned rung, and each
arm's metric against training compute on log axes with its fitted power law."""
import math
import textwrap
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
except ImportError as e:
    raise ImportError("matplotlib is not installed; for plots: pip install 'modforge[report]'") from e

from modforge.studies import tuning
from modforge.studies.design import Design


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def tuning_plot(d: Design, rec: dict, out: Path) -> list:
    rows = rec["tuning"]
    if not rows:
        return []
    key = next(iter(d.grid))
    rungs = list(dict.fromkeys(r["rung"] for r in rows))
    values = list(dict.fromkeys(r["setting"][key] for r in rows))
    numeric = all(isinstance(_num(v), float) and _num(v) == _num(v) for v in values)

    def x_of(v) -> float:  # a name (a scheduler, a norm) is placed at its position in the grid
        return _num(v) if numeric else float(values.index(v))

    fits = rec.get("fits") or []
    fig, axes = plt.subplots(2 if fits else 1, len(rungs), figsize=(5.5 * len(rungs), 7.5 if fits else 4), dpi=120,
                             squeeze=False, gridspec_kw={"height_ratios": [2, 1]} if fits else None)
    for col, (ax, rung) in enumerate(zip(axes[0], rungs)):
        failed: dict = {}
        colors: dict = {}
        for i, arm in enumerate(d.arms):
            mine = sorted([r for r in rows if r["rung"] == rung and r["arm"] == arm],
                          key=lambda r: x_of(r["setting"][key]))
            if not mine:
                continue
            xs = [x_of(r["setting"][key]) for r in mine]
            line, = ax.plot(xs, [r["mean"] for r in mine], marker="o", linestyle=["-", "--", "-.", ":"][i % 4],
                            label=arm + (" (baseline)" if arm == d.baseline else ""))
            colors[arm] = line.get_color()
            failed[line.get_color()] = [x for r, x in zip(mine, xs) if not math.isfinite(r["mean"])]
            for r, x in zip(mine, xs):
                ax.scatter([x] * len(r["values"]), [v if math.isfinite(v) else math.nan for v in r["values"]],
                           s=8, color=line.get_color(), alpha=0.4)
                if r["chosen"]:
                    ax.scatter([x], [r["mean"]], s=160, marker="*", color=line.get_color(), zorder=5)
            fit = next((f for f in fits if f["arm"] == arm and f["rung"] == rung), None)
            if fit is not None:
                _draw_fit(ax, axes[1][col], fit, line.get_color())
        top = ax.get_ylim()[1]
        for color, xs in failed.items():  # a setting with a failed run (diverged, collapsed): an x at the top
            ax.scatter(xs, [top] * len(xs), marker="x", s=50, color=color, clip_on=False)
        stopped = stopped_by_halving(rec, rung, rows)
        for arm, color in colors.items():  # stopped at a pause (its loss there is part-way): a v at the top
            xs = [x_of(v) for a, v in stopped if a == arm and (numeric or v in values)]
            if xs:
                ax.scatter(xs, [top] * len(xs), marker="v", s=36, color=color, clip_on=False, alpha=0.7)
        notes = (["x: a run diverged or collapsed"] if any(failed.values()) else []) + \
            (["v: stopped by successive halving"] if stopped else [])
        if notes:
            ax.text(0.01, 0.99, "; ".join(notes), transform=ax.transAxes, fontsize=7, va="top")
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        elif all(_num(v) > 0 for v in values):
            ax.set_xscale("log")  # ticks at the grid's own values only: log minor labels overlap (3e-3, 4e-3)
            ax.set_xticks(sorted(_num(v) for v in values), [f"{_num(v):g}" for v in sorted(values, key=_num)])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(key + (" (other keys at each arm's choice)" if len(d.grid) > 1 else ""))
        ax.set_ylabel(d.metric)
        ax.set_title(f"tuning at {rung or 'the config'} (★ chosen" + ("; dashed: the fitted valley, band: its basin"
                                                                     if fits else "") + ")", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below the axes, off the curves
    return _save(fig, out, "tuning.png")


def stopped_by_halving(rec: dict, rung: str, rows: list) -> list:
    """[(arm, value of the grid's first key)] of the settings successive halving stopped at a rung and never
    continued (no finished run in the tuning table)."""
    finished = {(r["arm"], tuning.key_of(r["setting"])) for r in rows if r["rung"] == rung}
    out: dict = {}
    for p in ((rec.get("halving") or {}).get("pauses") or []):
        for r in p["ranks"]:
            for k in r["settings"]:
                if r["rung"] == rung and k not in r["kept"] and (r["arm"], k) not in finished:
                    out[(r["arm"], k)] = None
    return [(a, _parsed_first(k)) for a, k in out]


def _parsed_first(setting_key: str):
    """The first key's value of a setting's key (``optim.lr=0.003,...``), as a number where it is one."""
    v = setting_key.split(",", 1)[0].split("=", 1)[1]
    try:
        return float(v)
    except ValueError:
        return v


def _draw_fit(ax, fax, fit: dict, color: str) -> None:
    """rule: fit: the valley over the rates it was fitted on, the basin as a band, the chosen rate as a star on the
    curve; below, the failure model: each run's failure (1: diverged or collapsed, a spike's weight) and the
    fitted probability."""
    v = fit["valley"]
    lo, hi = v["window"]
    if math.isfinite(v["a"]) and lo > 0 and hi > lo:
        xs = [lo * (hi / lo) ** (k / 40) for k in range(41)]
        ax.plot(xs, [v["m"] + v["a"] * (math.log2(x) - v["c"]) ** 2 for x in xs], color=color, linestyle=(0, (2, 2)),
                linewidth=1)
    if all(math.isfinite(b) and b > 0 for b in fit["basin"]):
        ax.axvspan(*fit["basin"], color=color, alpha=0.08)
    if math.isfinite(fit["at_lr"]):
        ax.scatter([fit["lr"]], [fit["at_lr"]], s=200, marker="*", color=color, edgecolor="black", zorder=6)
    runs = [r for r in fit["runs"] if r[0] > 0]
    fax.scatter([r[0] for r in runs], [1.0 if r[2] == "failed" else r[3] for r in runs], s=14, color=color, alpha=0.6)
    m = fit["failure_model"]
    if runs and math.isfinite(m["beta"]) and m["x0_lr"] > 0:
        a, b = min(r[0] for r in runs) / 2, max(r[0] for r in runs) * 2
        xs = [a * (b / a) ** (k / 60) for k in range(61)]
        fax.plot(xs, [1 / (1 + math.exp(-m["beta"] * (math.log2(x) - math.log2(m["x0_lr"])))) for x in xs],
                 color=color, linewidth=1)
    fax.axvline(fit["lr"], color=color, linewidth=0.8, alpha=0.6)
    fax.set_xscale("log")
    fax.set_ylim(-0.05, 1.05)
    fax.set_ylabel("failure (1) or spike weight", fontsize=8)
    fax.set_title("failure model: a logistic in log2(rate), slope shared", fontsize=8)
    fax.grid(alpha=0.3)


def ladder_plot(d: Design, rec: dict, out: Path) -> list:
    lad = rec["ladder"]
    if not lad:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=120)
    for i, arm in enumerate(d.arms):
        pts = sorted((lad["compute"][arm][r], m[arm], *lad["intervals"][arm][r]) for r, m in lad["means"].items()
                     if math.isfinite(m[arm]))  # the seeds every arm finished at that rung, as the fits
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[max(0.0, p[1] - p[2]) if math.isfinite(p[2]) else 0.0 for p in pts],
               [max(0.0, p[3] - p[1]) if math.isfinite(p[3]) else 0.0 for p in pts]]
        label = textwrap.fill(arm.replace(",", ", ") + (" (baseline)" if arm == d.baseline else ""), 70)
        bar = ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=label)
        f = lad.get("fit")
        if f and arm in f["A"]:
            hi = max(xs + ([lad["target_flops"]] if lad["target_flops"] else []))
            grid = [min(xs) * (hi / min(xs)) ** (k / 60) for k in range(61)]
            ax.plot(grid, [f["E"] + f["A"][arm] * (c / f["c_ref"]) ** (-f["alpha"]) for c in grid],
                    linestyle=["-", "--", "-.", ":"][i % 4], color=bar[0].get_color(), alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel(d.metric)
    ax.set_title("metric against compute; lines: the joint fit L = E + A_arm (C/C0)^-alpha", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below the axes: long arm names fit
    return _save(fig, out, "ladder.png")


def _save(fig, out: Path, name: str) -> list:
    fig.tight_layout()
    fig.savefig(out / name)
    plt.close(fig)
    return [name]


def write(d: Design, rec: dict, out: Path) -> list:
    return tuning_plot(d, rec, out) + ladder_plot(d, rec, out)
