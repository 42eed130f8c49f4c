"""The top floor of the registry: load modforge's own components, then the installed plugins.

:mod:`modforge.registry` is the ground floor and knows nothing above it; this
module knows the whole house. Entry points (``train``, ``generate``, ``list``,
:func:`modforge.config.compose`, :func:`modforge.checkpoints.files.load_checkpoint`)
call :func:`load_all` before they compose a config or build a component.

* :func:`load_builtins` imports every module that declares a kind or registers
  a built-in component, attributing the registrations to ``built-in``.
* :func:`load_plugins` imports every ``modforge.plugins`` entry point once. A
  plugin whose import fails gives one warning naming its distribution and the
  error, registers nothing, and everything else keeps working.
"""
import importlib.metadata
import warnings

from modforge import registry

ENTRY_POINT_GROUP = "modforge.plugins"

_builtins_loaded = False
_plugins_loaded = False


def load_builtins() -> None:
    """Declare every kind and register every built-in component (imports torch and Lightning)."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    with registry.provider(registry.BUILTIN):
        # The kinds are declared in registry.KINDS (their order is that table's); these imports register the
        # built-in options of each.
        from modforge.models import architectures  # noqa: F401  model
        from modforge.tasks import base  # noqa: F401  task
        from modforge.data import tokenizers, base as _  # noqa: F401  tokenizer (nested: data.tokenizer), data
        from modforge.components import (norms, residual, ffn, activations, positions, attention,  # noqa: F401
                                         logits, muon, moe, diff_attention, mla)
        from modforge.tasks import classify, lm, seq2seq  # noqa: F401  the tasks
        from modforge.data import classify as _c, lm as _l, parallel, seq2seq as _s, tokens as _t  # noqa: F401  data sets
        from modforge.components import optim  # noqa: F401  optim, scheduler
        from modforge.models import param, umup  # noqa: F401  param (the parametrisations)
    _builtins_loaded = True


def load_plugins() -> dict[str, str]:
    """Import every ``modforge.plugins`` entry point once; returns {distribution: error} for failures."""
    global _plugins_loaded
    if _plugins_loaded:
        return registry.failed_plugins()
    # Built-ins first: a plugin importing e.g. modforge.components.norms inside provider(label)
    # would otherwise register the built-ins under the plugin's name, and a plugin that
    # reuses a built-in name must be recorded as ambiguous, not break load_builtins later.
    load_builtins()
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else ep.value
        try:
            with registry.provider(label):
                obj = ep.load()
                conf = getattr(obj, "MODFORGE_CONFIG_DIR", None)
                if conf:
                    registry.record_config_dir(label, str(conf))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken plugin (even one that exits) must not break the rest
            registry.record_failure(label, f"{type(e).__name__}: {e}")  # nothing half-registered survives
            warnings.warn(f"modforge plugin {label} ({ep.value}) failed to load: {type(e).__name__}: {e}", stacklevel=2)
    return registry.failed_plugins()


def load_all() -> None:
    load_builtins()
    load_plugins()
