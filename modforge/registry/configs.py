"""An option's typed config from a name or a mapping (values checked against the config's field types), and the
option built from it."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from modforge.errors import ConfigError
from modforge.registry.core import Entry, registry, suggest


def get(kind: str, name: str) -> Entry:
    return registry(kind).get(name)


def make_config(kind: str, cfg: Any) -> tuple[Entry, Any]:
    """Resolve ``cfg`` (a name, a mapping with ``name``, a DictConfig or a config
    instance) to its registry entry and a typed config instance."""
    if isinstance(cfg, str):
        name, params = cfg, {}
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        name = getattr(cfg, "name", None)
        if name is None:  # a bare Config instance: find its entry by config class
            matches = [e for e in registry(kind).entries() if isinstance(cfg, e.config)]
            if len(matches) != 1:
                raise ConfigError(f"cannot tell which {kind} a {type(cfg).__name__} instance configures")
            return matches[0], cfg
        params = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "name"}
    else:
        params = _to_dict(cfg)
        params.pop("defaults", None)
        name = params.pop("name", None)
        if name is None:
            raise ConfigError(f"{kind} config has no 'name' key (got keys {sorted(params)})")
    entry = get(kind, name)
    allowed = [f.name for f in dataclasses.fields(entry.config)]
    for key in params:
        if key not in allowed:
            raise ConfigError(
                f"{kind}.{key}: unknown key for {kind} '{name}'.{suggest(key, allowed)} "
                f"Allowed keys: {', '.join(allowed) or 'none'}."
            )
    wrong = _not_a_number(entry, params)
    if wrong:
        raise ConfigError(f"{kind} '{name}': {kind}.{wrong}")
    try:
        inst = entry.config(**params)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{kind} '{name}': {e}") from None
    return entry, inst


_NUMBERS = {int: "a whole number", float: "a number", bool: "true or false"}


def _not_a_number(entry: Entry, params: dict) -> Optional[str]:
    """``key=value: must be ...`` for the first value given to a number or switch field (int, float, bool) that
    is not one; None when each fits. A checkpoint's config is read without Hydra's typing: a string there would
    reach the config's own checks, which compare numbers."""
    import numbers

    try:
        hints = typing.get_type_hints(entry.config)
    except Exception:  # noqa: BLE001 - a plugin's annotation that does not resolve: its own checks decide
        return None
    fits = {int: lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
            float: lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
            bool: lambda v: isinstance(v, numbers.Integral)}
    for key, value in params.items():
        hint = hints.get(key)
        types = [t for t in (typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,))
                 if t is not type(None)]
        if value is None or not types or not all(t in _NUMBERS for t in types) or any(fits[t](value) for t in types):
            continue
        return f"{key}={value!r}: must be {' or '.join(_NUMBERS[t] for t in types)}"
    return None


def as_dict(cfg: Any) -> dict:
    """A component's config (a name, a mapping or a DictConfig) as a plain dict with its ``name``."""
    return {"name": cfg} if isinstance(cfg, str) else _to_dict(cfg)


def _to_dict(cfg: Any) -> dict:
    if isinstance(cfg, Mapping):  # a dict, or a composed config node (OmegaConf's DictConfig is a Mapping)
        return {k: _plain(cfg[k]) for k in cfg}
    raise ConfigError(f"expected a component name or a mapping, got {type(cfg).__name__}: {cfg!r}")


def _plain(v: Any) -> Any:
    """Nested mappings and sequences as dicts and lists (a config node's values read, so resolved)."""
    if isinstance(v, Mapping):
        return {k: _plain(v[k]) for k in v}
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return [_plain(x) for x in v]
    return v


def build(kind: str, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """Build a fresh component: ``cls(config, *args, **kwargs)``."""
    entry, inst = make_config(kind, cfg)
    return entry.cls(inst, *args, **kwargs)


def resolve(kind: str, cfg: Any) -> Any:
    """The registered class for ``cfg`` (for class-level properties, e.g. a residual's final norm)."""
    return make_config(kind, cfg)[0].cls
