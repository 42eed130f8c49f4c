"""``hydra/launcher=ray`` (pip install 'modforge[ray]'): each job a Ray task asking for ``num_gpus`` = its
``trainer.devices`` when it trains on GPUs (Hydra finds it in ``hydra_plugins.modforge_launchers``)."""
import sys
from pathlib import Path
from typing import Any, Sequence

from modforge.config.grid import labels
from modforge.errors import ConfigError
from modforge.sweeps.clusters import check_launcher_installed, cluster_devices

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
