"""modforge's Hydra sweeper: every job planned from its directory, failures kept to the job, one summary.

It is Hydra's basic sweeper (the same grid: ``hydra.sweeper.params`` and the
command line's comma lists, expanded in the same order, numbered the same), with
what a long ablation needs around it:

* **cells** (``hydra.sweeper.cells``): a study whose configurations are not a grid
  (a SiLU MLP beside SwiGLU; three architectures, each with its own task and
  width) lists them, each a mapping of overrides; every cell is crossed with the
  grid (``params`` and the command line's sweeps), cells in the order listed;

* **plan**: each job's directory is read before anything starts (:func:`modforge.run.dirs.read_state`):
  a finished or diverged job is skipped, an interrupted one resumes from its
  ``last.ckpt`` in place, a failed one is skipped unless ``retry_failed=true``,
  a new one runs. Re-running a sweep command against its sweep directory
  (``hydra.sweep.dir=...``, or ``-m resume=<sweep dir>``) therefore continues it.
  A directory that holds a run of another configuration is never written to.
* **invalid jobs** (found by the pre-flight, :mod:`modforge.cli.preflight`) stop the sweep
  before it starts, or with ``skip_invalid=true`` are left out: the pre-flight's verdicts
  reach the sweeper through the command's channel (:mod:`modforge.sweeps.record`);
* **dry run** (``dry_run=true``): the plan is printed, nothing runs;
* **launch**: the jobs to run go to whichever launcher is configured (basic,
  joblib, or a cluster's) in blocks of consecutive job numbers, so each job
  keeps its number and directory. A launcher that breaks (a killed joblib
  worker) ends only its block: jobs it never started are launched again;
* **summary**: one line of counts, one line per job that failed, and the
  exit code of the command (1 when a job failed or was interrupted), handed to the
  command through its channel and kept as ``sweep.json`` in the sweep directory.

Each job itself records its own status (:mod:`modforge.sweeps.job` catches a job's
exception, writes ``status.json`` and returns, so the next job runs).
"""
import itertools
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf, open_dict

from modforge.config.grid import expand_jobs, labels
from modforge.errors import ConfigError, ModforgeError
from modforge.run.dirs import CONTROL_KEYS, FINAL, SWEEP_KEYS, config_difference, is_locked, read_state
from modforge.sweeps.record import job_key, read_invalid, write_outcome

log = logging.getLogger(__name__)


@dataclass
class Planned:
    num: int
    overrides: list
    dir: Optional[Path]
    action: str  # run | resume | retry | restart | skip | invalid | conflict
    why: str = ""
    stamp: Optional[int] = None  # config.yaml's mtime when planned: a job that starts rewrites it

    def started(self) -> bool:
        return self.dir is not None and config_stamp(self.dir) != self.stamp

    @property
    def runs(self) -> bool:
        return self.action in ("run", "resume", "retry", "restart")


@dataclass
class ModforgeSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.modforge_sweeper.ModforgeSweeper"  # Hydra loads plugins from there only
    params: Optional[dict] = field(default=None)
    cells: Optional[list] = field(default=None)  # a union of configurations, each {key: value}, crossed with params


ConfigStore.instance().store(group="hydra/sweeper", name="modforge", node=ModforgeSweeperConf, provider="modforge")


class PlannedSweeper(Sweeper):
    """Not a subclass of Hydra's BasicSweeper (Hydra's plugin scan may load that module twice, and its
    ``super(BasicSweeper, self)`` then fails): its grid expansion is reused through the static method."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 cells: Optional[list] = None):
        super().__init__()
        self.params = dict(params or {})  # hydra.sweeper.params: the grid an experiment carries
        self.cells = cells  # hydra.sweeper.cells: the configurations it lists, each crossed with the grid
        self.hydra_context = self.config = self.launcher = None
        self.invalid: dict = {}  # job key -> why the pre-flight found it invalid (skip_invalid=true)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        cfg = self.config
        flags = {k: bool(cfg.get(k, False)) for k in SWEEP_KEYS}
        jobs = self.expand([a for a in arguments if a.split("=", 1)[0].lstrip("+~") not in SWEEP_KEYS])
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
        self.invalid = read_invalid()
        plan = [self.plan_safely(i, job, flags) for i, job in enumerate(jobs)]
        print_plan(plan, sweep_dir, dry=flags["dry_run"])
        conflicts = [p for p in plan if p.action == "conflict"]
        if conflicts:
            write_outcome(sweep_dir, {"exit": 2, "summary": f"error: {len(conflicts)} job directories cannot be used "
                          f"(another configuration's run, or one training now), so the sweep does not start: "
                          + "; ".join(f"#{p.num} {p.dir}: {p.why}" for p in conflicts), "jobs": jobs_record(plan)})
            return []
        if flags["dry_run"]:
            return []
        self.record_sweep(sweep_dir, cfg)
        returns = []
        try:
            for block in blocks([p for p in plan if p.runs]):
                returns += self.launch(block)
        finally:  # also when a signal stops the sweep: the command prints the summary and the resume hint
            write_outcome(sweep_dir, {**outcome(plan, sweep_dir), "jobs": jobs_record(plan)})
        return returns

    def expand(self, arguments: list) -> list:
        """The jobs' overrides, in Hydra's basic sweeper's order."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        return expand_jobs(self.cells, self.params, list(arguments), parser.parse_overrides)

    def job_config(self, num: int, overrides: list):
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = num
            sweep_config.hydra.job.num = num
        return sweep_config

    def plan_safely(self, num: int, overrides: list, flags: dict) -> Planned:
        try:
            return self.plan_job(num, overrides, flags)
        except Exception as e:  # noqa: BLE001 - a directory or config that cannot be read: that job is refused
            return Planned(num, overrides, None, "conflict", f"cannot plan it: {type(e).__name__}: "
                           + (str(e).strip().splitlines() or [""])[0])

    def plan_job(self, num: int, overrides: list, flags: dict) -> Planned:
        if job_key(overrides) in self.invalid:
            return Planned(num, overrides, None, "invalid", self.invalid[job_key(overrides)])
        job_cfg = self.job_config(num, overrides)
        d = Path(str(job_cfg.hydra.sweep.dir)) / str(job_cfg.hydra.sweep.subdir)
        state = read_state(d)
        if is_locked(d):
            return Planned(num, overrides, d, "conflict", "another process is training it now (is the sweep "
                           "still running?)")
        if state.status == "foreign":
            return Planned(num, overrides, d, "conflict", state.error)
        if state.damaged:
            return Planned(num, overrides, d, "conflict", f"its config.yaml cannot be read ({state.damaged}); repair "
                           "it, or delete the directory to train the job again")
        if state.holds_run and state.config is not None:
            with open_dict(job_cfg):
                job_cfg.pop("hydra")
            diff = config_difference(state.config, OmegaConf.to_container(job_cfg, resolve=True))
            if diff:
                return Planned(num, overrides, d, "conflict", "; ".join(diff))
        if state.status == "new":
            return Planned(num, overrides, d, "run", stamp=config_stamp(d))
        if state.status in FINAL:
            return Planned(num, overrides, d, "skip", state.status)
        step = state.checkpoint_step()
        where = f"from step {step}" if step is not None else "from step 0 (no checkpoint)"
        if state.status in ("failed", "unreadable") and not flags["retry_failed"]:
            return Planned(num, overrides, d, "skip", f"{state.status}; retry_failed=true runs it again")
        if state.status in ("failed", "unreadable"):
            return Planned(num, overrides, d, "retry", where, config_stamp(d))
        return Planned(num, overrides, d, "resume" if step is not None else "restart", where, config_stamp(d))

    def record_sweep(self, sweep_dir: Path, cfg: Any) -> None:
        """multirun.yaml, as Hydra's sweeper writes it; the first run's record is kept when the sweep resumes."""
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if not (sweep_dir / "multirun.yaml").exists():
            OmegaConf.save(cfg, sweep_dir / "multirun.yaml")

    def launch(self, block: list) -> list:
        """Launch one block of consecutive jobs; a launcher that breaks ends only that block: jobs it never
        started are launched again (once); those it left half-done are reported as interrupted."""
        try:
            return list(self.launcher.launch([p.overrides for p in block], initial_job_idx=block[0].num))
        except ModforgeError:
            raise  # a launcher's setting or a job it cannot place: one line, not a broken launcher
        except Exception as e:  # noqa: BLE001 - e.g. joblib's TerminatedWorkerError when a worker is killed
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"[modforge] the launcher stopped: {type(e).__name__}: {first}", file=sys.stderr)
            unstarted = [p for p in block if not p.started()]
            if not unstarted or len(unstarted) == len(block):
                return []
            out = []
            for again in blocks(unstarted):
                try:
                    out += list(self.launcher.launch([p.overrides for p in again], initial_job_idx=again[0].num))
                except Exception:  # noqa: BLE001 - broken twice: what ran is in the summary
                    pass
            return out


def config_stamp(d: Path) -> Optional[int]:
    try:
        return (Path(d) / "config.yaml").stat().st_mtime_ns
    except OSError:
        return None


def blocks(plan: list) -> list:
    """Runs of consecutive job numbers (a launcher numbers the jobs of one call consecutively)."""
    out = []
    for _, grp in itertools.groupby(enumerate(plan), key=lambda t: t[1].num - t[0]):
        out.append([p for _, p in grp])
    return out


WHAT = {"run": "run", "resume": "resume", "restart": "run again", "retry": "retry", "skip": "skip",
        "invalid": "invalid: skipped", "conflict": "refused"}


def print_plan(plan: list, sweep_dir: Path, dry: bool) -> None:
    """The plan, one line per job (with a dry run, or when any job is not simply run)."""
    if not dry and all(p.action == "run" for p in plan):
        return
    n_run = sum(p.runs for p in plan)
    head = "dry run, nothing is trained" if dry else f"{n_run} to run"
    print(f"[modforge] sweep {sweep_dir}: {len(plan)} jobs ({head})")
    for p, mine in zip(plan, labels([p.overrides for p in plan])):
        what = WHAT[p.action] + (f" ({p.why})" if p.why and p.action != "invalid" else "")
        where = p.dir if p.dir is not None else p.why
        print(f"  #{p.num:<3} {mine:<40} {what}\n       {where}")


def outcome(plan: list, sweep_dir: Path) -> dict:
    """Counts by status over every job of the sweep (its directory's record, not the launcher's word), the summary
    to print, and the exit code of the command (1 when a job failed or was interrupted)."""
    counts = {s: 0 for s in ("finished", "failed", "diverged", "interrupted")}
    problems = []
    for p in plan:
        if p.action == "invalid":
            continue
        state = read_state(p.dir)
        status = {"new": "interrupted", "unreadable": "failed", "foreign": "failed"}.get(state.status, state.status)
        status = status if status in counts else "failed"  # whatever else a job's directory says: not a result
        counts[status] += 1
        if status in ("failed", "interrupted"):
            why = state.error or ("not started" if state.status == "new" and p.runs else "no final record (killed?)")
            problems.append(f"  #{p.num} {status}: {why} ({p.dir})")
    invalid = sum(p.action == "invalid" for p in plan)
    line = (f"[modforge] sweep {sweep_dir}: {len(plan)} jobs: " + ", ".join(f"{v} {k}" for k, v in counts.items())
            + (f", {invalid} invalid (skipped)" if invalid else ""))
    bad = counts["failed"] + counts["interrupted"]
    if bad:
        line += "; resume with: python -m modforge.train -m resume=" + str(sweep_dir) + (
            " retry_failed=true" if counts["failed"] else "")
    return {"exit": 1 if bad else 0, "summary": "\n".join([line, *problems]), "counts": counts}


def jobs_record(plan: list) -> list:
    """Each job's number, overrides, directory and planned action, for ``sweep.json``."""
    return [{"num": p.num, "overrides": list(p.overrides), "dir": str(p.dir) if p.dir else None, "action": p.action,
             **({"why": p.why} if p.why else {})} for p in plan]


def sweep_command(sweep_dir: Path) -> tuple[list, list]:
    """(task overrides, hydra overrides) of the sweep recorded in ``sweep_dir/multirun.yaml``."""
    record = Path(sweep_dir) / "multirun.yaml"
    if not record.is_file():
        raise ConfigError(f"resume={sweep_dir}: no multirun.yaml there, so it is not a sweep directory "
                          "(give the directory a sweep was started in, e.g. multirun/<date>/<time>)")
    from modforge.config.untrusted import check_recorded_override
    from modforge.utils import readers

    saved = readers.yaml_file(record, "resume")  # plain data: nothing in it is resolved or built
    if not isinstance(saved.get("hydra"), dict):
        raise ConfigError(f"resume={record}: not the multirun.yaml of a sweep (no hydra section)")
    overrides = saved["hydra"].get("overrides")
    if not isinstance(overrides, dict) or not all(isinstance(overrides.get(k, []), list) for k in ("task", "hydra")):
        raise ConfigError(f"resume={record}: not the multirun.yaml of a sweep (no hydra.overrides section)")
    for o in [*overrides.get("task", []), *overrides.get("hydra", [])]:
        if not isinstance(o, str):
            raise ConfigError(f"resume={record}: hydra.overrides holds {o!r}, not an override (key=value)")
    task = [o for o in overrides.get("task", []) if o.split("=", 1)[0].lstrip("+~") not in CONTROL_KEYS]
    hydra = [o for o in overrides.get("hydra", []) if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    for o in (*task, *hydra):  # what is replayed: data only
        check_recorded_override(o, f"resume={record}")
    return task, hydra
