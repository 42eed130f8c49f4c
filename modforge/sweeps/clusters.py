"""What sweeps on clusters need to know before they start: which launchers need an extra installed, which
run their jobs on other machines (whose devices cannot be checked here), and the resources a SLURM job asks for
(``${modforge_gpus:...}``, ``${modforge_tasks:...}`` in ``conf/hydra/launcher/slurm.yaml``, registered when this
module is imported). ``hydra/launcher=slurm`` is hydra-submitit-launcher's with modforge's settings; the DDP ranks
srun (or torchrun) starts beside rank 0 follow its decision (:mod:`modforge.run.ranks`)."""
from typing import Any, Sequence

from omegaconf import OmegaConf

from modforge.errors import ConfigError
from modforge.sweeps.slots import SlotError, devices_needed

# hydra/launcher options that need an extra installed: option -> (module it needs, extra)
EXTRAS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "slurm_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
          "ray": ("hydra_plugins.hydra_ray_launcher", "ray"),
          "joblib": ("hydra_plugins.hydra_joblib_launcher", "sweep")}

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

def job_gpus(accelerator: Any, devices: Any) -> int:
    """``${modforge_gpus:${trainer.accelerator},${trainer.devices}}``: the GPUs per node a SLURM job asks for."""
    return cluster_devices(devices, "slurm") if str(accelerator) in ("gpu", "cuda") else 0

def job_tasks(devices: Any) -> int:
    """``${modforge_tasks:${trainer.devices}}``: SLURM tasks per node, one per device (each task one DDP rank,
    started by srun: Lightning's SLURM environment then starts no processes of its own)."""
    return cluster_devices(devices, "slurm")


OmegaConf.register_new_resolver("modforge_gpus", job_gpus, replace=True)
OmegaConf.register_new_resolver("modforge_tasks", job_tasks, replace=True)
