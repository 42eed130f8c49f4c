"""Adopting runs that already ended elsewhere: a planned job whose directory is new takes a copy of an ended run
(finished or diverged) found under a source directory whose config is the job's, instead of training it again.

"The job's config" is the comparison a sweep makes before it skips or resumes a job in place
(:func:`modforge.run.dirs.config_difference`): every key the ended run recorded, with the same value, ignoring the
keys that say how a command runs and not what a run trains (progress bars, logging, the study block). A run
recorded before a key existed is read with that key at today's default, as a resumed run is. A run re-run from
its config on one machine gives its recorded values to the last digit (``experiments/README.md``, "Reproducing a
cell", and ``experiments/results/recheck_cells.md``), so the copy holds what training the job would give there;
on another CPU the kernels may round differently, and each run's ``metrics.json`` records the CPU it trained on.

The copy is the run's directory without its checkpoints, written under a temporary name and renamed into place,
with ``adopted.json`` beside its records naming the run it copies. The study runner uses this for a study
amended after its results (``python -m modforge.study experiment=<amended> reuse=<the first study's dir>``); the
report counts and names what was adopted."""
import datetime
import shutil
from pathlib import Path
from typing import Any, Optional

from modforge.errors import ConfigError
from modforge.run.dirs import FINAL, config_difference, read_state
from modforge.utils.files import write_json

ADOPTED = "adopted.json"


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class Adopter:
    """The ended runs under ``source`` (read once, when first asked), and what :meth:`adopt` copied from them."""

    def __init__(self, source: Path):
        self.source = Path(source)
        if not self.source.is_dir():
            raise ConfigError(f"reuse={source}: no such directory (give a directory holding ended runs, e.g. a "
                              "study's, restored with experiments/study_state.py restore)")
        self._index: Optional[list] = None
        self.adopted: dict = {}  # {job directory: the run it copies}

    def index(self) -> list:
        """[(directory, recorded config)] of every finished or diverged run under the source, in path order."""
        if self._index is None:
            found = []
            for f in sorted(self.source.rglob("config.yaml")):
                d = f.parent
                if d.name == ".hydra" or (d / ADOPTED).is_file():  # Hydra's copy; a copy of a copy names the first
                    continue
                state = read_state(d, owned=False)
                if state.status in FINAL and state.config is not None:
                    found.append((d, state.config))
            self._index = found
        return self._index

    def match(self, config: dict) -> Optional[Path]:
        """The first ended run whose recorded config is ``config`` (as a sweep compares them), or None."""
        for d, recorded in self.index():
            if not config_difference(recorded, config, limit=1):
                return d
        return None

    def adopt(self, job) -> bool:
        """A job of a plan (:class:`modforge.sweeps.plan.Job`) that would train from nothing in a new directory:
        copy the matching ended run there and mark the job skipped; True when it did."""
        if job.action != "run" or job.dir is None or job.cfg is None or read_state(job.dir).status != "new":
            return False
        config = {k: _plain(job.cfg[k]) for k in job.cfg if k != "hydra"}
        src = self.match(config)
        if src is None:
            return False
        dest = Path(job.dir)
        tmp = dest.parent / f".adopting-{dest.name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("checkpoints"), symlinks=True)
        write_json(tmp / ADOPTED, {"from": str(src.resolve()),
                                   "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                   "rule": "its recorded config is this job's (modforge.run.dirs.config_difference)"})
        if dest.is_dir():  # an empty directory Hydra or an interrupted copy left (read_state said: new)
            shutil.rmtree(dest)
        tmp.rename(dest)
        job.action, job.why = "skip", f"adopted from {src}"
        self.adopted[str(dest)] = str(src)
        return True
