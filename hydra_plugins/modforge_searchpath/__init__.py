"""Hydra SearchPathPlugin: put the YAML shipped by modforge plugins on Hydra's search path.

A modforge plugin (a package with a ``modforge.plugins`` entry point) may set a
module attribute ``MODFORGE_CONFIG_DIR`` (``"pkg://its_package.conf"`` or an
absolute directory); :func:`modforge.plugins.load_plugins` records it and this
plugin appends it after modforge's own config directory, so e.g.
``experiment=extras_small`` is selectable with no search-path editing, both in
``python -m modforge.train`` and in :func:`modforge.config.compose`.

Hydra finds this module by scanning the ``hydra_plugins`` namespace package of
every installed distribution, so it is imported by *any* Hydra app in the
environment. It therefore imports nothing heavy at module level and acts only
when modforge's config directory is on the search path (a modforge run).
"""
import os
from typing import Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER_PREFIX = "modforge-plugin"


def _local_path(path: str) -> Optional[str]:
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        return None
    return os.path.realpath(path)


def _is_modforge_search_path(search_path: ConfigSearchPath) -> bool:
    from modforge.config.composition import CONF_DIR

    conf = os.path.realpath(str(CONF_DIR))
    for el in search_path.get_path():
        if el.path == "pkg://modforge.conf" or _local_path(el.path) == conf:
            return True
    return False


def _as_search_path(entry: str) -> str:
    if "://" in entry:
        return entry
    return "file://" + os.path.abspath(entry)


class ModforgeSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        try:
            from modforge import registry
            from modforge.cli import manifest
            from modforge.plugins import load_all
        except ImportError:  # modforge uninstalled but this module left behind
            return
        if not _is_modforge_search_path(search_path):
            return
        if not manifest.installed:  # --help / Tab completion: the cached manifest recorded the directories
            load_all()  # cached: a no-op after modforge.train / modforge.config.compose loaded it
        present = {el.path for el in search_path.get_path()}
        for provider, path in registry.plugin_config_dirs():
            path = _as_search_path(path)
            if path not in present:
                search_path.append(f"{PROVIDER_PREFIX}:{provider}", path)
                present.add(path)
