"""The front door of ``python -m modforge.train``: its help and its Tab completion, without torch or Lightning.

Both answer from the registry's data (:mod:`modforge.cli.manifest`), so they take a
fraction of a second. Hydra's own help would compose every group (seconds), and
Hydra's bash completion only knows ``python <script file>``, not ``python -m``.
"""
import os
from typing import Optional

from modforge.cli.command import wants_help
from modforge.config.schema import PRESET_GROUPS

TRAIN_HELP = """python -m modforge.train [-m] [group=option ...] [key=value ...]   (also: modforge-train)

Train one configuration, or with -m a sweep of them (the cross product of comma lists, or an experiment's
grid). Every run writes config.yaml, checkpoints/, logs/metrics.csv and metrics.json into its directory
(outputs/<date>/<time>, a sweep's job under multirun/<date>/<time>/); a bad value is one line, before any work.

Examples:
  python -m modforge.train                                      the default: a small decoder on the Python stdlib
  python -m modforge.train norm=rms ffn=swiglu pos=rope          swap components
  python -m modforge.train experiment=shakespeare_char           a preset (nanoGPT's character-level recipe)
  python -m modforge.train -m norm=layer,rms seed=1,2,3          a sweep; then python -m modforge.report <its dir>
  python -m modforge.train -m resume=multirun/<date>/<time>      continue a sweep (retry_failed=true: failed jobs too)
  python -m modforge.train resume=outputs/<date>/<time>          continue a run in its directory, exactly
  python -m modforge.train -m norm=layer,rms dry_run=true        the jobs and their directories, nothing trained

== Configuration groups ==
{groups}

== Keys of the run ==
seed, resume, pause_at, eval_at_start, eval_block_sizes, eval_stride, eval_by_position, sample, compile, divergence_patience, and for sweeps
dry_run, skip_invalid, retry_failed
(conf/train.yaml says what each does); trainer.<any lightning.Trainer argument>; <group>.<parameter>

More: python -m modforge list [KIND [NAME]]   every option with its parameters and defaults
      python -m modforge.train --cfg job       the composed config;  --hydra-help: Hydra's own flags
      eval "$(python -m modforge.train -sc install=bash)"   Tab completion, for python -m modforge.train
"""


BASH_COMPLETION = r"""# Tab completion for `python -m modforge.train ...` and `modforge-train ...` (bash).
# Install: eval "$(python -m modforge.train -sc install=bash)"   (e.g. in ~/.bashrc)
_modforge_train_complete() {
    case "$COMP_LINE" in
        *"-m modforge.train"*|modforge-train*) ;;
        *) return 0 ;;
    esac
    local words=($COMP_LINE) choices word
    choices=$(COMP_LINE="$COMP_LINE" COMP_POINT="$COMP_POINT" python -m modforge.train -sc query=bash 2>/dev/null)
    word=${words[$COMP_CWORD]}
    [[ "$COMP_LINE" == *" " ]] && word=""
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "$word"))
}
complete -o nospace -o default -F _modforge_train_complete python python3 modforge-train
"""


def completion_request(argv: list) -> Optional[str]:
    """The value of ``-sc``/``--shell-completion`` (``install=bash``, ``query=bash`` ...), or None."""
    for i, a in enumerate(argv):
        if a in ("-sc", "--shell-completion") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--shell-completion="):
            return a.split("=", 1)[1]
    return None


def as_hydra_completion_line() -> None:
    """Hydra's completion reads ``$COMP_LINE`` as "<program> <overrides>": ``python -m modforge.train`` is
    rewritten to one word, so completion works for the README's invocation too."""
    import re

    line = os.environ.get("COMP_LINE", "")
    m = re.match(r"\s*\S*python[\d.]*\s+-m\s+modforge\.train", line)
    if m:
        os.environ["COMP_LINE"] = "modforge-train" + line[m.end():]
        point = int(os.environ.get("COMP_POINT", len(line)))
        os.environ["COMP_POINT"] = str(max(0, point - m.end() + len("modforge-train")))


def train_help(data: dict) -> str:
    """The command's help from the registry's data (the cached manifest: no torch, no Hydra composition)."""
    from modforge.cli import manifest

    lines = [f"{k}: {', '.join(e['name'] for e in v['entries'])}" for k, v in data["kinds"].items() if v["top_level"]]
    lines += [f"{g}: {', '.join(manifest.preset_options(data, g))}" for g in PRESET_GROUPS]
    return TRAIN_HELP.format(groups="\n".join(lines))


def answer(argv: list, cached: Optional[dict]) -> bool:
    """Answer ``--help`` and ``-sc install=bash`` (True: done); ready a completion query for Hydra."""
    from modforge.cli import manifest

    if wants_help(argv):
        print(train_help(cached or manifest.of_registry()))
        return True
    shell = completion_request(argv)
    if shell is not None and shell.startswith("install=bash"):
        print(BASH_COMPLETION, end="")
        return True
    if shell is not None and shell.startswith("query="):
        as_hydra_completion_line()
    return False
