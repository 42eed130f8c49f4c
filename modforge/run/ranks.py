"""DDP ranks and rank 0's decision: a run's other ranks train exactly what rank 0 decided (fresh, resumed from
which checkpoint, in place or not, or nothing to do).

Lightning starts ranks 1..N-1 itself and hands them the decision in their environment (:data:`FOLLOW_ENV`);
srun (one SLURM task per rank) or torchrun start every rank at once, and those follow the decision rank 0 writes
into the run directory (:data:`DECISION`). Every rank leaves its process group when its run ends."""
import json
import os
import time
from pathlib import Path
from typing import Optional

from modforge.utils.files import write_json

_STARTED = time.time()  # this process's start (imported early): a rank follows no decision written before it
FOLLOW_ENV = "MODFORGE_RESUMED_FROM"  # rank 0's resume decision, for the DDP ranks Lightning starts

DECISION = ".rank0.json"  # rank 0's resume decision, for ranks started beside it (srun, torchrun)

def launched_rank(env: Optional[dict] = None) -> tuple:
    """(global rank, launch id) of a process that srun (one SLURM task per rank) or torchrun started as one of
    several DDP ranks; (0, None) for anything else (Lightning starts the other ranks itself). The launch id
    changes when the job is requeued or restarted, so a rank never follows an earlier attempt's decision."""
    env = os.environ if env is None else env
    if int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"]), (f"slurm-{env.get('SLURM_JOB_ID')}.{env.get('SLURM_STEP_ID', '0')}-"
                                          f"{env.get('SLURM_RESTART_COUNT', '0')}")
    if "TORCHELASTIC_RUN_ID" in env and int(env.get("WORLD_SIZE", "1") or 1) > 1:
        return int(env.get("RANK", "0")), (f"torchrun-{env['TORCHELASTIC_RUN_ID']}-"
                                          f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    return 0, None

def rank0_decision(out_dir: Path, timeout: float = 900.0) -> dict:
    """Wait for rank 0 of this launch to write its decision (resume from where, in place or not) in ``out_dir``."""
    launch = launched_rank()[1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            path = out_dir / DECISION
            decided = json.loads(path.read_text())
            # this launch's, and written since this process started (a launch id can repeat: torchrun's "none")
            if decided.get("launch") == launch and path.stat().st_mtime >= _STARTED - 60:
                return decided
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"rank 0 of launch {launch} wrote no decision in {out_dir / DECISION} within {timeout:.0f} s")

def announce(out_dir: Path, decision: dict) -> None:
    """Rank 0's decision (or why it stopped), for the ranks srun or torchrun started beside it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / DECISION, {"launch": launched_rank()[1], **decision})


def leave_process_group() -> None:
    """A DDP rank (rank 0 too) leaves its process group when its run ends, however it ends: a live gloo group
    torn down by interpreter exit can abort the process ("terminate called without an active exception",
    exit -6: once in ten runs of the DDP test), and the next job of a sweep must start without one. Local:
    no collective, so a rank that finished first may already have left."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def follows_rank0(rank: int) -> bool:
    """Whether this process is a DDP rank that rank 0 decides for: one Lightning started (the decision in its
    environment), or one that srun or torchrun started beside rank 0 (the decision in a file of the run
    directory)."""
    return (os.environ.get("LOCAL_RANK", "0") != "0" and FOLLOW_ENV in os.environ) or rank > 0


def relaunched_by_lightning() -> bool:
    """Whether this process is a DDP rank Lightning started for a run (rank 0 checked the command line)."""
    return os.environ.get("LOCAL_RANK", "0") != "0"
