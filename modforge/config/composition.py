"""Composing a job's config with Hydra: where the YAML lives, Hydra's config loader over modforge's search
path, one job composed in-process, Hydra's multi-line errors as one line. The checks are
:mod:`modforge.config.checks`'; the public in-process entry is :func:`modforge.config.compose`."""
import contextlib
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.config import resolvers  # noqa: F401 - the YAML's ${modforge_new_dir:...}, ${modforge_dirname:...}
from modforge.config.schema import store_trainer_schema
from modforge.plugins import load_all
from modforge.utils import readers

_PKG_CONF = Path(__file__).resolve().parent.parent / "conf"  # in an installed wheel
_SRC_CONF = Path(__file__).resolve().parent.parent.parent / "conf"  # in a source checkout / editable install
CONF_DIR = _PKG_CONF if (_PKG_CONF / "train.yaml").exists() else _SRC_CONF


def load() -> None:
    """Everything Hydra composes from: the registry (built-ins, then plugins) and the Trainer's schema."""
    load_all()
    store_trainer_schema()


_PRIMARY: ContextVar = ContextVar("modforge_primary_config", default="train")  # the command's --config-name
JOB_NAME = "train"  # hydra.job.name, as python -m modforge.train names it (its log: train.log)


@contextlib.contextmanager
def hydra_loader(config_dir: Optional[str] = None, config_name: Optional[str] = None) -> Iterator[Any]:
    """Hydra's config loader over modforge's search path (plugins' YAML included), for the checks below; with
    the command's ``--config-dir`` added where Hydra adds it (before the schema source) and its
    ``--config-name`` as the primary config that :func:`compose_job` composes inside this block."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    load()
    if GlobalHydra.instance().is_initialized():  # left over by an app that exited (in-process use)
        GlobalHydra.instance().clear()
    token = _PRIMARY.set(config_name or "train")
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name=JOB_NAME):  # restores Hydra's global state after
            if config_dir is not None:
                _add_config_dir(config_dir)
            yield GlobalHydra.instance().config_loader()
    finally:
        _PRIMARY.reset(token)


def _add_config_dir(config_dir: str) -> None:
    """Re-create Hydra's global state with ``config_dir`` in the search path, as ``--config-dir`` puts it
    (``hydra._internal.utils.run_hydra``: prepended before the schema source)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    csp = create_config_search_path(search_path_dir=str(CONF_DIR))
    csp.prepend(provider="command-line", path=f"file://{os.path.abspath(config_dir)}",
                anchor=SearchPathQuery(provider="schema"))
    GlobalHydra.instance().clear()
    Hydra.create_main_hydra2(task_name=JOB_NAME, config_search_path=csp)

def one_line(e: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages as one line (what they say, without their key dumps): which
    config file, which key, what is wrong."""
    skip = ("full_key:", "object_type", "reference_type", "Set the environment variable", "Traceback", "See https://",
            "None")
    chain, seen = [], set()
    while e is not None and id(e) not in seen:  # Hydra's message, then the OmegaConf error that caused it
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = "\n".join(str(x) for x in chain)
    if m := re.search(r"Could not find '([^']+)'\s*Available options in '([^']+)':\n((?:\t.*\n?)*)", text):
        return f"could not find '{m.group(1)}' (the options of {m.group(2)}: " \
               f"{', '.join(x.strip() for x in m.group(3).splitlines() if x.strip())})"
    if m := re.search(r"Cannot find primary config '([^']*)'", text):
        return f"--config-name {m.group(1)}: no such primary config (it names NAME.yaml at the top of conf/ or of " \
               "--config-dir; modforge's own is train)"
    lines = [ln.strip() for x in chain for ln in str(x).splitlines()
             if ln.strip() and not ln.strip().startswith(skip) and "$VALUE" not in ln]
    lines = [ln for ln in dict.fromkeys(lines) if not ln.startswith("To append to your config use")]
    prefix = ""
    if lines and (m := re.fullmatch(r"In '([^']+)': \w+ raised while composing config:", lines[0])):
        prefix, lines = f"in {m.group(1)}: ", lines[1:]  # the file the error is in, then what is wrong in it
    key = next((x.full_key for x in chain if getattr(x, "full_key", None)), None)
    if key and prefix:
        prefix += f"{key}: "
    if lines and lines[0].startswith("Could not override"):  # the key exists for other options of the group
        lines[0] += " It is not a key of the option chosen in its group; python -m modforge list shows each option's keys."
    return prefix + ("; ".join(lines[:2]) or "invalid configuration")

def parse_overrides(args: list, loader: Any = None) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create(config_loader=loader).parse_overrides(args)
    except HydraException as e:
        odd = [a for a in args if not a.isascii() or " " in a or "\t" in a]
        hint = (f" (quote the value: '{odd[0].split('=', 1)[0]}=\"{odd[0].split('=', 1)[-1]}\"'; Hydra's override "
                "grammar reads spaces and non-ASCII characters only inside quotes)") if odd else ""
        raise registry.ConfigError(f"not a valid override: {one_line(e)}{hint}") from None

def preset_options(group: str, loader: Any = None) -> list[str]:
    """The YAML options of a Hydra config group (modforge's and plugins'), as Hydra itself finds them."""
    if loader is None:
        with hydra_loader() as loader:
            return preset_options(group, loader)
    return [o for o in loader.get_group_options(group) if o != "lightning"]  # trainer/lightning: the schema

def compose_job(overrides: list, hydra: bool = False) -> DictConfig:
    """Compose one job's config (its overrides already checked); any composition error is one ConfigError."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir

    from hydra.core.global_hydra import GlobalHydra

    ctx = contextlib.nullcontext() if GlobalHydra.instance().is_initialized() else \
        initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name=JOB_NAME)
    with ctx, composing():
        return h_compose(_PRIMARY.get(), overrides=list(overrides), return_hydra_config=hydra)


def compose_command(loader: Any, overrides: list, multirun: bool) -> DictConfig:
    """The command's config as Hydra's app composes it, its ``hydra`` node included: a single run's job, or a
    sweep's own config (each job is then :func:`compose_sweep_job`); composition errors are one ConfigError."""
    from hydra.types import RunMode

    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    with composing():
        return loader.load_configuration(_PRIMARY.get(), overrides=[*overrides, f"hydra.mode={mode.name}"],
                                         run_mode=mode)


def compose_sweep_job(loader: Any, sweep_cfg: DictConfig, overrides: list, num: int) -> DictConfig:
    """Job ``num`` of a sweep, as Hydra's launchers compose it (the sweep's hydra overrides, then the job's)."""
    from omegaconf import open_dict

    with composing():
        cfg = loader.load_sweep_config(sweep_cfg, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.id = num
        cfg.hydra.job.num = num
    return cfg


@contextlib.contextmanager
def composing() -> Iterator[None]:
    """Hydra's, OmegaConf's and YAML's errors while composing, as one ConfigError line each."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except UnicodeDecodeError as e:  # Hydra read a YAML file that is not UTF-8, and does not say which
        raise registry.ConfigError(f"{not_utf8() or 'a config file'}: not UTF-8 text ({e.reason} at byte "
                                   f"{e.start}); save it as UTF-8") from None
    except (HydraException, OmegaConfBaseException, ValueError, TypeError, AssertionError, KeyError) as e:
        raise registry.ConfigError(one_line(e)) from None
    except yaml.YAMLError as e:  # a config file (an experiment, a preset) that is not valid YAML
        raise registry.ConfigError(readers.yaml_error(e)) from None

def not_utf8() -> Optional[str]:
    """The first YAML file in the search path's directories that is not UTF-8 (None if none is)."""
    from hydra.core.global_hydra import GlobalHydra

    for source in GlobalHydra.instance().config_loader().get_sources():
        if source.scheme() != "file":
            continue
        for f in sorted(Path(source.path).rglob("*.yaml")):
            try:
                f.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                return str(f)
            except OSError:
                continue
    return None

def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain containers, without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def default_config() -> dict:
    """Today's default run config, as a run records it: what a run that predates a key trained with there
    (:func:`modforge.run.dirs.run_difference`). modforge's own primary config, whatever the command's
    ``--config-name``: the defaults a run falls back on are modforge's."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    load()
    ctx = contextlib.nullcontext() if GlobalHydra.instance().is_initialized() else \
        initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name=JOB_NAME)
    try:
        with ctx, composing():
            return to_plain(h_compose("train", overrides=[]))
    except registry.ConfigError as e:
        raise registry.ConfigError(f"cannot compose modforge's default config to compare a saved run's with ({e})") \
            from None
