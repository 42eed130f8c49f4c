"""The config: composition (:mod:`~modforge.config.composition`), the command line's checks
(:mod:`~modforge.config.command_line`) and the composed config's (:mod:`~modforge.config.checks`),
the root keys and the Trainer's schema (:mod:`~modforge.config.schema`), a sweep's jobs
(:mod:`~modforge.config.grid`), Hydra's command-line words (:mod:`~modforge.config.overrides`) and the
directory resolvers (:mod:`~modforge.config.resolvers`).

:func:`compose` is the in-process entry (tests, notebooks): the config ``python -m modforge.train`` would
compose, every mistake a one-line :class:`~modforge.errors.ConfigError`."""
from typing import Optional

from omegaconf import DictConfig

from modforge.config import store
from modforge.config.command_line import check_overrides
from modforge.config.composition import compose_job, load, to_plain  # noqa: F401 - to_plain: public

store.install()  # Hydra's ConfigStore mirrors the registry from here on (the registry knows no Hydra)


def compose(overrides: Optional[list] = None) -> DictConfig:
    """Compose the run config in-process, as ``python -m modforge.train`` would (no output dir); every mistake
    is a one-line ConfigError."""
    load()
    overrides = list(overrides or [])
    check_overrides(overrides)
    return compose_job(overrides)
