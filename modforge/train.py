"""``python -m modforge.train [-m] [group=option ...] [key=value ...]``: train one configuration, or sweep many.

The command only: answer ``--help`` and Tab completion, rewrite ``resume=`` to what it means, plan every job
(:mod:`modforge.cli.preflight`), stop after a dry run, then run the plan (:mod:`modforge.sweeps.launch`: the
one job, or each job of the sweep with its launcher), each job by :func:`modforge.run.story.run`. Any
:class:`~modforge.errors.ModforgeError` ends the command in one line, with no traceback.
"""
import time

_STARTED = time.perf_counter()  # `python -m modforge.train` imports this module first: the command's clock
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

from omegaconf import DictConfig  # noqa: E402

from modforge.cli.command import one_line_errors, signal_name, signals_noted  # noqa: E402
from modforge.config.composition import CONF_DIR  # noqa: E402
from modforge.config.overrides import HYDRA_INFO_FLAGS, check_modes  # noqa: E402


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with one_line_errors():
        argv, verdict = before_hydra(argv)
        if verdict is None:
            return
    multirun = any(a in ("-m", "--multirun") for a in argv)
    received: list = []  # the signals that arrived while the job(s) ran
    run_dirs: list = []  # the directory of each job run in this process
    plan = verdict.plan
    from modforge.sweeps.job import sweep_task  # (torch and Lightning: not for --help and Tab)
    from modforge.sweeps.launch import run_plan

    try:
        with signals_noted(received):
            if plan is not None and plan.ours:
                run_plan(plan, sweep_task(plan.checked, _STARTED, run_dirs) if multirun else
                         single_task(run_dirs, plan.checked))
            else:  # Hydra composes alone (--config-path, a DDP rank, --cfg), or another sweeper samples the jobs
                hand_to_hydra(argv, plan is not None and plan.checked, run_dirs)
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, SIGTERM (Lightning stops at a step: SystemExit) ...
        if isinstance(e, SystemExit) and not received and type(e).__name__ != "SIGTERMException":
            raise  # a command's own exit (a one-line error: 2)
        if plan is not None and plan.outcome is not None:
            report_sweep(plan.outcome)
        elif not multirun:
            print(f"[modforge] stopped by {signal_name(received)}: resume with python -m modforge.train "
                  f"resume={run_dirs[-1] if run_dirs else '<its run directory>'} (what it trained up to its last "
                  "checkpoint is kept)", file=sys.stderr)
        sys.exit(128 + received[0] if received else (130 if isinstance(e, KeyboardInterrupt) else 143))
    if plan is not None and plan.outcome is not None:
        report_sweep(plan.outcome)
        if plan.outcome.get("exit"):
            sys.exit(plan.outcome["exit"])


def single_task(run_dirs: list, checked: bool = True):
    """The task function of a single run: its failure recorded in its directory, a mistake one line; ``checked``:
    the pre-flight validated its config."""
    from hydra.core.hydra_config import HydraConfig

    from modforge.run.dirs import failure_recorded
    from modforge.run.story import run
    from modforge.sweeps.job import final_loss

    def task(cfg: DictConfig) -> Optional[float]:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        run_dirs.append(out_dir)
        with one_line_errors(), failure_recorded(out_dir):
            return final_loss(run(cfg, out_dir, checked=checked, started=_STARTED))

    return task


def before_hydra(argv: list) -> tuple:
    """-> (the command line Hydra gets, the pre-flight's verdict), or (argv, None) when the command is done:
    help or completion answered, a dry run of one job printed."""
    from modforge.cli import train_help as front
    from modforge.cli import manifest
    from modforge.cli.preflight import Verdict, preflight
    from modforge.cli.resume import continue_where_recorded
    from modforge.config import resolvers
    from modforge.config.composition import load
    from modforge.errors import ConfigError
    from modforge.run import ranks
    from modforge.sweeps.plan import print_plan

    resolvers.forget_claimed()  # a second command in one process (a notebook) gets its own new directory
    check_modes(argv)
    info = any(a.split("=")[0] in HYDRA_INFO_FLAGS for a in argv)
    cached = manifest.read() if info else None
    if front.answer(argv, cached):  # --help, -sc install=bash: answered here, without Hydra
        return argv, None
    if cached is not None:  # Tab completion, --cfg: the registry as data, no torch, no Lightning
        manifest.install(cached)
    else:
        load()
        manifest.write()  # for the next --help / Tab
    relaunched = ranks.relaunched_by_lightning()  # a DDP rank Lightning started: rank 0 checked the command
    if not relaunched and not info:
        argv = continue_where_recorded(argv, any(a in ("-m", "--multirun") for a in argv))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if ranks.launched_rank()[1] is not None and not multirun and not info and \
            not any(a.split("=", 1)[0] == "hydra.run.dir" for a in argv):
        raise ConfigError("this process is one of several DDP ranks started by srun or torchrun: give "
                          "hydra.run.dir=<dir> (every rank must train in the same directory)")
    if relaunched or info:
        return argv, Verdict()
    verdict = preflight(argv, multirun)
    if verdict.plan is not None and verdict.plan.dry_run:
        if multirun:
            print_plan(verdict.plan, dry=True)
        else:
            print(f"[modforge] dry run, nothing is trained: 1 job ({' '.join(argv) or 'defaults'})\n"
                  f"       {verdict.plan.jobs[0].dir}")
        return argv, None
    return argv, verdict


def hand_to_hydra(argv: list, checked: bool, run_dirs: list) -> None:
    """Hydra composes the config and runs the job, or its sweeper runs each job of the sweep (``--config-path``,
    a DDP rank Lightning started, an information flag, a sweeper other than modforge's); ``run_dirs`` gets the
    directory of each job this process runs."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from modforge.sweeps.job import sweep_task

    sweep, single = sweep_task(checked, _STARTED, run_dirs), single_task(run_dirs, checked)

    @hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
    def _app(cfg: DictConfig) -> Optional[float]:
        return (sweep if HydraConfig.get().mode == RunMode.MULTIRUN else single)(cfg)

    sys.argv = [sys.argv[0]] + argv
    _app()


def report_sweep(outcome: dict) -> None:
    """The sweeper's summary (its counts, each failed job, the resume hint)."""
    if outcome.get("summary"):
        print(outcome["summary"], file=sys.stderr if outcome.get("exit") else sys.stdout)


if __name__ == "__main__":
    main()
