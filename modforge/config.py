"""Config plumbing shared by the entry points: where the YAML lives, checking the
command line against the registry, and composing in-process (tests, notebooks)."""
import dataclasses
import hashlib
from pathlib import Path
from typing import Iterable, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.builtins import load_all

_PKG_CONF = Path(__file__).resolve().parent / "conf"  # in an installed wheel
_SRC_CONF = Path(__file__).resolve().parent.parent / "conf"  # in a source checkout / editable install
CONF_DIR = _PKG_CONF if (_PKG_CONF / "train.yaml").exists() else _SRC_CONF


def check_overrides(args: Iterable[str]) -> None:
    """Fail early, with suggestions, on unknown component names and keys in command-line overrides.

    ``norm=rmss`` -> "Unknown norm 'rmss'. Did you mean 'rms'? ..."; also inside
    sweeps (``norm=layer,rmss``). ``norm.epz=1`` -> the keys any norm accepts.
    Everything else is left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in args if "=" in a and not a.startswith("-")]
    if not args:
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors
        return
    kinds = set(registry.group_kinds())
    nested = {k: registry.kind(k).nested_in for k in registry.kinds() if not registry.kind(k).top_level}
    for ov in overrides:
        key = ov.key_or_group.lstrip("+~")
        if ov.is_delete() or ov.package:
            continue
        head, _, sub = key.partition(".")
        if head in nested:
            raise registry.ConfigError(
                f"{ov.input_line}: {head} is not a config group of its own; choose it with "
                f"{nested[head]}=NAME (options: {', '.join(registry.registry(head).names())})")
        if head == "trainer" and sub and "." not in sub and not key.startswith("trainer/"):
            check_trainer_key(sub)
            continue
        if head not in kinds:
            continue
        reg = registry.registry(head)
        if not sub:
            values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
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


def check_trainer_key(key: str) -> None:
    """``key`` must be a Trainer argument that a config may set (see modforge.trainer_schema)."""
    from modforge.trainer_schema import SET_BY_MODFORGE, trainer_arguments

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


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain containers, without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def compose(overrides: Optional[list] = None, config_name: str = "train") -> DictConfig:
    """Compose the run config in-process, as ``python -m modforge.train`` would (no output dir)."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir

    load_all()
    overrides = list(overrides or [])
    check_overrides(overrides)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return h_compose(config_name, overrides=overrides, return_hydra_config=False)


