"""What the training command and its sweeper tell each other, as files: no module state is shared between
them (a launcher may run jobs in other processes, and a sweep is resumed by another command).

The command opens a *channel* for each invocation, a private temporary directory named in the environment
(:data:`CHANNEL_ENV`), and removes it when Hydra returns:

* ``invalid.json``, command -> sweeper: the pre-flight's verdict on each job it found invalid (with
  ``skip_invalid=true`` the others run): ``{"invalid": [[job overrides, reason], ...]}``;
* ``outcome.json``, sweeper -> command: the outcome of this invocation (its counts, its summary, the exit
  code the command ends with, each job's action), written when the sweep ends, is refused, or is stopped.

The outcome is also kept in the sweep directory as ``sweep.json``: the record of the sweep's last invocation.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from modforge.run.dirs import SWEEP_KEYS
from modforge.utils.files import write_json

CHANNEL_ENV = "MODFORGE_SWEEP_CHANNEL"
RECORD = "sweep.json"


def job_key(overrides: Any) -> tuple:
    """A job's identity between the pre-flight and the sweeper: its task overrides, without the sweep's switches
    (the pre-flight sees the whole command line, hydra.* included; the sweeper only the task's part)."""
    keys = [(str(o), str(o).split("=", 1)[0].lstrip("+~")) for o in overrides]
    return tuple(sorted(o for o, k in keys if k not in SWEEP_KEYS and not k.startswith(("hydra.", "hydra/"))))


def open_channel() -> Path:
    """A new channel for this invocation of the command, named in this process's environment."""
    channel = Path(tempfile.mkdtemp(prefix="modforge-sweep-"))
    os.environ[CHANNEL_ENV] = str(channel)
    return channel


def close_channel(channel: Path) -> Optional[dict]:
    """-> the sweeper's outcome (None: no sweeper of modforge's ran, or it planned a dry run); the channel is
    removed and no longer named in the environment."""
    outcome = _read(channel / "outcome.json")
    if os.environ.get(CHANNEL_ENV) == str(channel):
        del os.environ[CHANNEL_ENV]
    shutil.rmtree(channel, ignore_errors=True)
    return outcome


def _channel() -> Optional[Path]:
    value = os.environ.get(CHANNEL_ENV)
    return Path(value) if value and Path(value).is_dir() else None


def _read(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_invalid(channel: Path, invalid: list) -> None:
    """The pre-flight's verdicts: ``invalid`` is [(job overrides, reason), ...]."""
    write_json(channel / "invalid.json", {"invalid": [[list(job_key(job)), str(why)] for job, why in invalid]})


def read_invalid() -> dict:
    """{job key: reason} from the pre-flight of the command this sweeper runs in ({} outside one)."""
    channel = _channel()
    data = _read(channel / "invalid.json") if channel is not None else None
    return {tuple(job): why for job, why in (data or {}).get("invalid", [])}


def write_outcome(sweep_dir: Path, outcome: dict) -> None:
    """The sweep's outcome (``exit``, ``summary``, ``counts``, ``jobs``): to the command, and as ``sweep.json``."""
    channel = _channel()
    if channel is not None:
        write_json(channel / "outcome.json", outcome)
    try:
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        write_json(Path(sweep_dir) / RECORD, outcome, indent=2)
    except OSError:  # the record is a courtesy; the command has the outcome
        pass
