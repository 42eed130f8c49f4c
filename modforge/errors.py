"""The errors modforge raises for its users: each prints as one line (``error: ...``, exit code 2), never a
traceback. Every layer may import this module; it imports nothing."""


class ModforgeError(Exception):
    """An error with a message meant for the user, printed without a traceback."""


class ConfigError(ModforgeError, ValueError):
    """A bad configuration value: names the key, the value and what is allowed."""


class UnknownComponentError(ConfigError, KeyError):
    """A component name that no provider registered (the message suggests the nearest names)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DuplicateComponentError(ModforgeError):
    """One provider registered the same name twice."""


class AmbiguousComponentError(ConfigError):
    """Two providers registered one name: the config must say which (the message names both)."""


class RunDirTaken(ConfigError):
    """The output directory holds another run, or a process is training there now: nothing is written to it."""
