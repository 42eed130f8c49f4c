"""modforge: a config-driven registry of swappable Transformer components.

``import modforge`` is cheap: it imports neither torch nor Lightning. The
registry lives in :mod:`modforge.registry`; built-in components are registered
by :func:`modforge.registry.load_builtins`.
"""
from modforge.registry import ConfigError, ModforgeError, build, get, register  # noqa: F401

__version__ = "0.1.0"
