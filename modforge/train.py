"""``python -m modforge.train [-m] [group=option ...] [key=value ...]``: train one configuration, or sweep many.

The command only: answer ``--help`` and Tab completion, rewrite ``resume=`` to what it means, pre-flight
every job (:mod:`modforge.cli.preflight`), stop after a dry run, then hand the job to Hydra, which runs
:func:`modforge.run.story.run` once, or the sweeper (:mod:`modforge.sweeps.sweeper`) which runs it per
job. Any :class:`~modforge.errors.ModforgeError` ends the command in one line, with no traceback.
"""
import time

_STARTED = time.perf_counter()  # `python -m modforge.train` imports this module first: the command's clock
import math  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

from omegaconf import DictConfig  # noqa: E402

from modforge.cli.command import one_line_errors  # noqa: E402
from modforge.config.composition import CONF_DIR  # noqa: E402
from modforge.config.overrides import HYDRA_INFO_FLAGS, flag  # noqa: E402


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    started = time.time()
    with one_line_errors():
        argv, verdict = before_hydra(argv)
        if verdict is None:
            return
    multirun = any(a in ("-m", "--multirun") for a in argv)
    try:
        hand_to_hydra(argv, verdict.checked)
    finally:
        if verdict.sweep_dir is not None:
            from modforge.sweeps.record import clear_invalid

            clear_invalid(verdict.sweep_dir)
    if multirun:
        end_of_sweep(verdict.sweep_dir, started)


def before_hydra(argv: list) -> tuple:
    """-> (the command line Hydra gets, the pre-flight's verdict), or (argv, None) when the command is done:
    help or completion answered, a dry run of one job printed."""
    from modforge.cli import train_help as front
    from modforge.cli import manifest
    from modforge.cli.preflight import Verdict, preflight
    from modforge.cli.resume import continue_where_recorded
    from modforge.config import resolvers
    from modforge.config.composition import compose_job, load
    from modforge.errors import ConfigError
    from modforge.run import ranks
    from modforge.sweeps.record import write_invalid

    resolvers.forget_claimed()  # a second command in one process (a notebook) gets its own new directory
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
    if verdict.invalid:
        write_invalid(verdict.sweep_dir, verdict.invalid)
    if not multirun and flag(argv, "dry_run"):
        cfg = compose_job([a for a in argv if "=" in a and not a.startswith("-")], hydra=True)
        print(f"[modforge] dry run, nothing is trained: 1 job ({' '.join(argv) or 'defaults'})\n"
              f"       {cfg.hydra.run.dir}")
        return argv, None
    return argv, verdict


def hand_to_hydra(argv: list, checked: bool) -> None:
    """Hydra composes the config and runs the job (or the sweeper runs each job of the sweep)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    @hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
    def _app(cfg: DictConfig) -> Optional[float]:
        from modforge.run.dirs import failure_recorded
        from modforge.run.story import run
        from modforge.sweeps.job import sweep_job, sweep_job_outcome

        out_dir = Path(HydraConfig.get().runtime.output_dir)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            with sweep_job():
                m = sweep_job_outcome(cfg, out_dir, checked=checked, started=_STARTED)
        else:
            with one_line_errors(), failure_recorded(out_dir):
                m = run(cfg, out_dir, checked=checked, started=_STARTED)
        loss = (m or {}).get("val", {}).get("val/loss")
        return loss if loss is not None and math.isfinite(loss) else None  # for Hydra sweepers

    sys.argv = [sys.argv[0]] + argv
    _app()


def end_of_sweep(sweep_dir: Optional[Path], started: float) -> None:
    """The sweeper's summary and the exit code it decided (``sweep.json`` in the sweep directory: the one the
    pre-flight composed, or, when it composed none (your own primary config), the last job's)."""
    from hydra.core.hydra_config import HydraConfig

    from modforge.sweeps.record import read_outcome

    if sweep_dir is None and HydraConfig.initialized():
        sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    if sweep_dir is None:
        return
    outcome = read_outcome(sweep_dir, since=started)
    if outcome is None:
        return
    if outcome.get("summary"):
        print(outcome["summary"], file=sys.stderr if outcome["exit"] else sys.stdout)
    if outcome.get("exit"):
        sys.exit(outcome["exit"])


if __name__ == "__main__":
    main()
