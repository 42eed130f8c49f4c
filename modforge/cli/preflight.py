"""The pre-flight: before the first job starts, check the command line's words, then plan every job it runs
(:mod:`modforge.sweeps.planning`: each of a sweep's composed, validated and decided from its directory), so that
all mistakes are named at once, in one line each, and no job fails after another has trained."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from modforge import registry
from modforge.config.command_line import check_overrides
from modforge.config.composition import hydra_loader
from modforge.config.overrides import HYDRA_VALUE_FLAGS, config_flags
from modforge.sweeps.clusters import check_launcher_installed, runs_elsewhere
from modforge.sweeps.plan import Plan
from modforge.sweeps.planning import build


@dataclass
class Verdict:
    """What the pre-flight found: the plan of the command's jobs (None where Hydra composes alone:
    ``--config-path``, a DDP rank, an information flag)."""

    plan: Optional[Plan] = None
    notes: list = field(default_factory=list)  # settings legal but probably not meant, printed once each

    @property
    def jobs(self) -> int:
        return len(self.plan.jobs) if self.plan is not None else 0

    @property
    def invalid(self) -> list:
        """[(job overrides, reason)] of the jobs left out (``skip_invalid=true``)."""
        return [(j.overrides, j.why) for j in self.plan.jobs if j.action == "invalid"] if self.plan else []


def preflight(argv: list, multirun: bool) -> Verdict:
    """Check the command line, then plan every job it runs (each of a sweep's) before the first one starts;
    all invalid jobs are named at once."""
    check_launcher_installed(argv)  # hydra/launcher=slurm without its extra: one line naming the extra
    elsewhere = multirun and runs_elsewhere(argv)  # its jobs' devices are checked where they run
    check_words(argv)
    source = config_source(argv)
    if source is None:
        # --config-path: a directory relative to modforge's own module; Hydra composes it, the registry's checks apply
        check_overrides([a for a in argv if a.split("=")[0].lstrip("+~").split(".")[0] in registry.group_kinds()])
        return Verdict()
    with hydra_loader(*source) as loader:
        plan = build(argv, multirun, loader, here=not elsewhere, source=source, flags=config_flags(argv))
    return Verdict(plan, plan.notes)


def check_words(argv: list) -> None:
    """Every word of the command line is ``key=value``, a flag, or a flag's value, and the overrides are one run
    of words (Hydra's parser reads them so: one after a flag that follows another is 'unrecognized')."""
    words, rest, seen, flag_since, split = [], iter(argv), False, None, None
    for a in rest:
        if a.startswith("-"):
            flag_since = a
            if a in HYDRA_VALUE_FLAGS:
                next(rest, None)
        elif "=" not in a and not a.startswith("~") or a.lstrip("+~").startswith("="):
            words.append(a)
        else:
            if seen and flag_since and split is None:
                split = (a, flag_since)
            seen, flag_since = True, None
    if words:
        raise registry.ConfigError(f"'{words[0]}': expected key=value (e.g. norm=rms) or a flag such as -m")
    if split:
        raise registry.ConfigError(f"'{split[0]}' comes after {split[1]}, which follows other overrides: Hydra reads "
                                   "the key=value overrides as one run; put the flags (-m, --config-dir DIR, "
                                   "--config-name NAME) before or after all of them")


def config_source(argv: list) -> Optional[tuple]:
    """``(config_dir, config_name)`` as the command's ``--config-dir`` / ``--config-name`` give them (None, None
    without), refused in one line when the directory does not exist; None for ``--config-path``, which names a
    directory relative to modforge's own module (Hydra composes that one alone)."""
    given: dict = {}
    rest = iter(argv)
    for a in rest:
        name, eq, value = a.partition("=")
        if name in HYDRA_VALUE_FLAGS:
            given[name] = value if eq else next(rest, "")
    if "--config-path" in given or "-cp" in given:
        return None
    config_dir = given.get("--config-dir", given.get("-cd"))
    if config_dir is not None and not Path(config_dir).is_dir():
        raise registry.ConfigError(f"--config-dir {config_dir}: no such directory (give a directory that holds your "
                                   "config groups, e.g. DIR/experiment/NAME.yaml)")
    return config_dir, given.get("--config-name", given.get("-cn"))
