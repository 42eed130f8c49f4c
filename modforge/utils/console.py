"""What a run prints: through Python logging (so Hydra's ``train.log`` gets it too), without known noise.

Hydra configures logging for every job (console and ``<job>.log``; modforge's
``conf/train.yaml`` prints messages plain on the console and time-stamped in the
file). :func:`say` writes to the ``modforge`` logger when logging is configured
and prints otherwise (a run started from Python without Hydra), so the summary
is never lost. :func:`quiet` removes output that tells the user nothing about
their run: Lightning's advertisement for its cloud logger and a deprecation
warning Lightning itself triggers (``LeafSpec``, from its own pytree helper).
"""
import logging
import warnings

log = logging.getLogger("modforge")

_NOISE = ("💡 Tip:",)  # Lightning's advertisements (logger_connector: "try installing litlogger")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_NOISE)


_FILTER = _DropNoise()


def quiet() -> None:
    """Drop Lightning's advertisement and the harmless deprecation warnings it raises (idempotent)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")


def say(message: str) -> None:
    """One message of the run (a line or several): logged when logging would show it, else printed."""
    if (logging.getLogger().handlers or log.handlers) and log.isEnabledFor(logging.INFO):
        for line in message.splitlines() or [""]:
            log.info(line)
    else:
        print(message, flush=True)
