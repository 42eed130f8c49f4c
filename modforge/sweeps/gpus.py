"""``hydra/launcher=gpus``: one node, one job per free GPU slot (Hydra finds it in ``hydra_plugins.modforge_launchers``).

Every job is a fresh ``python -m modforge.train`` process in its own sweep directory, with
``CUDA_VISIBLE_DEVICES`` set to the devices :mod:`modforge.sweeps.slots` gave it
(``trainer.devices=k`` takes k), so no two jobs share a GPU and a finished
job's GPUs go to the next one. A fresh process per job also means a clean CUDA
context, all memory returned, and DDP jobs whose ranks Lightning starts as
usual. Each job's console goes to ``<job dir>/console.log``; the sweep's
console shows one line when a job starts and one when it ends.
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from modforge.config.composition import compose_sweep_job
from modforge.config.grid import labels
from modforge.config.overrides import config_flags, hydra_value
from modforge.errors import ConfigError
from modforge.sweeps.plan import Job, Plan
from modforge.sweeps.slots import SlotError, check_per_device, cpu_threads, devices_needed, pool_devices, schedule
from modforge.run.dirs import claim
from modforge.utils.files import read_json, write_json

# the parent command's hydra overrides that are the sweep's own, not one job's
_SWEEP_ONLY = ("hydra.sweep.", "hydra.mode=", "hydra.run.dir=", "hydra.job.name=", "hydra.output_subdir=",
               "hydra/launcher=", "hydra.launcher.", "hydra/sweeper=", "hydra.sweeper.")


def slot_count(launcher_cfg: Any) -> Optional[int]:
    """How many devices ``hydra/launcher=gpus`` hands out (None for any other launcher); a bad
    ``hydra.launcher.devices`` is one line."""
    if not str(launcher_cfg.get("_target_", "")).endswith("GpuSlotLauncher"):
        return None
    from omegaconf import OmegaConf

    setting = launcher_cfg.get("devices")
    if OmegaConf.is_config(setting):
        setting = OmegaConf.to_container(setting, resolve=True)
    try:
        check_per_device(launcher_cfg.get("jobs_per_device", 1))
        return len(pool_devices(setting, count=_cuda_count))
    except SlotError as e:
        raise ConfigError(str(e)) from None

def check_slots(devices: Any, pool_size: int) -> int:
    """The devices a job takes under ``hydra/launcher=gpus``, or one line when it cannot be placed."""
    try:
        need = devices_needed(devices, pool_size)
    except SlotError as e:
        raise ConfigError(str(e)) from None
    if not 1 <= need <= pool_size:
        raise ConfigError(f"trainer.devices={devices}: the launcher has {pool_size} devices; give between 1 and "
                          f"{pool_size}, or more devices (hydra.launcher.devices)")
    return need

def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPUs
        return 0

class GpuSlotLauncher:
    """``hydra/launcher=gpus`` (see the module's doc). ``devices``: the devices to hand out (null: the visible
    GPUs; a number n: slots 0..n-1; a list: those ids), ``jobs_per_device``: how many jobs may share one device
    at once (1: none share; k: small jobs packed k to a GPU, each CPU job then with 1/k of a slot's cores),
    ``poll_seconds``: how often ended jobs are looked for."""

    def __init__(self, devices: Any = None, poll_seconds: float = 0.5, jobs_per_device: int = 1) -> None:
        self.devices_setting = devices
        self.poll_seconds = float(poll_seconds)
        self.per_device = jobs_per_device
        self.config = self.hydra_context = self.task_function = None
        self.plan: Optional[Plan] = None  # the sweep's plan, handed over by modforge.sweeps.launch.run_sweep

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        from hydra.core.utils import JobReturn, JobStatus, setup_globals
        from omegaconf import OmegaConf

        setup_globals()
        setting = self.devices_setting
        if OmegaConf.is_config(setting):
            setting = OmegaConf.to_container(setting, resolve=True)
        try:
            devices = pool_devices(setting, count=_cuda_count)
            per_device = check_per_device(self.per_device)
        except SlotError as e:
            raise ConfigError(str(e)) from None
        jobs: list = []
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            planned = self.plan.job(num) if self.plan is not None else self.compose(num, overrides)
            try:
                need = check_slots(planned.devices, len(devices))
            except ConfigError as e:
                raise ConfigError(f"job #{num}: {e}") from None
            jobs.append(_Job(num, list(overrides), planned.dir, need, planned.accelerator, self.config))
        for j, label in zip(jobs, labels([j.overrides for j in jobs])):
            j.label = label
        with _interrupt_on_sigterm():
            try:
                schedule([j.need for j in jobs], devices,
                         lambda i, got: jobs[i].start(got, self.command(jobs[i]), len(devices), per_device),
                         self._wait, per_device)
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM to this process: every running job stops, recorded
                stopped = _stop_all([j for j in jobs if j.running()])
                print(f"[modforge] interrupted: {stopped} running jobs stopped (each records 'interrupted')",
                      file=sys.stderr, flush=True)
                raise  # the command (or the study) ends as on Ctrl-C: its summary, 128 + the signal
        returns = []
        for job in jobs:
            metrics = read_json(job.dir / "metrics.json") or {}
            status = JobStatus.COMPLETED if job.returncode == 0 else JobStatus.FAILED
            loss = (metrics.get("val") or {}).get("val/loss")
            value = loss if status == JobStatus.COMPLETED else RuntimeError(
                f"job #{job.num} exited with {job.returncode}")
            returns.append(JobReturn(overrides=job.overrides, cfg=job.cfg, hydra_cfg=job.cfg, working_dir=str(job.dir),
                                     task_name="train", status=status, _return_value=value))
        return returns

    def compose(self, num: int, overrides: list) -> Job:
        """A job's directory and devices where no plan was handed over (a sweeper other than modforge's)."""
        cfg = compose_sweep_job(self.hydra_context.config_loader, self.config, overrides, num)
        return Job(num, list(overrides), Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir), "run",
                   devices=cfg.trainer.get("devices", 1), accelerator=str(cfg.trainer.get("accelerator", "auto")))

    def command(self, job: "_Job") -> list:
        """The job's own command line: the sweep's config flags and hydra settings, the job's overrides, its
        directory as the run directory (the run then resumes or skips there exactly as in the sweep's plan)."""
        hydra_overrides = [o for o in self.config.hydra.overrides.hydra if not o.lstrip("+~").startswith(_SWEEP_ONLY)]
        flags = self.plan.flags if self.plan is not None else config_flags(sys.argv[1:])
        return [sys.executable, "-m", "modforge.train", *flags, *hydra_overrides, *job.overrides,
                f"hydra.run.dir={hydra_value(str(job.dir))}", "hydra.output_subdir=.hydra"]

    def _wait(self, running: list) -> list:
        while True:
            done = [p for p in running if p.handle.poll() is not None]
            if done:
                for p in done:
                    p.handle.finish()
                return done
            time.sleep(self.poll_seconds)

# what a job's process must not inherit from the sweep's: another launch's DDP rendezvous and rank variables
_NOT_INHERITED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                  "LOCAL_WORLD_SIZE")

# a launcher's rank and world (SLURM, torchrun, MPICH/Intel PMI, PMIx, Open MPI's COMM_WORLD): Lightning would take
# the job for one of its ranks. MPI's settings stay (OMPI_MCA_*, PMIX_MCA_*): on the workplace's GPU machines
# OMPI_MCA_plm=isolated and its neighbours are what let mpi4py (imported by Lightning's MPI detection) start a
# singleton; stripped, every job of the first GPU check's sweeps aborted before training
_NOT_INHERITED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PMI_", "PMIX_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE",
                           "OMPI_APP_CTX_")
_INHERITED_PREFIXES = ("OMPI_MCA_", "PMIX_MCA_")

def job_env(base: dict, devices: list, accelerator: str, pool_size: int, per_device: int = 1,
            num: Optional[int] = None) -> dict:
    """A job's environment: the sweep's, without rank and rendezvous variables (so that Lightning starts its own
    DDP ranks on a free port), with ``CUDA_VISIBLE_DEVICES`` = its devices, for a CPU job one slot's share of
    the cores per process (unless ``OMP_NUM_THREADS`` is set), and its number in the sweep (``JOB_NUM_ENV``:
    the job runs as a single run, so Hydra's own job number is not the sweep's)."""
    from modforge.run.callbacks import JOB_NUM_ENV

    env = {k: v for k, v in base.items() if k not in _NOT_INHERITED
           and (not k.startswith(_NOT_INHERITED_PREFIXES) or k.startswith(_INHERITED_PREFIXES))}
    env.update(CUDA_VISIBLE_DEVICES=",".join(devices), PYTHONUNBUFFERED="1")
    if num is not None:
        env[JOB_NUM_ENV] = str(num)
    if accelerator == "cpu" and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = str(cpu_threads(pool_size, per_device=per_device))
    return env

# a console line that says why a process failed: a Python exception, or modforge's one-line refusal
_CAUSE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: |$))")


class _Job:
    def __init__(self, num: int, overrides: list, d: Path, need: int, accelerator: str, cfg: Any):
        self.num, self.overrides, self.dir, self.need, self.accelerator, self.cfg = num, overrides, d, need, \
            accelerator, cfg
        self.process: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.started = 0.0
        self.devices: list = []
        self.label = " ".join(overrides) or "(defaults)"

    def start(self, devices: list, command: list, pool_size: int, per_device: int = 1) -> "_Job":
        self.devices, self.started = devices, time.time()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / "console.log", "ab") as log:  # its own session: signalled as one process group
                self.process = subprocess.Popen(command, env=job_env(dict(os.environ), devices, self.accelerator,
                                                                     pool_size, per_device, self.num),
                                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        except OSError as e:  # this job fails; the others go on
            self.returncode = 1
            self._record_failure(f"the job could not be started: {type(e).__name__}: {e}")
            print(f"[modforge] #{self.num} could not be started: {e}", file=sys.stderr, flush=True)
            return self
        print(f"[modforge] #{self.num} started on device {','.join(devices)}: {self.label}\n"
              f"       log: {self.dir / 'console.log'}", flush=True)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def poll(self) -> Optional[int]:
        if self.process is not None and self.returncode is None:
            self.returncode = self.process.poll()
        return self.returncode

    def finish(self) -> None:
        m = read_json(self.dir / "metrics.json") or {}
        s = read_json(self.dir / "status.json") or {}
        rc = self.returncode
        if rc is not None and rc > 0 and not s and not m:  # failed before it could record why (its own pre-flight)
            self._record_failure(self._last_line() or f"exit {rc}")
            s = read_json(self.dir / "status.json") or {}
        took = f"{time.time() - self.started:.0f} s"
        if rc == 0 and m:
            loss = (m.get("val") or {}).get("val/loss")
            what = f"{m.get('status', 'finished')}, val/loss={loss:.4f}" if isinstance(loss, float) else m.get("status")
        elif rc == 0:
            what = "nothing to do" if not s else s.get("status")
        else:
            why = s.get("error") or (f"killed by signal {-rc}" if rc < 0 else f"exit {rc}; see console.log")
            what = f"{s.get('status', 'failed')}: {why}"
        print(f"[modforge] #{self.num} ended after {took} on device {','.join(self.devices)}: {what}", flush=True)

    def _last_line(self) -> str:
        """Why the job's process failed, from its console: the last exception or ``error:`` line (what a library
        prints at exit after it, an MPI abort notice say, is not the cause), else the last line."""
        try:
            lines = [x.strip() for x in (self.dir / "console.log").read_text(errors="replace").splitlines()
                     if x.strip()]
        except OSError:
            return ""
        cause = [x for x in lines if _CAUSE.match(x)]
        return cause[-1] if cause else (lines[-1] if lines else "")

    def _record_failure(self, error: str) -> None:
        try:  # the directory is this sweep's job's (the launcher made it): marked so, its record is the job's
            if claim(self.dir):
                write_json(self.dir / "status.json", {"status": "failed", "error": error})
        except OSError:
            pass

def _stop_all(jobs: list, grace: float = 60.0) -> int:
    """Ask every job's process group (a DDP job's ranks too) to stop, as Ctrl-C would, at once; after ``grace``
    seconds kill what is left. Returns how many were running."""
    for j in jobs:
        with contextlib.suppress(OSError):
            os.killpg(j.process.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    for j in jobs:
        try:
            j.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(j.process.pid, signal.SIGKILL)
            j.process.wait()
    return len(jobs)

@contextlib.contextmanager
def _interrupt_on_sigterm():
    """SIGTERM to the sweep (a scheduler stopping it) is handled as Ctrl-C: its jobs are stopped, not orphaned."""
    def _raise(signum, frame):
        if callable(previous):  # the command's own handler notes the signal (its exit code is 128 + it)
            previous(signum, frame)
        raise KeyboardInterrupt

    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
