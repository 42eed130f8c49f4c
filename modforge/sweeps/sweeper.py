"""modforge's Hydra sweeper (``hydra/sweeper=modforge``), for a sweep that Hydra's own app starts: with
``--config-path`` (``python -m modforge.train`` runs every other sweep itself, :mod:`modforge.sweeps.launch`).

It does what ``python -m modforge.train -m`` does, through the same functions: the grid of Hydra's basic sweeper
(``hydra.sweeper.params`` and the command line's comma lists) crossed with ``hydra.sweeper.cells`` (a union of
configurations, each a mapping of overrides), each job planned from its directory
(:mod:`modforge.sweeps.planning`), the jobs to run launched, one summary. And the sweep recorded in a sweep
directory, read back to resume it (:func:`sweep_command`).
"""
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper

from modforge.errors import ConfigError
from modforge.run.dirs import CONTROL_KEYS


@dataclass
class ModforgeSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.modforge_sweeper.ModforgeSweeper"  # Hydra loads plugins from there only
    params: Optional[dict] = field(default=None)
    cells: Optional[list] = field(default=None)  # a union of configurations, each {key: value}, crossed with params


ConfigStore.instance().store(group="hydra/sweeper", name="modforge", node=ModforgeSweeperConf, provider="modforge")


class PlannedSweeper(Sweeper):
    """Not a subclass of Hydra's BasicSweeper (Hydra's plugin scan may load that module twice, and its
    ``super(BasicSweeper, self)`` then fails). The grid and cells are read from the sweep's config."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 cells: Optional[list] = None):
        super().__init__()
        self.hydra_context = self.config = self.launcher = self.task_function = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config, self.task_function = hydra_context, config, task_function
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list) -> Any:
        from modforge.sweeps.launch import run_sweep
        from modforge.sweeps.plan import Plan, print_plan
        from modforge.sweeps.planning import plan_sweep

        plan = Plan(True, [], self.config, checked=False)
        try:
            plan_sweep(plan, list(arguments), self.hydra_context.config_loader)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if bool(self.config.get("dry_run", False)):
            print_plan(plan, dry=True)
            return []
        result = run_sweep(plan, self.task_function, self.hydra_context.config_loader, launcher=self.launcher)
        print(result["summary"], file=sys.stderr if result["exit"] else sys.stdout)
        if result["exit"]:
            raise SystemExit(result["exit"])
        return []


def sweep_command(sweep_dir: Path) -> tuple[list, list]:
    """(task overrides, hydra overrides) of the sweep recorded in ``sweep_dir/multirun.yaml``."""
    record = Path(sweep_dir) / "multirun.yaml"
    if not record.is_file():
        raise ConfigError(f"resume={sweep_dir}: no multirun.yaml there, so it is not a sweep directory "
                          "(give the directory a sweep was started in, e.g. multirun/<date>/<time>)")
    from modforge.config.untrusted import check_recorded_override
    from modforge.utils import readers

    saved = readers.yaml_file(record, "resume")  # plain data: nothing in it is resolved or built
    if not isinstance(saved.get("hydra"), dict):
        raise ConfigError(f"resume={record}: not the multirun.yaml of a sweep (no hydra section)")
    overrides = saved["hydra"].get("overrides")
    if not isinstance(overrides, dict) or not all(isinstance(overrides.get(k, []), list) for k in ("task", "hydra")):
        raise ConfigError(f"resume={record}: not the multirun.yaml of a sweep (no hydra.overrides section)")
    for o in [*overrides.get("task", []), *overrides.get("hydra", [])]:
        if not isinstance(o, str):
            raise ConfigError(f"resume={record}: hydra.overrides holds {o!r}, not an override (key=value)")
    task = [o for o in overrides.get("task", []) if o.split("=", 1)[0].lstrip("+~") not in CONTROL_KEYS]
    hydra = [o for o in overrides.get("hydra", []) if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    for o in (*task, *hydra):  # what is replayed: data only
        check_recorded_override(o, f"resume={record}")
    return task, hydra
