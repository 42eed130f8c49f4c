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
  (``conf/hydra/launcher/slurm.yaml``): no code here.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from modforge.registry import ConfigError
from modforge.slots import SlotError, cpu_threads, devices_needed, pool_devices, schedule

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
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
        jobs: list = []
        try:
            devices = pool_devices(setting, count=_cuda_count)
            for i, overrides in enumerate(job_overrides):
                num = initial_job_idx + i
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                with open_dict(cfg):
                    cfg.hydra.job.num = num
                    cfg.hydra.job.id = f"job_{num}"
                try:
                    need = devices_needed(cfg.trainer.get("devices", 1), len(devices))
                except SlotError as e:
                    raise SlotError(f"job #{num}: {e}") from None
                jobs.append(_Job(num, list(overrides), Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir),
                                 need, str(cfg.trainer.get("accelerator", "auto")), cfg))
            for j, label in zip(jobs, labels([j.overrides for j in jobs])):
                j.label = label
            ended = schedule([j.need for j in jobs], devices,
                             lambda i, got: jobs[i].start(got, self.command(jobs[i]), len(devices)), self._wait)
        except SlotError as e:
            raise ConfigError(str(e)) from None
        except BaseException:
            for j in jobs:  # Ctrl-C or SIGTERM: the running jobs are asked to stop (they record "interrupted")
                j.stop()
            raise
        returns = []
        for p in sorted(ended, key=lambda p: p.job):
            job = jobs[p.job]
            metrics = _read_json(job.dir / "metrics.json")
            status = JobStatus.COMPLETED if job.process.returncode == 0 else JobStatus.FAILED
            loss = (metrics.get("val") or {}).get("val/loss")
            value = loss if status == JobStatus.COMPLETED else RuntimeError(
                f"job #{job.num} exited with {job.process.returncode}")
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


class _Job:
    def __init__(self, num: int, overrides: list, d: Path, need: int, accelerator: str, cfg: Any):
        self.num, self.overrides, self.dir, self.need, self.accelerator, self.cfg = num, overrides, d, need, \
            accelerator, cfg
        self.process: Optional[subprocess.Popen] = None
        self.started = 0.0
        self.devices: list = []
        self.label = " ".join(overrides) or "(defaults)"

    def start(self, devices: list, command: list, pool_size: int) -> "_Job":
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(devices), PYTHONUNBUFFERED="1")
        if self.accelerator == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(cpu_threads(self.need, pool_size))
        self.devices, self.started = devices, time.time()
        with open(self.dir / "console.log", "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        print(f"[modforge] #{self.num} started on device {','.join(devices)}: {self.label}\n"
              f"       log: {self.dir / 'console.log'}", flush=True)
        return self

    def poll(self) -> Optional[int]:
        return self.process.poll() if self.process is not None else 0

    def finish(self) -> None:
        m = _read_json(self.dir / "metrics.json")
        s = _read_json(self.dir / "status.json")
        rc = self.process.returncode
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

    def stop(self, grace: float = 60.0) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


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


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


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
            remote["num_gpus"] = ray_gpus(cfg.trainer.get("accelerator", "auto"), cfg.trainer.get("devices", 1))
            print(f"[modforge] #{num} to Ray ({remote['num_gpus']} GPUs): {label}", flush=True)
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


def ray_gpus(accelerator: Any, devices: Any) -> int:
    """A job's ``num_gpus`` for Ray: its ``trainer.devices`` when it trains on GPUs, else 0."""
    if str(accelerator) not in ("gpu", "cuda"):
        return 0
    try:
        return devices_needed(devices, 1 if devices in ("auto", -1, "-1") else int(devices))
    except (SlotError, TypeError, ValueError):
        raise ConfigError(f"trainer.devices={devices}: under hydra/launcher=ray give a number of GPUs") from None


def job_gpus(accelerator: Any, devices: Any) -> int:
    """``${modforge_gpus:${trainer.accelerator},${trainer.devices}}``: the GPUs per node a cluster job asks for."""
    return ray_gpus(accelerator, devices)


def job_tasks(devices: Any) -> int:
    """``${modforge_tasks:${trainer.devices}}``: SLURM tasks per node, one per device (each task one DDP rank,
    started by srun: Lightning's SLURM environment then starts no processes of its own)."""
    try:
        return devices_needed(devices, 0)
    except SlotError:
        raise ConfigError(f"trainer.devices={devices}: under hydra/launcher=slurm give a number of devices per "
                          "node (SLURM starts one task per device)") from None


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("modforge_gpus", job_gpus, replace=True)
    OmegaConf.register_new_resolver("modforge_tasks", job_tasks, replace=True)
