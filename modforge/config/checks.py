"""The checks of a composed config, each job's before any work (:func:`validate`): every option's own rules
(its ``Config.check``), the root keys, the Trainer and its callbacks and loggers. The command line is checked
before composing by :mod:`modforge.config.command_line`. A mistake is one :class:`~modforge.errors.ConfigError`
naming the key, the value and what is allowed."""
import os
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.config.composition import preset_options
from modforge.config.untrusted import check_targets
from modforge.config.schema import (LOGGER_PACKAGES, PROGRESS, ROOT_KEYS, SET_BY_MODFORGE, TYPE_WORDS,
                                    trainer_arguments)
from modforge.utils.devices import PRECISIONS


def validate(cfg: DictConfig, here: bool = True) -> list:
    """Everything that can be checked before any work: every component group resolved to its typed config
    (values in range), task, model and data fitting together, the root keys' types, the Trainer's values
    (with ``here=False``, for jobs a cluster runs elsewhere, not those that depend on this machine's devices).
    -> notes: settings that are legal but probably not what was meant (one line each, for the user)."""
    notes: list = []
    check_targets(cfg)  # before anything is built or imported: _target_ only where modforge builds
    typed = {g: registry.make_config(g, cfg[g]) for g in registry.group_kinds() if g in cfg}
    run = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
           for k in cfg if k != "hydra"}  # the run as plain values (Hydra's own node resolves only inside a job)
    check_finite(run)
    check_trainer_keys(cfg.trainer)
    check_callbacks(cfg.get("callbacks"))
    check_loggers(cfg.get("logger"))
    check_trainer_values(cfg.trainer, here)
    for key in ROOT_KEYS:
        check_root_value(key, cfg.get(key))
    check_pause(cfg.get("pause_at"), cfg.trainer)
    if cfg.get("study") is not None:
        from modforge.config.study import check_study

        check_study(OmegaConf.to_container(cfg.study, resolve=True) if OmegaConf.is_config(cfg.study) else cfg.study)
    for kind in registry.kinds():  # nested kinds (ffn.activation, data.tokenizer): their names, now
        where = registry.kind(kind).nested_in
        name = OmegaConf.select(cfg, where) if where else None
        if isinstance(name, str):
            registry.get(kind, name)
    if "optim" in typed and "scheduler" in typed:  # built once on a dummy parameter: their own checks, now
        import torch

        if getattr(typed["optim"][0].cls, "by_role", False):  # (optim=muon: given its parameters by role)
            dummy = [{"params": [torch.nn.Parameter(torch.zeros(2, 2))], "role": "hidden"},
                     {"params": [torch.nn.Parameter(torch.zeros(1))], "role": "vector"}]
        else:
            dummy = [torch.nn.Parameter(torch.zeros(1))]
        opt = registry.build("optim", cfg.optim, dummy)
        if "param" in typed and getattr(typed["param"][0].cls, "uses_groups", False) and \
                not getattr(typed["optim"][0].cls, "by_role", False):  # and as param=mup builds it
            registry.build("optim", cfg.optim, [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr_scale": 1.0,
                                                 "eps_scale": 1.0, "wd_scale": 1.0}])
        total = cfg.trainer.max_steps if cfg.trainer.max_steps > 0 else None
        d_model = getattr(typed.get("model", (None, None))[1], "d_model", 1)
        registry.build("scheduler", cfg.scheduler, opt, d_model=d_model, total_steps=total)
    for _, conf in typed.values():  # each option's own rules against the rest of the run (its config's check)
        hook = getattr(conf, "check", None)
        if callable(hook):
            notes += [n for n in hook(run) or [] if n not in notes]
    if "param" in typed and "model" in typed:  # param=mup: every part declared, the base shape's keys known
        from modforge.models.blocks import Parts

        registry.build("param", cfg.param).preflight(cfg.model, Parts.from_config(cfg))
    if {"task", "model", "data"} <= set(typed):
        from modforge.tasks.base import check_fit

        check_fit(typed["task"][0], typed["model"][0], typed["data"][0])
    if "data" in typed:
        typed["data"][0].cls.check_files(typed["data"][1])
    if "data" in typed and "model" in typed:
        (data_entry, data), (_, model) = typed["data"], typed["model"]
        check_positions(data_entry.cls.max_positions(data), model.max_len, f"data={cfg.data.name}")
    for key in ("eval_stride", "eval_by_position"):
        if cfg.get(key) and not cfg.get("eval_block_sizes"):
            raise registry.ConfigError(f"{key}={cfg.get(key)}: it applies to the evaluations of eval_block_sizes, which "
                                       "is empty; give eval_block_sizes=[N, ...] (the training length included, if "
                                       "wanted)")
    stride = cfg.get("eval_stride")
    if stride and stride > min(int(n) for n in cfg.eval_block_sizes):
        raise registry.ConfigError(f"eval_stride={stride}: must be at most the shortest of eval_block_sizes="
                                   f"{list(cfg.eval_block_sizes)} (each window scores its last eval_stride tokens)")
    return notes


def check_finite(run: dict) -> None:
    """No number of a config is NaN or infinite: nothing a run computes with one means anything (a learning
    rate of inf, a clip value of nan)."""
    import math

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, float) and not math.isfinite(node):
            raise registry.ConfigError(f"{key}={node}: must be a finite number")

    for key, value in run.items():
        walk(value, str(key))


def check_positions(longest: Optional[int], max_len: int, what: str) -> None:
    """The longest sequence the data can produce must fit the model's positions / KV cache."""
    if longest is not None and longest > max_len:
        raise registry.ConfigError(
            f"model.max_len={max_len} is shorter than the sequences of {what} ({longest} "
            "positions, from its block_size / max_len); raise model.max_len or shorten the data"
        )

def check_trainer_keys(trainer_cfg: Any) -> None:
    for key in trainer_cfg:
        check_trainer_key(key)

def check_trainer_values(t: Any, here: bool = True) -> None:
    """The Trainer values that Lightning or torch would only reject after data preparation, or never; with
    ``here=False`` not those that depend on this machine's devices (a login node has no GPU)."""
    def bad(key: str, why: str) -> None:
        raise registry.ConfigError(f"trainer.{key}={t.get(key)}: {why}")

    ms = t.get("max_steps")
    if not isinstance(ms, int) or isinstance(ms, bool) or not (ms >= 1 or ms == -1):
        bad("max_steps", "a positive number of optimizer steps (or -1: no limit, then set max_epochs)")
    agb = t.get("accumulate_grad_batches")
    if not isinstance(agb, int) or isinstance(agb, bool) or agb < 1:
        bad("accumulate_grad_batches", "an integer >= 1")
    vci = t.get("val_check_interval")
    if isinstance(vci, bool) or (isinstance(vci, (int, float)) and vci <= 0):
        bad("val_check_interval", "a positive number of steps (int), a fraction of an epoch (float), or a time")
    if isinstance(vci, float) and t.get("check_val_every_n_epoch") is None:
        bad("val_check_interval", "a fraction of an epoch needs trainer.check_val_every_n_epoch=1 (the default "
            "validates by steps across epochs)")
    cve = t.get("check_val_every_n_epoch")
    if cve is not None and (isinstance(cve, bool) or not isinstance(cve, int) or cve < 1):
        bad("check_val_every_n_epoch", "an integer >= 1, or null (validate by steps)")
    lvb = t.get("limit_val_batches")
    if lvb is not None and (isinstance(lvb, bool) or not isinstance(lvb, (int, float)) or lvb <= 0):
        bad("limit_val_batches", "a number of batches >= 1 or a fraction in (0, 1]: 0 validates nothing, so the run "
            "would have no result to report or compare")
    ltb = t.get("limit_train_batches")
    if ltb is not None and (isinstance(ltb, bool) or not isinstance(ltb, (int, float)) or ltb <= 0):
        bad("limit_train_batches", "a number of batches >= 1 or a fraction in (0, 1]: 0 trains nothing")
    if isinstance(ltb, float) and ltb > 1:
        bad("limit_train_batches", "a fraction must be in (0, 1]; give a whole number for a count of batches")
    epochs = t.get("max_epochs")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs == 0 or epochs < -1):
        bad("max_epochs", "an integer >= 1, or -1 / null (no limit: trainer.max_steps decides): 0 trains nothing")
    every = t.get("log_every_n_steps")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        bad("log_every_n_steps", "an integer >= 1 (the training curve's resolution)")
    if t.get("fast_dev_run"):
        bad("fast_dev_run", "Lightning's fast_dev_run writes no checkpoint and no log, so the run could be neither "
            "resumed nor reported; use trainer.max_steps=1 for a one-step run, or dry_run=true to check the config")
    clip = t.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        bad("gradient_clip_val", "a number >= 0 (or null: no clipping)")
    if not here:
        return
    acc = str(t.get("accelerator") or "auto")
    if acc in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise registry.ConfigError(f"trainer.accelerator={acc}: no CUDA GPU is visible here "
                                       "(torch.cuda.is_available() is False); use trainer=cpu")
    # everything else the Trainer itself checks when it is built: build one now, before any data is read
    import lightning as L

    settings = {k: v for k, v in OmegaConf.to_container(t, resolve=True).items()
                if k not in ("enable_progress_bar", "enable_checkpointing", "enable_model_summary")}
    try:
        import logging
        import warnings

        quiet = logging.getLogger("lightning.pytorch")  # its "GPU available" lines and tips belong to the real run
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = L.Trainer(**settings, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                  enable_model_summary=False)
        finally:
            quiet.setLevel(level)
    except Exception as e:  # noqa: BLE001 - Lightning's MisconfigurationException, ValueError, TypeError ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        named = [k for k in settings if f"{k}=" in first] or [k for k in settings if k in first]
        where = f"trainer.{named[0]}={settings[named[0]]}" if named else "trainer"
        raise registry.ConfigError(f"{where}: {first}") from None
    if isinstance(lvb, float) and 0 < lvb < 1 and built.world_size > 1:
        bad("limit_val_batches", f"a fraction cannot be validated exactly once over {built.world_size} DDP ranks "
            "(each would take the fraction of its own part); give a number of batches, e.g. 50: the batches one "
            "process would validate, split between the ranks")


def check_root_value(key: str, v: Any, line: str = "") -> None:
    allowed = ROOT_KEYS[key]
    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v)
    if key == "eval_block_sizes" and isinstance(v, list) and not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in v):
        raise registry.ConfigError(f"{line or f'{key}={v}'}: eval_block_sizes must be a list of positive integers "
                                   "(sequence lengths to evaluate at after training), e.g. [128]")
    if key == "eval_stride" and v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        raise registry.ConfigError(f"{line or f'{key}={v}'}: eval_stride must be a positive integer (score the last S "
                                   "tokens of a window every S tokens) or null")
    if key == "matmul_precision" and v is not None and v not in PRECISIONS:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: matmul_precision must be one of {', '.join(PRECISIONS)} "
                                   f"(torch.set_float32_matmul_precision), or null (high on CUDA: TF32; else highest)."
                                   + registry.suggest(str(v), list(PRECISIONS)))
    if not isinstance(v, allowed) or (bool not in allowed and isinstance(v, bool)):
        want = " or ".join(TYPE_WORDS[t] for t in allowed)
        raise registry.ConfigError(f"{line or f'{key}={v}'}: {key} must be {want}, not {v!r}")
    if key in ("resume", "init_from") and isinstance(v, str) and not v.strip():
        raise registry.ConfigError(f"{line or f'{key}={v}'}: an empty path (an unset shell variable?); give a run "
                                   f"directory or a .ckpt file, or leave {key} out")
    if key == "seed" and not 0 <= v < 2 ** 32:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: seed must be in [0, 2^32 - 1]")
    if key == "pause_at" and v is not None and v < 1:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: pause_at must be >= 1 (training steps), or null")
    if key == "divergence_patience" and v is not None and v < 1:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: divergence_patience must be >= 1 (training batches in a row), "
                                   "or null (never stop)")

def check_pause(pause_at, trainer) -> None:
    """``pause_at``: a step before the last one, at a validation (its checkpoint is then the one a run that never
    paused writes there too, so the continued run ends where the uninterrupted one does)."""
    if pause_at is None:
        return
    steps, every = trainer.get("max_steps"), trainer.get("val_check_interval")
    if isinstance(steps, int) and steps > 0 and pause_at >= steps:
        raise registry.ConfigError(f"pause_at={pause_at}: the run ends at trainer.max_steps={steps}; pause before it")
    if not (isinstance(every, int) and not isinstance(every, bool) and pause_at % every == 0):
        raise registry.ConfigError(f"pause_at={pause_at}: pause at a validation step, a multiple of "
                                   f"trainer.val_check_interval (now {every}; give it in steps)")


def check_output_dir(path: str, key: str) -> None:
    """The run (or sweep) directory must be creatable: its nearest existing ancestor a writable directory, and
    its name not blank (a directory named ' ' is a typo, not a place)."""
    if not path.strip() or any(not part.strip() for part in Path(path).parts):
        raise registry.ConfigError(f"{key}='{path}': a blank directory name; give a path, e.g. {key}=outputs/run1")
    p = Path(path).expanduser().absolute()
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise registry.ConfigError(f"{key}={path}: {probe} is a file, so no directory can be made under it")
    if not os.access(probe, os.W_OK | os.X_OK) or str(probe).startswith(("/proc", "/sys")):
        raise registry.ConfigError(f"{key}={path}: {probe} is not writable; choose another {key}")

def check_callbacks(node: Any) -> None:
    """The ``callbacks`` config: a known progress display, and every ``_target_`` an importable Lightning
    callback class (a typo fails here, in one line, not after data preparation)."""
    node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else (node or {})
    progress = node.get("progress", "auto")
    if progress not in PROGRESS:
        raise registry.ConfigError(f"callbacks.progress={progress}: one of {', '.join(PROGRESS)}"
                                   f"{registry.suggest(str(progress), list(PROGRESS))}")
    every = node.get("progress_every", 50)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise registry.ConfigError(f"callbacks.progress_every={every}: a number of steps >= 1")
    if progress == "rich":
        import importlib.util

        if importlib.util.find_spec("rich") is None:
            raise registry.ConfigError("callbacks.progress=rich needs the rich package: pip install rich")
    import lightning as L

    for name, value in node.items():
        if name in ("progress", "progress_every"):
            continue
        if not isinstance(value, dict) or "_target_" not in value:
            raise registry.ConfigError(f"callbacks.{name}: expected a callback (a mapping with _target_: "
                                       "a Lightning Callback class) or progress / progress_every")
        cls = _locate_class(f"callbacks.{name}", str(value["_target_"]))
        if not (isinstance(cls, type) and issubclass(cls, L.Callback)):
            raise registry.ConfigError(f"callbacks.{name}._target_={value['_target_']}: not a lightning Callback")
        monitor = value.get("monitor")
        if isinstance(monitor, str) and not (monitor == "train/loss" or monitor.startswith("val/")):
            raise registry.ConfigError(f"callbacks.{name}.monitor={monitor}: runs log train/loss and val/<metric> "
                                       "(val/loss, and the task's own: val/bpc, val/acc, val/exact_match ...)")

def check_loggers(node: Any) -> None:
    """Every ``logger`` entry: a Lightning logger class whose package is installed (one line naming the extra
    to install, before any work)."""
    import importlib.util

    import lightning as L

    node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else (node or {})
    for name, value in node.items():
        if name == "csv" and not value:
            continue  # the run's own logs/metrics.csv, always written
        if not isinstance(value, dict) or "_target_" not in value:
            raise registry.ConfigError(f"logger.{name}: expected a logger (a mapping with _target_: a Lightning "
                                       "logger class); options: " + ", ".join(preset_options("logger")))
        cls = _locate_class(f"logger.{name}", str(value["_target_"]))
        if not (isinstance(cls, type) and issubclass(cls, L.pytorch.loggers.Logger)):
            raise registry.ConfigError(f"logger.{name}._target_={value['_target_']}: not a lightning Logger")
        needs = LOGGER_PACKAGES.get(cls.__name__, ())
        if needs and not any(importlib.util.find_spec(p) for p in needs):
            raise registry.ConfigError(f"logger={name} needs the {' or '.join(needs)} package: "
                                       "pip install 'modforge[loggers]'")

def _locate_class(key: str, path: str) -> Any:
    """The class ``path`` names (hydra.utils.get_class would also log the error, to handlers of an earlier run)."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError as e:
            raise registry.ConfigError(f"{key}._target_={path}: cannot be imported (AttributeError: {e})") from None
        return obj
    raise registry.ConfigError(f"{key}._target_={path}: cannot be imported (no module in {path})")

def check_trainer_key(key: str) -> None:
    """``key`` must be a Trainer argument that a config may set (see modforge.config.schema)."""
    if key == "logger":
        raise registry.ConfigError("trainer.logger: choose loggers with logger=... (conf/logger/: csv, tensorboard, "
                                   "mlflow, wandb; several: logger=[tensorboard,mlflow]); logs/metrics.csv is "
                                   "always written")
    if key == "callbacks":
        raise registry.ConfigError("trainer.callbacks: choose callbacks with callbacks=... (conf/callbacks/: "
                                   "default, early_stopping, none; several: callbacks=[default,early_stopping]) "
                                   "or add your own with +callbacks.NAME._target_=your.Callback")
    if key in SET_BY_MODFORGE:
        raise registry.ConfigError(f"trainer.{key}: set by modforge itself, not from the config")
    allowed = sorted(trainer_arguments())
    if key not in allowed:
        raise registry.ConfigError(
            f"trainer.{key}: not an argument of lightning.Trainer.{registry.suggest(key, allowed)} "
            f"Arguments: {', '.join(allowed)}."
        )
