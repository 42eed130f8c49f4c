"""A study's stages as sweeps: each stage (the probe, a tuning round, a comparison round) is one sweep, run in
this process as ``python -m modforge.train -m`` runs it (:func:`modforge.sweeps.launch.sweep`), in its own
directory under the study's, its jobs listed as cells (one per job, every override explicit) and kept in
``cells.json`` before anything runs. Re-running a stage is re-running its
sweep: finished jobs are skipped, interrupted ones resume from their last checkpoint (:mod:`modforge.sweeps`).
What a stage's jobs ended as is read back with :mod:`modforge.results.jobs`."""
import contextlib
import json
import math
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Optional

from modforge.config.overrides import hydra_value, quoted
from modforge.errors import ConfigError, ModforgeError
from modforge.results.jobs import load_jobs, mark_collapsed, metric_value
from modforge.run.dirs import reached_pause
from modforge.studies.design import PROBE_KEYS, RUNNER_KEYS, Design
from modforge.sweeps.launch import sweep
from modforge.utils.files import read_json, write_json

PROBE_STEPS = 30


class StudyStopped(ModforgeError):
    """A stage that did not end: its jobs failed or it was interrupted. Re-running the command continues."""


@dataclass
class Cell:
    """One job of a stage: what it is in the study, and its overrides."""

    arm: str
    rung: str
    setting: str  # the tuning setting's key ("" for the config's own)
    seed: int
    overrides: dict

    def record(self) -> dict:
        return {"arm": self.arm, "rung": self.rung, "setting": self.setting, "seed": self.seed,
                "overrides": self.overrides}


def cells_argument(cells: list[Cell]) -> str:
    """``hydra.sweeper.cells=[{k:'v',...},...]``: every value quoted, so the override grammar reads it as given."""
    def q(v) -> str:
        return quoted("null" if v is None else ("true" if v is True else "false" if v is False else str(v)))

    return "[" + ",".join("{" + ",".join(f"{k}:{q(v)}" for k, v in c.overrides.items()) + "}" for c in cells) + "]"


def stage_cells(stage_dir: Path, make) -> list[Cell]:
    """The stage's cells as first decided (``cells.json``), or ``make()``'s, now kept there."""
    kept = kept_cells(stage_dir / "cells.json")
    if kept is not None:
        return kept
    cells = make()
    if cells:
        stage_dir.mkdir(parents=True, exist_ok=True)
        write_json(stage_dir / "cells.json", {"cells": [c.record() for c in cells]})
    return cells


def not_written(where: Path, why: str) -> ConfigError:
    """A stage's record the study did not write as it is: one line naming the file and what is wrong."""
    return ConfigError(f"{where}: {why}; this is not a stage the study wrote: give the study a new dir=")


CELL_FIELDS = {f.name: f.type for f in fields(Cell)}  # arm, rung, setting: str; seed: int; overrides: dict
TYPE_WORDS = {str: "a string", int: "a whole number", dict: "a mapping"}


def kept_cells(where: Path) -> Optional[list[Cell]]:
    """A stage's ``cells.json`` as the study writes it, ``{"cells": [...]}`` with one mapping of :class:`Cell`'s
    fields per job (one job at least: a stage without jobs keeps no file), as cells; None when there is none.
    Anything else is one line naming the file and what is wrong."""
    if not where.exists():
        return None
    kept = read_json(where)
    if kept is None:
        raise not_written(where, "not a readable JSON file")
    if not isinstance(kept, dict) or set(kept) != {"cells"}:
        raise not_written(where, f"it holds {short(kept)}, not {{\"cells\": [one mapping per job]}}")
    if not isinstance(kept["cells"], list) or not kept["cells"]:
        raise not_written(where, f"its cells are {short(kept['cells'])}, not a list of one or more jobs")
    cells = []
    for i, c in enumerate(kept["cells"]):
        if not isinstance(c, dict):
            raise not_written(where, f"cell {i} is {short(c)}, not a mapping of {', '.join(CELL_FIELDS)}")
        if set(c) != set(CELL_FIELDS):
            raise not_written(where, f"cell {i} has the keys {', '.join(sorted(map(str, c)))}; a cell has "
                                     f"exactly {', '.join(CELL_FIELDS)}")
        for k, kind in CELL_FIELDS.items():
            if not isinstance(c[k], kind) or isinstance(c[k], bool):
                raise not_written(where, f"cell {i} has {k}={short(c[k])}, not {TYPE_WORDS[kind]}")
        cells.append(Cell(**c))
    return cells


def short(x, width: int = 60) -> str:
    """A record's value as JSON, cut to ``width`` characters: a message's quotation of what a file holds."""
    text = json.dumps(x)
    return text if len(text) <= width else text[:width - 3] + "..."


def design_keys(d: Design) -> set:
    """Every key a cell of this design may set: its arms', rungs' and tuning grid's, the runner's and the probe's,
    and µP's transfer (``param``, ``param.base.*``)."""
    return ({k for ov in (*d.arms.values(), *d.rungs.values()) for k in ov} | set(d.grid) | set(RUNNER_KEYS) |
            set(PROBE_KEYS) | {"param"})


def check_cells(d: Design, stage_dir: Path, cells: list) -> None:
    """A stage's cells (``cells.json``, a file) before they become a command line: each a mapping of keys this
    design sets to plain values, with nothing that builds or resolves, for an arm and a rung of the design; else
    one line naming the cell and what is wrong."""
    from modforge.config.untrusted import check_recorded_override

    allowed = design_keys(d)
    where = stage_dir / "cells.json"
    for i, c in enumerate(cells):
        for k, v in c.overrides.items():
            if not isinstance(k, str) or (k not in allowed and not k.startswith("param.base.")) or \
                    isinstance(v, (dict, list)):
                raise not_written(where, f"cell {i} sets {k}={v!r}, which this study's design does not set (its "
                                         f"keys: {', '.join(sorted(allowed))})")
            check_recorded_override(f"{k}={v}", str(where))
        if c.arm not in d.arms or c.rung not in d.rungs:
            raise not_written(where, f"cell {i} is arm {c.arm!r} at rung {c.rung!r}, which this design does not "
                                     f"have (arms: {', '.join(d.arms)}; rungs: {', '.join(map(repr, d.rungs))})")


class StageClock:
    """Each stage's wall time, in the study's log (``study.json``: ``stage_seconds``), written to disk every
    ``every`` seconds while the stage runs: a sitting that is killed outright (a session's end, SIGKILL) loses at
    most that much of it, not the whole sitting."""

    def __init__(self, study_dir: Path, state: dict, every: float = 30.0, adopter=None):
        self.study_dir, self.state, self.every = study_dir, state, every
        self.adopter = adopter  # this sitting's reuse= (modforge.sweeps.adopt.Adopter), or None
        state.setdefault("stage_seconds", {})

    def add(self, stage_dir: Path, seconds: float) -> None:
        log = self.state["stage_seconds"]
        log[str(stage_dir)] = log.get(str(stage_dir), 0.0) + seconds
        write_log(self.study_dir, self.state)

    @contextlib.contextmanager
    def running(self, stage_dir: Path) -> Iterator[None]:
        """While the stage's sweep runs in this process, its time so far is added to the log every ``every``
        seconds (by a timer thread), and the rest when it ends, however it ends."""
        t, lock, stop = [time.time()], threading.Lock(), threading.Event()

        def tick() -> None:
            with lock:
                now = time.time()
                self.add(stage_dir, now - t[0])
                t[0] = now

        def ticking() -> None:
            while not stop.wait(self.every):
                tick()

        timer = threading.Thread(target=ticking, name="study-clock", daemon=True)
        timer.start()
        try:
            yield
        finally:
            stop.set()
            timer.join()
            tick()


def run_stage(d: Design, stage_dir: Path, cells: list[Cell], jobs: int, clock: StageClock,
              pause: Optional[dict] = None) -> None:
    """Run the stage's sweep (in this process; its console is this one's) unless every job already ended; stop the
    study in one line when a job failed or the sweep was interrupted. ``pause``: {cell index: step}, the cells
    that stop at that step this time (``pause_at``, given on the command line only: a job's name and its cell
    stay the same at every pause); a cell paused there already has ended for this sweep, which skips it."""
    if not cells:
        return
    pause = pause or {}
    check_cells(d, stage_dir, cells)
    results = read_stage(d, stage_dir, cells)
    if all(ended(r, pause.get(i)) for i, r in enumerate(results)):
        return
    pace = ("study.budget", "study.jobs")  # a sitting's own (check_same_study ignores them): not in a job's name
    given = [o for o in d.overrides if not o.lstrip("+~").startswith(pace)]
    sent = [Cell(c.arm, c.rung, c.setting, c.seed, {**c.overrides, **({"pause_at": pause[i]} if i in pause else {})})
            for i, c in enumerate(cells)]
    overrides = [f"experiment={d.experiment}", *given, f"hydra.sweep.dir={hydra_value(str(stage_dir))}",
                 "hydra.sweeper.params=null", f"hydra.sweeper.cells={cells_argument(sent)}"]
    if jobs > 1:
        overrides += ["hydra/launcher=gpus", f"hydra.launcher.devices={jobs}"]
    print(f"[study] {'/'.join(stage_dir.parts[-2:]) if stage_dir.name != 'probe' else 'probe'}: {len(cells)} jobs "
          f"({sum(ended(r, pause.get(i)) for i, r in enumerate(results))} ended before"
          f"{'; pausing at step ' + ', '.join(map(str, sorted(set(pause.values())))) if pause else ''})", flush=True)
    try:
        with clock.running(stage_dir):
            # in this process (hydra/launcher=gpus: a process per job); the probe measures this machine: never adopted
            outcome = sweep(overrides, clock.adopter if stage_dir.name != "probe" else None)
    except ConfigError as e:
        raise StudyStopped(f"{stage_dir}: the sweep did not start: {e}; fix it and run the same command again") \
            from None
    except SystemExit:  # a signal while a job trained: Lightning stopped it (its SIGTERMException, or its exit(1)
        # after a KeyboardInterrupt that came before its own handler was in place); no job of a sweep exits itself
        raise KeyboardInterrupt from None  # the study stops as on Ctrl-C: one line, 128 + the signal
    print(outcome["summary"], flush=True)
    results = read_stage(d, stage_dir, cells)
    failed = [r for i, r in enumerate(results) if not ended(r, pause.get(i))]
    if failed:
        r = failed[0]
        raise StudyStopped(f"{stage_dir}: {len(failed)} of {len(cells)} jobs did not end ({r['name']}: {r['status']}"
                           f"{': ' + r['error'] if r.get('error') else ''}); fix the cause and run the same command "
                           "again (failed jobs run again with retry_failed=true)")


def ended(result: dict, pause: Optional[int] = None) -> bool:
    """A job that needs no more training in this sweep: it finished, collapsed or diverged, or it is to pause at
    step ``pause`` and has paused there (or later)."""
    if result["status"] in ("finished", "collapsed", "diverged"):
        return True
    return result["status"] == "interrupted" and reached_pause(result["pause"], pause)


def read_stage(d: Design, stage_dir: Path, cells: list[Cell]) -> list[dict]:
    """Each cell's job as it stands: {"cell", "status", "value", "metrics", "name", "error", "pause"} in cell
    order (``pause``: a paused job's step and validation there, :func:`modforge.run.dirs.pause_of`)."""
    by_num = {}
    if stage_dir.is_dir():
        jobs = load_jobs(stage_dir)
        mark_collapsed(jobs, float(d.study.get("collapse_tol", 0.02)))
        for j in jobs:
            head = j.name.split("_", 1)[0]
            if head.isdigit():
                by_num[int(head)] = j
    out = []
    for i, c in enumerate(cells):
        j = by_num.get(i)
        if j is not None and j.status != "unreadable":
            check_job(stage_dir, i, c, j)
        status = j.status if j is not None else "unfinished"
        value = metric_value(j.metrics, d.metric) if j is not None and status == "finished" else math.nan
        out.append({"cell": c, "status": status, "value": value, "metrics": (j.metrics or {}) if j else {},
                    "name": j.name if j else f"#{i}", "error": j.error if j else None,
                    "pause": j.pause if j is not None and status == "interrupted" else None})
    return out


def check_job(stage_dir: Path, i: int, c: Cell, j) -> None:
    """A kept job must be its cell's: every key of the cell with the cell's value in the job's recorded
    overrides (a job whose cell was edited afterwards, or that is not this study's, would be read as another
    arm or seed). One line naming the job and the first difference."""
    from modforge.config.grid import cell_overrides
    from modforge.results.jobs import canonical

    def plain(v: str) -> str:
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1].replace("\\'", "'")
        return canonical(v)

    for o in (cell_overrides([c.overrides])[0] if c.overrides else []):
        k, v = o.split("=", 1)
        ran = j.overrides.get(k)
        if ran is None or plain(ran) != plain(v):
            raise ConfigError(f"{stage_dir / j.name}: job #{i} ran {k}={ran if ran is not None else '(not set)'}, "
                              f"but its cell in cells.json says {k}={v}; the stage's record no longer describes "
                              "its runs: give the study a new dir=")


def probe(d: Design, study_dir: Path, clock: StageClock) -> dict:
    """A short run of every arm at every rung (``PROBE_STEPS`` steps, the config's own settings), as the study's
    jobs will run (side by side when they will): {(arm, rung): what it measured}."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in d.overrides}
    quick = {k: False for k in PROBE_KEYS if k not in given}  # no step-0 validation, no sample: not the job's time
    cells = stage_cells(study_dir / "probe", lambda: [
        Cell(arm, rung, "", 0, {**d.arms[arm], **rv, "trainer.max_steps": PROBE_STEPS, "seed": 0, **quick})
        for rung, rv in d.rungs.items() for arm in d.arms])
    check_cells(d, study_dir / "probe", cells)  # what each cell sets first, then that they measure every arm
    unmeasured = [(a, r) for r in d.rungs for a in d.arms if not any((c.arm, c.rung) == (a, r) for c in cells)]
    if unmeasured:
        a, r = unmeasured[0]
        raise not_written(study_dir / "probe" / "cells.json", f"no cell measures arm {a} at {r or 'the config'}")
    print(f"[study] measuring this machine: {len(cells)} runs of {PROBE_STEPS} steps (each arm at each size)",
          flush=True)
    run_stage(d, study_dir / "probe", cells, d.jobs, clock)
    results = read_stage(d, study_dir / "probe", cells)
    check_reported(d.metric, results)
    return {(r["cell"].arm, r["cell"].rung): probe_figures(r["metrics"]) for r in results}


def check_reported(metric: str, results: list) -> None:
    """The study's metric among what the probe's runs report, before anything else trains. (Before any run,
    :func:`modforge.studies.runner.check_metric` holds it to what their tasks declare; a task may declare a
    metric it reports only with some data or settings, e.g. ``val/bpc`` on text.)"""
    reported = sorted({k for r in results if isinstance(r["metrics"].get("val"), dict) for k in r["metrics"]["val"]})
    if reported and metric not in reported:
        raise ConfigError(f"study.metric={metric}: no run of the probe reports it (they report "
                          f"{', '.join(reported)}); declare one of those, and give the study a new dir= (its design "
                          "is fixed once runs have results)")


def probe_figures(m: dict) -> dict:
    """A probe run's metrics as the plan uses them. Its steps run at the steady tokens/s (after the first
    few steps); what the first steps took beyond that is paid once per run, with the other per-run work."""
    sec = m.get("session_seconds") or {}
    steps = max(int(m.get("steps") or PROBE_STEPS), 1)
    tokens_per_step = float(m.get("tokens_seen") or math.nan) / steps
    rate = float(m.get("tokens_per_sec") or math.nan)
    overhead = sum(float(sec.get(k) or 0.0) for k in ("setup", "data", "model", "trainer", "fit_other", "sample"))
    steady = m.get("tokens_per_sec_steady")
    if steady and m.get("train_seconds") and math.isfinite(tokens_per_step):
        overhead += max(0.0, float(m["train_seconds"]) - steps * tokens_per_step / float(steady))
        rate = float(steady)
    return {
        "params": float(m.get("params") or math.nan),
        "params_non_embedding": float(m.get("params_non_embedding") or math.nan),
        "flops_per_token": float(m.get("train_flops_per_token") or math.nan),
        "tokens_per_step": tokens_per_step,
        "tokens_per_sec": rate,
        "eval_seconds": float(sec.get("final_eval") or 0.0),
        "overhead_seconds": overhead,
        "startup_seconds": float(sec.get("before_run") or 0.0),
    }


def run_seconds(p: dict, steps: int, val_every: Optional[int], eval_at_start: bool) -> float:
    """One run's estimated wall time from the probe's measurements: its steps at the measured tokens/s, its
    validations at the measured time of one, and the per-run work around them (start-up not included)."""
    evals = 1 + int(eval_at_start) + (steps // val_every if val_every else 0)
    return steps * p["tokens_per_step"] / p["tokens_per_sec"] + evals * p["eval_seconds"] + p["overhead_seconds"]


MARK = "modforge study"  # study.json's "kind": the directory is a study's (logs written before it: experiment + study)
STUDY_ENTRIES = ("study.json", "study.md", "report.json", "tuning.png", "ladder.png", "boundaries.json", "probe", "tune",
                 "compare")


def read_log(study_dir: Path) -> dict:
    return read_json(study_dir / "study.json") or {}


def owned_log(study_dir: Path) -> dict:
    """The study's log, from a directory the study may write to: a new or empty one, or one a study wrote (its
    ``study.json`` marked as a study's log, and nothing beside it that a study does not write). Anything else (a
    sweep's or a run's directory, a user's own files, a ``study.json`` modforge did not write) is refused in one
    line, before anything is written."""
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"dir={study_dir}: {why}; a study writes only into a new directory or its own: give "
                           "a new dir= (nothing was written)")

    if study_dir.exists() and not study_dir.is_dir():
        raise refuse("a file, not a directory")
    entries = sorted(p.name for p in study_dir.iterdir()) if study_dir.is_dir() else []
    if not entries:
        return {}
    for marker, what in (("multirun.yaml", "a sweep's directory"), ("metrics.json", "a run's directory"),
                         ("config.yaml", "a run's directory"), (".hydra", "a run's directory")):
        if marker in entries:
            raise refuse(f"{what} ({marker} is there)")
    state = read_json(study_dir / "study.json") if "study.json" in entries else None
    if not isinstance(state, dict) or not (state.get("kind") == MARK or {"experiment", "study"} <= set(state)):
        raise refuse("study.json there is not a study's log" if "study.json" in entries else
                     f"it holds files a study did not write ({', '.join(entries[:3])})")
    foreign = [e for e in entries if e not in STUDY_ENTRIES and not e.startswith(".")]
    if foreign:
        raise refuse(f"it holds files a study did not write ({', '.join(foreign[:3])})")
    seconds = state.get("stage_seconds", {})  # the log's own bookkeeping, carried on (the design's: check_same_study)
    if not (isinstance(seconds, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and
                                              math.isfinite(v) and v >= 0 for v in seconds.values())):
        raise refuse(f"study.json there holds stage_seconds={short(seconds)}, not each stage's seconds")
    return state


def write_log(study_dir: Path, state: dict) -> None:
    study_dir.mkdir(parents=True, exist_ok=True)
    write_json(study_dir / "study.json", {"kind": MARK, **state})


def dumps(x) -> str:
    return json.dumps(x, sort_keys=True)
