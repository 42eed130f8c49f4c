"""The registry as data, cached: so ``--help``, Tab completion and ``modforge list`` answer without torch.

Loading the registry imports every component module, and with them torch and
Lightning (seconds). What the front door needs is only data: the kinds, their
options with their parameters and defaults, the plugins' config directories and
the Trainer's arguments. :func:`write` stores that as JSON after any full load
(every training run and ``modforge list`` refresh it); :func:`read` returns it
while it is current. Current means: the same modforge version, the same
installed plugins (distribution and version), and no source or config file of
modforge or of a plugin changed since (sizes and modification times: an
editable install's edits count). :func:`install` puts it into Hydra's
ConfigStore the way the registry would, so Hydra composes, lists and completes
exactly as after a full load. Anything else runs with the full registry.
"""
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any, Optional

from modforge import __version__, registry
from modforge.plugins import ENTRY_POINT_GROUP

installed = False  # set by install(): the registry's data is in Hydra without the registry being loaded
_PACKAGE = Path(__file__).resolve().parent.parent  # modforge/


def cache_file() -> Path:
    from modforge.utils.files import cache_dir

    return cache_dir() / "manifest.json"


def _files_of(origin: Optional[str]) -> list:
    if not origin:
        return []
    base = Path(origin).parent if Path(origin).name == "__init__.py" else Path(origin)
    return sorted(base.rglob("*.py")) + sorted(base.rglob("*.yaml")) if base.is_dir() else [base]


def fingerprint() -> str:
    """What the manifest depends on: modforge's version and files, and each plugin's version and files."""
    h = hashlib.sha256(__version__.encode())
    conf = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else _PACKAGE.parent / "conf"
    files = sorted(_PACKAGE.rglob("*.py")) + sorted(conf.rglob("*.yaml"))
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        h.update(f"{ep.name}={ep.value}@{dist.version if dist else '?'};".encode())
        spec = importlib.util.find_spec(ep.value.split(":")[0].split(".")[0])
        files += _files_of(spec.origin if spec else None)
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def build() -> dict:
    """The loaded registry as data (call after ``load_all``)."""
    from modforge.config.schema import trainer_arguments

    kinds = {}
    for kind in registry.kinds():
        k = registry.kind(kind)
        reg = registry.registry(kind)
        entries = [{"name": e.name, "provider": e.provider, "doc": e.doc, "class": registry._qualname(e.cls),
                    "params": {n: _plain(v) for n, v in e.default_params().items()}, "defaults": dict(e.defaults),
                    "params_text": ", ".join(f"{n}={v!r}" for n, v in e.default_params().items()),
                    "ambiguous": len(reg._entries[e.name]) > 1}
                   for e in reg.entries()]
        kinds[kind] = {"doc": k.doc, "default": k.default, "nested_in": k.nested_in, "top_level": k.top_level,
                       "base": k.base_name, "entries": entries}
    return {"fingerprint": fingerprint(), "kinds": kinds,
            "config_dirs": [(label, _as_file(path)) for label, path in registry.plugin_config_dirs()],
            "failed": registry.failed_plugins(),
            "trainer": {n: _plain(v) for n, v in trainer_arguments().items()}}


def _as_file(path: str) -> str:
    """A plugin's ``pkg://package.conf`` as a directory: Hydra reading a pkg:// source imports the package
    (and with a plugin, torch); a directory it reads as files."""
    if not path.startswith("pkg://"):
        return path
    top, *rest = path[len("pkg://"):].split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found without importing it
    if spec is None or not spec.submodule_search_locations:
        return path
    return str(Path(list(spec.submodule_search_locations)[0]).joinpath(*rest))


def write(data: Optional[dict] = None) -> None:
    """Store ``data`` (default: the manifest of the registry now loaded); best effort: a read-only cache only
    costs speed."""
    from modforge.utils.files import write_json

    try:
        write_json(cache_file(), data or build())
    except (OSError, TypeError, ValueError):
        pass


def read() -> Optional[dict]:
    """The cached manifest if it describes what is installed now, else None."""
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("fingerprint") == fingerprint() else None


def install(data: dict) -> None:
    """Give Hydra what a full load would: every top-level option as a config node (name, parameters, the
    groups it selects), the component defaults, the Trainer schema and the plugins' config directories."""
    from hydra.core.config_store import ConfigStore

    from modforge.config import store

    cs = ConfigStore.instance()
    defaults = []
    for kind, k in data["kinds"].items():
        if not k["top_level"]:
            continue
        if k["default"]:
            defaults.append({kind: k["default"]})
        for e in k["entries"]:
            node: dict = {"name": e["name"]}
            if e["defaults"]:
                node["defaults"] = store.option_defaults(e["defaults"])
            node.update(e["params"])
            cs.store(group=kind, name=e["name"], node=node, provider=e["provider"])
    cs.store(name=store.DEFAULTS_NODE, node={"defaults": defaults}, provider="modforge")
    cs.store(group="trainer", name="lightning", node=dict(data["trainer"]), provider="modforge")
    for label, path in data["config_dirs"]:
        registry.record_config_dir(label, path)
    global installed
    installed = True


def of_registry() -> dict:
    """The same data from the loaded registry (when no current manifest is cached)."""
    from modforge.config.composition import load

    load()
    data = build()
    write(data)
    return data


def preset_options(data: dict, group: str) -> list:
    """The YAML options of a preset group (modforge's conf/ and the plugins' config directories), read as
    files: no Hydra composition."""
    from modforge.config.composition import CONF_DIR

    dirs = [Path(CONF_DIR)] + [Path(_as_file(p).replace("file://", "")) for _, p in data.get("config_dirs", [])]
    names = {f.stem for d in dirs for f in (d / group).glob("*.yaml")} if dirs else set()
    return sorted(names - {"lightning"})
