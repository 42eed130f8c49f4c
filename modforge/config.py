"""Config plumbing shared by the entry points: where the YAML lives, checking the
command line against the registry, and composing in-process (tests, notebooks)."""
import contextlib
import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.builtins import load_all
from modforge.devices import PRECISIONS
from modforge.runs import register_resolver

_PKG_CONF = Path(__file__).resolve().parent / "conf"  # in an installed wheel
_SRC_CONF = Path(__file__).resolve().parent.parent / "conf"  # in a source checkout / editable install
CONF_DIR = _PKG_CONF if (_PKG_CONF / "train.yaml").exists() else _SRC_CONF


ROOT_KEYS = {"seed": (int,), "resume": (str, type(None)), "init_from": (str, type(None)), "eval_at_start": (bool,), "sample": (bool,),
             "divergence_patience": (int, type(None)), "compile": (bool,), "dry_run": (bool,), "skip_invalid": (bool,),
             "retry_failed": (bool,), "matmul_precision": (str, type(None)), "eval_block_sizes": (list,)}
_TYPE_WORDS = {int: "an integer", bool: "true or false", str: "a path", type(None): "null",
               list: "a list of block sizes, e.g. [128]"}
PRESET_GROUPS = {"experiment": "presets of groups and values (conf/experiment/, and plugins')",
                 "trainer": "lightning.Trainer settings (conf/trainer/)",
                 "callbacks": "optional Lightning callbacks and the progress display (conf/callbacks/); "
                              "several at once: callbacks=[default,early_stopping]",
                 "logger": "where metrics go besides logs/metrics.csv (conf/logger/): csv, tensorboard, mlflow, "
                           "wandb; several at once: logger=[tensorboard,mlflow]"}  # the YAML-only groups


@contextlib.contextmanager
def hydra_loader() -> Iterator[Any]:
    """Hydra's config loader over modforge's search path (plugins' YAML included), for the checks below."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    load_all()
    if GlobalHydra.instance().is_initialized():  # left over by an app that exited (in-process use)
        GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def one_line(e: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages as one line (what they say, without their key dumps)."""
    skip = ("full_key:", "object_type", "reference_type", "Set the environment variable", "Traceback", "See https://",
            "None")
    lines, seen = [], set()
    while e is not None and id(e) not in seen:  # Hydra's message, then the OmegaConf error that caused it
        seen.add(id(e))
        lines += [ln.strip() for ln in str(e).splitlines()
                  if ln.strip() and not ln.strip().startswith(skip) and "$VALUE" not in ln]
        e = e.__cause__ or e.__context__
    lines = [ln for ln in dict.fromkeys(lines) if not ln.startswith("To append to your config use")]
    if lines and lines[0].startswith("Could not override"):  # the key exists for other options of the group
        lines[0] += " It is not a key of the option chosen in its group; python -m modforge.list shows each option's keys."
    return "; ".join(lines[:2]) or "invalid configuration"


def _parse(args: list, loader: Any = None) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create(config_loader=loader).parse_overrides(args)
    except HydraException as e:
        raise registry.ConfigError(f"not a valid override: {one_line(e)}") from None


def check_overrides(args: Iterable[str], loader: Any = None) -> None:
    """Fail early, with suggestions, on anything in the command line that cannot be right.

    ``norm=rmss`` -> "Unknown norm 'rmss'. Did you mean 'rms'? ..."; also inside
    sweeps (``norm=layer,rmss``). ``norm.epz=1`` -> the keys any norm accepts.
    ``experiment=shakespeare`` -> the experiments that exist. ``+modle=...``,
    ``+logger=wandb`` -> no such key or group (nothing would read it).
    ``seed=abc`` -> an integer. ``activation=silu`` -> chosen with ``ffn.activation=``.
    Hydra's sweep syntax (``glob``, ``range``, ``choice``, intervals) passes; the
    jobs it expands to are checked by :func:`preflight`.
    """
    args = [a for a in args if ("=" in a or a.startswith("~")) and not a.startswith("-")]
    if not args:
        return
    if loader is None:
        with hydra_loader() as loader:
            return check_overrides(args, loader)
    kinds = set(registry.group_kinds())
    nested = {k: registry.kind(k).nested_in for k in registry.kinds() if not registry.kind(k).top_level}
    for ov in _parse(args, loader):
        key = ov.key_or_group.lstrip("+~")
        if ov.package or key.startswith("hydra.") or key.startswith("hydra/") and ov.is_delete() or key == "hydra":
            continue
        head, _, sub = key.partition(".")
        if ov.is_delete():
            if head in kinds or head in ROOT_KEYS or head in PRESET_GROUPS or head == "trainer":
                raise registry.ConfigError(
                    f"{ov.input_line}: modforge needs {key}; choose another option or value instead of deleting it")
            continue
        values = _values(ov)
        if head in PRESET_GROUPS and not sub and ov.input_line.startswith("+"):
            raise registry.ConfigError(f"{ov.input_line}: {head} is a config group that always has an option; "
                                       f"choose one with {ov.input_line[1:]} (no +)")
        if key.startswith("hydra/") or (head in PRESET_GROUPS and not sub) or (
                head not in kinds and head not in ROOT_KEYS and head != "trainer" and loader.get_group_options(key)):
            check_preset(key, values, loader)
            continue
        if head in nested:
            raise registry.ConfigError(
                f"{ov.input_line}: {head} is not a config group of its own; choose it with "
                f"{nested[head]}=NAME (options: {', '.join(registry.registry(head).names())})")
        if head == "trainer":
            if sub and "." not in sub:
                check_trainer_key(sub)
            continue
        if head in ("callbacks", "logger"):  # checked by check_callbacks / check_loggers once composed
            continue
        if head in ROOT_KEYS:
            _check_root(ov.input_line, head, sub, values)
            continue
        if head not in kinds:
            known = sorted([*kinds, *ROOT_KEYS, *PRESET_GROUPS])
            raise registry.ConfigError(
                f"{ov.input_line}: '{head}' is not a key or group of modforge's config, so nothing would read it."
                f"{registry.suggest(head, known)} Top-level keys and groups: {', '.join(known)}.")
        reg = registry.registry(head)
        if not sub:
            for v in values:
                if isinstance(v, str):
                    reg.get(v)
        elif "." not in sub:
            fields = sorted({f.name for e in reg.entries() for f in dataclasses.fields(e.config)} | {"name"})
            if sub not in fields:
                raise registry.ConfigError(
                    f"{key}: no {head} option has a key '{sub}'.{registry.suggest(sub, fields)} "
                    f"Keys of {head} options: {', '.join(fields)}."
                )


def _values(ov: Any) -> list:
    """The values an override names (each of a sweep's); [] for a glob, whose names come from the group."""
    from hydra.core.override_parser.types import Glob

    if isinstance(ov.value(), Glob):
        return []
    try:
        return list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
    except Exception:  # noqa: BLE001 - an interval sweep has no list of values; Hydra's sweeper handles it
        return []


def preset_options(group: str, loader: Any = None) -> list[str]:
    """The YAML options of a Hydra config group (modforge's and plugins'), as Hydra itself finds them."""
    if loader is None:
        with hydra_loader() as loader:
            return preset_options(group, loader)
    return [o for o in loader.get_group_options(group) if o != "lightning"]  # trainer/lightning: the schema


def check_preset(group: str, values: list, loader: Any) -> None:
    options = preset_options(group, loader)
    values = [x for v in values for x in (v if isinstance(v, list) else [v])]  # group=[a,b]: several options
    for v in values:
        if v is not None and str(v) not in options:
            raise registry.ConfigError(
                f"Unknown {group} '{v}'.{registry.suggest(str(v), options)} Available {group} options: "
                f"{', '.join(options) or 'none'}.")


def _check_root(line: str, head: str, sub: str, values: list) -> None:
    if sub:
        raise registry.ConfigError(f"{line}: {head} is a value, it has no keys")
    for v in values:
        check_root_value(head, v, line)


def check_root_value(key: str, v: Any, line: str = "") -> None:
    allowed = ROOT_KEYS[key]
    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v)
    if key == "eval_block_sizes" and isinstance(v, list) and not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in v):
        raise registry.ConfigError(f"{line or f'{key}={v}'}: eval_block_sizes must be a list of positive integers "
                                   "(sequence lengths to evaluate at after training), e.g. [128]")
    if key == "matmul_precision" and v is not None and v not in PRECISIONS:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: matmul_precision must be one of {', '.join(PRECISIONS)} "
                                   f"(torch.set_float32_matmul_precision), or null (high on CUDA: TF32; else highest)."
                                   + registry.suggest(str(v), list(PRECISIONS)))
    if not isinstance(v, allowed) or (bool not in allowed and isinstance(v, bool)):
        want = " or ".join(_TYPE_WORDS[t] for t in allowed)
        raise registry.ConfigError(f"{line or f'{key}={v}'}: {key} must be {want}, not {v!r}")
    if key == "seed" and not 0 <= v < 2 ** 32:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: seed must be in [0, 2^32 - 1]")
    if key == "divergence_patience" and v is not None and v < 1:
        raise registry.ConfigError(f"{line or f'{key}={v}'}: divergence_patience must be >= 1 (training batches in a row), "
                                   "or null (never stop)")


def job_overrides(args: list, multirun: bool, loader: Any) -> list[list[str]]:
    """The overrides of each job the command runs: itself, or each job of the sweep (its command-line
    sweeps and the grid an experiment carries in ``hydra.sweeper.params``, crossed with each of its
    ``hydra.sweeper.cells``), expanded as modforge's sweeper does."""
    from modforge import sweep

    args = [a for a in args if ("=" in a or a.startswith("~")) and not a.startswith("-")]
    if not multirun:
        return [args]
    parsed = _parse(args, loader)
    fixed = [ov.input_line for ov in parsed if not ov.is_sweep_override()]
    cfg = compose_job(fixed, hydra=True)
    try:
        return sweep.expand_jobs(cfg.hydra.sweeper.get("cells"), cfg.hydra.sweeper.get("params") or {}, args,
                                 lambda a: _parse(a, loader))
    except registry.ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. an interval, which only a sampling sweeper (Optuna) can use
        raise registry.ConfigError(f"the sweep cannot be expanded into jobs: {one_line(e)} (quote a value with "
                                   "commas, e.g. 'hydra.sweeper.params.norm=\"layer,rms\"'; intervals need a "
                                   "sampling sweeper such as Optuna's)") from None


def compose_job(overrides: list, hydra: bool = False) -> DictConfig:
    """Compose one job's config (its overrides already checked); any composition error is one ConfigError."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from hydra.core.global_hydra import GlobalHydra

    ctx = contextlib.nullcontext() if GlobalHydra.instance().is_initialized() else \
        initialize_config_dir(str(CONF_DIR), version_base="1.3")
    with ctx:
        try:
            return h_compose("train", overrides=list(overrides), return_hydra_config=hydra)
        except (HydraException, OmegaConfBaseException, ValueError, TypeError, AssertionError, KeyError) as e:
            raise registry.ConfigError(one_line(e)) from None


def check_output_dir(path: str, key: str) -> None:
    """The run (or sweep) directory must be creatable: its nearest existing ancestor a writable directory."""
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
    from modforge.monitoring import PROGRESS

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


LOGGER_PACKAGES = {"TensorBoardLogger": ("tensorboard", "tensorboardX"), "MLFlowLogger": ("mlflow",),
                   "WandbLogger": ("wandb",), "CometLogger": ("comet_ml",), "NeptuneLogger": ("neptune",)}


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
    """``key`` must be a Trainer argument that a config may set (see modforge.trainer_schema)."""
    from modforge.trainer_schema import SET_BY_MODFORGE, trainer_arguments

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


def run_dirname(overrides: str, limit: int = 120) -> str:
    """One safe directory name for a sweep job, from Hydra's ``override_dirname``.

    Hydra puts the overrides into the name as they are, so ``data.path=../a/b.txt``
    would nest the job three directories deep and a long sweep line would pass
    the file system's 255-byte limit. Here ``/`` becomes ``_`` and a name longer
    than ``limit`` bytes is cut and ends in a hash of the whole, so names stay distinct.
    """
    name = overrides.replace("/", "_").replace("\\", "_") or "defaults"
    raw = name.encode()
    if len(raw) > limit:  # bytes, not characters: the file system's limit is in bytes
        name = raw[: limit - 9].decode(errors="ignore") + "-" + hashlib.sha256(raw).hexdigest()[:8]
    return name


OmegaConf.register_new_resolver("modforge_dirname", run_dirname, replace=True)
register_resolver()  # ${modforge_new_dir:...}: the default run and sweep directories (modforge.runs)
from modforge import launchers  # noqa: E402
launchers.register_resolvers()  # ${modforge_gpus:...}, ${modforge_tasks:...}: cluster launchers' resources
import modforge.sweep  # noqa: E402,F401 - stores hydra/sweeper=modforge, which conf/train.yaml selects


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain containers, without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def compose(overrides: Optional[list] = None) -> DictConfig:
    """Compose the run config in-process, as ``python -m modforge.train`` would (no output dir); every mistake
    is a one-line ConfigError."""
    load_all()
    overrides = list(overrides or [])
    check_overrides(overrides)
    return compose_job(overrides)


