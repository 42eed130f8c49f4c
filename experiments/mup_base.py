"""Stage 0 of the mup_ladder study (issue 50, item 3): the base's constants, tuned once, at the base.

µP's promise is that a model's hyperparameters are tuned once, on a small base, and hold at every width. So the
base gets a real tuning, not only its learning rate: coordinate descent over the rate, the readout multiplier
(``param.output_mult``), the attention multiplier (``param.attn_mult``: scores x attn_mult / d_head) and the init
scale (``model.init_std``), then the rate again (it moves most with the others). Each coordinate is a 1-D sweep at
the others' current values on seeds 1-3, and its value is the argmin of the curve fitted to its runs (the study's
fit rule, ``modforge.studies.lrfit``: a local quadratic in log2 of the value, clear of failures; a best value at
an end of the sweep is extended one step past it, at most twice). The plan below is declared before its runs.

    python experiments/mup_base.py                  # runs what is missing, writes results/mup_ladder/base.{json,md}
    python experiments/mup_base.py dry_run=true     # the plan only
    python experiments/mup_base.py umup             # u-µP's base (mup_ladder_umup): results/mup_ladder/base_umup.*

It runs in ``studies/mup_ladder_base/`` (resumable: a finished job is never run again) and prints the commands
of mup_ladder and of mup_depth (issue 50, item 5: the same base carried in depth) with the chosen constants.
"""
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = {"model.d_model": 64, "model.n_heads": 2}  # the ladder's lowest rung: its base shape
SEEDS = [1, 2, 3]
EXTEND = 2  # steps past an edge optimum, per coordinate
PROFILES = {
    # µP (mup_ladder): the base shape is the arm; the attention multiplier's sweep is centred on its default,
    # sqrt(32): the standard parametrisation's 1/sqrt(d_head)
    "mup": {
        "experiment": "mup_ladder", "title": "µP's base, tuned once (stage 0 of mup_ladder)",
        "arm_name": "param.base.d_model=64,param.base.n_heads=2",
        "arm": {"param.base.d_model": 64, "param.base.n_heads": 2},
        "start": {"optim.lr": 0.00390625, "param.output_mult": 1.0, "param.attn_mult": 32 ** 0.5,
                  "model.init_std": 0.02},
        "plan": [("optim.lr", [2.0 ** -k for k in (10, 9, 8, 7, 6, 5)]),
                 ("param.output_mult", [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]),
                 ("param.attn_mult", [32 ** 0.5 * 2.0 ** k for k in (-2, -1, 0, 1, 2)]),
                 ("model.init_std", [0.005, 0.01, 0.02, 0.04, 0.08]),
                 ("optim.lr", [2.0 ** -k for k in (10, 9, 8, 7, 6, 5)])]},
    # u-µP (mup_ladder_umup, declared in its config): no base shape, so the experiment's own defaults (param=umup,
    # untied embeddings) are the arm; its four multipliers start at their default, 1 (u-µP's claim is that 1 is
    # near the optimum), each swept x2^-2 ... and the rate (its rates sit near 1: docs/mup.md) before and after
    "umup": {
        "experiment": "mup_ladder_umup", "title": "u-µP's base, tuned once (stage 0 of mup_ladder_umup)",
        "arm_name": "param=umup",
        "arm": {},
        "start": {"optim.lr": 0.25, "param.output_mult": 1.0, "param.attn_mult": 1.0, "param.residual_mult": 1.0,
                  "param.residual_attn_ratio": 1.0},
        "plan": [("optim.lr", [2.0 ** k for k in (-5, -4, -3, -2, -1, 0, 1)]),
                 ("param.output_mult", [2.0 ** k for k in (-2, -1, 0, 1, 2, 3, 4)]),
                 ("param.attn_mult", [2.0 ** k for k in (-2, -1, 0, 1, 2, 3)]),
                 ("param.residual_mult", [2.0 ** k for k in (-2, -1, 0, 1, 2)]),
                 ("param.residual_attn_ratio", [2.0 ** k for k in (-2, -1, 0, 1, 2)]),
                 ("optim.lr", [2.0 ** k for k in (-5, -4, -3, -2, -1, 0, 1)])]},
}
PROFILE = PROFILES["mup"]  # main() sets the one asked for
def design():
    from omegaconf import OmegaConf

    from modforge.config.composition import compose_job, load
    from modforge.studies.design import design_of

    load()
    cfg = compose_job(["experiment=" + PROFILE["experiment"]])
    block = OmegaConf.to_container(cfg.study, resolve=True)
    block["tune"]["params"] = {k: [v] for k, v in PROFILE["start"].items()}  # the keys this stage sets (the runner checks)
    if PROFILE is PROFILES["umup"]:  # (the study's arm sets the multipliers this stage tunes: an arm of none here)
        block.update(compare=["param=umup"], transfer=None)
        block["tune"].pop("scale", None)
    return design_of(PROFILE["experiment"], [], block, 2, {"max_steps": cfg.trainer.max_steps})


def cells_of(key: str, values: list, current: dict, steps: int) -> list:
    from modforge.studies.design import rung_name
    from modforge.studies.stages import Cell
    from modforge.studies.tuning import key_of

    out = []
    for v in values:
        setting = {**current, key: float(f"{v:.6g}")}
        for seed in SEEDS:
            out.append(Cell(PROFILE["arm_name"], rung_name(BASE), key_of(setting), seed,
                            {**PROFILE["arm"], **BASE, **setting, "trainer.max_steps": steps, "seed": seed}))
    return out


def past_edge(values: list, side: str) -> float:
    v = sorted(values)
    return v[0] * v[0] / v[1] if side == "low" else v[-1] * v[-1] / v[-2]


def coordinate(d, i: int, key: str, values: list, current: dict, clock, dry: bool) -> dict:
    """One coordinate's sweep (extended past an edge optimum: each extension a round of its own), its fit and its
    choice."""
    from modforge.studies import lrfit
    from modforge.studies.stages import read_stage, run_stage, stage_cells
    from modforge.studies.tuning import key_of

    steps = d.base["max_steps"]
    if dry:
        print(f"  {i}: {key} in {[float(f'{v:.4g}') for v in values]} at the values before it: "
              f"{len(values) * len(SEEDS)} runs (+ {EXTEND * len(SEEDS)} if its best is at an end)")
        return {"key": key, "chosen": current[key]}
    record = {"key": key, "values": list(values), "at": dict(current), "extended": []}
    curve, known, new = {}, {}, list(values)
    for ext in range(EXTEND + 1):
        stage = d_dir() / f"{i}-{key}" / f"round-{ext}"
        cells = stage_cells(stage, lambda: cells_of(key, new, current, steps))
        run_stage(d, stage, cells, d.jobs, clock)
        for r in read_stage(d, stage, cells):
            s = {key: r["cell"].overrides[key]}
            known[key_of(s)] = s
            curve.setdefault(key_of(s), []).append(r["value"])
        ch = lrfit.fit_all({("base", ""): curve}, known, key, draws=200)[("base", "")]
        v = ch.valley
        if v.bracketed or ext == EXTEND:
            break
        new = [past_edge(record["values"], v.edge)]
        record["extended"].append(new[0])
        record["values"] = sorted(record["values"] + new)
    record.update(chosen=None if ch.setting is None else ch.setting[key], bracketed=v.bracketed,
                  interval=[2 ** v.low, 2 ** v.high] if math.isfinite(v.low) else None,
                  basin=[2 ** b for b in v.basin] if all(map(math.isfinite, v.basin)) else None,
                  fitted_loss=v.at_choice if math.isfinite(v.at_choice) else None, runs=curve)
    return record


def d_dir() -> Path:
    return ROOT / "studies" / (PROFILE["experiment"] + "_base")  # (beside the study: its directory holds only what it writes)


def out_dir() -> Path:
    return ROOT / "experiments" / "results" / PROFILE["experiment"].replace("_umup", "")


def write(records: list, current: dict) -> None:
    out = out_dir()
    name = "base.json" if PROFILE is PROFILES["mup"] else "base_umup.json"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps({"plan": PROFILE["plan"], "seeds": SEEDS, "start": PROFILE["start"],
                                        "steps": records, "chosen": current}, indent=1) + "\n")
    lines = [f"# {PROFILE['title']}", "",
             f"Base d_model {BASE['model.d_model']}, {BASE['model.n_heads']} heads of "
             f"{BASE['model.d_model'] // BASE['model.n_heads']}, 2 layers; 400 steps; seeds {SEEDS}. Written by "
             f"`python experiments/mup_base.py{'' if PROFILE is PROFILES['mup'] else ' umup'}` from its runs "
             f"(studies/{PROFILE['experiment']}_base).", "",
             "| step | key | values tried | chosen (fitted argmin) | its interval | basin (within 0.02) | fitted loss |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(records):
        iv = "—" if not r.get("interval") else f"[{r['interval'][0]:.4g}, {r['interval'][1]:.4g}]"
        bs = "—" if not r.get("basin") else f"[{r['basin'][0]:.4g}, {r['basin'][1]:.4g}]"
        fl = "—" if r.get("fitted_loss") is None else f"{r['fitted_loss']:.4f}"
        lines.append(f"| {i} | `{r['key']}` | {', '.join(f'{v:.4g}' for v in r['values'])} | {r['chosen']:.4g}"
                     f"{'' if r.get('bracketed', True) else ' (edge)'} | {iv} | {bs} | {fl} |")
    lines += ["", "Chosen: " + ", ".join(f"`{k}={v:.4g}`" for k, v in current.items()), ""]
    if PROFILE is PROFILES["mup"]:
        lines += ["The studies' commands with them (mup_ladder: width; mup_depth: depth):", "", "```bash",
                  command(current, "mup_ladder"), command(current, "mup_depth"), "```", ""]
    else:
        lines += ["The arm of mup_ladder_umup with them (its `study.compare`, `study.transfer` and the rate "
                  "grid's factor, `study.tune.scale`, as its config declares):", "", "```text",
                  umup_arm(current), "```", ""]
    (out / name.replace(".json", ".md")).write_text("\n".join(lines))


def command(current: dict, experiment: str) -> str:
    """The study's command with the base's constants and its rate grid, lr* x 2^-4 ... 2^1 (the standard
    parametrisation's best rate falls with width: the grid reaches further below the base's rate)."""
    lr = current["optim.lr"]
    grid = ",".join(f"{lr * 2.0 ** k:.6g}" for k in (-4, -3, -2, -1, 0, 1))
    return (f"python -m modforge.study experiment={experiment} param.output_mult={current['param.output_mult']:.4g} "
            f"param.attn_mult={current['param.attn_mult']:.4g} model.init_std={current['model.init_std']:.4g} "
            f"'study.tune.params={{optim.lr: [{grid}]}}'")


def umup_arm(current: dict) -> str:
    """u-µP's arm: its four multipliers at the base's values, and the factor that puts the study's rate grid
    (declared around the standard parametrisation's base rate) around u-µP's tuned base rate."""
    arm = ",".join(f"{k}={current[k]:.4g}" for k in current if k != "optim.lr")
    return f"{arm}\nrate at the base: {current['optim.lr']:.4g}"


def main(argv: list) -> None:
    from modforge.studies.stages import StageClock

    global PROFILE
    dry = "dry_run=true" in argv
    PROFILE = PROFILES["umup" if "umup" in argv else "mup"]
    d = design()
    d_dir().mkdir(parents=True, exist_ok=True)
    clock = StageClock(d_dir(), {})
    current, records = dict(PROFILE["start"]), []
    for i, (key, values) in enumerate(PROFILE["plan"]):
        rec = coordinate(d, i, key, values, current, clock, dry)
        records.append(rec)
        if rec["chosen"] is not None:
            current = {**current, key: rec["chosen"]}
        print(f"[mup_base] {key}: {rec['chosen']}", flush=True)
    if dry:
        return
    write(records, current)
    if PROFILE is PROFILES["mup"]:
        print(command(current, "mup_ladder"))
        print(command(current, "mup_depth"))
    else:
        print(umup_arm(current))


if __name__ == "__main__":
    main(sys.argv[1:])
