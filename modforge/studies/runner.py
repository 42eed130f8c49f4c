"""A study from its declaration to its report: measure, plan, tune every arm alike, compare on fresh seeds added
where the answer is still open, fit the ladder, write ``study.md``.

Directory (``studies/<experiment>`` unless ``dir=``)::

    study.json            the log: the command that started it, each stage's wall time, the plan as printed
    probe/                a short run of each arm at each rung: parameters, FLOPs per token, tokens/s
    tune/round-0/         stage one: every arm x rung x setting x tuning seed
    tune/extend-<i>/      a grid extended past an edge optimum
    compare/round-<j>/    stage two, look j: the arms still undecided (and the baseline) on fresh seeds
    study.md, report.json, tuning.png, ladder.png   the report (:mod:`modforge.studies.writeup`)

Every stage is a sweep whose jobs are decided once and kept (``cells.json``): re-running the command skips what
ended, resumes what was cut short, and decides nothing twice. Here: the plan, the budget and the checks before
any run; the two stages' rounds are :mod:`modforge.studies.rounds`'.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from modforge.errors import ConfigError
from modforge.studies import halving, tuning
from modforge.studies.design import Design
from modforge.studies.stages import run_seconds


@dataclass
class Plan:
    steps: dict  # (arm, rung) -> training steps
    val_every: dict  # (arm, rung) -> validation interval in steps (None: the config's, not in steps)
    seconds: dict  # (arm, rung) -> one run's estimated seconds (without start-up)
    flops: dict  # (arm, rung) -> one run's training FLOPs
    runs: dict = field(default_factory=dict)  # "tune", "extend", "compare_min", "compare_max" -> runs
    hours: dict = field(default_factory=dict)  # "least", "most" -> estimated hours
    total_flops: dict = field(default_factory=dict)  # "least", "most"
    startup: float = 0.0
    share: float = 1.0  # the least share of the tuning round's steps that it trains (successive halving: < 1)


def make_plan(d: Design, p: dict) -> Plan:
    s = d.study
    for (arm, rung), m in p.items():
        for key in ("tokens_per_sec", "tokens_per_step", "params_non_embedding", "flops_per_token"):
            if not math.isfinite(m[key]) or m[key] <= 0:
                raise ConfigError(f"probe: {arm} at {rung or 'the config'} recorded no {key} (see its run under probe/; "
                                  "a run that diverged in 30 steps cannot be measured): fix the arm, or delete probe/ "
                                  "and run again")
    sizes = [p[(d.baseline, r)]["params_non_embedding"] for r in d.rungs]
    if any(b < a for a, b in zip(sizes, sizes[1:])):
        raise ConfigError(f"study.sizes: declare the rungs smallest first (the baseline's non-embedding parameters "
                          f"by rung: {', '.join(f'{r}: {n:,.0f}' for r, n in zip(d.rungs, sizes))})")
    steps, val_every = {}, {}
    for rung in d.rungs:
        base = p[(d.baseline, rung)]
        tokens = s["tokens_per_param"] * base["params_non_embedding"] if "tokens_per_param" in s else None
        for arm in d.arms:
            me = p[(arm, rung)]
            if tokens is None:
                n = d.setting_of(arm, rung, "trainer.max_steps")
                if not isinstance(n, int) or n < 1:
                    raise ConfigError(f"trainer.max_steps={n}: a study without study.tokens_per_param trains each "
                                      "run for trainer.max_steps; give a number of steps (or tokens_per_param)")
            elif s.get("match", "tokens") == "flops":
                n = round(tokens * base["flops_per_token"] / (me["flops_per_token"] * me["tokens_per_step"]))
            else:
                n = round(tokens / me["tokens_per_step"])
            steps[(arm, rung)] = max(1, int(n))
            val_every[(arm, rung)] = validation_every(d, arm, rung, steps[(arm, rung)])
    seconds = {k: run_seconds(p[k], n, val_every[k], bool(d.setting_of(k[0], k[1], "eval_at_start"))) for k, n in steps.items()}
    flops = {k: n * p[k]["tokens_per_step"] * p[k]["flops_per_token"] for k, n in steps.items()}
    plan = Plan(steps, val_every, seconds, flops, startup=max(v["startup_seconds"] for v in p.values()))
    n_set = len(tuning.settings(d.grid)) if d.grid else 0
    tuned = [(a, r) for r in d.tuned_rungs for a in d.arms if r in d.tuned_rungs_of(a)] if d.grid else []
    each = [(a, r) for r in d.rungs for a in d.arms]
    ts = len(d.tune_seeds)
    carried = [(a, r) for r in d.rungs if r not in d.tuned_rungs for a in d.arms] if d.carry else []  # (every arm alike)
    n_check = len(d.carry["check"]) if d.carry else 0
    n_carry_ext = d.carry.get("extend", 0) if d.carry else 0
    n_ext = extension_settings(d)
    plan.runs = {"tune": len(tuned) * n_set * ts + len(carried) * n_check * ts,
                 "extend": len(tuned) * n_ext * ts + len(carried) * n_carry_ext * ts,
                 "compare_min": len(each) * d.seeds["min"], "compare_max": len(each) * d.seeds["max"]}
    h = halving.schedule(d)
    share = halving.expected_share(h, n_set) if h else 1.0  # halving: the least its tuning round trains
    tune_s = sum(seconds[k] for k in tuned) * n_set * ts
    check_s = sum(seconds[k] for k in carried) * n_check * ts  # never halved
    ext_s = sum(seconds[k] for k in tuned) * n_ext * ts + \
        sum(seconds[k] for k in carried) * n_carry_ext * ts
    lo_s = sum(seconds[k] for k in each) * d.seeds["min"]
    hi_s = sum(seconds[k] for k in each) * d.seeds["max"]
    tune_f = sum(flops[k] for k in tuned) * n_set * ts + sum(flops[k] for k in carried) * n_check * ts
    ext_f = sum(flops[k] for k in tuned) * n_ext * ts + \
        sum(flops[k] for k in carried) * n_carry_ext * ts
    plan.total_flops = {"least": tune_f + sum(flops[k] for k in each) * d.seeds["min"],
                        "most": tune_f + ext_f + sum(flops[k] for k in each) * d.seeds["max"]}
    least_runs = plan.runs["tune"] + plan.runs["compare_min"]
    most_runs = least_runs + plan.runs["extend"] + plan.runs["compare_max"] - plan.runs["compare_min"]
    stages_lo = (1 if d.grid else 0) + 1 + bool(carried)
    stages_hi = (1 + d.extend if d.grid else 0) + len(d.looks) + bool(carried) + (n_carry_ext if carried else 0)
    plan.share = share
    plan.hours = {"least": wall(tune_s * share + check_s + lo_s, least_runs, stages_lo + len(h["at"] if h else []), d.jobs,
                                plan.startup) / 3600,
                  "most": wall(tune_s + check_s + ext_s + hi_s, most_runs, stages_hi, d.jobs, plan.startup) / 3600}
    return plan


def extension_settings(d: Design) -> int:
    """The most settings an arm-rung's edge extensions add: one per key per extension under the best-mean rule;
    under rule: fit, one rate past the edge and, for each other key (a warm-up) whose chosen slice is at an end, a
    whole slice at the grid's rates (grown by at most one per extension before)."""
    if not d.grid or not d.extend:
        return 0
    if d.rule != "fit":
        return d.extend * len(d.grid)
    rates = len(d.grid.get(d.fit["key"], ()))
    return sum(1 + (len(d.grid) - 1) * (rates + i) for i in range(d.extend))


def config_steps(d: Design) -> tuple:
    """({(arm, rung): steps}, {(arm, rung): validation interval or None}) of a study without tokens_per_param:
    the config's, as :func:`make_plan` reads them."""
    steps, every = {}, {}
    for rung in d.rungs:
        for arm in d.arms:
            n = d.setting_of(arm, rung, "trainer.max_steps")
            steps[(arm, rung)] = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
            every[(arm, rung)] = validation_every(d, arm, rung, steps[(arm, rung)])
    return steps, every


def validation_every(d: Design, arm: str, rung: str, steps: int) -> Optional[int]:
    """A job's validation interval in steps (at most its steps), None when the config's is not in steps."""
    v = d.setting_of(arm, rung, "trainer.val_check_interval")
    return min(int(v), steps) if isinstance(v, int) and not isinstance(v, bool) else None


def wall(seconds: float, runs: int, stages: int, jobs: int, startup: float) -> float:
    """Side by side, every job is its own process (start-up each); one at a time, a stage starts once."""
    if jobs > 1:
        return (seconds + runs * startup) / jobs
    return seconds + stages * startup


def print_plan(d: Design, p: dict, plan: Plan, study_dir: Path) -> str:
    from modforge.results.formats import fmt_count

    lines = [f"study {d.experiment}: {d.study.get('question', '(no question declared)')}",
             f"  directory {study_dir}; {d.jobs} job{'s' * (d.jobs > 1)} side by side",
             f"  arms: {d.baseline} (baseline), {', '.join(d.compared)}; metric {d.metric} ({d.better}); "
             f"level {d.level:g}" + (f"; margin ±{d.margin:g}" if d.margin is not None else "; no margin declared"),
             ""]
    labels = {(arm, rung): f"{rung or 'the config'} / {arm}" for rung in d.rungs for arm in d.arms}
    w = max(len("rung / arm"), *(len(v) for v in labels.values()))
    lines.append(f"  {'rung / arm':<{w}}  params(non-emb)  steps     tokens  train FLOPs  s/run")
    for k, label in labels.items():
        lines.append(f"  {label:<{w}}  {fmt_count(p[k]['params_non_embedding']):>15}  {plan.steps[k]:>5}  "
                     f"{fmt_count(plan.steps[k] * p[k]['tokens_per_step']):>9}  {plan.flops[k]:>11.3g}  "
                     f"{plan.seconds[k]:>5.1f}")
    r = plan.runs
    if d.grid:
        per_arm = isinstance(d.study.get("transfer"), dict)
        lines.append(f"\n  stage 1, tuning: "
                     + (f"{sum(len(d.tuned_rungs_of(a)) for a in d.arms)} arm-rungs (rungs tuned: "
                        f"{', '.join(f'{a}: {len(d.tuned_rungs_of(a))}' for a in d.arms)})"
                        if per_arm else f"{len(d.arms)} arms x {len(d.tuned_rungs)} rung(s)")
                     + f" x {len(tuning.settings(d.grid))} settings of {', '.join(d.grid)} x {len(d.tune_seeds)} seeds = "
                     f"{r['tune']} runs (+ at most {r['extend']} if edge optima are extended)"
                     + (f"; by successive halving at {halving.schedule(d)['at']} of each run's steps, as few as "
                        f"{plan.share:.0%} of their steps" if halving.schedule(d) else "")
                     + "".join(f"; {a}'s grid x {', '.join(f'{f:g} ({k})' for k, f in keys.items())}"
                               for a, keys in d.scales.items())
                     + (f"; settings carried up by transfer={d.transfer}" if d.transfer else "")
                     + ("; carried up from the smallest rung: " + ", ".join(f"{a} by {d.transfer_of(a)}" for a in d.arms
                                                                           if d.transfer_of(a)) if per_arm else "")
                     + (f" (the lowest {d.carry['tuned']} rungs; each arm's rate carried up to the "
                        f"{len(d.rungs) - d.carry['tuned']} above by a power law in compute and checked there at "
                        f"{len(d.carry['check'])} rates, included"
                        + (f"; at most {d.carry['extend']} doubling(s) more past the check's end where its best lies "
                           "there" if d.carry.get("extend") else "") + ")" if d.carry else ""))
    lines.append(f"  stage 2, comparison: fresh seeds from {d.seeds['start']}, looks at {d.looks} pairs: "
                 f"{r['compare_min']} to {r['compare_max']} runs; {d.family} comparisons in the family")
    lines.append(f"  in all: {r['tune'] + r['compare_min']} to {r['tune'] + r['extend'] + r['compare_max']} runs, "
                 f"{plan.total_flops['least']:.3g} to {plan.total_flops['most']:.3g} training FLOPs, about "
                 f"{duration(plan.hours['least'])} to {duration(plan.hours['most'])} here (measured: "
                 f"{fmt_count(p[(d.baseline, list(d.rungs)[0])]['tokens_per_sec'])} tokens/s for the baseline"
                 f"{' at the smallest rung' if len(d.rungs) > 1 else ''}, start-up {plan.startup:.1f} s per process)")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def duration(hours: float) -> str:
    s = hours * 3600
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 5400 else f"{hours:.1f} h"


def check_budget(d: Design, plan: Plan, force: bool) -> Optional[str]:
    """One line when the plan's worst case exceeds the declared budget (None when within, or forced)."""
    budget = d.study.get("budget") or {}
    most_runs = plan.runs["tune"] + plan.runs["extend"] + plan.runs["compare_max"]
    over = []
    if "hours" in budget and plan.hours["most"] > budget["hours"]:
        over.append(f"study.budget.hours={budget['hours']:g}: the plan could take {plan.hours['most']:.2f} h")
    if "runs" in budget and most_runs > budget["runs"]:
        over.append(f"study.budget.runs={budget['runs']:g}: the plan could take {most_runs} runs")
    if not over:
        return None
    msg = "; ".join(over) + " (at most seeds, every edge extended)"
    if force:
        print(f"[study] over budget, started anyway (force=true): {msg}", flush=True)
        return msg
    raise ConfigError(f"{msg}; lower study.seeds.max or study.tune.extend, shrink the grid or the ladder, raise the "
                      "budget, or start with force=true")


def check_cells_compose(d: Design) -> None:
    """Every value of the tuning grid (with the baseline at the first rung) and every arm at every rung (with the
    grid's first values) composed and validated as its jobs will be, and the study's metric one that each arm's
    task declares, before the probe: a mistake is one line naming the study's key, never the runner's internal
    override."""
    from modforge.config.checks import validate
    from modforge.config.composition import compose_job
    from modforge.config.grid import cell_overrides

    def check(cell: dict, where: str):
        try:
            cfg = compose_job([f"experiment={d.experiment}", *d.overrides,
                               *(cell_overrides([cell])[0] if cell else [])])
            validate(cfg)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        return cfg

    first = {k: v[0] for k, v in d.grid.items()}
    small = next(iter(d.rungs.values()))
    for k, values in d.grid.items():
        for v in values:
            check({**d.arms[d.baseline], **small, **first, k: v}, f"study.tune.params.{k}={v}")
    for arm, ov in d.arms.items():
        for rung, rv in d.rungs.items():
            where = f"study.{'baseline' if arm == d.baseline else 'compare'}: {arm}{f' at rung {rung}' if rung else ''}"
            check_metric(d.metric, check({**ov, **rv, **{k: v[0] for k, v in d.grid_of(arm).items()}}, where), where)


def check_metric(metric: str, cfg, where: str) -> None:
    """``study.metric``: a validation metric the job's task declares (its ``metric_ranges``, by the name after
    ``val/``; ``val@<n>/`` for each length of ``eval_block_sizes``), known before any run. Whether the runs
    report it is checked again on the probe's records (:func:`modforge.studies.stages.check_reported`)."""
    from modforge import registry

    entry, task_cfg = registry.make_config("task", cfg.task)
    heads = ["val", *(f"val@{n}" for n in cfg.get("eval_block_sizes") or [])]
    declared = [f"{h}/{name}" for h in heads for name in entry.cls.declared_metrics(task_cfg)]
    if metric not in declared:
        raise ConfigError(f"study.metric={metric}: not a validation metric of task={entry.name} ({where}); it "
                          f"declares {', '.join(declared)}")


def config_of(cfg) -> dict:
    """The composed config every job starts from (resolved), less the study block (compared on its own) and
    Hydra's: changing the experiment outside its ``study:`` block (its steps, a rate) makes it another study."""
    from omegaconf import OmegaConf

    from modforge.run.dirs import CONTROL_KEYS

    plain = OmegaConf.to_container(cfg, resolve=True)
    return {k: v for k, v in plain.items() if k not in ("hydra", "study", *CONTROL_KEYS)}


def forget_unrun(study_dir: Path) -> None:
    """A study directory whose design never ran: its stages' kept cells and failed jobs (no record ended) are
    removed, so a fixed design starts afresh. Only the stage directories the study writes."""
    import shutil

    for stage in ("probe", "tune", "compare"):
        if (study_dir / stage).is_dir():
            shutil.rmtree(study_dir / stage)


def ran_before(study_dir: Path) -> bool:
    """Whether any run of the study ended with a record (a design is fixed once it has results)."""
    return any(study_dir.rglob("metrics.json")) if study_dir.is_dir() else False


def check_same_study(d: Design, state: dict, study_dir: Path, config: Optional[dict] = None) -> None:
    """A study directory answers one declared study: a different block, command line or composed config (the
    experiment edited outside its block) needs a new ``dir=``. The log is a file: a recorded value of another
    shape than the study writes is another study's (or none's), refused as such."""
    if not state:
        return
    if config is not None and "config" in state:
        from modforge.run.dirs import config_difference

        then = state["config"]
        diff = config_difference(then, config) if isinstance(then, dict) else [f"study.json holds {then!r}"]
        if diff:
            raise ConfigError(f"{study_dir}: its runs were trained with another config ({'; '.join(diff)}); give a "
                              "new dir= (a study's runs and its report must describe the same config)")

    def design(block):  # what decides the runs and their answers (not the budget, not the pace)
        return {k: v for k, v in block.items() if k not in ("budget", "jobs")} if isinstance(block, dict) else block

    def command(overrides):  # the command's switches (retry_failed=true ...) change no run
        from modforge.run.dirs import CONTROL_KEYS

        if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
            return overrides
        return [o for o in overrides if not o.lstrip("+~").startswith(("study.budget", "study.jobs"))
                and o.split("=", 1)[0] not in CONTROL_KEYS]

    import json

    for key, then, now in (("experiment", state.get("experiment"), d.experiment),
                           ("overrides", command(state.get("overrides", [])), command(d.overrides)),
                           ("study", design(state.get("study", {})), design(json.loads(json.dumps(d.study))))):
        if key in state and then != now:
            raise ConfigError(f"{study_dir}: it holds a study started with another {key} (study.json: {then!r}, "
                              f"now {now!r}); give a new dir= (a study's design is fixed before its results)")
