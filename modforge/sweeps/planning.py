"""Planning a command's jobs, once, before the first one starts: the grid expanded (each of
``hydra.sweeper.cells`` crossed with ``hydra.sweeper.params`` and the command line's comma lists, in Hydra's
basic sweeper's order), each job composed, validated, and its directory read (:func:`modforge.run.dirs.read_state`):

* a new job runs; a finished or diverged one is skipped; an interrupted one resumes from its ``last.ckpt`` in
  place; a failed one is skipped unless ``retry_failed=true``. Re-running a sweep command against its sweep
  directory (``hydra.sweep.dir=...``, or ``-m resume=<sweep dir>``) therefore continues it;
* a directory that holds a run of another configuration, another tool's files, or a run training now is never
  written to: the sweep does not start, and each such job is named;
* invalid jobs are all named at once and the sweep does not start, or with ``skip_invalid=true`` are left out.

Mistakes are one line each (:class:`~modforge.errors.ConfigError`), before any job has trained."""
import functools
import sys
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from modforge import registry
from modforge.config.checks import check_output_dir, validate
from modforge.config.command_line import check_overrides, top_names
from modforge.config.composition import compose_command, compose_sweep_job, default_config, parse_overrides
from modforge.config.grid import sweep_jobs
from modforge.config.overrides import user_override_keys
from modforge.run.dirs import FINAL, SWEEP_KEYS, is_locked, reached_pause, read_state, run_difference
from modforge.run.resume import resume_path, resumed_config, unrecorded, with_init_from
from modforge.sweeps.gpus import check_slots, slot_count
from modforge.sweeps.plan import Job, Plan, config_stamp


def build(argv: list, multirun: bool, loader: Any, here: bool = True, source: tuple = (None, None),
          flags: Optional[list] = None) -> Plan:
    """The plan of the command ``argv`` (its overrides; flags are ignored): a single run's job, or each job of
    the sweep. ``here=False``: the jobs run elsewhere (a cluster), so what depends on this machine's devices is
    checked there. Composes each job once; a mistake anywhere is one ConfigError."""
    overrides = [a for a in argv if ("=" in a or a.startswith("~")) and not a.startswith("-")]
    check_overrides(argv, loader)
    cfg = compose_command(loader, overrides, multirun)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    check_output_dir(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir), key)
    plan = Plan(multirun, [], cfg, source, list(flags or []), checked=here,
                dry_run=bool(OmegaConf.select(cfg, "dry_run", default=False)))
    if not multirun:
        d = Path(str(cfg.hydra.run.dir))
        check_run_dir(d)
        add_notes(plan, check_job(cfg, user_override_keys(overrides), here))
        plan.jobs = [Job(0, overrides, d, "run", devices=_plain(cfg.trainer.get("devices", 1)),
                         accelerator=str(cfg.trainer.get("accelerator", "auto")), cfg=cfg)]
        return plan
    arguments = [o.input_line for o in parse_overrides(overrides, loader) if not o.is_hydra_override()]
    return plan_sweep(plan, arguments, loader, here)


def plan_sweep(plan: Plan, arguments: list, loader: Any, here: bool = True) -> Plan:
    """Each job of the sweep whose own config is ``plan.cfg``, from its task overrides (``arguments``, as Hydra
    gives a sweeper): expanded, composed, validated and decided; ``plan`` gets them."""
    cfg = plan.cfg
    arguments = [a for a in arguments if a.split("=", 1)[0].lstrip("+~") not in SWEEP_KEYS]
    jobs = sweep_jobs(cfg, arguments, lambda a: parse_overrides(a, loader))
    check_distinct(jobs, arguments)
    if len(jobs) > 1:
        check_subdir(cfg, len(jobs))
    slots = slot_count(cfg.hydra.launcher)  # hydra/launcher=gpus: its devices
    retry = bool(cfg.get("retry_failed", False))
    default = functools.cache(default_config)  # composed once, and only for a run that predates a key
    bad = []
    for num, job in enumerate(jobs):
        try:
            job_cfg = compose_sweep_job(loader, cfg, job, num)
            if slots is not None:
                check_slots(job_cfg.trainer.get("devices", 1), slots)
            add_notes(plan, check_job(job_cfg, user_override_keys(job), here))
        except registry.ConfigError as e:
            bad.append((num, job, e))
            plan.jobs.append(Job(num, job, None, "invalid", str(e)))
            continue
        plan.jobs.append(decide(num, job, job_cfg, retry, default))
    refuse_invalid(plan, bad, jobs, bool(cfg.get("skip_invalid", False)))
    conflicts = [p for p in plan.jobs if p.action == "conflict"]
    if conflicts:
        raise registry.ConfigError(f"{len(conflicts)} job directories cannot be used (another configuration's run, "
                                   "or one training now), so the sweep does not start: "
                                   + "; ".join(f"#{p.num} {p.dir}: {p.why}" for p in conflicts))
    return plan


def add_notes(plan: Plan, notes: list) -> None:
    for note in notes:
        if note not in plan.notes:
            plan.notes.append(note)
            print(f"[modforge] note: {note}", file=sys.stderr)


def refuse_invalid(plan: Plan, bad: list, jobs: list, skip: bool) -> None:
    """All invalid jobs named at once: the sweep does not start, or with ``skip_invalid=true`` runs the others."""
    if not bad:
        return
    if len(jobs) == 1:
        raise bad[0][2]
    varying = {o.split("=")[0] for j in jobs for o in j} - {o.split("=")[0] for o in set.intersection(*map(set, jobs))}
    described = "; ".join(f"#{i} ({' '.join(o for o in job if o.split('=')[0] in varying)}): {e}" for i, job, e in bad)
    if not skip or len(bad) == len(jobs):
        hint = "" if len(bad) == len(jobs) else " (skip_invalid=true runs the others)"
        raise registry.ConfigError(f"{len(bad)} of {len(jobs)} jobs are invalid, so the sweep does not start: "
                                   f"{described}{hint}")
    print(f"[modforge] skipping {len(bad)} invalid of {len(jobs)} jobs (skip_invalid=true): {described}",
          file=sys.stderr)


def decide(num: int, overrides: list, cfg: Any, retry_failed: bool, default_of: Any = default_config) -> Job:
    """What happens to one job of the sweep, from what its directory holds."""
    d = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    job = Job(num, overrides, d, "run", devices=_plain(cfg.trainer.get("devices", 1)),
              accelerator=str(cfg.trainer.get("accelerator", "auto")), cfg=cfg)
    try:
        state = read_state(d)
        if is_locked(d):
            return _as(job, "conflict", "another process is training it now (is the sweep still running?)")
        if state.status == "foreign":
            return _as(job, "conflict", state.error)
        if state.damaged:
            return _as(job, "conflict", f"its config.yaml cannot be read ({state.damaged}); repair it, or delete the "
                                        "directory to train the job again")
        if state.holds_run and state.config is not None:
            diff = run_difference(state.config, job_config(cfg), default_of)
            if diff:
                return _as(job, "conflict", "; ".join(diff))
    except Exception as e:  # noqa: BLE001 - a directory or config that cannot be read: that job is refused
        return _as(job, "conflict", f"cannot plan it: {type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0])
    job.stamp = config_stamp(d)
    if state.status == "new":
        return job
    if state.status in FINAL:
        return _as(job, "skip", state.status)
    if state.status == "interrupted" and reached_pause(state.pause, cfg.get("pause_at")):  # by its record (a
        # checkpoint alone may be one killed before the record)
        return _as(job, "skip", f"paused at step {state.pause['step']} (pause_at={cfg.get('pause_at')})")
    step = state.checkpoint_step()
    where = f"from step {step}" if step is not None else "from step 0 (no checkpoint)"
    if state.status in ("failed", "unreadable"):
        return _as(job, "retry", where) if retry_failed else \
            _as(job, "skip", f"{state.status}; retry_failed=true runs it again")
    return _as(job, "resume" if step is not None else "restart", where)


def _as(job: Job, action: str, why: str) -> Job:
    job.action, job.why = action, why
    return job


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def job_config(cfg: Any) -> dict:
    """A composed job's config as its run records it: plain values, without Hydra's node (which resolves only in
    the job)."""
    return {k: _plain(cfg[k]) for k in cfg if k != "hydra"}


def check_distinct(jobs: list, argv: list) -> None:
    """No two jobs of a sweep are one configuration (``seed=1,1``): they would share a directory name's
    meaning and count twice in the report's statistics."""
    seen: dict = {}
    for i, job in enumerate(jobs):
        key = frozenset(job)
        if key in seen:
            first = seen[key]
            swept = {a.split("=")[0].lstrip("+~") for a in argv if "," in a or "(" in a}
            differs = [o for o in job if o.split("=")[0].lstrip("+~") in swept] or job[-1:]
            raise registry.ConfigError(f"jobs #{first} and #{i} of the sweep are the same configuration "
                                       f"({' '.join(differs)}): a value is listed twice; list each once")
        seen[key] = i


def check_subdir(cfg: Any, jobs: int) -> None:
    """A sweep's jobs each train in a directory of their own: a ``hydra.sweep.subdir`` without an interpolation
    (``${hydra.job.num}``, the overrides' name) is one directory for every job."""
    subdir = OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir")
    if isinstance(subdir, str) and "${" not in subdir:
        raise registry.ConfigError(f"hydra.sweep.subdir={subdir}: all {jobs} jobs of the sweep would train in that "
                                   "one directory; name each job's, e.g. hydra.sweep.subdir='job${hydra.job.num}' "
                                   "(by default each is named by its overrides)")


def check_run_dir(d: Path) -> None:
    """A single run's directory is refused before Hydra writes its record into it when it holds another tool's
    files, or a run whose config.yaml cannot be read."""
    state = read_state(d)
    if state.status == "foreign":
        raise registry.ConfigError(f"hydra.run.dir={d}: it {state.error}; choose an empty or new directory")
    if state.damaged:
        raise registry.ConfigError(f"hydra.run.dir={d}: its config.yaml cannot be read ({state.damaged}); repair "
                                   "it, or delete the directory to train the run again")


def check_job(cfg: Any, user_keys: Optional[list], here: bool) -> list:
    """One job's config as it will train: the ``init_from=`` checkpoint's architecture under the command line,
    or the resumed run's config with what the command line may change; validated once. -> notes."""
    check_root_keys(cfg)
    cfg, _ = with_init_from(cfg, user_keys)
    resume = resume_path(cfg.get("resume"))
    if resume:
        cfg = resumed_config(cfg, resume, user_keys, finished_ok=unrecorded(resume))
    return validate(cfg, here=here)


def check_root_keys(cfg: Any) -> None:
    """Every root key of a composed job is one modforge reads: a config file's typo (``colour: red`` in an
    experiment) is refused as the same key on the command line is, and so is an experiment file whose settings
    landed under ``experiment.`` (it lacks ``# @package _global_``), so that none of them would apply."""
    if cfg.get("experiment"):  # (an empty file leaves an empty mapping: nothing lost)
        raise registry.ConfigError("experiment: its file's settings landed under 'experiment.' and none of them "
                                   "applies; an experiment file is a mapping whose first line is "
                                   "'# @package _global_' (as in conf/experiment/)")
    known = {*top_names(), "hydra"}
    unknown = [k for k in cfg.keys() if k not in known]
    if unknown:
        raise registry.ConfigError(f"{unknown[0]}: '{unknown[0]}' is not a key or group of modforge's config (set "
                                   "in a config file: an experiment, --config-dir), so nothing would read it; "
                                   "python -m modforge list shows the groups and keys")
