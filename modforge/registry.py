"""The component registry: the single source of truth for every swappable part.

This is the ground floor: it imports nothing else of modforge but its error classes
(:mod:`modforge.errors`, which it re-exports), neither torch nor Lightning, and everything above
registers into it.

A *kind* (``norm``, ``ffn``, ``pos``, ...) is declared once: modforge's own in the ordered table
:data:`KINDS` below, a plugin's with :func:`declare` beside its base class. A declaration says the kind's doc,
its base class (named ``"module:Class"`` in the table, imported when the first option registers), its default
option, whether it is a top-level config group (``norm=rms``) or nested (selected through another group's key,
e.g. ``ffn.activation=silu``), and whether models are built from it. Everything else derives from these
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
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from modforge.errors import (AmbiguousComponentError, ConfigError, DuplicateComponentError,  # noqa: F401
                             ModforgeError, UnknownComponentError)

BUILTIN = "built-in"


@dataclass
class Entry:
    """One registered component."""

    kind: str
    name: str
    cls: Any
    config: type
    provider: str
    defaults: dict = field(default_factory=dict)  # other groups this option selects
    doc: str = ""

    def default_params(self) -> dict:
        return {f.name: _field_default(f) for f in dataclasses.fields(self.config)}


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "???"


@dataclass
class _EmptyConfig:
    pass


def suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(str(name), options, n=3, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


@dataclass
class Kind:
    """The declaration of one kind of component (see :func:`declare`)."""

    name: str
    doc: str
    base: Any = None  # every component must subclass it: a class, or "module:Class" (None: any callable)
    default: Optional[str] = None  # the option chosen when the config names none (None: chosen by another group)
    nested_in: Optional[str] = None  # e.g. "ffn.activation": selected through that key, not a top-level group
    part: bool = False  # models are built from it (a field of models.blocks.Parts)
    provider: str = BUILTIN  # who declared it (a plugin's kinds go when the plugin fails to load)

    @property
    def top_level(self) -> bool:
        return self.nested_in is None

    @property
    def base_name(self) -> Optional[str]:
        """``module.Class`` of the base class, without importing it."""
        if isinstance(self.base, str):
            return self.base.replace(":", ".")
        return f"{self.base.__module__}.{self.base.__qualname__}" if self.base is not None else None


class Registry:
    """All components of one kind."""

    def __init__(self, kind: Kind):
        self.decl = kind
        self.kind = kind.name
        self._entries: dict[str, list[Entry]] = {}

    @property
    def base(self) -> Optional[type]:
        """The base class (a table's "module:Class" imported when first asked: by the first registration, from
        the module that defines it, so it is there)."""
        if isinstance(self.decl.base, str):
            import importlib

            module, _, name = self.decl.base.partition(":")
            return getattr(importlib.import_module(module), name)
        return self.decl.base

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [e for n in self.names() for e in self._entries[n]]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def add(self, entry: Entry, *, allow_ambiguous: bool) -> None:
        if self.base is not None and not (isinstance(entry.cls, type) and issubclass(entry.cls, self.base)):
            what = entry.cls.__name__ if isinstance(entry.cls, type) else repr(entry.cls)
            raise ModforgeError(
                f"{self.kind} '{entry.name}' ({entry.provider}): {what} must subclass "
                f"{self.base.__module__}.{self.base.__name__} (the contract of every {self.kind})"
            )
        existing = self._entries.get(entry.name, [])
        for old in existing:
            if old.cls is entry.cls:  # re-import of the same class: idempotent
                return
        if existing and not allow_ambiguous:
            raise DuplicateComponentError(
                f"{self.kind} '{entry.name}' is registered twice: by {existing[0].provider} "
                f"({_qualname(existing[0].cls)}) and by {entry.provider} ({_qualname(entry.cls)}). "
                "Pick another name."
            )
        self._entries.setdefault(entry.name, []).append(entry)

    def get(self, name: str) -> Entry:
        entries = self._entries.get(name)
        if not entries:
            avail = ", ".join(f"{n} ({self._entries[n][0].provider})" for n in self.names()) or "none"
            msg = f"Unknown {self.kind} '{name}'.{suggest(name, self.names())} Available {self.kind} options: {avail}."
            broken = failed_plugins()
            if broken:
                msg += " Plugins that failed to load (the name may come from one of them): " + "; ".join(
                    f"{d}: {e}" for d, e in broken.items()
                )
            raise UnknownComponentError(msg)
        if len(entries) > 1:
            provs = " and ".join(f"{e.provider} ({_qualname(e.cls)})" for e in entries)
            raise AmbiguousComponentError(
                f"{self.kind} '{name}' is ambiguous: it is provided by {provs}. "
                "Uninstall one of the packages or ask its author to rename the component."
            )
        return entries[0]


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


_REGISTRIES: dict[str, Registry] = {}

# modforge's own kinds, in their order (of the config groups and their defaults, `python -m modforge list`,
# config.yaml and metrics.json): declared here as data, so that no order of imports decides it; each base class
# lives with the kind's options and is named, not imported (this floor imports nothing above it)
KINDS = (
    Kind("model", "architecture (and, through it, its default task)", "modforge.models.architectures:Model",
         default="decoder_only"),
    Kind("task", "training objective (a LightningModule) and its default data (chosen by the model unless given)",
         "modforge.tasks.base:Task"),
    Kind("tokenizer", "text <-> token ids", "modforge.data.tokenizers.base:Tokenizer", nested_in="data.tokenizer"),
    Kind("data", "dataset / datamodule (chosen by the task unless given)", "modforge.data.base:DataModule"),
    Kind("norm", "normalisation layer (called as norm(x, mask))", "modforge.components.norms:Norm", default="layer",
         part=True),
    Kind("residual", "where the norm sits around each sub-layer", "modforge.components.residual:Residual",
         default="pre", part=True),
    Kind("ffn", "position-wise feed-forward block", "modforge.components.ffn:FFN", default="gelu", part=True),
    Kind("activation", "element-wise non-linearity used by FFNs", "modforge.components.activations:Activation",
         nested_in="ffn.activation"),
    Kind("pos", "positional scheme (embedding, rotation or attention bias)",
         "modforge.components.positions:PositionalScheme", default="learned", part=True),
    Kind("attention", "attention (self and cross) and its decoding cache", "modforge.components.attention:Attention",
         default="mha", part=True),
    Kind("optim", "optimizer: a function (cfg, params) -> torch.optim.Optimizer", default="adamw"),
    Kind("scheduler", "learning-rate schedule: a function (cfg, optimizer, *, d_model, total_steps) -> LR scheduler",
         default="cosine"),
    Kind("param", "parametrisation: how init, learning rates and multipliers scale with the model's size",
         "modforge.models.param:Parametrisation", default="standard"),
)
_provider_stack: list[str] = []
_FAILED: dict[str, str] = {}  # {plugin distribution: error}, filled by modforge.plugins.load_plugins
_CONFIG_DIRS: list[tuple[str, str]] = []  # (provider, hydra search path), likewise


def declare(name: str, doc: str, *, base: Optional[type] = None, default: Optional[str] = None,
            nested_in: Optional[str] = None, part: bool = False) -> Kind:
    """Declare a kind of component, once, next to its base class.

    ``base``: the class every component of the kind must subclass (its
    contract). ``default``: the option a run gets when its config names none
    (a top-level kind's default enters the primary config's defaults list).
    ``nested_in``: the config key that selects it (``"ffn.activation"``) for a
    kind that is not a top-level config group. ``part``: models are built from
    it, so it needs a ``default``. Declaring the same kind again with the same
    settings is a no-op.
    """
    prov = _provider_stack[-1] if _provider_stack else sys._getframe(1).f_globals.get("__name__", "?")
    kind = Kind(name, doc, base, default, nested_in, part, prov)
    old = _REGISTRIES.get(name)
    if old is not None:
        if (old.decl.doc, old.decl.base, old.decl.default, old.decl.nested_in, old.decl.part) != \
                (doc, base, default, nested_in, part):
            raise ModforgeError(f"kind '{name}' is declared twice, differently: by {old.decl.provider} and by {prov}")
        return old.decl
    if not name.replace("_", "").isalnum() or name != name.lower():
        raise ModforgeError(f"kind name {name!r}: use a short lower-case identifier (letters, digits, _)")
    if part and not default:
        raise ModforgeError(f"kind '{name}': a part kind (part=True) needs a default option, which models get "
                            "when a config names none")
    _REGISTRIES[name] = Registry(kind)
    if kind.top_level and kind.default:
        _tell("defaults", defaults_list())
    return kind


def kinds() -> list[str]:
    """Every declared kind, in order of declaration."""
    return list(_REGISTRIES)


def kind(name: str) -> Kind:
    return registry(name).decl


def group_kinds() -> list[str]:
    """The kinds that are top-level config groups (``norm=rms``)."""
    return [k for k, r in _REGISTRIES.items() if r.decl.top_level]


def part_kinds() -> list[str]:
    """The kinds a model is built from (the fields of :class:`modforge.models.blocks.Parts`)."""
    return [k for k, r in _REGISTRIES.items() if r.decl.part]


def registry(kind: str) -> Registry:
    try:
        return _REGISTRIES[kind]
    except KeyError:
        close = suggest(kind, kinds())
        hint = "" if close else (" (kinds are declared when their modules are imported; modforge.plugins.load_all() "
                                 "declares every built-in kind)")
        raise UnknownComponentError(
            f"Unknown component kind '{kind}'.{close} Kinds: {', '.join(kinds()) or 'none declared'}{hint}."
        ) from None


@contextlib.contextmanager
def provider(name: str) -> Iterator[None]:
    """Attribute registrations made inside this block to ``name``."""
    _provider_stack.append(name)
    try:
        yield
    finally:
        _provider_stack.pop()


def register(kind: str, name: str, *, config: Optional[type] = None, defaults: Optional[dict] = None) -> Callable:
    """Class decorator: register ``cls`` as component ``name`` of ``kind``.

    ``config`` is the typed config dataclass; it defaults to the class's nested
    ``Config`` (an empty config if there is none). ``defaults`` maps other
    config groups to the option this one selects by default (a model picks its
    task, a task its data); command-line choices still win.
    """
    reg = registry(kind)
    if not name or not name.replace("_", "").isalnum() or name != name.lower():
        raise ModforgeError(f"{kind} name {name!r}: use a short lower-case identifier (letters, digits, _)")

    def deco(cls: Any) -> Any:
        cfg_cls = config if config is not None else getattr(cls, "Config", _EmptyConfig)
        if not dataclasses.is_dataclass(cfg_cls):
            raise ModforgeError(f"{kind} '{name}': its config {cfg_cls!r} must be a dataclass")
        if any(f.name in ("name", "defaults") for f in dataclasses.fields(cfg_cls)):
            raise ModforgeError(f"{kind} '{name}': config fields 'name' and 'defaults' are reserved")
        prov = _provider_stack[-1] if _provider_stack else getattr(cls, "__module__", "?")
        entry = Entry(kind, name, cls, cfg_cls, prov, dict(defaults or {}), (cls.__doc__ or "").strip().split("\n")[0])
        in_plugin = bool(_provider_stack) and prov != BUILTIN
        reg.add(entry, allow_ambiguous=in_plugin)
        if len(reg._entries[name]) == 1 and reg.decl.top_level:
            _tell("entry", entry)
        return cls

    return deco


_WATCHERS: list = []  # told of every change of the top-level options (the config layer's Hydra mirror)


def watch(watcher: Any) -> None:
    """Tell ``watcher`` of every change from now on, after what is registered already: ``entry(e)`` when an
    option of a top-level kind is registered (or becomes the one its name means), ``dropped(kind, name)``,
    ``kind_dropped(kind)``, and ``defaults(list)`` when the top-level kinds' defaults change."""
    if watcher in _WATCHERS:
        return
    _WATCHERS.append(watcher)
    for reg in _REGISTRIES.values():
        if reg.decl.top_level:
            for entries in reg._entries.values():
                watcher.entry(entries[0])
    watcher.defaults(defaults_list())


def _tell(event: str, *args: Any) -> None:
    for w in _WATCHERS:
        getattr(w, event)(*args)


def defaults_list() -> list:
    """The defaults of every top-level kind that declares one, as ``[{kind: option}]`` (declaration order)."""
    return [{k: r.decl.default} for k, r in _REGISTRIES.items() if r.decl.top_level and r.decl.default]


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


# --------------------------------------------------------------------------- plugin records
# modforge.plugins loads built-ins and plugins; what it learns is kept here, on the ground floor.


def record_failure(label: str, error: str) -> None:
    """A plugin failed to import: remember it (for error messages) and forget what it declared and registered."""
    _FAILED[label] = error
    forget_provider(label)


def record_config_dir(label: str, path: str) -> None:
    _CONFIG_DIRS.append((label, path))


def forget_provider(label: str) -> None:
    for reg in _REGISTRIES.values():
        for name in list(reg._entries):
            kept = [e for e in reg._entries[name] if e.provider != label]
            if len(kept) == len(reg._entries[name]):
                continue
            if kept:
                reg._entries[name] = kept
                if reg.decl.top_level:
                    _tell("entry", kept[0])
            else:
                del reg._entries[name]
                _tell("dropped", reg.kind, name)
    _CONFIG_DIRS[:] = [(p, d) for p, d in _CONFIG_DIRS if p != label]
    dropped = [k for k, reg in _REGISTRIES.items() if reg.decl.provider == label]
    for k in dropped:
        forget_kind(k)


def forget_kind(name: str) -> None:
    """Remove a declared kind, its components and its config group (a failed plugin's, a test's)."""
    del _REGISTRIES[name]
    _tell("kind_dropped", name)
    _tell("defaults", defaults_list())


def failed_plugins() -> dict[str, str]:
    return dict(_FAILED)


def plugin_config_dirs() -> list[tuple[str, str]]:
    return list(_CONFIG_DIRS)


for _kind in KINDS:  # modforge's own kinds, before anything registers (a plugin declares its own: declare())
    _REGISTRIES[_kind.name] = Registry(_kind)
