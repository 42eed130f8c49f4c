"""The ``trainer`` config group's schema: every ``lightning.Trainer`` argument, with Lightning's default.

Stored in Hydra's ConfigStore as ``trainer/lightning`` and inherited by
``conf/trainer/*.yaml``, so any Trainer argument can be set from the command
line (``trainer.accumulate_grad_batches=4``, ``trainer.enable_progress_bar=false``)
without a ``+``, a misspelt one fails at compose time, and every run's
``config.yaml`` records the complete Trainer settings. Arguments that modforge
fills itself (logger, callbacks, output directory) and object-valued ones are
left out.
"""
import dataclasses
import inspect
from typing import Any

import lightning as L
from hydra.core.config_store import ConfigStore

SET_BY_MODFORGE = ("logger", "callbacks", "default_root_dir", "plugins")
_PRIMITIVE = (type(None), bool, int, float, str)


def trainer_arguments() -> dict:
    """{argument: Lightning's default} for every Trainer argument a config may set."""
    return {
        name: p.default
        for name, p in inspect.signature(L.Trainer.__init__).parameters.items()
        if name != "self" and name not in SET_BY_MODFORGE and isinstance(p.default, _PRIMITIVE)
    }


def store() -> None:
    fields = [(name, Any, dataclasses.field(default=default)) for name, default in trainer_arguments().items()]
    node = dataclasses.make_dataclass("TrainerArguments", fields)
    ConfigStore.instance().store(group="trainer", name="lightning", node=node, provider="modforge")


store()
