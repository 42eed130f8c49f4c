"""The command line's overrides checked before anything is composed: every group, option and key against the
registry and Hydra's groups, with the nearest names suggested (``norm=rmss`` -> "Did you mean 'rms'?")."""
import dataclasses
from typing import Any, Iterable

from modforge import registry
from modforge.config.checks import check_root_value, check_trainer_key
from modforge.config.composition import hydra_loader, parse_overrides, preset_options
from modforge.config.schema import PRESET_GROUPS, ROOT_KEYS


def top_names() -> list:
    """Every top-level key and group of modforge's config (what a command line or a config file may set)."""
    return sorted({*registry.group_kinds(), *ROOT_KEYS, *PRESET_GROUPS, "study"})


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
    parsed = parse_overrides(args, loader)
    given = {ov.key_or_group.lstrip("+~"): ov for ov in parsed if not ov.is_delete()}
    if given.get("resume") and given.get("init_from") and given["resume"].value() and given["init_from"].value():
        raise registry.ConfigError(f"{given['init_from'].input_line} with {given['resume'].input_line}: resume= "
                                   "continues a run (its weights, optimizer and step), init_from= starts a new one "
                                   "from weights; give one of them")
    for ov in parsed:
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
        if head in ("callbacks", "logger", "study"):  # checked once composed (check_callbacks, check_study ...)
            continue
        if head in ROOT_KEYS:
            _check_root(ov.input_line, head, sub, values)
            continue
        if head not in kinds:
            known = top_names()
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
