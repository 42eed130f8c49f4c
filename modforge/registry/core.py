"""Kinds, their options and who provided them: declare, register, look up; watchers told of each change;
what the plugin loader learns (failures, config directories). The package's docstring says how it fits."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from modforge.errors import AmbiguousComponentError, DuplicateComponentError, ModforgeError, UnknownComponentError

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
        self._base: Optional[type] = None  # a table's base class, once imported

    @property
    def base(self) -> Optional[type]:
        """The base class (a table's "module:Class" imported when first asked: by the first registration, from
        the module that defines it, so it is there)."""
        if isinstance(self.decl.base, str) and self._base is None:
            import importlib

            module, _, name = self.decl.base.partition(":")
            self._base = getattr(importlib.import_module(module), name)
        return self._base if isinstance(self.decl.base, str) else self.decl.base

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


# --------------------------------------------------------------------------- plugin records
# modforge.plugins loads built-ins and plugins; what it learns is kept here, on the ground floor.


def record_failure(label: str, error: str) -> None:
    """A plugin failed to import: remember it (for error messages) and forget what it declared and registered."""
    _FAILED[label] = error
    forget_provider(label)


def record_config_dir(label: str, path: str) -> None:
    """A plugin's config directory, once: a full load records it as ``pkg://...`` and the cached manifest as
    the directory it names, and a process can do both (the front door from the manifest after a load)."""
    if all(p != label for p, _ in _CONFIG_DIRS):
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
