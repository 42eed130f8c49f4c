"""What modforge accepts from a file it reads back (a checkpoint's run config, a sweep's recorded command, a study's
kept cells): data, never code.

Two things in a config turn data into actions. Hydra builds an object wherever a mapping holds ``_target_``, at any
depth (recursive instantiation follows nested ``_target_`` into a callback's arguments), and Hydra's own blocklist
stops only the obvious callables (``builtins.open`` truncates any file the user can write). OmegaConf resolves
``${...}`` when a value is read, and resolvers act (``modforge_new_dir`` creates directories). So:

* a file's config carries neither: :func:`refuse_code` names the first ``_target_`` or interpolation, in one line;
* a composed config builds objects only where modforge asks Hydra to, ``callbacks.NAME._target_`` and
  ``logger.NAME._target_`` (each checked to be a Lightning callback or logger class), never nested in their
  arguments nor anywhere else: :func:`check_targets`, run by every validation and again just before building;
* a recorded command line replays only overrides of the run's config and the sweep's own settings:
  :func:`check_recorded_override` (no ``_target_``, no Hydra callbacks, logging, environment or search path).
"""
import os
from pathlib import PurePath
from typing import Any, Iterator, Mapping

from modforge.errors import ConfigError

TARGET = "_target_"
BUILT = ("callbacks", "logger")  # the root keys whose entries modforge instantiates (modforge.run.monitoring)


def _items(node: Any) -> Iterator[tuple[str, Any]]:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):  # unresolved: an interpolation is seen, not followed
            node = OmegaConf.to_container(node, resolve=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(node, Mapping):
        yield from ((str(k), v) for k, v in node.items())
    elif isinstance(node, (list, tuple)):
        yield from ((str(i), v) for i, v in enumerate(node))


def code_in(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(key path, what)`` in ``node`` that would act rather than be read: a ``_target_`` (also a key that
    is not a string, which Hydra may coerce) at any depth, and any ``${...}`` interpolation, key or value."""
    for key, value in _items(node):
        where = f"{path}.{key}" if path else key
        if key == TARGET:
            yield where, f"names an object to build ({TARGET}={value})"
        elif "${" in key:
            yield where, "is an interpolation (${...}), which would be resolved"
        if isinstance(value, str) and "${" in value:
            yield where, f"holds an interpolation ({value[:60]}), which would be resolved"
        elif isinstance(value, (Mapping, list, tuple)) or type(value).__name__ in ("DictConfig", "ListConfig"):
            yield from code_in(value, where)


def refuse_code(node: Any, source: str, what: str = "its run config") -> None:
    """Refuse, in one line naming the key, a config read from a file (``source``: ``resume=<path>``, ...) that
    holds anything but data (:func:`code_in`)."""
    for where, why in code_in(node):
        raise ConfigError(f"{source}: {what} at {where} {why}; modforge builds nothing a file names (components "
                          "are chosen by name through the registry): refused, nothing was run")


def check_targets(cfg: Any) -> None:
    """``_target_`` only where modforge builds: ``callbacks.NAME._target_`` and ``logger.NAME._target_``; one
    nested in their arguments, or under any other key (the ``hydra`` node aside: Hydra's own), is refused."""
    for key, value in _items(cfg):
        if key == "hydra":
            continue
        if key in BUILT:
            for name, entry in _items(value):
                for sub, inner in _items(entry):
                    if sub != TARGET:
                        for where, why in code_in(inner, f"{key}.{name}.{sub}"):
                            if why.startswith("names"):
                                raise ConfigError(
                                    f"{where}: {why}; modforge builds each {key[:-1] if key == 'callbacks' else key}"
                                    f"'s own class ({key}.{name}.{TARGET}) and passes its arguments as data, never "
                                    "an object built from them")
            continue
        for where, why in code_in(value, key):
            if why.startswith("names"):
                raise ConfigError(f"{where}: {why}; modforge builds objects only for callbacks.NAME and logger.NAME "
                                  "(components are chosen by name: norm=rms, not a class path)")


# A recorded command line (a sweep's multirun.yaml, a study's cells) is replayed on resume: only these of Hydra's
# own settings may come back from it (a launcher and its plain settings, the sweep's grid and cells)
RECORDED_HYDRA = ("hydra/launcher", "hydra.launcher.", "hydra.sweeper.params", "hydra.sweeper.cells",
                  "hydra.sweeper.max_batch_size", "hydra.sweep.subdir", "hydra.job.chdir", "hydra.verbose")
RUNS_COMMANDS = ("setup", "env", "env_set", "env_copy", "init", "ray", "python", "executable", "srun_args",
                 "additional_parameters", "submitit_folder", "temp_folder")


def outside(path: str) -> bool:
    """Whether a path meant to lie inside a directory leaves it: absolute, or through '..'."""
    return os.path.isabs(path) or ".." in PurePath(path).parts


def check_recorded_override(override: str, source: str) -> None:
    """One override of a command recorded in a file (``source``), before it is replayed: no ``_target_`` or
    instantiation directive anywhere in it, no interpolation, and of Hydra's settings only :data:`RECORDED_HYDRA`
    (never its callbacks, logging, environment or search path; never a launcher setting that runs commands)."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    bad = None
    if not key or override.startswith("-") or "=" not in override and not override.startswith("~"):
        bad = "is not key=value (a flag or an override without a key)"
    elif TARGET in override or "_args_" in override or "${" in override or "()" in key:
        bad = "names an object to build or an interpolation"
    elif key.startswith("hydra"):
        allowed = any(key == p or (p.endswith(".") and key.startswith(p)) for p in RECORDED_HYDRA)
        tail = key.split(".")[2:] if key.startswith("hydra.launcher.") else []
        if not allowed or any(part in RUNS_COMMANDS for part in tail):
            bad = "sets a Hydra setting a replayed record may not (only the launcher's plain settings and the grid)"
        elif key == "hydra.sweep.subdir" and outside(value.strip("'\"")):
            bad = "puts the jobs outside the sweep's directory (an absolute path or one through '..')"
    if bad:
        raise ConfigError(f"{source}: the recorded override {override[:120]} {bad}; a record is replayed as data "
                          "only: refused, nothing was run. Start it again with your own command line")
