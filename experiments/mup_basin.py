"""mup_basin's reading (issue 50): is µP's carried rate inside each width's basin?

For each width of the sweep (``conf/experiment/mup_basin.yaml``), the curve of val/loss against the rate is fitted
as a study fits it (``modforge.studies.lrfit``: a local quadratic in log2 of the rate; the basin is where it is
within 0.02 of its minimum), and the carried rate, 0.005527, is checked against that basin.

    python experiments/mup_basin.py multirun/mup_basin      # writes experiments/results/mup_ladder/basin.md
    python experiments/mup_basin.py multirun/mup_basin_umup umup   # u-µP's (mup_basin_umup.yaml): basin_umup.md
    python experiments/mup_basin.py multirun/mup_basin_mults mults # the base's constants at 512: basin_mults.md
"""
import json
import math
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "mup_ladder"
PROFILES = {  # name: (the carried rate, the study it comes from, what it is, the sweep's config, the files written)
    "mup": (0.005527, "mup_ladder", "µP", "mup_basin", "basin"),
    "umup": (None, "mup_ladder_umup", "u-µP", "mup_basin_umup", "basin_umup"),
}
CARRIED, STUDY, WHAT, CONFIG, NAME = PROFILES["mup"]


def read(sweep: Path) -> dict:
    """{width: {rate: [val/loss over seeds]}} of the sweep's finished runs (NaN: a run that failed)."""
    from modforge.results.jobs import load_jobs, metric_value

    out: dict = {}
    for j in load_jobs(sweep):
        w, lr = int(j.overrides["model.d_model"]), float(j.overrides["optim.lr"])
        v = metric_value(j.metrics, "val/loss") if j.status == "finished" else math.nan
        out.setdefault(w, {}).setdefault(lr, []).append(v)
    return out


def fit(runs: dict) -> dict:
    from modforge.studies import lrfit
    from modforge.studies.tuning import key_of

    rows = {}
    for w, by_rate in sorted(runs.items()):
        known = {key_of({"optim.lr": r}): {"optim.lr": r} for r in by_rate}
        curve = {key_of({"optim.lr": r}): v for r, v in by_rate.items()}
        ch = lrfit.fit_all({("mup", w): curve}, known, "optim.lr", delta=0.02, draws=200)[("mup", w)]
        v = ch.valley
        lo, hi = (2 ** b for b in v.basin)
        at = by_rate.get(CARRIED, [math.nan])
        rows[w] = {"lr*": 2 ** v.x, "interval": [2 ** v.low, 2 ** v.high], "basin": [lo, hi],
                   "bracketed": v.bracketed, "fitted_min": v.at_choice,
                   "carried_mean": sum(at) / len(at), "inside": lo <= CARRIED <= hi,
                   "means": {str(r): sum(x) / len(x) for r, x in sorted(by_rate.items())}}
    return rows


def markdown(rows: dict) -> str:
    lines = [f"# {WHAT}'s carried rate against each width's basin ({CONFIG})", "",
             f"Written by `python experiments/mup_basin.py{'' if WHAT == 'µP' else ' <sweep> umup'}` from the sweep "
             f"of `conf/experiment/{CONFIG}.yaml`; carried rate {CARRIED} ({STUDY}'s, tuned at the base).", "",
             "| width | fitted lr* | its interval | basin (within 0.02) | carried rate inside | loss at the carried "
             "rate | fitted minimum |", "|---|---|---|---|---|---|---|"]
    for w, r in rows.items():
        lines.append(f"| {w} | {r['lr*']:.4g}{'' if r['bracketed'] else ' (edge)'} | [{r['interval'][0]:.4g}, "
                     f"{r['interval'][1]:.4g}] | [{r['basin'][0]:.4g}, {r['basin'][1]:.4g}] | "
                     f"{'yes' if r['inside'] else '**no**'} | {r['carried_mean']:.4f} | {r['fitted_min']:.4f} |")
    lines += ["", "Means per rate:", ""]
    for w, r in rows.items():
        lines.append(f"- {w}: " + ", ".join(f"{float(k):.4g}: {v:.4f}" for k, v in r["means"].items()))
    return "\n".join(lines) + "\n"


MULTS = {"param.output_mult": 4.802, "param.attn_mult": 25.32, "model.init_std": 0.0575}  # mup_ladder's base


def read_mults(sweep: Path) -> dict:
    """{key: {value: [val/loss over seeds]}} of mup_basin_mults' runs: each run sets at most one of the base's
    constants away from its value; the runs at the base's values are on every key's curve."""
    from modforge.results.jobs import load_jobs, metric_value

    out: dict = {k: {} for k in MULTS}
    for j in load_jobs(sweep):
        v = metric_value(j.metrics, "val/loss") if j.status == "finished" else math.nan
        moved = [k for k in MULTS if k in j.overrides]
        for k in moved or MULTS:
            x = float(j.overrides[k]) if moved else MULTS[k]
            out[k].setdefault(x, []).append(v)
    return out


def fit_mults(runs: dict) -> dict:
    from modforge.studies import lrfit
    from modforge.studies.tuning import key_of

    rows = {}
    for key, by_value in runs.items():
        known = {key_of({key: x}): {key: x} for x in by_value}
        curve = {key_of({key: x}): v for x, v in by_value.items()}
        v = lrfit.fit_all({("mup", key): curve}, known, key, delta=0.02, draws=200)[("mup", key)].valley
        lo, hi = (2 ** b for b in v.basin)
        at = by_value[MULTS[key]]
        rows[key] = {"best": 2 ** v.x, "interval": [2 ** v.low, 2 ** v.high], "basin": [lo, hi],
                     "bracketed": v.bracketed, "fitted_min": v.at_choice, "base": MULTS[key],
                     "base_mean": sum(at) / len(at), "inside": lo <= MULTS[key] <= hi,
                     "means": {str(x): sum(y) / len(y) for x, y in sorted(by_value.items())}}
    return rows


def markdown_mults(rows: dict) -> str:
    lines = ["# µP's base constants against their basins at width 512 (mup_basin_mults)", "",
             "Written by `python experiments/mup_basin.py multirun/mup_basin_mults mults` from the sweep of "
             "`conf/experiment/mup_basin_mults.yaml` (µP at mup_ladder's base constants and carried rate 0.005527, "
             "width 512, one constant moved at a time, seeds 1-2).", "",
             "| constant | base value | fitted best at 512 | its interval | basin (within 0.02) | base value inside | "
             "loss at the base value | fitted minimum |", "|---|---|---|---|---|---|---|---|"]
    for k, r in rows.items():
        lines.append(f"| `{k}` | {r['base']:.4g} | {r['best']:.4g}{'' if r['bracketed'] else ' (edge)'} | "
                     f"[{r['interval'][0]:.4g}, {r['interval'][1]:.4g}] | [{r['basin'][0]:.4g}, {r['basin'][1]:.4g}] | "
                     f"{'yes' if r['inside'] else '**no**'} | {r['base_mean']:.4f} | {r['fitted_min']:.4f} |")
    lines += ["", "Means per value:", ""]
    for k, r in rows.items():
        lines.append(f"- `{k}`: " + ", ".join(f"{float(x):.4g}: {v:.4f}" for x, v in r["means"].items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[2] == "mults":
        rows = fit_mults(read_mults(Path(sys.argv[1])))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "basin_mults.json").write_text(json.dumps(rows, indent=1) + "\n")
        (OUT / "basin_mults.md").write_text(markdown_mults(rows))
        print(markdown_mults(rows))
        raise SystemExit(0)
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in PROFILES):
        raise SystemExit("usage: python experiments/mup_basin.py <the sweep's directory> [mup | umup | mults]")
    CARRIED, STUDY, WHAT, CONFIG, NAME = PROFILES[sys.argv[2] if len(sys.argv) == 3 else "mup"]
    rows = fit(read(Path(sys.argv[1])))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{NAME}.json").write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=1) + "\n")
    (OUT / f"{NAME}.md").write_text(markdown(rows))
    print(markdown(rows))
