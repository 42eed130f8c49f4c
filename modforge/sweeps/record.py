"""What the training command and its sweeper tell each other, as files in the sweep directory (no module
state is shared between them: a launcher may run the sweeper's jobs in other processes, and a sweep is
resumed by another command).

* ``.preflight.json``, command -> sweeper: the pre-flight's verdict on each job it found invalid (with
  ``skip_invalid=true`` the others run): ``{"invalid": [[job overrides, reason], ...]}``. The sweeper reads
  it once and removes it; the command removes it too when the sweep ends (a dry run leaves nothing behind).
* ``sweep.json``, sweeper -> command: the outcome of this invocation of the sweep (its counts, its summary,
  the exit code the command ends with, each job's action), written when the sweep ends or is refused. It
  stays as the record of the sweep's last invocation; the command reads only the one written in its own
  process since it started.
"""
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from modforge.run.dirs import SWEEP_KEYS
from modforge.utils.files import write_json

PREFLIGHT = ".preflight.json"
RECORD = "sweep.json"


def job_key(overrides: Any) -> tuple:
    """A job's identity between the pre-flight and the sweeper: its task overrides, without the sweep's switches
    (the pre-flight sees the whole command line, hydra.* included; the sweeper only the task's part)."""
    keys = [(str(o), str(o).split("=", 1)[0].lstrip("+~")) for o in overrides]
    return tuple(sorted(o for o, k in keys if k not in SWEEP_KEYS and not k.startswith(("hydra.", "hydra/"))))


def write_invalid(sweep_dir: Path, invalid: list) -> None:
    """The pre-flight's verdicts: ``invalid`` is [(job overrides, reason), ...]."""
    write_json(Path(sweep_dir) / PREFLIGHT, {"invalid": [[list(job_key(job)), str(why)] for job, why in invalid]})


def take_invalid(sweep_dir: Path) -> dict:
    """{job key: reason} from the pre-flight of this command (none: {}); the file is consumed."""
    path = Path(sweep_dir) / PREFLIGHT
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    clear_invalid(sweep_dir)
    return {tuple(job): why for job, why in data.get("invalid", [])}


def clear_invalid(sweep_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (Path(sweep_dir) / PREFLIGHT).unlink()


def write_outcome(sweep_dir: Path, outcome: dict) -> None:
    """The sweep's outcome (``exit``, ``summary``, ``counts``, ``jobs``), stamped with the writing process."""
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(sweep_dir) / RECORD, {**outcome, "pid": os.getpid(), "written": time.time()}, indent=2)


def read_outcome(sweep_dir: Path, since: float) -> Optional[dict]:
    """The outcome this process's sweeper wrote in ``sweep_dir`` since ``since`` (a time.time()); None if none
    (a dry run, a sweeper that is not modforge's)."""
    try:
        data = json.loads((Path(sweep_dir) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("pid") != os.getpid() or data.get("written", 0) < since:
        return None
    return data
