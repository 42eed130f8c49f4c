"""Adopting runs that already ended elsewhere: a planned job whose directory is new takes a copy of an ended run
(finished or diverged) found under a source directory whose config is the job's, instead of training it again.

"The job's config", compared both ways as a sweep compares a job with the run its directory holds before it
skips or resumes it (:func:`modforge.run.dirs.run_difference`), ignoring the keys that say how a command runs and
not what a run trains (progress bars, logging, the study block: :data:`modforge.run.dirs.HOW_KEYS`): every key the
ended run recorded has the job's value, and every key of the job's that the run did not record (a key added to
modforge after it ran) is at today's default, the value the run trained with (for a component's key, the
default of the run's own option); a job that sets such a key to anything else adopts nothing. A job that is to
pause (``pause_at``: successive halving ranks runs at a step) adopts nothing either.

A run re-run from its config on one machine gives its recorded values to the last digit (``experiments/README.md``,
"Reproducing a cell", and ``experiments/results/recheck_cells.md``), so a copy holds what training the job would
give there, as long as the training code did not change between the two; on another CPU the kernels may round
differently, and each run's ``metrics.json`` records the CPU it trained on. The copy is the run's directory without
its checkpoints, written under a temporary name beside the job's and renamed into place, with Hydra's record
(``.hydra/overrides.yaml``, ``.hydra/config.yaml``) rewritten to the job's, so the sweep that holds it reads as one
experiment, and ``adopted.json`` naming the run it copies, the source directory and the overrides it ran with.
The study runner uses this for a study amended after its results (``python -m modforge.study
experiment=<amended> reuse=<the first study's dir>``); the report counts and names what was adopted."""
import datetime
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from modforge.config.composition import default_config
from modforge.errors import ConfigError
from modforge.run.dirs import FINAL, read_state, run_difference
from modforge.sweeps.planning import job_config
from modforge.utils.files import write_json

ADOPTED = "adopted.json"
PARTIAL = ".adopting-"  # a copy under way: never read as a run (modforge.results.jobs.load_jobs skips it)


class Adopter:
    """The ended runs under ``source`` (read once, when first asked), and what :meth:`adopt` copied from them."""

    def __init__(self, source: Path, default: Optional[Callable[[], dict]] = None):
        self.source = Path(source)
        if not self.source.is_dir():
            raise ConfigError(f"reuse={source}: no such directory (give a directory holding ended runs, e.g. a "
                              "study's, restored with experiments/study_state.py restore)")
        self._index: Optional[list] = None
        self._default, self._default_of = None, default or default_config
        self.adopted: dict = {}  # {job directory: the run it copies}

    def index(self) -> list:
        """[(directory, recorded config)] of every finished or diverged run under the source, in path order (a copy
        another adoption made is a run of its own record too: its config is its job's)."""
        if self._index is None:
            found = []
            for f in sorted(self.source.rglob("config.yaml")):
                d = f.parent
                if d.name == ".hydra" or any(p.startswith(PARTIAL) for p in d.relative_to(self.source).parts):
                    continue
                state = read_state(d, owned=False)
                if state.status in FINAL and state.config is not None:
                    found.append((d, state.config))
            self._index = found
        return self._index

    def default(self) -> dict:
        if self._default is None:
            self._default = self._default_of()
        return self._default

    def match(self, config: dict) -> Optional[Path]:
        """The first ended run whose recorded config is ``config`` both ways, or None."""
        for d, recorded in self.index():
            if not run_difference(recorded, config, self.default, limit=1):
                return d
        return None

    def adopt(self, job) -> bool:
        """A job of a plan (:class:`modforge.sweeps.plan.Job`) that would train from nothing in a new directory:
        copy the matching ended run there and mark the job skipped; True when it did."""
        if job.action != "run" or job.dir is None or job.cfg is None or read_state(job.dir).status != "new":
            return False
        if job.cfg.get("pause_at") is not None:
            return False
        config = job_config(job.cfg)
        src = self.match(config)
        if src is None:
            return False
        dest = Path(job.dir)
        tmp = dest.parent / f"{PARTIAL}{dest.name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("checkpoints"), symlinks=True)
        ran_with = tmp / ".hydra" / "overrides.yaml"
        original = yaml.safe_load(ran_with.read_text(encoding="utf-8")) if ran_with.is_file() else None
        (tmp / ".hydra").mkdir(exist_ok=True)
        ran_with.write_text(yaml.safe_dump([str(o) for o in job.overrides], sort_keys=False), encoding="utf-8")
        (tmp / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        write_json(tmp / ADOPTED, {"from": str(src.resolve()), "source": str(self.source.resolve()),
                                   "overrides_it_ran_with": original,
                                   "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                   "rule": "its recorded config is this job's, both ways (modforge.sweeps.adopt)"})
        if dest.is_dir():  # an empty directory, or Hydra's record only (read_state said: new)
            shutil.rmtree(dest)
        tmp.rename(dest)
        job.action, job.why = "skip", f"adopted from {src}"
        self.adopted[str(dest)] = str(src)
        return True


def adopted_in(root: Path) -> dict:
    """{run directory: its adopted.json} of every adopted run under ``root`` (what the report counts: the files
    are the record, whatever became of the sitting that copied them)."""
    from modforge.utils.files import read_json

    out = {}
    for f in sorted(Path(root).rglob(ADOPTED)):
        if any(p.startswith(PARTIAL) for p in f.relative_to(root).parts):
            continue
        rec = read_json(f)
        if isinstance(rec, dict):
            out[str(f.parent)] = rec
    return out
