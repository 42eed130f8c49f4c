"""The pre-flight: before the first job starts, check the command line, then compose and validate every job
it runs (each of a sweep's), so that all mistakes are named at once, in one line each, and no job fails
after another has trained. Its verdict goes to the caller as a :class:`Verdict` (and, for the sweeper, to
the sweep directory: :mod:`modforge.sweeps.record`)."""
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from modforge import registry
from modforge.config.checks import check_output_dir, validate
from modforge.config.command_line import check_overrides, top_names
from modforge.config.composition import compose_job, hydra_loader
from modforge.config.grid import job_overrides
from modforge.config.overrides import HYDRA_VALUE_FLAGS, flag, user_override_keys
from modforge.run.dirs import read_state
from modforge.run.resume import resume_path, resumed_config, unrecorded, with_init_from
from modforge.sweeps.clusters import check_launcher_installed, runs_elsewhere
from modforge.sweeps.gpus import check_slots, slot_count


@dataclass
class Verdict:
    """What the pre-flight found: how many jobs, which are invalid (with ``skip_invalid=true`` the others
    run), and whether every job's config was validated on this machine (the jobs then need not validate
    again)."""

    jobs: int = 0
    invalid: list = field(default_factory=list)  # [(job overrides, reason)]
    checked: bool = False
    notes: list = field(default_factory=list)  # settings legal but probably not meant, printed once each


def preflight(argv: list, multirun: bool) -> Verdict:
    """Check the command line, then compose and validate every job it runs (each of a sweep's) before the
    first one starts; all invalid jobs are named at once."""
    check_launcher_installed(argv)  # hydra/launcher=slurm without its extra: one line naming the extra
    elsewhere = multirun and runs_elsewhere(argv)  # its jobs' devices are checked where they run
    check_words(argv)
    source = config_source(argv)
    if source is None:
        # --config-path: a directory relative to modforge's own module; Hydra composes it, the registry's checks apply
        check_overrides([a for a in argv if a.split("=")[0].lstrip("+~").split(".")[0] in registry.group_kinds()])
        return Verdict()
    verdict = Verdict(checked=not elsewhere)
    with hydra_loader(*source) as loader:
        check_overrides(argv, loader)
        jobs = job_overrides(argv, multirun, loader)
        verdict.jobs = len(jobs)
        check_distinct(jobs, argv)
        bad, slots = [], None
        for i, job in enumerate(jobs):
            try:
                cfg = compose_job(job, hydra=(i == 0))
            except registry.ConfigError as e:
                bad.append((i, job, e))
                continue
            if i == 0:  # the run (or sweep) directory is the command's, not a job's: it fails at once
                key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
                check_output_dir(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir), key)
                if not multirun:
                    check_run_dir(Path(str(cfg.hydra.run.dir)))
                elif len(jobs) > 1:
                    check_subdir(cfg, len(jobs))
                slots = slot_count(cfg.hydra.launcher) if multirun else None  # hydra/launcher=gpus: its devices
            try:
                if slots is not None:
                    check_slots(cfg.trainer.get("devices", 1), slots)
                for note in check_job(cfg, user_override_keys(job), here=not elsewhere):
                    if note not in verdict.notes:
                        verdict.notes.append(note)
                        print(f"[modforge] note: {note}", file=sys.stderr)
            except registry.ConfigError as e:
                bad.append((i, job, e))
    if len(jobs) == 1 and bad:
        raise bad[0][2]
    if bad:
        varying = {o.split("=")[0] for j in jobs for o in j} - {o.split("=")[0] for o in set.intersection(*map(set, jobs))}
        described = "; ".join(f"#{i} ({' '.join(o for o in job if o.split('=')[0] in varying)}): {e}" for i, job, e in bad)
        if not flag(argv, "skip_invalid") or len(bad) == len(jobs):
            hint = "" if len(bad) == len(jobs) else " (skip_invalid=true runs the others)"
            raise registry.ConfigError(f"{len(bad)} of {len(jobs)} jobs are invalid, so the sweep does not start: "
                                       f"{described}{hint}")
        print(f"[modforge] skipping {len(bad)} invalid of {len(jobs)} jobs (skip_invalid=true): {described}",
              file=sys.stderr)
        verdict.invalid = [(job, str(e)) for _, job, e in bad]
        verdict.checked = False  # the valid ones were, but a sweeper that does not read the verdicts runs all
    return verdict


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


def check_subdir(cfg, jobs: int) -> None:
    """A sweep's jobs each train in a directory of their own: a ``hydra.sweep.subdir`` without an interpolation
    (``${hydra.job.num}``, the overrides' name) is one directory for every job."""
    from omegaconf import OmegaConf

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


def check_job(cfg, user_keys: Optional[list], here: bool) -> list:
    """One job's config as it will train: the ``init_from=`` checkpoint's architecture under the command line,
    or the resumed run's config with what the command line may change; validated once."""
    check_root_keys(cfg)
    cfg, _ = with_init_from(cfg, user_keys)
    resume = resume_path(cfg.get("resume"))
    if resume:
        cfg = resumed_config(cfg, resume, user_keys, finished_ok=unrecorded(resume))
    return validate(cfg, here=here)


def check_root_keys(cfg) -> None:
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


def check_words(argv: list) -> None:
    """Every word of the command line is ``key=value``, a flag, or a flag's value, and the overrides are one run
    of words (Hydra's parser reads them so: one after a flag that follows another is 'unrecognized')."""
    words, rest, seen, flag_since, split = [], iter(argv), False, None, None
    for a in rest:
        if a.startswith("-"):
            flag_since = a
            if a in HYDRA_VALUE_FLAGS:
                next(rest, None)
        elif "=" not in a and not a.startswith("~") or a.lstrip("+~").startswith("="):
            words.append(a)
        else:
            if seen and flag_since and split is None:
                split = (a, flag_since)
            seen, flag_since = True, None
    if words:
        raise registry.ConfigError(f"'{words[0]}': expected key=value (e.g. norm=rms) or a flag such as -m")
    if split:
        raise registry.ConfigError(f"'{split[0]}' comes after {split[1]}, which follows other overrides: Hydra reads "
                                   "the key=value overrides as one run; put the flags (-m, --config-dir DIR, "
                                   "--config-name NAME) before or after all of them")


def config_source(argv: list) -> Optional[tuple]:
    """``(config_dir, config_name)`` as the command's ``--config-dir`` / ``--config-name`` give them (None, None
    without), refused in one line when the directory does not exist; None for ``--config-path``, which names a
    directory relative to modforge's own module (Hydra composes that one alone)."""
    given: dict = {}
    rest = iter(argv)
    for a in rest:
        name, eq, value = a.partition("=")
        if name in HYDRA_VALUE_FLAGS:
            given[name] = value if eq else next(rest, "")
    if "--config-path" in given or "-cp" in given:
        return None
    config_dir = given.get("--config-dir", given.get("-cd"))
    if config_dir is not None and not Path(config_dir).is_dir():
        raise registry.ConfigError(f"--config-dir {config_dir}: no such directory (give a directory that holds your "
                                   "config groups, e.g. DIR/experiment/NAME.yaml)")
    return config_dir, given.get("--config-name", given.get("-cn"))
