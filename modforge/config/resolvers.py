"""The resolvers modforge's YAML uses to name directories (registered when :mod:`modforge.config` is imported).

* ``${modforge_new_dir:outputs/%Y-%m-%d/%H-%M-%S}`` (the default ``hydra.run.dir`` and ``hydra.sweep.dir``):
  the time-stamped name is claimed with an atomic ``mkdir``, so two commands started in the same second get
  ``…/12-00-00`` and ``…/12-00-00-2``, never one shared directory;
* ``${modforge_dirname:${hydra.job.override_dirname}}``: one safe directory name for a sweep job.

The cluster launchers' resolvers (``modforge_gpus``, ``modforge_tasks``) are theirs: :mod:`modforge.sweeps.clusters`.
"""
import atexit
import contextlib
import hashlib
import os
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf


_CLAIMED: dict[str, str] = {}
_PENDING: list = []  # each claimed directory with the parents made for it, absolute, until removed if empty


def new_dir(pattern: str) -> str:
    """``pattern`` (strftime codes: ``outputs/%Y-%m-%d/%H-%M-%S``) for now, claimed by creating it.

    ``os.mkdir`` fails when another process made the directory first, so the
    name then gets ``-2``, ``-3``, ...: two commands never share one. The result
    is kept for the life of the process (Hydra resolves the directory several
    times). A claimed directory still empty when the process exits (a dry run,
    a refused command) is removed again.
    """
    if pattern not in _CLAIMED:
        base = datetime.now().strftime(pattern)
        made = [p for p in Path(base).parents if str(p) not in ("", ".") and not p.exists()]
        Path(base).parent.mkdir(parents=True, exist_ok=True)
        for i in range(1, 10_000):
            candidate = base if i == 1 else f"{base}-{i}"
            try:
                os.mkdir(candidate)
            except FileExistsError:
                continue
            break
        else:
            raise OSError(f"{base}: no free directory name after 9999 tries")
        _CLAIMED[pattern] = candidate
        paths = [os.path.abspath(candidate), *(os.path.abspath(str(m)) for m in made)]
        _PENDING.append(paths)
        atexit.register(_remove_if_empty, paths)
    return _CLAIMED[pattern]


def _remove_if_empty(paths: list) -> None:
    """The claimed directory and the parents made for it, innermost first, while they are empty."""
    with contextlib.suppress(OSError):
        for p in paths:
            os.rmdir(p)  # only succeeds when empty


def forget_claimed() -> None:
    """A second command in one process (a notebook, a test) claims its own new directory; what the first claimed
    and left empty (a dry run, a refused command) is removed now, as the end of its process would."""
    for paths in _PENDING:
        _remove_if_empty(paths)
    _PENDING.clear()
    _CLAIMED.clear()


def run_dirname(overrides: str, limit: int = 120) -> str:
    """One safe directory name for a sweep job, from Hydra's ``override_dirname``.

    Hydra puts the overrides into the name as they are, so ``data.path=../a/b.txt``
    would nest the job three directories deep and a long sweep line would pass
    the file system's 255-byte limit. Here ``/`` becomes ``_`` and a name longer
    than ``limit`` bytes keeps the whole ``key=value`` pairs that fit (a pair is never cut in the middle, where
    its value would mislead) and ends in a hash of the whole, so names stay distinct.
    """
    name = overrides.replace("/", "_").replace("\\", "_") or "defaults"
    raw = name.encode()
    if len(raw) > limit:  # bytes, not characters: the file system's limit is in bytes
        kept, size = [], 0
        for pair in name.split(","):
            size += len(pair.encode()) + (1 if kept else 0)
            if size > limit - 9:
                break
            kept.append(pair)
        name = ",".join(kept) + "-" + hashlib.sha256(raw).hexdigest()[:8]
    return name


OmegaConf.register_new_resolver("modforge_dirname", run_dirname, replace=True)
OmegaConf.register_new_resolver("modforge_new_dir", new_dir, replace=True, use_cache=True)
