"""A command's jobs as one plan: each job's number, overrides, directory, what will happen to it and why, the
devices it takes; built once, before anything runs (:mod:`modforge.sweeps.planning`), handed to the launcher that
needs it (``hydra/launcher=gpus``: each job's directory and devices) and kept in the sweep directory as
``plan.json``, the record of what was planned.

A job's composed config stays with the plan in the process that built it (``Job.cfg``, never written): that
process runs its jobs from it, so no job is composed twice there."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from modforge.config.grid import labels
from modforge.errors import ConfigError
from modforge.utils.files import write_json

PLAN = "plan.json"


@dataclass
class Job:
    num: int
    overrides: list  # the job's own overrides (the sweep's hydra.* settings are the sweep config's)
    dir: Optional[Path]
    action: str  # run | resume | retry | restart | skip | invalid | conflict
    why: str = ""
    stamp: Optional[int] = None  # config.yaml's mtime when planned: a job that starts rewrites it
    devices: Any = 1  # trainer.devices: the slots a hydra/launcher=gpus job takes
    accelerator: str = "auto"
    cfg: Any = field(default=None, repr=False, compare=False)  # composed, hydra node included (not kept on disk)

    def started(self) -> bool:
        return self.dir is not None and config_stamp(self.dir) != self.stamp

    @property
    def runs(self) -> bool:
        return self.action in ("run", "resume", "retry", "restart")

    def record(self) -> dict:
        return {"num": self.num, "overrides": list(self.overrides), "dir": str(self.dir) if self.dir else None,
                "action": self.action, **({"why": self.why} if self.why else {}), "devices": self.devices,
                "accelerator": self.accelerator}


@dataclass
class Plan:
    """A sweep's jobs (``multirun``), or a single run's one job; ``cfg``: the command's config as composed (a
    sweep's own, or the single job's), ``source``: its ``--config-dir`` and ``--config-name``, ``flags``: those
    as command-line words (a job started as its own process gets them), ``checked``: every job was validated on
    this machine, ``notes``: settings legal but probably not meant."""

    multirun: bool
    jobs: list
    cfg: Any = None
    source: tuple = (None, None)
    flags: list = field(default_factory=list)
    checked: bool = True
    notes: list = field(default_factory=list)
    dry_run: bool = False
    outcome: Optional[dict] = None  # a sweep's, once it ran (also when it was stopped)

    @property
    def sweep_dir(self) -> Optional[Path]:
        return Path(str(self.cfg.hydra.sweep.dir)) if self.multirun and self.cfg is not None else None

    @property
    def ours(self) -> bool:
        """Whether modforge's sweeper is the sweep's (another, e.g. Optuna's, samples its own jobs)."""
        return not self.multirun or str(self.cfg.hydra.sweeper.get("_target_", "")).endswith("ModforgeSweeper")

    def job(self, num: int) -> Job:
        for j in self.jobs:
            if j.num == num:
                return j
        raise ConfigError(f"job #{num} is not in the sweep's plan ({self.sweep_dir / PLAN}): was the sweep "
                          "directory's plan replaced by another command's?")

    def save(self) -> None:
        write_json(self.sweep_dir / PLAN, {"flags": self.flags, "jobs": [j.record() for j in self.jobs]}, indent=1)


def config_stamp(d: Path) -> Optional[int]:
    try:
        return (Path(d) / "config.yaml").stat().st_mtime_ns
    except OSError:
        return None


WHAT = {"run": "run", "resume": "resume", "restart": "run again", "retry": "retry", "skip": "skip",
        "invalid": "invalid: skipped", "conflict": "refused"}


def print_plan(plan: Plan, dry: bool) -> None:
    """A sweep's plan, one line per job (with a dry run, or when any job is not simply run)."""
    jobs = plan.jobs
    if not dry and all(p.action == "run" for p in jobs):
        return
    n_run = sum(p.runs for p in jobs)
    head = "dry run, nothing is trained" if dry else f"{n_run} to run"
    print(f"[modforge] sweep {plan.sweep_dir}: {len(jobs)} jobs ({head})")
    for p, mine in zip(jobs, labels([p.overrides for p in jobs])):
        what = WHAT[p.action] + (f" ({p.why})" if p.why and p.action != "invalid" else "")
        where = p.dir if p.dir is not None else p.why
        print(f"  #{p.num:<3} {mine:<40} {what}\n       {where}")
