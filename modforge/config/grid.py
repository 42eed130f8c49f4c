"""A sweep's jobs: each of ``hydra.sweeper.cells`` (a union of configurations, in the order listed) crossed
with the grid (``hydra.sweeper.params``, then the command line's comma lists), the grid expanded as Hydra's
basic sweeper expands it, once, by the plan of the sweep (:mod:`modforge.sweeps.planning`)."""
import functools
from typing import Any, Sequence

from omegaconf import OmegaConf

from modforge.errors import ConfigError
from modforge.config.composition import one_line


def cell_overrides(cells: Any) -> list:
    """``hydra.sweeper.cells`` -> one list of ``key=value`` overrides per cell ([[]]: no cells, the grid alone)."""
    if cells is None:
        return [[]]
    if OmegaConf.is_config(cells):
        cells = OmegaConf.to_container(cells)
    if not isinstance(cells, list) or not cells or not all(isinstance(c, dict) and c for c in cells):
        raise ConfigError(f"hydra.sweeper.cells={cells!r}: must be a non-empty list of mappings of overrides, "
                          "e.g. [{ffn: swiglu}, {ffn: mlp, ffn.activation: silu}]")
    return [[f"{k}={_override_value(v)}" for k, v in c.items()] for c in cells]

def _override_value(v: Any) -> str:
    """A cell's value as the override grammar should read it: as written when the grammar reads it (a list, a
    number, a name), else quoted, so that a value holding ``}`` or ``'`` is that string, not a grammar error."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    text = str(v)
    from modforge.config.overrides import quoted

    try:
        read = _parser().parse_override(f"k={text}").value()
    except Exception:  # noqa: BLE001 - hydra's OverrideParseException and the grammar's own errors
        return quoted(text)
    return quoted(text) if isinstance(read, str) and read != text else text  # a string reads back as itself

@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def expand_jobs(cells: Any, params: dict, arguments: list, parse) -> list:
    """Every job's overrides: each cell (in order) crossed with the grid (``params``, then the command line),
    the grid expanded as Hydra's basic sweeper expands it. ``parse`` is an ``OverridesParser.parse_overrides``."""
    grid = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    jobs = []
    for cell in cell_overrides(cells):
        mine = {o.split("=", 1)[0] for o in cell}
        clash = [a for a in grid if a.split("=", 1)[0].lstrip("+~") in mine]
        if clash:
            raise ConfigError(f"{clash[0]}: that key is set by a cell of hydra.sweeper.cells ({' '.join(cell)}); "
                              "set it in every cell, or remove it from the cells")
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        jobs += [list(job) for batch in BasicSweeper.split_arguments(parse(cell + grid), None) for job in batch]
    return jobs


def sweep_jobs(sweep_cfg: Any, arguments: list, parse) -> list[list[str]]:
    """The overrides of each job of a sweep whose own config is ``sweep_cfg``: the command line's ``arguments``
    (its task overrides) and the grid an experiment carries in ``hydra.sweeper.params``, crossed with each of its
    ``hydra.sweeper.cells``. ``parse`` reads a list of overrides (Hydra's parser over the command's loader)."""
    try:
        return expand_jobs(sweep_cfg.hydra.sweeper.get("cells"), sweep_cfg.hydra.sweeper.get("params") or {},
                           list(arguments), parse)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. an interval, which only a sampling sweeper (Optuna) can use
        raise ConfigError(f"the sweep cannot be expanded into jobs: {one_line(e)} (quote a value with "
                          "commas, e.g. 'hydra.sweeper.params.norm=\"layer,rms\"'; intervals need a "
                          "sampling sweeper such as Optuna's)") from None


def labels(job_overrides: Sequence[Sequence[str]]) -> list:
    """Each job's overrides that not every job of the launch shares (what tells it apart), as one string."""
    sets = [set(o) for o in job_overrides]
    shared = set.intersection(*sets) if len(sets) > 1 else set()
    return [" ".join(o for o in overrides if o not in shared) or "(defaults)" for overrides in job_overrides]
