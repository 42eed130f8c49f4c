"""Composing a job's config with Hydra: where the YAML lives, Hydra's config loader over modforge's search
path, one job composed in-process, Hydra's multi-line errors as one line. The checks are
:mod:`modforge.config.checks`'; the public in-process entry is :func:`modforge.config.compose`."""
import contextlib
from pathlib import Path
from typing import Any, Iterator

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


@contextlib.contextmanager
def hydra_loader() -> Iterator[Any]:
    """Hydra's config loader over modforge's search path (plugins' YAML included), for the checks below."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    load()
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
        lines[0] += " It is not a key of the option chosen in its group; python -m modforge list shows each option's keys."
    return "; ".join(lines[:2]) or "invalid configuration"

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
        except yaml.YAMLError as e:  # a config file (an experiment, a preset) that is not valid YAML
            raise registry.ConfigError(readers.yaml_error(e)) from None

def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain containers, without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d
