"""modforge: a config-driven registry of swappable Transformer components.

``import modforge`` is cheap: it imports neither torch nor Lightning. The
registry lives in :mod:`modforge.registry` (the ground floor); the built-in
components and the installed plugins are loaded by :func:`modforge.plugins.load_all`.
"""
from modforge.registry import ConfigError, ModforgeError, build, get, register  # noqa: F401

__version__ = "0.1.0"
