"""The shape of modforge's config beyond the registry's groups: the root keys and their types, the YAML-only
groups, the progress displays, and the ``trainer`` group's schema (every ``lightning.Trainer`` argument, with
Lightning's default).

The Trainer schema is stored in Hydra's ConfigStore as ``trainer/lightning`` and inherited by
``conf/trainer/*.yaml``, so any Trainer argument can be set from the command
line (``trainer.accumulate_grad_batches=4``, ``trainer.enable_progress_bar=false``)
without a ``+``, a misspelt one fails at compose time, and every run's
``config.yaml`` records the complete Trainer settings. Arguments that modforge
fills itself (logger, callbacks, output directory) and object-valued ones are
left out. Importing this module is cheap (no Lightning): ``--help`` reads it.
"""
import dataclasses
import inspect
from typing import Any

ROOT_KEYS = {"seed": (int,), "resume": (str, type(None)), "init_from": (str, type(None)), "eval_at_start": (bool,), "sample": (bool,),
             "divergence_patience": (int, type(None)), "compile": (bool,), "dry_run": (bool,), "skip_invalid": (bool,),
             "retry_failed": (bool,), "matmul_precision": (str, type(None)), "eval_block_sizes": (list,),
             "eval_stride": (int, type(None)), "eval_by_position": (bool,), "pause_at": (int, type(None))}

TYPE_WORDS = {int: "an integer", bool: "true or false", str: "a path", type(None): "null",
               list: "a list of block sizes, e.g. [128]"}

PRESET_GROUPS = {"experiment": "presets of groups and values (conf/experiment/, and plugins')",
                 "trainer": "lightning.Trainer settings (conf/trainer/)",
                 "callbacks": "optional Lightning callbacks and the progress display (conf/callbacks/); "
                              "several at once: callbacks=[default,early_stopping]",
                 "logger": "where metrics go besides logs/metrics.csv (conf/logger/): csv, tensorboard, mlflow, "
                           "wandb; several at once: logger=[tensorboard,mlflow]"}  # the YAML-only groups

PROGRESS = ("auto", "tqdm", "rich", "log", "none")  # callbacks.progress: how a run shows its progress

LOGGER_PACKAGES = {"TensorBoardLogger": ("tensorboard", "tensorboardX"), "MLFlowLogger": ("mlflow",),
                   "WandbLogger": ("wandb",), "CometLogger": ("comet_ml",), "NeptuneLogger": ("neptune",)}

SET_BY_MODFORGE = ("logger", "callbacks", "default_root_dir", "plugins")
_PRIMITIVE = (type(None), bool, int, float, str)


def trainer_arguments() -> dict:
    """{argument: Lightning's default} for every Trainer argument a config may set."""
    import lightning as L

    return {
        name: p.default
        for name, p in inspect.signature(L.Trainer.__init__).parameters.items()
        if name != "self" and name not in SET_BY_MODFORGE and isinstance(p.default, _PRIMITIVE)
    }


_stored = False


def store_trainer_schema() -> None:
    """Put ``trainer/lightning`` into Hydra's ConfigStore (once; imports Lightning)."""
    global _stored
    if _stored:
        return
    from hydra.core.config_store import ConfigStore

    fields = [(name, Any, dataclasses.field(default=default)) for name, default in trainer_arguments().items()]
    node = dataclasses.make_dataclass("TrainerArguments", fields)
    ConfigStore.instance().store(group="trainer", name="lightning", node=node, provider="modforge")
    _stored = True
