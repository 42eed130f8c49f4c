"""The registry mirrored into Hydra's ConfigStore: each option of a top-level kind as a config node of its group
(``norm=scale`` with no YAML file), and the kinds' defaults as the node ``component_defaults`` that
``conf/train.yaml`` includes. The registry knows nothing of Hydra; this watcher (:func:`modforge.registry.watch`),
installed when :mod:`modforge.config` is imported, keeps Hydra in step with it."""
import dataclasses
import typing
from dataclasses import field
from typing import Any, List

from modforge import registry

DEFAULTS_NODE = "component_defaults"


def option_defaults(selects: dict) -> list:
    """The Hydra defaults list of an option that selects other groups' options (a model its task, a task its
    data): each at the top level of the config, then the option's own values."""
    return [{f"/{g}@_global_.{g}": v} for g, v in selects.items()] + ["_self_"]


def hydra_node(entry: registry.Entry) -> type:
    """The dataclass Hydra composes for ``<kind>=<name>``: ``name`` first, then the config's fields."""
    fields: list[tuple] = [("name", str, field(default=entry.name))]
    if entry.defaults:
        dl = option_defaults(entry.defaults)
        fields.append(("defaults", List[Any], field(default_factory=lambda dl=dl: list(dl))))
    hints = typing.get_type_hints(entry.config)  # real types even under `from __future__ import annotations`
    for f in dataclasses.fields(entry.config):
        kw = {}
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            kw["default_factory"] = f.default_factory  # type: ignore[misc]
        fields.append((f.name, hints.get(f.name, Any), field(**kw)))
    return dataclasses.make_dataclass(f"{entry.kind}_{entry.name}", fields)


class HydraMirror:
    """What the registry tells its watchers, done to Hydra's ConfigStore."""

    @staticmethod
    def _store():
        from hydra.core.config_store import ConfigStore

        return ConfigStore.instance()

    def entry(self, e: registry.Entry) -> None:
        self._store().store(group=e.kind, name=e.name, node=hydra_node(e), provider=e.provider)

    def dropped(self, kind: str, name: str) -> None:
        self._store().repo.get(kind, {}).pop(f"{name}.yaml", None)

    def kind_dropped(self, kind: str) -> None:
        self._store().repo.pop(kind, None)

    def defaults(self, defaults: list) -> None:
        self._store().store(name=DEFAULTS_NODE, node={"defaults": defaults}, provider="modforge")


MIRROR = HydraMirror()


def install() -> None:
    """Keep Hydra's ConfigStore in step with the registry (what is registered already, and from now on)."""
    registry.watch(MIRROR)
