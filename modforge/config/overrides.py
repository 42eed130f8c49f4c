"""Hydra's command-line words as modforge reads and writes them: the flags that take a value, quoting a value
for an override, one sweep job's own command line, the keys a command line sets, a root switch's value."""
import re
from typing import Any, Optional

from modforge.errors import ConfigError

HYDRA_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")

_NOT_FOR_RANKS = ("hydra.sweep.", "hydra.mode=", "hydra.run.dir=", "hydra.job.name=", "hydra.output_subdir=")
HYDRA_MODES = {"--run": ("-r", "--run"), "--multirun": ("-m", "--multirun"), "--cfg": ("-c", "--cfg"),
               "--info": ("-i", "--info"), "--shell-completion": ("-sc", "--shell-completion")}  # one at a time


def check_modes(argv: list) -> None:
    """Hydra runs one mode at a time: two of -r, -m, --cfg, --info, -sc are one line (Hydra's own is a traceback)."""
    given = [m for m, flags in HYDRA_MODES.items() if any(a.split("=")[0] in flags for a in argv)]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: one of {', '.join(HYDRA_MODES)} at a time (to see a sweep's "
                          "jobs without running them: -m ... dry_run=true; one job's config: --cfg job without -m)")


HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc",
                    "--version")  # flags that ask Hydra for information: nothing is run


def job_argv(argv: list, hc: Any) -> list:
    """The command line of one sweep job: Hydra's config flags and hydra.* overrides kept, the sweep replaced
    by the job's own overrides, ``-m`` and the sweep/run directories dropped (Lightning adds the run dir)."""
    hydra_overrides = [o for o in hc.overrides.hydra if not o.lstrip("+~").startswith(_NOT_FOR_RANKS)]
    return [argv[0], *config_flags(argv[1:]), *hydra_overrides, *hc.overrides.task]

def hydra_value(value: str) -> str:
    """``value`` as one Hydra override value (quoted when it holds characters the override grammar reads)."""
    if re.fullmatch(r"[A-Za-z0-9_./@%+:-]+", value):
        return value
    return quoted(value)


def quoted(value: str) -> str:
    """``value`` as a single-quoted Hydra string that reads back as exactly ``value``."""
    # in a quoted value Hydra reads a backslash as an escape only before a quote or at the end: only those double
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def user_override_keys(argv: Optional[list] = None) -> Optional[list]:
    """The keys the user set on the command line (this job's, in a sweep); None when unknown (in-process use:
    the config given is taken as meant, key by key)."""
    if argv is None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        argv = list(HydraConfig.get().overrides.task)
    return [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")]

def flag(argv: list, key: str) -> bool:
    """Whether the command line sets the boolean root key ``key`` to true."""
    return any(a.split("=", 1)[0].lstrip("+") == key and a.split("=", 1)[1].strip().lower() in ("true", "yes", "1")
               for a in argv if "=" in a)


def config_flags(argv: list) -> list:
    """The command's config flags as words (``--config-dir DIR``, ``--config-name=NAME``): a job started as its own
    process gets them."""
    out, rest = [], iter(argv)
    for a in rest:
        if a in HYDRA_VALUE_FLAGS:
            out += [a, next(rest, "")]
        elif a.split("=", 1)[0] in HYDRA_VALUE_FLAGS:
            out.append(a)
    return out
