"""The component registry: the single source of truth for every swappable part.

This is the ground floor: it imports nothing else of modforge but its error classes
(:mod:`modforge.errors`, which it re-exports), neither torch nor Lightning, and everything above
registers into it.

A *kind* (``norm``, ``ffn``, ``pos``, ...) is declared once: modforge's own in the ordered table
:data:`~modforge.registry.builtin_kinds.KINDS`, a plugin's with :func:`declare` beside its base class. A
declaration says the kind's doc, its base class (named ``"module:Class"`` in the table, imported when the first
option registers), its default option, whether it is a top-level config group (``norm=rms``) or nested (selected
through another group's key, e.g. ``ffn.activation=silu``), and whether models are built from it. Everything else derives from these
declarations: the config groups and their defaults, the model's parts
(:func:`part_kinds`), ``python -m modforge list``.

A component is a class registered under a short name together with a typed
config (a dataclass with defaults)::

    @register("norm", "scale")
    class ScaleNorm(Norm):
        @dataclass
        class Config:
            eps: float = 1e-5

        def __init__(self, cfg: Config, d_model: int): ...

Registering a component of a top-level kind also tells every watcher (:func:`watch`): the config layer's
mirror (:mod:`modforge.config.store`) stores its config in Hydra's ConfigStore as option ``<name>`` of the
config group ``<kind>`` (the fairseq pattern), so ``norm=scale`` works on the command line with no YAML
file. This module imports neither Hydra nor OmegaConf. Model code never compares variant names: it calls
:func:`build` with the composed config node and the registry decides.

Loading the built-ins and the plugins is not done here but one floor up, in
:mod:`modforge.plugins`, which knows the whole house.
"""
from modforge.errors import (AmbiguousComponentError, ConfigError, DuplicateComponentError,  # noqa: F401
                             ModforgeError, UnknownComponentError)
from modforge.registry.core import (BUILTIN, Entry, Kind, Registry, _EmptyConfig, _qualname,  # noqa: F401
                                    declare, defaults_list, failed_plugins, forget_kind, forget_provider,
                                    group_kinds, kind, kinds, part_kinds, plugin_config_dirs, provider,
                                    record_config_dir, record_failure, register, registry, suggest, watch)
from modforge.registry.builtin_kinds import KINDS  # noqa: F401 - installs modforge's own kinds
from modforge.registry.configs import as_dict, build, get, make_config, resolve  # noqa: F401
