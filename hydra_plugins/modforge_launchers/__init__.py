"""Hydra loads launchers only from ``hydra_plugins``: modforge's (``hydra/launcher=gpus`` and the class behind
``hydra/launcher=ray``); what they do is :mod:`modforge.sweeps.gpus`' and :mod:`modforge.sweeps.ray_jobs`'. Importing this is cheap (no torch, no
Lightning, no Ray), as every Hydra app in the environment imports it."""
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

from modforge.sweeps import gpus, ray_jobs


@dataclass
class GpuSlotLauncherConf:
    _target_: str = "hydra_plugins.modforge_launchers.GpuSlotLauncher"
    devices: Any = None  # null: the visible GPUs; N: slots 0..N-1 (CPU jobs side by side); [ids]: those devices
    poll_seconds: float = 0.5
    jobs_per_device: int = 1  # jobs that may share one device at once: small jobs packed k to a GPU


ConfigStore.instance().store(group="hydra/launcher", name="gpus", node=GpuSlotLauncherConf, provider="modforge")


@dataclass
class RayJobsLauncherConf:
    """``hydra/launcher=ray`` (pip install 'modforge[ray]'): each job a Ray task asking for num_gpus = its
    trainer.devices when it trains on GPUs (0 otherwise); Ray places it and sets CUDA_VISIBLE_DEVICES."""

    _target_: str = "hydra_plugins.modforge_launchers.RayJobsLauncher"
    ray: Any = field(default_factory=lambda: {
        # arguments of ray.init; address null: start a local Ray here; auto or ray://head:10001: join a cluster
        "init": {"address": None, "include_dashboard": False},
        # arguments of ray.remote for every job (num_gpus is set per job); max_calls 1: a fresh worker process
        # per job (clean CUDA state, memory returned)
        "remote": {"num_cpus": 1, "max_calls": 1},
    })


try:  # hydra-ray-launcher stores its own "ray" option: imported first, it is replaced by this one, whatever
    import hydra_plugins.hydra_ray_launcher._config  # noqa: F401 - the order Hydra's plugin scan imports them in
except ImportError:  # not installed: hydra/launcher=ray then says which extra to install
    pass
ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayJobsLauncherConf, provider="modforge")


class GpuSlotLauncher(gpus.GpuSlotLauncher, Launcher):
    """One job per free GPU slot on this node (see :mod:`modforge.sweeps.gpus`)."""


class RayJobsLauncher(ray_jobs.RayJobsLauncher, Launcher):
    """Each job a Ray task with its own ``num_gpus`` (see :mod:`modforge.sweeps.ray_jobs`)."""
