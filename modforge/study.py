"""Run a declared study end to end: ``python -m modforge.study experiment=<name> [key=value ...]``.

The experiment's ``study:`` block declares the question and the design (docs/studies.md):
the arms (``baseline`` and ``compare``), the metric and its direction, the margin and level, a tuning grid every
arm gets alike (``tune``), fresh seeds for the comparison added where it is still open (``seeds: {min, max,
step, start}``), a ladder of sizes (``sizes``, ``tokens_per_param``, ``match``, ``target_flops``, ``transfer``)
and a ``budget``. The command measures this machine (a short run of each arm at each size), prints the plan
(runs, training FLOPs, wall time) and refuses one that could exceed the budget; then tunes, compares and writes
``study.md`` (with ``report.json`` and the plots) in the study's directory. Re-running the same command continues
where it stopped: finished runs are skipped, interrupted ones resume, nothing is decided twice.

Examples:
  python -m modforge.study experiment=norm_quick
  python -m modforge.study experiment=norm_quick dry_run=true
  modforge study experiment=ffn_ladder dir=studies/ffn_ladder_v2
  python -m modforge.study experiment=ladder_norms_bracket reuse=/tmp/ladder_norms   # keep the first design's runs
"""
import json
from pathlib import Path
from typing import Optional

from modforge.cli.command import command
from modforge.cli.options import Option, Options
from modforge.errors import ConfigError

MAX_DRAWS = 1_000_000  # bootstrap draws at most
OPTIONS = Options("python -m modforge.study", (
    Option("experiment", "the experiment whose study: block is run", required=True, metavar="name"),
    Option("dir", "the study's directory (default studies/<experiment>)", metavar="path"),
    Option("jobs", "jobs side by side, each with its share of the cores, 1 to the cores here (default: the block's "
           "jobs, else 2 on a machine of 2 or more cores: measured faster here, docs/studies.md)", type="int", low=1),
    Option("dry_run", "measure and print the plan, run nothing else", False, "bool"),
    Option("force", "start even when the plan could exceed study.budget", False, "bool"),
    Option("draws", "bootstrap draws for the ladder's fits", 1000, "int", low=0, high=MAX_DRAWS),
    Option("reuse", "a directory of ended runs (another study's, e.g. restored by experiments/study_state.py): a job "
           "whose config one of them recorded is copied from it instead of trained, and the report counts and names "
           "the copies (a study amended after its results keeps the first design's runs)", metavar="path"),
), rest="an override of the config, applied to every job")


def parse(argv: list) -> tuple[dict, list]:
    """The options and the overrides of the config (every other key=value, and ~key)."""
    opts, overrides = OPTIONS.parse(argv)
    if opts["jobs"] is not None:  # bounded by the cores, in the design's words, before anything is read
        from modforge.studies.design import check_jobs

        check_jobs("jobs", opts["jobs"], shown=opts.given["jobs"][:40])
    if opts["reuse"] is not None and not Path(opts["reuse"]).is_dir():
        raise ConfigError(f"reuse={opts.given['reuse'][:200]}: no such directory "
                          "(give a directory holding ended runs, e.g. a study's restored by "
                          "experiments/study_state.py restore)")
    return opts, overrides


def study_command(argv: list) -> None:
    from omegaconf import OmegaConf

    from modforge.config.composition import compose_job, load, preset_options
    from modforge.studies import halving, rounds, runner, writeup
    from modforge.studies.design import design_of
    from modforge.studies.stages import StageClock, owned_log, probe, write_log

    opts, overrides = parse(argv)
    load()
    known = preset_options("experiment")
    if opts["experiment"] not in known:
        from modforge.registry import suggest

        raise ConfigError(f"experiment={opts['experiment']}: no such experiment.{suggest(opts['experiment'], known)} "
                          f"The experiments: python -m modforge list experiment")
    cfg = compose_job([f"experiment={opts['experiment']}", *overrides])
    block = OmegaConf.to_container(cfg.study, resolve=True) if cfg.get("study") is not None else None
    base = {"max_steps": cfg.trainer.get("max_steps"), "val_check_interval": cfg.trainer.get("val_check_interval"),
            "eval_at_start": bool(cfg.get("eval_at_start", True))}
    d = design_of(opts["experiment"], overrides, block, opts["jobs"], base)
    study_dir = Path(opts["dir"] or f"studies/{opts['experiment']}")
    state = owned_log(study_dir)  # refused untouched unless the directory is new or a study's
    config = runner.config_of(cfg)  # every job's config but the runner's keys: the study's identity with its block
    if runner.ran_before(study_dir):  # a design is fixed once it has results
        runner.check_same_study(d, json.loads(json.dumps(state)), study_dir, config)
    elif state:  # a design that never ran (refused, failed before any record) is not pinned: start it afresh
        runner.forget_unrun(study_dir)
        state = {k: v for k, v in state.items() if k == "stage_seconds"}
    runner.check_cells_compose(d)  # every arm, rung and grid value before the probe: one line naming the study key
    if "tokens_per_param" not in d.study:  # each run's steps are the config's: halving's pauses checked now
        halving.check(d, *runner.config_steps(d))
    state.update(experiment=d.experiment, overrides=d.overrides, study=json.loads(json.dumps(d.study)),
                 config=config)
    adopter = None
    if opts["reuse"] is not None:
        from modforge.sweeps.adopt import Adopter

        if Path(opts["reuse"]).resolve() == study_dir.resolve():
            raise ConfigError(f"reuse={opts['reuse']}: that is this study's own directory; give another study's")
        adopter = Adopter(Path(opts["reuse"]))
    clock = StageClock(study_dir, state, adopter=adopter)
    write_log(study_dir, state)
    try:
        p = probe(d, study_dir, clock)
        plan = runner.make_plan(d, p)
        halving.check(d, plan.steps, plan.val_every)  # the steps of a study with tokens_per_param: known now
        plan_text = runner.print_plan(d, p, plan, study_dir)
        state["plan"] = plan_text
        over = runner.check_budget(d, plan, opts["force"])
        if over:  # started past its declared budget: the report says so, across resumes (the first reason)
            state.setdefault("forced", over)
        write_log(study_dir, state)  # the plan and the force now, not only when the sitting ends (SIGKILL)
        if opts["dry_run"]:
            print("[study] dry run: nothing else runs")
            return
        tuned = rounds.tune(d, study_dir, plan, clock)
        compared = rounds.compare(d, study_dir, plan, tuned["chosen"], clock, tuned["fits"])
    finally:
        write_log(study_dir, state)
    from modforge.sweeps.adopt import adopted_in

    state["adopted"] = {k: v["from"] for k, v in adopted_in(study_dir).items() if isinstance(v.get("from"), str)}
    rec = writeup.gather(d, p, plan, tuned, compared, state, opts["draws"])
    written = writeup.write_report(d, study_dir, rec, plan_text)
    print(f"\n[study] wrote {', '.join(written)} to {study_dir}")
    for v in rec["verdicts"]:
        at = f" at {v['rung']}" if v["rung"] else ""
        num = f" Δ {v['estimate']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}]" if "estimate" in v else ""
        print(f"  {v['arm']}{at}: {v['verdict']}{num} ({v['why']})")


def stoppable(argv: list) -> None:
    """The study, stopped by Ctrl-C or SIGTERM in one line: its running stage is told to stop (its jobs keep
    their last checkpoint and record 'interrupted') and waited for, then the exit is 128 + the signal with the
    hint; no stage is left running."""
    import sys

    from modforge.cli.command import signal_name, signals_noted

    received: list = []
    try:
        with signals_noted(received):
            study_command(argv)
    except KeyboardInterrupt:
        print(f"error: stopped by {signal_name(received)}: run the same command again to continue where it "
              "stopped (finished runs are kept, interrupted ones resume)", file=sys.stderr)
        sys.exit(128 + received[0] if received else 130)


def main(argv: Optional[list] = None) -> None:
    command(__doc__, stoppable, argv, OPTIONS)


if __name__ == "__main__":
    main()
