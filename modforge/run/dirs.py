"""Run directories: what a run leaves behind, what state that says it is in, and new directories that are
never shared.

A run directory holds ``config.yaml`` (the resolved config, written first),
``checkpoints/`` (``last.ckpt``, ``best.ckpt``), ``logs/metrics.csv``, and at the
end either ``metrics.json`` (``finished`` or ``diverged``) or ``status.json``
(``failed`` with the one-line error, or ``interrupted``). A directory with a
config and no final record was killed (or is still running): ``interrupted``,
resumable when it has a checkpoint. :func:`read_state` reads all of that, for
the training command (which continues such a run in place), the sweeper (which
skips, resumes or runs each job) and the report.

New run and sweep directories are named by :mod:`modforge.config.resolvers`.
"""
import contextlib
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from modforge.errors import ModforgeError, RunDirTaken

FINAL = ("finished", "diverged")  # a run in one of these has nothing left to do
RECORDS = ("config.yaml", "metrics.json", "status.json", "checkpoints", "logs")  # what a run writes


@dataclass
class RunState:
    """What a directory says about the run in it."""

    status: str  # new | finished | diverged | failed | interrupted | unreadable | foreign (files not of a run)
    error: Optional[str] = None
    metrics: Optional[dict] = None
    config: Optional[dict] = None  # the run's config.yaml
    checkpoint: Optional[Path] = None  # checkpoints/last.ckpt, when there is one

    @property
    def holds_run(self) -> bool:
        return self.status != "new"

    def checkpoint_step(self) -> Optional[int]:
        """The step of ``last.ckpt`` (read memory-mapped: no weights are loaded), None without one."""
        if self.checkpoint is None:
            return None
        try:
            import torch

            return int(torch.load(self.checkpoint, map_location="cpu", weights_only=True, mmap=True)["global_step"])
        except Exception:  # noqa: BLE001 - unreadable: the resume itself will say why, in one line
            return None


def read_state(d: Path) -> RunState:
    """The state of the run in ``d`` (``new`` when it holds none)."""
    d = Path(d)
    ckpt = d / "checkpoints" / "last.ckpt"
    ckpt = ckpt if ckpt.is_file() else None
    config = None
    try:
        if (d / "config.yaml").is_file():
            config = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8"))
        if (d / "metrics.json").is_file():
            metrics = json.loads((d / "metrics.json").read_text(encoding="utf-8"))
            if not isinstance(metrics, dict) or not isinstance(metrics.get("val", {}), dict):
                raise ValueError("not a metrics record (expected an object with a 'val' object)")
            status = metrics.get("status")
            finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in metrics.get("val", {}).values())
            if status not in FINAL:  # records written before statuses existed
                status = "finished" if finite else "diverged"
            return RunState(status, metrics.get("error"), metrics, config, ckpt)
        if (d / "status.json").is_file():
            record = json.loads((d / "status.json").read_text(encoding="utf-8"))
            status = record.get("status") if record.get("status") in ("failed", "interrupted") else "failed"
            return RunState(status, record.get("error"), None, config, ckpt)
    except (OSError, ValueError, AttributeError, yaml.YAMLError) as e:
        return RunState("unreadable", f"{type(e).__name__}: {e}".splitlines()[0], None, config, ckpt)
    if config is not None:
        return RunState("interrupted", None, None, config, ckpt)
    if ckpt is not None or (d / "logs").exists() or (d / "checkpoints").exists():  # not written by a modforge run
        return RunState("foreign", "holds logs/ or checkpoints/ but no config.yaml: not a modforge run's directory")
    return RunState("new")


# the sweep's own switches: read by the sweeper, never passed on to a job
SWEEP_KEYS = ("dry_run", "skip_invalid", "retry_failed")
# keys that say how a command runs, not what a run trains: they neither name nor distinguish runs
# (conf/train.yaml excludes the same keys from a job directory's name)
CONTROL_KEYS = ("resume", *SWEEP_KEYS)
# component keys a resumed run may change: where the data is and how it is loaded, what the summary shows
RESUME_FREE_KEYS = ("data.path", "data.cache_dir", "data.num_workers", "data.encoding", "task.sample_chars",
                    "task.sample_prompt", "task.sample_temperature", "task.sample_top_k")
# keys a run may change without becoming another run: the above, and output, logging and compilation
HOW_KEYS = (*RESUME_FREE_KEYS, "sample", "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps",
            "callbacks.progress", "callbacks.progress_every", "logger", "compile")


def config_difference(saved: dict, new: dict, limit: int = 3) -> list[str]:
    """The keys (dotted) whose values differ between two run configs, ignoring control and how-keys."""
    out: list[str] = []

    def walk(a: Any, b: Any, key: str) -> None:
        if key in CONTROL_KEYS or key in HOW_KEYS or len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            if "name" in a and "name" in b and a["name"] != b["name"]:  # another option of a group: that is all
                out.append(f"{key}: {a['name']!r} there, {b['name']!r} now")
                return
            for k in sorted(a):  # keys the saved run predates are today's defaults: no difference
                walk(a.get(k), b.get(k), f"{key}.{k}" if key else k)
        elif a != b:
            out.append(f"{key}: {a!r} there, {b!r} now")

    walk(saved or {}, new or {}, "")
    return out


def clear_records(d: Path) -> None:
    """Remove what an interrupted run without a checkpoint left (it starts again from step 0)."""
    import shutil

    for name in RECORDS:
        p = Path(d) / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def trim_metrics_csv(path: Path, step: int) -> None:
    """Drop the rows a killed session logged after its last checkpoint (``step``): the resumed run logs
    them again, and the file then reads as the uninterrupted run's."""
    from modforge.utils.files import atomic_file

    path = Path(path)
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows or "step" not in rows[0]:
        return
    col = rows[0].index("step")
    keep = [rows[0]] + [r for r in rows[1:] if len(r) > col and r[col] and int(float(r[col])) < step]
    if len(keep) != len(rows):
        with atomic_file(path, "w") as fh:
            csv.writer(fh, lineterminator="\n").writerows(keep)


# --------------------------------------------------------------------------- one process per run

LOCK = ".lock"


@contextlib.contextmanager
def run_lock(d: Path):
    """Hold ``d/.lock`` (an advisory ``flock``, released by the kernel when the process dies, even by SIGKILL)
    while a run trains in ``d``: a second process that would train there (a sweep resumed while it still runs,
    an overlapping requeue) is refused instead of writing into the same checkpoints and logs."""
    try:
        import fcntl
    except ImportError:  # not on Unix: no lock
        yield
        return
    Path(d).mkdir(parents=True, exist_ok=True)
    fh = open(Path(d) / LOCK, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RunDirTaken(f"{d}: another process is training this run right now (it holds {d / LOCK}); "
                              "wait for it, or stop it first") from None
        yield
    finally:
        fh.close()


def is_locked(d: Path) -> bool:
    """Whether a process is training in ``d`` now."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        with open(Path(d) / LOCK) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            return False
    except OSError:
        return False


# --------------------------------------------------------------------------- a run that raises

@contextlib.contextmanager
def failure_recorded(out_dir: Path):
    """A run that raises leaves ``status.json`` beside its other records: ``failed`` with the one-line error (and
    the traceback, for anything but a configuration error), or ``interrupted`` (Ctrl-C, SIGTERM: Lightning
    turns both into SystemExit); the report and a re-run of the sweep read it. The exception then goes on."""
    try:
        yield
    except RunDirTaken:
        raise  # the directory is another run's: nothing is written there
    except BaseException as e:
        import traceback

        from modforge.utils.files import write_json

        record = {"status": "failed" if isinstance(e, Exception) else "interrupted",
                  "error": (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]}
        if isinstance(e, Exception) and not isinstance(e, ModforgeError):
            record["traceback"] = "".join(traceback.format_exception(e))
        with contextlib.suppress(OSError):
            if out_dir.is_dir():
                write_json(out_dir / "status.json", record)
        raise
