"""One job of a sweep, inside Hydra's multirun: its own command line for the DDP ranks Lightning starts, and
a failure that stays the job's (recorded in its ``status.json``, one line on the console; the sweep goes on)."""
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from omegaconf import DictConfig

from modforge.config.overrides import job_argv
from modforge.errors import ModforgeError
from modforge.run.dirs import failure_recorded
from modforge.run.story import run


def sweep_task(checked: bool, started: Optional[float] = None, run_dirs: Optional[list] = None) -> Callable:
    """The task function of a sweep's jobs (Hydra's: a job's config -> its val/loss, or None): each job run by
    :func:`sweep_job_outcome`; ``started``: the command's clock, for the jobs that run in the command's own process
    (a launcher's worker, a cluster node: its own start); ``run_dirs`` gets each job's directory."""
    pid = os.getpid()

    def task(cfg: DictConfig) -> Optional[float]:
        from hydra.core.hydra_config import HydraConfig

        out_dir = Path(HydraConfig.get().runtime.output_dir)
        if run_dirs is not None:
            run_dirs.append(out_dir)
        with sweep_job():
            m = sweep_job_outcome(cfg, out_dir, checked=checked, started=started if os.getpid() == pid else None)
        return final_loss(m)

    return task


def final_loss(m: Optional[dict]) -> Optional[float]:
    """A run's final val/loss for Hydra's sweepers (None when it has none, or not a finite one)."""
    loss = (m or {}).get("val", {}).get("val/loss")
    return loss if loss is not None and math.isfinite(loss) else None


@contextlib.contextmanager
def sweep_job():
    """Let a multirun job use DDP: Lightning's relaunch must run this job only, and the next job start clean.

    Lightning starts ranks 1..N-1 as ``python -m modforge.train <sys.argv[1:]>
    hydra.run.dir=<HydraConfig run.dir>`` (Lightning issues #11300, #2727).
    Inside a multirun, sys.argv still holds ``-m`` and the whole sweep and
    ``run.dir`` is not the job's directory, so each rank would start the sweep
    over elsewhere: here sys.argv becomes this job's command line (``job_argv``)
    and ``run.dir`` its directory. Afterwards the environment variables Lightning set
    (LOCAL_RANK, WORLD_SIZE, MASTER_PORT ...) are removed (the run has left its
    process group); otherwise the next job would believe its ranks already exist.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        yield
        return
    argv, env = list(sys.argv), dict(os.environ)
    sys.argv = job_argv(argv, hc)
    with read_write(hc.run):
        hc.run.dir = hc.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(env)

def sweep_job_outcome(cfg: DictConfig, out_dir: Path, checked: bool = False,
                      started: Optional[float] = None) -> Optional[dict]:
    """One job of a sweep: its failure is recorded and reported in one line, and the sweep goes on (Hydra's
    launchers stop at a SystemExit, Hydra #2551); an interruption (Ctrl-C, SIGTERM) stops the sweep too."""
    from hydra.core.hydra_config import HydraConfig

    try:
        with failure_recorded(out_dir):
            return run(cfg, out_dir, checked=checked, started=started)
    except Exception as e:  # noqa: BLE001 - recorded in the job's status.json, counted in the sweep's summary
        where = "" if isinstance(e, ModforgeError) else f" (traceback in {out_dir / 'status.json'})"
        first = (str(e).splitlines() or [""])[0]
        print(f"[modforge] job #{HydraConfig.get().job.num} failed: {type(e).__name__}: {first}{where}",
              file=sys.stderr)
        return None
