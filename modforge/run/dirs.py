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
from typing import Any, Callable, Optional

import yaml

from modforge.errors import ConfigError, ModforgeError, RunDirTaken

FINAL = ("finished", "diverged")  # a run in one of these has nothing left to do
RECORDS = ("config.yaml", "metrics.json", "status.json", "checkpoints", "logs")  # what a run writes


MARKER = ".modforge-run"  # written when a run claims its directory: what modforge may continue, trim or clear
HYDRAS = (".hydra", ".lock", ".rank0.json", MARKER)  # Hydra's per-job record, the lock, rank 0's decision, the mark


@dataclass
class RunState:
    """What a directory says about the run in it."""

    status: str  # new | finished | diverged | failed | interrupted | unreadable | foreign (files not of a run)
    error: Optional[str] = None
    metrics: Optional[dict] = None
    config: Optional[dict] = None  # the run's config.yaml
    checkpoint: Optional[Path] = None  # checkpoints/last.ckpt, when there is one
    damaged: Optional[str] = None  # why the run's own config.yaml cannot be read: it is never retrained over
    pause: Optional[dict] = None  # a run paused by pause_at: {"step": k, "val": {metric: value at step k}}

    @property
    def holds_run(self) -> bool:
        return self.status not in ("new", "foreign")

    def checkpoint_step(self) -> Optional[int]:
        """The step of ``last.ckpt`` (read memory-mapped: no weights are loaded), None without one."""
        if self.checkpoint is None:
            return None
        try:
            import torch

            return int(torch.load(self.checkpoint, map_location="cpu", weights_only=True, mmap=True)["global_step"])
        except Exception:  # noqa: BLE001 - unreadable: the resume itself will say why, in one line
            return None


def pause_of(record: dict, status: str) -> Optional[dict]:
    """An interrupted run's pause (``pause_at``) as its ``status.json`` records it: {"step", "val"}, or None (not
    paused, or a record no pause writes)."""
    step, val = record.get("paused_at"), record.get("val")
    if status != "interrupted" or not isinstance(step, int) or isinstance(step, bool) or step < 1 or \
            not isinstance(val, dict):
        return None
    return {"step": step, "val": {str(k): v for k, v in val.items() if isinstance(v, (int, float))
                                  and not isinstance(v, bool)}}


def reached_pause(pause: Optional[dict], pause_at: Optional[int]) -> bool:
    """Whether a run's recorded pause (:func:`pause_of`) is at ``pause_at`` or later: the run has done what a
    command with that ``pause_at`` asks of it."""
    return pause is not None and pause_at is not None and pause["step"] >= pause_at


def is_run_config(config: Any) -> bool:
    """A mapping as modforge writes a run's ``config.yaml``: the model, task, data and trainer groups."""
    return isinstance(config, dict) and all(isinstance(config.get(k), dict) for k in ("model", "task", "data", "trainer"))


def strangers(d: Path) -> list[str]:
    """What ``d`` holds besides Hydra's record of a job (``.hydra/``, ``<job>.log``) and modforge's own files."""
    try:
        names = sorted(p.name for p in Path(d).iterdir())
    except OSError:
        return []
    return [n for n in names if n not in HYDRAS and not n.endswith(".log")]


def read_state(d: Path, owned: bool = True) -> RunState:
    """The state of the run in ``d`` (``new`` when it holds none). A directory is a run's when modforge marked
    it (:data:`MARKER`) or its ``config.yaml`` is a modforge run config (runs from before the mark); anything
    else in it besides Hydra's own record makes it ``foreign``: never written to, never cleared. ``owned=False``
    (reading results only, as the report does): the records are read whoever wrote the directory."""
    d = Path(d)
    if not d.is_dir():
        return RunState("new")
    config, damaged = None, None
    if (d / "config.yaml").exists() and not (d / "config.yaml").is_file():  # a FIFO would block the read
        damaged = "it is not a regular file"
    elif (d / "config.yaml").exists():
        try:
            config = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8"))
            if not is_run_config(config):
                damaged, config = "it is not a run configuration (empty, or not the mapping modforge writes)", None
        except (OSError, ValueError, yaml.YAMLError) as e:
            damaged = f"{type(e).__name__}: {e}".splitlines()[0]
    if owned and not (d / MARKER).is_file() and config is None:
        strange = strangers(d)
        if strange:
            return RunState("foreign", f"holds {', '.join(strange[:3])}{' ...' if len(strange) > 3 else ''} but no "
                                       "modforge run (no .modforge-run mark, no run config.yaml): not a modforge "
                                       "run's directory")
        return RunState("new")
    ckpt = d / "checkpoints" / "last.ckpt"
    ckpt = ckpt if ckpt.is_file() else None
    if damaged:
        return RunState("unreadable", f"config.yaml: {damaged}", None, None, ckpt, damaged=damaged)
    try:
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
            if not isinstance(record, dict):
                raise ValueError("not a status record (expected an object)")
            status = record.get("status") if record.get("status") in ("failed", "interrupted") else "failed"
            return RunState(status, record.get("error"), None, config, ckpt, pause=pause_of(record, status))
    except (OSError, ValueError, AttributeError, RecursionError) as e:  # RecursionError: JSON nested too deep
        return RunState("unreadable", f"{type(e).__name__}: {e}".splitlines()[0], None, config, ckpt)
    if config is not None or ckpt is not None or (d / "checkpoints").exists():
        return RunState("interrupted", None, None, config, ckpt)
    return RunState("new")


def claim(d: Path) -> bool:
    """Mark ``d`` as a modforge run's directory (made if missing) unless another tool's files are in it; True when
    it is (now) a run's directory."""
    from modforge.utils.files import write_json

    state = read_state(d)
    if state.status == "foreign":
        return False
    if not (Path(d) / MARKER).is_file():
        Path(d).mkdir(parents=True, exist_ok=True)
        write_json(Path(d) / MARKER, {"format": "modforge-run-1"})
    return True


# the sweep's own switches: read by the sweeper, never passed on to a job
SWEEP_KEYS = ("dry_run", "skip_invalid", "retry_failed")
# keys that say how a command runs, not what a run trains: they neither name nor distinguish runs
# (conf/train.yaml excludes the same keys from a job directory's name)
CONTROL_KEYS = ("resume", "pause_at", *SWEEP_KEYS)
# component keys a resumed run may change: where the data is and how it is loaded, what the summary shows
RESUME_FREE_KEYS = ("data.path", "data.cache_dir", "data.num_workers", "data.encoding", "task.sample_chars",
                    "task.sample_prompt", "task.sample_temperature", "task.sample_top_k")
# keys a run may change without becoming another run: the above, and output, logging and compilation
HOW_KEYS = (*RESUME_FREE_KEYS, "sample", "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps",
            "callbacks.progress", "callbacks.progress_every", "logger", "compile",
            "study")  # the study block is read by the report, never by training


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


ABSENT = object()  # no value: a key a config does not have


def option_default(kind: str, name: Any) -> Any:
    """Today's defaults of option ``name`` of a top-level kind, as a run records them (``{name, **params}``), or
    None where there is no such option (a part of the model, an option of a plugin that is not loaded)."""
    from modforge import registry

    if kind not in registry.group_kinds() or not isinstance(name, str):
        return None
    try:
        entry = registry.get(kind, name)
    except ModforgeError:  # not registered (here)
        return None
    from omegaconf import OmegaConf

    return {"name": name, **OmegaConf.to_container(OmegaConf.structured(entry.config), resolve=False)}


def keys_it_predates(recorded: Any, config: Any, default: Any, key: str = "") -> list[tuple]:
    """[(dotted key, value, default or ABSENT)] of each key of ``config`` that ``recorded`` lacks and whose value
    is not today's ``default`` there: [] when a run that predates the keys trained as ``config`` would. Under a
    component whose option is not the default's, the default is that option's own (:func:`option_default`);
    ``default=None``: every key the record lacks, whatever its value."""
    if key in CONTROL_KEYS or key in HOW_KEYS or not isinstance(config, dict) or not isinstance(recorded, dict):
        return []
    if isinstance(default, dict) and "name" in config and config.get("name") != default.get("name"):
        default = option_default(key, config.get("name"))  # another option than the default's: its own defaults
    out = []
    for k, v in config.items():
        sub = f"{key}.{k}" if key else k
        if sub in CONTROL_KEYS or sub in HOW_KEYS:
            continue
        there = default.get(k, ABSENT) if isinstance(default, dict) else ABSENT
        if k in recorded:
            out += keys_it_predates(recorded[k], v, there if there is not ABSENT else None, sub)
        elif isinstance(v, dict) and v:  # a whole block the run predates: key by key (some may be how-keys)
            out += keys_it_predates({}, v, there if there is not ABSENT else None, sub)
        elif default is None or there is ABSENT or there != v:
            out.append((sub, v, there))
    return out


def run_difference(saved: dict, new: dict, default_of: Callable[[], dict], limit: int = 3) -> list[str]:
    """:func:`config_difference` both ways: also each key of ``new`` that the saved run never recorded (a key added
    to modforge after it ran) and that ``new`` sets off today's default (``default_of()``, composed only when the
    record lacks a key; under another option than the default's, that option's own defaults), since the run
    trained at that default."""
    out = config_difference(saved, new, limit)
    if out or not keys_it_predates(saved or {}, new or {}, None):
        return out
    for k, value, default in keys_it_predates(saved or {}, new or {}, default_of())[:limit]:
        was = f"its default {default!r}" if default is not ABSENT else "a default modforge no longer knows"
        out.append(f"{k}: {value!r} now; the run predates the key, so it trained at {was}")
    return out


def clear_records(d: Path) -> None:
    """Remove what an interrupted run without a checkpoint left (it starts again from step 0): only the files a
    run writes, by name; anything else in its directory stays, and so does a folder that still holds it."""
    d = Path(d)
    for name in ("config.yaml", "metrics.json", "status.json"):
        if (d / name).is_file():  # only files: a folder of that name is not a run's record
            with contextlib.suppress(FileNotFoundError):
                (d / name).unlink()
    for folder, patterns in (("checkpoints", ("last*.ckpt", "best*.ckpt", ".last*.ckpt.*.tmp", ".best*.ckpt.*.tmp")),
                             ("logs", ("metrics.csv", "hparams.yaml"))):
        for pattern in patterns:
            for p in (d / folder).glob(pattern):
                if p.is_file():
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
        with contextlib.suppress(OSError):
            (d / folder).rmdir()  # only when nothing else is in it


def trim_metrics_csv(path: Path, step: int) -> None:
    """Drop the rows a killed session logged after its last checkpoint (``step``): the resumed run logs
    them again, and the file then reads as the uninterrupted run's."""
    from modforge.utils.files import atomic_file

    path = Path(path)
    if not path.is_file():
        return
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path}: not the CSV log a run writes ({type(e).__name__}: {str(e)[:120]}); move it "
                          "away to resume this run, or choose an empty hydra.run.dir") from None
    if not rows or "step" not in rows[0]:
        return
    col = rows[0].index("step")

    def before(r: list) -> bool:  # a row of a step before the checkpoint's; one whose step is no number is dropped
        try:
            v = float(r[col])
        except (IndexError, ValueError):
            return False
        return math.isfinite(v) and int(v) < step

    keep = [rows[0]] + [r for r in rows[1:] if before(r)]
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
    not_a_file(Path(d), LOCK, MARKER)
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


def not_a_file(d: Path, *names: str) -> None:
    """Refuse a run directory where one of the files a run keeps (``names``) is something else: a directory, a
    device, a link to nothing. Nothing is changed."""
    for name in names:
        f = d / name
        if (f.exists() or f.is_symlink()) and not f.is_file():
            raise RunDirTaken(f"{f}: not a file (a directory, a device, a link to nothing), where a run keeps its "
                              f"{name.split('/')[-1]}; nothing was changed: move it away, or choose an empty "
                              "hydra.run.dir")


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
        if not isinstance(e, Exception):  # Lightning ends a run on SIGTERM with its SIGTERMException, on Ctrl-C exit 1
            record["error"] = "stopped by SIGTERM" if type(e).__name__ == "SIGTERMException" else \
                "stopped by Ctrl-C (SIGINT)" if isinstance(e, KeyboardInterrupt) or type(e) is SystemExit else \
                record["error"]
        if isinstance(e, Exception) and not isinstance(e, ModforgeError):
            record["traceback"] = "".join(traceback.format_exception(e))
        with contextlib.suppress(OSError):
            if out_dir.is_dir() and claim(out_dir):  # never into another tool's directory
                write_json(out_dir / "status.json", record)
        raise
