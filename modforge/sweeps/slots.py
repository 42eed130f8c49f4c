"""GPU slots: which job runs on which devices, so that no two jobs ever share one and none stays idle.

Plain Python (no torch, no Hydra): the decisions of ``hydra/launcher=gpus``
(:mod:`modforge.sweeps.gpus`) are made here and tested on simulated devices.

* :class:`SlotPool` hands out devices: ``take(k)`` gives k distinct devices with room for one more job, the
  least loaded first, then the lowest (or nothing when fewer have room), ``give`` returns them. A device has
  room for ``per_device`` jobs at once (``hydra.launcher.jobs_per_device``; 1 by default: no two jobs share one),
  so small jobs can be packed onto one GPU.
* :func:`schedule` runs jobs that each need some devices: whenever devices are
  free it starts every waiting job that fits, in job order (a job that needs
  more than are free waits, and smaller jobs behind it go first: no device
  stays idle while a waiting job could use it), then waits for any job to end
  and gives its devices to the next.
* :func:`devices_needed` reads a job's ``trainer.devices``; :func:`pool_devices`
  the launcher's ``devices`` setting.
"""
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence


class SlotError(ValueError):
    """A job that cannot be placed, or a device list that cannot be used (one line, naming the key)."""


class SlotPool:
    def __init__(self, devices: Sequence[str], per_device: int = 1):
        if len(set(devices)) != len(devices):
            raise SlotError(f"hydra.launcher.devices={list(devices)}: a device is listed twice")
        check_per_device(per_device)
        self.devices = list(devices)
        self.per_device = per_device
        self.load = {d: 0 for d in self.devices}  # jobs on each device now

    @property
    def free(self) -> list:
        """The devices with room for one more job, in pool order."""
        return [d for d in self.devices if self.load[d] < self.per_device]

    def take(self, k: int) -> Optional[list]:
        """k distinct devices with room, the least loaded first, then in pool order; None when fewer have room.
        Returned in pool order."""
        room = sorted(self.free, key=lambda d: (self.load[d], self.devices.index(d)))
        if k > len(room):
            return None
        taken = sorted(room[:k], key=self.devices.index)
        for d in taken:
            self.load[d] += 1
        return taken

    def give(self, devices: Iterable[str]) -> None:
        back = list(devices)
        if any(d not in self.load or self.load[d] < back.count(d) for d in back):
            raise SlotError(f"devices {back} were not taken from this pool")  # a scheduler bug, never a user's
        for d in back:
            self.load[d] -= 1


def check_per_device(per_device) -> int:
    if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
        raise SlotError(f"hydra.launcher.jobs_per_device={per_device}: a whole number of jobs >= 1 that may share "
                        "one device (1: none share)")
    return per_device


@dataclass
class Placed:
    job: int  # index into the jobs given to schedule()
    devices: list
    handle: Any  # what start() returned


def schedule(needs: Sequence[int], devices: Sequence[str], start: Callable[[int, list], Any],
             wait: Callable[[list], list], per_device: int = 1) -> list:
    """Run job i (needing ``needs[i]`` distinct devices) with ``start(i, devices)``, at most as many at once as the
    devices allow (``per_device`` jobs on each); ``wait(running)`` blocks until one or more of the running
    :class:`Placed` end and returns those. Returns every :class:`Placed`, in the order they ended. A job needing
    more devices than exist is refused before anything starts."""
    pool = SlotPool(devices, per_device)
    too_big = [(i, k) for i, k in enumerate(needs) if k > len(pool.devices) or k < 1]
    if too_big:
        i, k = too_big[0]
        raise SlotError(f"job #{i} needs {k} devices (trainer.devices) and the launcher has "
                        f"{len(pool.devices)} ({', '.join(pool.devices)}): give trainer.devices between 1 and "
                        f"{len(pool.devices)}, or more devices (hydra.launcher.devices)")
    waiting = list(range(len(needs)))
    running: list = []
    ended: list = []
    while waiting or running:
        for i in list(waiting):
            got = pool.take(needs[i])
            if got is not None:
                waiting.remove(i)
                running.append(Placed(i, got, None))
                running[-1].handle = start(i, got)
        if not running:  # unreachable: every job fits an empty pool
            raise SlotError(f"jobs {waiting} cannot be placed on {pool.devices}")
        for p in wait(running):
            running.remove(p)
            pool.give(p.devices)
            ended.append(p)
    return ended


def devices_needed(value: Any, pool_size: int) -> int:
    """How many devices of the pool a job with ``trainer.devices=value`` takes: a count as given; "auto" or
    -1 all of them. A list of device ids is refused: the launcher chooses the devices."""
    if isinstance(value, bool):
        raise SlotError(f"trainer.devices={value}: give a number of devices")
    if value in ("auto", -1, "-1"):
        return pool_size
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    raise SlotError(f"trainer.devices={value}: under hydra/launcher=gpus give a number of devices (e.g. "
                    "trainer.devices=2); the launcher chooses which ones, so that jobs never share a GPU")


def pool_devices(setting: Any, visible: Optional[str] = None, count: Optional[Callable[[], int]] = None) -> list:
    """The devices the launcher hands out, as strings (``CUDA_VISIBLE_DEVICES`` entries):
    ``hydra.launcher.devices`` given as a list (those), a number n (0 .. n-1); null: the GPUs this process
    sees (``CUDA_VISIBLE_DEVICES`` if set, else torch's device count)."""
    if isinstance(setting, (list, tuple)) or (setting is not None and hasattr(setting, "__iter__")
                                              and not isinstance(setting, str)):
        devices = [str(d) for d in setting]
        if not devices:
            raise SlotError("hydra.launcher.devices=[]: give at least one device")
        twice = sorted({d for d in devices if devices.count(d) > 1})
        if twice:
            raise SlotError(f"hydra.launcher.devices=[{','.join(devices)}]: device {twice[0]} is listed twice; each "
                            "device once (hydra.launcher.jobs_per_device=K runs K jobs on each)")
        return devices
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    seen = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    if isinstance(setting, int) and not isinstance(setting, bool):
        if setting < 1:
            raise SlotError(f"hydra.launcher.devices={setting}: give a positive number of devices, or a list")
        if seen and setting > len(seen):
            raise SlotError(f"hydra.launcher.devices={setting}: CUDA_VISIBLE_DEVICES={visible} shows {len(seen)}")
        return seen[:setting] if seen else [str(i) for i in range(setting)]  # the first N this process sees
    if setting is not None:
        raise SlotError(f"hydra.launcher.devices={setting}: a list of device ids, a number, or null (the visible GPUs)")
    if seen:
        return seen
    n = count() if count is not None else 0
    if n < 1:
        raise SlotError("hydra/launcher=gpus: no GPU is visible here; give hydra.launcher.devices=N to run N jobs "
                        "at a time anyway (CPU slots), or use the default launcher")
    return [str(i) for i in range(n)]


def cpu_threads(pool_size: int, cores: Optional[int] = None, per_device: int = 1) -> int:
    """Threads for each process of a CPU job (a DDP job's ranks are one process per slot): one slot's share of
    the cores (at least 1; a slot is one of ``per_device`` places on one of ``pool_size`` devices), so that jobs
    running side by side do not oversubscribe the machine."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // (pool_size * per_device))
