"""Running a plan (:mod:`modforge.sweeps.plan`): the one entry point that ``python -m modforge.train`` and the
study runner both call.

* a single run: its job, composed once by the plan, runs in this process as Hydra's app runs it (its directory,
  ``.hydra`` record, logging, callbacks);
* a sweep: the plan is kept in the sweep directory, then the jobs to run go to the configured launcher in
  blocks of consecutive job numbers, so each keeps its number and directory. Hydra's basic launcher's jobs run
  here from their planned configs; another launcher (``gpus``, ``joblib``, SLURM's, Ray's) gets the jobs'
  overrides and runs each where it places it. A launcher that breaks (a killed joblib worker) ends only its
  block: when it had started some, the jobs it never started are launched again, once (one that broke before
  its first job is not tried again: it would break the same way);
* the outcome: counts by status (each job directory's record, not the launcher's word), one line per job that
  failed, the exit code (1 when a job failed or was interrupted); returned, and kept as ``sweep.json``.

Each job records its own status (:mod:`modforge.sweeps.job` catches a job's exception, writes ``status.json`` and
returns, so the next job runs)."""
import itertools
import logging
import sys
from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from modforge.config import resolvers
from modforge.config.composition import hydra_loader
from modforge.errors import ConfigError, ModforgeError
from modforge.run.dirs import reached_pause, read_state
from modforge.sweeps.clusters import runs_elsewhere
from modforge.sweeps.job import sweep_task
from modforge.sweeps.plan import Plan, print_plan
from modforge.sweeps.planning import build
from modforge.utils.files import write_json

RECORD = "sweep.json"  # the outcome of the sweep's last invocation
log = logging.getLogger("hydra.launcher")


def sweep(overrides: list, adopter: Optional[Any] = None) -> dict:
    """A sweep run in this process, as ``python -m modforge.train -m <overrides>`` runs it (planned, every job
    checked, finished jobs skipped, interrupted ones resumed), for code that drives sweeps (the study runner).
    ``adopter`` (:class:`modforge.sweeps.adopt.Adopter`): a new job whose config an ended run under its source
    has is copied from it, not trained. -> its outcome ({exit, summary, counts, jobs}); a mistake in the command
    is one ConfigError, before any job."""
    resolvers.forget_claimed()  # this sweep claims its own new directory
    with hydra_loader() as loader:
        plan = build(overrides, True, loader, here=not runs_elsewhere(overrides))
    ddp = [j for j in plan.jobs if j.runs and _device_count(j.devices) > 1]
    if ddp and str(plan.cfg.hydra.launcher.get("_target_", "")).endswith("BasicLauncher"):
        raise ConfigError(f"trainer.devices={ddp[0].devices}: this sweep runs its jobs in this process, where "
                          "Lightning cannot start a DDP job's ranks; give each job its own process with "
                          "hydra/launcher=gpus")
    if adopter is not None and not plan.dry_run:
        for job in plan.jobs:
            adopter.adopt(job)
    return run_plan(plan, sweep_task(plan.checked))


def _device_count(devices: Any) -> int:
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    try:
        return int(devices)
    except (TypeError, ValueError):  # "auto": one device, or as many as Lightning finds
        return 1


def run_plan(plan: Plan, task: Callable) -> Optional[dict]:
    """Run the plan's jobs with ``task`` (Hydra's task function: config -> value); a sweep's outcome, or None
    for a single run (its exception, if it raised one, is raised here)."""
    from hydra.core.utils import configure_log, setup_globals

    cfg = plan.cfg
    with hydra_loader(*plan.source) as loader:  # what a launcher composes with, elsewhere (SLURM, Ray, joblib)
        setup_globals()
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        if not plan.multirun:
            run_single(plan, task, loader)
            return None
        return run_sweep(plan, task, loader)


def run_single(plan: Plan, task: Callable, loader: Any) -> None:
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    cfg = plan.jobs[0].cfg
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=cfg.hydra.job.config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=loader, callbacks=callbacks), task_function=task,
                  config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None)
    callbacks.on_run_end(config=cfg, config_name=cfg.hydra.job.config_name, job_return=ret)
    _ = ret.return_value  # the task's exception, raised


def run_sweep(plan: Plan, task: Callable, loader: Any, launcher: Any = None) -> dict:
    """Launch the plan's jobs to run (``launcher``: an instantiated Hydra launcher, inside Hydra's own multirun,
    which tells the callbacks; else the sweep config's); -> the outcome, also kept as ``sweep.json``."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext

    cfg, sweep_dir = plan.cfg, plan.sweep_dir
    print_plan(plan, dry=False)
    notify = launcher is None  # (Hydra's multirun tells the callbacks itself)
    callbacks = Callbacks(cfg if notify else None)
    if notify:
        callbacks.on_multirun_start(config=cfg, config_name=cfg.hydra.job.config_name)
    context = HydraContext(config_loader=loader, callbacks=callbacks)
    if launcher is None:
        launcher = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=task, config=cfg)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not (sweep_dir / "multirun.yaml").exists():  # as Hydra's sweeper writes it; a resumed sweep keeps the first
        OmegaConf.save(cfg, sweep_dir / "multirun.yaml")
    plan.save()
    if hasattr(launcher, "plan"):  # modforge's gpus launcher: each job's directory and devices from the plan
        launcher.plan = plan
    here = type(launcher).__name__ == "BasicLauncher"  # Hydra's own: the jobs run in this process
    try:
        for block in blocks([p for p in plan.jobs if p.runs]):
            if here:
                run_here(block, task, context, cfg)
            else:
                launch(launcher, block)
    finally:  # also when a signal stops the sweep: the caller prints the summary and the resume hint
        result = plan.outcome = {**outcome(plan), "jobs": [p.record() for p in plan.jobs]}
        try:
            write_json(sweep_dir / RECORD, result, indent=2)
        except OSError:  # the record is a courtesy; the caller has the outcome
            pass
    if notify:
        callbacks.on_multirun_end(config=cfg, config_name=cfg.hydra.job.config_name)
    return result


def run_here(block: list, task: Callable, context: Any, cfg: Any) -> None:
    """Jobs run one after another in this process from their planned configs (what Hydra's basic launcher does,
    without composing each job again)."""
    from hydra.core.utils import configure_log, run_job

    log.info(f"Launching {len(block)} jobs locally")
    for job in block:
        log.info(f"\t#{job.num} : {' '.join(job.overrides)}")
        run_job(hydra_context=context, task_function=task, config=job.cfg, job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir")
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)


def launch(launcher: Any, block: list) -> None:
    """One block of consecutive jobs to ``launcher``; a launcher that breaks ends only that block: when it had
    started some, the jobs it never started are launched again (once); those it left half-done are reported as
    interrupted."""
    try:
        launcher.launch([p.overrides for p in block], initial_job_idx=block[0].num)
    except ModforgeError:
        raise  # a launcher's setting or a job it cannot place: one line, not a broken launcher
    except Exception as e:  # noqa: BLE001 - e.g. joblib's TerminatedWorkerError when a worker is killed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"[modforge] the launcher stopped: {type(e).__name__}: {first}", file=sys.stderr)
        unstarted = [p for p in block if not p.started()]
        if not unstarted or len(unstarted) == len(block):
            return
        for again in blocks(unstarted):
            try:
                launcher.launch([p.overrides for p in again], initial_job_idx=again[0].num)
            except Exception:  # noqa: BLE001 - broken twice: what ran is in the summary
                pass


def blocks(jobs: list) -> list:
    """Runs of consecutive job numbers (a launcher numbers the jobs of one call consecutively)."""
    return [[p for _, p in grp] for _, grp in itertools.groupby(enumerate(jobs), key=lambda t: t[1].num - t[0])]


def outcome(plan: Plan) -> dict:
    """Counts by status over every job of the sweep (its directory's record, not the launcher's word), the summary
    to print, and the exit code of the command (1 when a job failed or was interrupted). A job that paused where
    its ``pause_at`` asked is ``paused``: done, for this command."""
    sweep_dir = plan.sweep_dir
    counts = {s: 0 for s in ("finished", "failed", "diverged", "interrupted", "paused")}
    problems = []
    for p in plan.jobs:
        if p.action == "invalid":
            continue
        state = read_state(p.dir)
        status = {"new": "interrupted", "unreadable": "failed", "foreign": "failed"}.get(state.status, state.status)
        status = status if status in counts else "failed"  # whatever else a job's directory says: not a result
        pause_at = p.cfg.get("pause_at") if p.cfg is not None else None
        if status == "interrupted" and reached_pause(state.pause, pause_at):
            status = "paused"
        counts[status] += 1
        if status in ("failed", "interrupted"):
            why = state.error or ("not started" if state.status == "new" and p.runs else "no final record (killed?)")
            problems.append(f"  #{p.num} {status}: {why} ({p.dir})")
    invalid = sum(p.action == "invalid" for p in plan.jobs)
    line = (f"[modforge] sweep {sweep_dir}: {len(plan.jobs)} jobs: "
            + ", ".join(f"{v} {k}" for k, v in counts.items() if k != "paused" or v)
            + (f", {invalid} invalid (skipped)" if invalid else ""))
    bad = counts["failed"] + counts["interrupted"]
    if bad:
        line += "; resume with: python -m modforge.train -m resume=" + str(sweep_dir) + (
            " retry_failed=true" if counts["failed"] else "")
    return {"exit": 1 if bad else 0, "summary": "\n".join([line, *problems]), "counts": counts}
