"""Launchers for sweeps on GPUs and clusters; Hydra finds them in ``hydra_plugins.modforge_launchers``.

* ``hydra/launcher=gpus``: one node, one job per free GPU slot. Every job is a
  fresh ``python -m modforge.train`` process in its own sweep directory, with
  ``CUDA_VISIBLE_DEVICES`` set to the devices :mod:`modforge.slots` gave it
  (``trainer.devices=k`` takes k), so no two jobs share a GPU and a finished
  job's GPUs go to the next one. A fresh process per job also means a clean CUDA
  context, all memory returned, and DDP jobs whose ranks Lightning starts as
  usual. Each job's console goes to ``<job dir>/console.log``; the sweep's
  console shows one line when a job starts and one when it ends.
* ``hydra/launcher=ray``: each job a Ray task (hydra-ray-launcher's machinery)
  asking for ``num_gpus`` = its ``trainer.devices`` when it trains on GPUs.
* ``hydra/launcher=slurm`` is hydra-submitit-launcher's with modforge's settings
  (``conf/hydra/launcher/slurm.yaml``); the DDP ranks srun (or torchrun) starts
  beside rank 0 follow its resume decision, written to ``.rank0.json``.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from modforge.io import read_json, write_json
from modforge.registry import ConfigError
from modforge.slots import SlotError, cpu_threads, devices_needed, pool_devices, schedule

_STARTED = time.time()  # this process's start (imported early): a rank follows no decision written before it

# hydra/launcher options that need an extra installed: option -> (module it needs, extra)
EXTRAS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "slurm_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "ray": ("hydra_plugins.hydra_ray_launcher", "ray"),
          "joblib": ("hydra_plugins.hydra_joblib_launcher", "sweep")}

# the parent command's hydra overrides that are the sweep's own, not one job's
_SWEEP_ONLY = ("hydra.sweep.", "hydra.mode=", "hydra.run.dir=", "hydra.job.name=", "hydra.output_subdir=",
               "hydra/launcher=", "hydra.launcher.", "hydra/sweeper=", "hydra.sweeper.")


_HYDRA_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
_NOT_FOR_RANKS = ("hydra.sweep.", "hydra.mode=", "hydra.run.dir=", "hydra.job.name=", "hydra.output_subdir=")


def job_argv(argv: list, hc: Any) -> list:
    """The command line of one sweep job: Hydra's config flags and hydra.* overrides kept, the sweep replaced
    by the job's own overrides, ``-m`` and the sweep/run directories dropped (Lightning adds the run dir)."""
    flags, rest = [], iter(argv[1:])
    for a in rest:
        if a in _HYDRA_VALUE_FLAGS:
            flags += [a, next(rest, "")]
        elif a.split("=", 1)[0] in _HYDRA_VALUE_FLAGS:
            flags.append(a)
    hydra_overrides = [o for o in hc.overrides.hydra if not o.lstrip("+~").startswith(_NOT_FOR_RANKS)]
    return [argv[0], *flags, *hydra_overrides, *hc.overrides.task]


def hydra_value(value: str) -> str:
    """``value`` as one Hydra override value (quoted when it holds characters the override grammar reads)."""
    import re

    if re.fullmatch(r"[A-Za-z0-9_./@%+:-]+", value):
        return value
    # in a quoted value Hydra reads a backslash as an escape only before a quote or at the end: only those double
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


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


ELSEWHERE = ("slurm", "submitit_slurm", "ray")  # launchers whose jobs run on other machines


def runs_elsewhere(argv: Sequence[str]) -> bool:
    """Whether the command's launcher runs its jobs on other machines (whose devices this one cannot check)."""
    return any(a.lstrip("+~").partition("=")[::2] in [("hydra/launcher", o) for o in ELSEWHERE] for a in argv)


def check_launcher_installed(argv: Sequence[str]) -> None:
    """One line naming the extra to install when ``hydra/launcher=X`` needs a package that is missing."""
    import importlib.util

    for a in argv:
        key, _, value = a.lstrip("+~").partition("=")
        if key == "hydra/launcher" and value in EXTRAS:
            module, extra = EXTRAS[value]
            if importlib.util.find_spec(module) is None:
                raise ConfigError(f"hydra/launcher={value} needs the '{extra}' extra: pip install 'modforge[{extra}]'")


class GpuSlotLauncher:
    """``hydra/launcher=gpus`` (see the module's doc). ``devices``: the devices to hand out (null: the visible
    GPUs; a number n: slots 0..n-1; a list: those ids), ``poll_seconds``: how often ended jobs are looked for."""

    def __init__(self, devices: Any = None, poll_seconds: float = 0.5) -> None:
        self.devices_setting = devices
        self.poll_seconds = float(poll_seconds)
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        from hydra.core.utils import JobReturn, JobStatus, setup_globals
        from omegaconf import OmegaConf, open_dict

        setup_globals()
        setting = self.devices_setting
        if OmegaConf.is_config(setting):
            setting = OmegaConf.to_container(setting, resolve=True)
        try:
            devices = pool_devices(setting, count=_cuda_count)
        except SlotError as e:
            raise ConfigError(str(e)) from None
        jobs: list = []
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.num = num
                cfg.hydra.job.id = f"job_{num}"
            try:
                need = check_slots(cfg.trainer.get("devices", 1), len(devices))
            except ConfigError as e:
                raise ConfigError(f"job #{num}: {e}") from None
            jobs.append(_Job(num, list(overrides), Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir),
                             need, str(cfg.trainer.get("accelerator", "auto")), cfg))
        for j, label in zip(jobs, labels([j.overrides for j in jobs])):
            j.label = label
        with _interrupt_on_sigterm():
            try:
                schedule([j.need for j in jobs], devices,
                         lambda i, got: jobs[i].start(got, self.command(jobs[i]), len(devices)), self._wait)
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM to this process: every running job stops, recorded
                stopped = _stop_all([j for j in jobs if j.running()])
                print(f"[modforge] interrupted: {stopped} running jobs stopped (each records 'interrupted'); "
                      f"resume with: python -m modforge.train -m resume={self.config.hydra.sweep.dir}",
                      file=sys.stderr, flush=True)
                raise SystemExit(130) from None
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

    def command(self, job: "_Job") -> list:
        """The job's own command line: the sweep's config flags and hydra settings, the job's overrides, its
        directory as the run directory (the run then resumes or skips there exactly as in the sweep's plan)."""
        hydra_overrides = [o for o in self.config.hydra.overrides.hydra if not o.lstrip("+~").startswith(_SWEEP_ONLY)]
        hc = {"overrides": {"hydra": hydra_overrides, "task": list(job.overrides)}}
        from omegaconf import OmegaConf

        argv = job_argv(sys.argv, OmegaConf.create(hc))
        return [sys.executable, "-m", "modforge.train", *argv[1:], f"hydra.run.dir={hydra_value(str(job.dir))}",
                "hydra.output_subdir=.hydra"]

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
_NOT_INHERITED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PMI_", "OMPI_")


def job_env(base: dict, devices: list, accelerator: str, pool_size: int) -> dict:
    """A job's environment: the sweep's, without rank and rendezvous variables (so that Lightning starts its own
    DDP ranks on a free port), with ``CUDA_VISIBLE_DEVICES`` = its devices, and for a CPU job one slot's share of
    the cores per process (unless ``OMP_NUM_THREADS`` is set)."""
    env = {k: v for k, v in base.items() if k not in _NOT_INHERITED and not k.startswith(_NOT_INHERITED_PREFIXES)}
    env.update(CUDA_VISIBLE_DEVICES=",".join(devices), PYTHONUNBUFFERED="1")
    if accelerator == "cpu" and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = str(cpu_threads(pool_size))
    return env


class _Job:
    def __init__(self, num: int, overrides: list, d: Path, need: int, accelerator: str, cfg: Any):
        self.num, self.overrides, self.dir, self.need, self.accelerator, self.cfg = num, overrides, d, need, \
            accelerator, cfg
        self.process: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.started = 0.0
        self.devices: list = []
        self.label = " ".join(overrides) or "(defaults)"

    def start(self, devices: list, command: list, pool_size: int) -> "_Job":
        self.devices, self.started = devices, time.time()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / "console.log", "ab") as log:  # its own session: signalled as one process group
                self.process = subprocess.Popen(command, env=job_env(dict(os.environ), devices, self.accelerator,
                                                                     pool_size),
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
        try:
            lines = [x for x in (self.dir / "console.log").read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def _record_failure(self, error: str) -> None:
        from modforge.io import write_json

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
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
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- DDP ranks started by srun or torchrun

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


def labels(job_overrides: Sequence[Sequence[str]]) -> list:
    """Each job's overrides that not every job of the launch shares (what tells it apart), as one string."""
    sets = [set(o) for o in job_overrides]
    shared = set.intersection(*sets) if len(sets) > 1 else set()
    return [" ".join(o for o in overrides if o not in shared) or "(defaults)" for overrides in job_overrides]


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPUs
        return 0


class RayJobsLauncher:
    """``hydra/launcher=ray``: hydra-ray-launcher's job runner, with each job's Ray resources from its own
    config: ``num_gpus`` = ``trainer.devices`` for a job that trains on GPUs (0 otherwise), on top of
    ``ray.remote`` (e.g. ``num_cpus``, ``max_calls``); ``ray.init`` as hydra-ray-launcher's (``address``:
    null starts a local Ray, ``auto`` or ``ray://host:10001`` joins a running cluster)."""

    def __init__(self, ray: Any) -> None:
        self.ray_cfg = ray
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        check_launcher_installed(["hydra/launcher=ray"])
        import ray
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals
        from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray
        from omegaconf import OmegaConf, open_dict

        setup_globals()
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        start_ray(self.ray_cfg.init)
        runs = []
        for (i, overrides), label in zip(enumerate(job_overrides), labels(job_overrides)):
            num = initial_job_idx + i
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = f"job_id_for_{num}"
                cfg.hydra.job.num = num
            remote = OmegaConf.to_container(self.ray_cfg.remote, resolve=True) or {}
            trainer = cfg.get("trainer")
            if trainer is not None:  # a modforge run (another Hydra app keeps ray.remote as given)
                remote["num_gpus"] = ray_gpus(trainer.get("accelerator", "auto"), trainer.get("devices", 1))
            print(f"[modforge] #{num} to Ray ({remote.get('num_gpus', 0)} GPUs): {label}", flush=True)
            runs.append((num, overrides, cfg, launch_job_on_ray(self.hydra_context, OmegaConf.create(remote), cfg,
                                                                self.task_function, Singleton.get_state())))
        out = []
        for num, overrides, cfg, ref in runs:  # a worker that died ends its own job, not the others'
            try:
                out.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - e.g. ray's WorkerCrashedError, OutOfMemoryError
                from hydra.core.utils import JobReturn, JobStatus

                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                print(f"[modforge] #{num} lost on Ray: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
                out.append(JobReturn(overrides=list(overrides), cfg=cfg, hydra_cfg=cfg, task_name="train",
                                     status=JobStatus.FAILED, _return_value=e))
        return out


def cluster_devices(devices: Any, launcher: str) -> int:
    """``trainer.devices`` as the count a cluster job asks for: a number >= 1 (the job runs elsewhere, so "auto"
    cannot be resolved here)."""
    try:
        n = devices_needed(devices, 0)
    except SlotError:
        n = 0
    if n < 1:
        raise ConfigError(f"trainer.devices={devices}: under hydra/launcher={launcher} give a number of devices "
                          f"per job, e.g. trainer.devices=1 (the job runs elsewhere: 'auto' cannot be resolved here)")
    return n


def ray_gpus(accelerator: Any, devices: Any) -> int:
    """A job's ``num_gpus`` for Ray: 1 for a GPU job (0 otherwise). A job of several devices is refused: its
    DDP ranks would be started from the Ray worker's command line, which is not this job's."""
    if str(accelerator) not in ("gpu", "cuda"):
        return 0
    n = cluster_devices(devices, "ray")
    if n > 1:
        raise ConfigError(f"trainer.devices={devices}: a Ray job trains on one device; run DDP jobs with "
                          "hydra/launcher=gpus (one node) or hydra/launcher=slurm")
    return n


def job_gpus(accelerator: Any, devices: Any) -> int:
    """``${modforge_gpus:${trainer.accelerator},${trainer.devices}}``: the GPUs per node a SLURM job asks for."""
    return cluster_devices(devices, "slurm") if str(accelerator) in ("gpu", "cuda") else 0


def job_tasks(devices: Any) -> int:
    """``${modforge_tasks:${trainer.devices}}``: SLURM tasks per node, one per device (each task one DDP rank,
    started by srun: Lightning's SLURM environment then starts no processes of its own)."""
    return cluster_devices(devices, "slurm")


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("modforge_gpus", job_gpus, replace=True)
    OmegaConf.register_new_resolver("modforge_tasks", job_tasks, replace=True)
