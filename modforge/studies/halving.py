"""Successive halving of a tuning round (``study.tune.halving``; Jamieson & Talwalkar 2016, Li et al. 2017).

Every setting of the round trains to a first pause (a fraction ``at`` of its steps, at a validation); per arm and
rung, the settings are ranked by the mean of the study's metric there over the tuning seeds, and only the
better part (``keep``, never fewer than ``least``) trains on to the next pause, and so on to the end. The rest
stop where they paused: each keeps its checkpoint, so it can still be continued, exactly as if it never paused
(``pause_at``, :mod:`modforge.run.story`).

What is kept, per slice of the grid's other keys: the kept rates of the rate being fitted (``study.tune.key``)
widened to one unbroken run of the grid, plus the best rate's neighbours on both sides, so that the fitted
valley has its best point and both sides. A run that diverged before a pause ranks last.

After the last pause the fit rule (:mod:`modforge.studies.lrfit`) sees only runs that finished; where its best
rate is the last finished one of a slice and a stopped rate lies beyond it, that rate is continued to the end
and the fit made again (:func:`revivals`): a curve's minimum is never decided by a run that stopped early. Runs
stop early only for being worse part way; a short-horizon ranking favours larger rates (Wu et al. 2018), which
the revival undoes where it matters (beside the best). What this does *not* see: a stopped rate's failures
after its pause, so the failure model counts a stopped run as neither failed nor stable.

The round's record of each pause is ``halving.json`` beside its ``cells.json``: a resumed study reads it and
decides nothing twice."""
import math
from pathlib import Path
from typing import Optional

from modforge.errors import ConfigError
from modforge.studies import tuning
from modforge.utils.files import read_json, write_json

def schedule(d) -> Optional[dict]:
    """The design's halving as checked (``study.tune.halving``: {at, keep, least}), or None when it does not
    halve."""
    return (d.study.get("tune") or {}).get("halving") or None


def pause_steps(fracs: list, steps: int, every: int) -> list:
    """Each pause's step: the validation nearest ``frac`` of ``steps`` (every ``every`` steps), at least one."""
    return [max(every, round(f * steps / every) * every) for f in fracs]


def check(d, steps: dict, val_every: dict) -> None:
    """Every arm and rung that is tuned can pause at each of ``at`` (a validation before its last step, the pauses
    in order and apart); one line naming the key, the value and what is allowed, before any tuning run."""
    h = schedule(d)
    if h is None:
        return
    for (arm, rung), n in steps.items():
        if rung not in d.tuned_rungs_of(arm):
            continue
        where = f"{arm}{f' at {rung}' if rung else ''}"
        every = val_every.get((arm, rung))
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"study.tune.halving: runs pause at a validation, and {where} validates every "
                              f"trainer.val_check_interval={d.setting_of(arm, rung, 'trainer.val_check_interval')}, "
                              "not a number of steps: give it in steps")
        got = pause_steps(h["at"], n, every)
        if got[-1] >= n or len(set(got)) < len(got):
            raise ConfigError(f"study.tune.halving.at={h['at']}: {where} trains {n} steps and validates every "
                              f"{every}, so its pauses would be at steps {got}; each must be a different validation "
                              f"before step {n} (fewer or smaller fractions, or a smaller val_check_interval)")


def survivors(ranked: dict, known: dict, key: str, keep: float, least: int) -> list:
    """The settings that train on past a pause. ``ranked``: {setting key: score, lower is better (inf: failed)},
    ``known``: {setting key: setting}. The best ``max(least, ceil(keep n))``, then per slice of the other keys,
    widened to an unbroken run of that slice's rates and to the best rate's neighbours."""
    n = len(ranked)
    order = sorted(ranked, key=lambda k: (ranked[k], list(ranked).index(k)))
    top = set(order[:min(n, max(least, math.ceil(keep * n)))])
    slices: dict = {}
    for k in ranked:
        others = repr(sorted((kk, v) for kk, v in known[k].items() if kk != key))
        slices.setdefault(others, []).append(k)
    out = set()
    for members in slices.values():
        members.sort(key=lambda k: float(known[k][key]))
        kept = [i for i, k in enumerate(members) if k in top]
        if not kept:
            continue
        best = min(kept, key=lambda i: (ranked[members[i]], i))
        lo, hi = min(kept[0], best - 1), max(kept[-1], best + 1)
        out.update(members[max(0, lo):hi + 1])
    return [k for k in ranked if k in out]


def score(result: dict, metric: str, better: str) -> float:
    """A run's score at its pause, lower is better; a run that failed before it (or recorded no metric) is inf."""
    if result["status"] in ("diverged", "collapsed", "failed"):
        return math.inf
    v = ((result.get("pause") or {}).get("val") or {}).get(metric) if result["status"] == "interrupted" else None
    if v is None and result["status"] == "finished":
        v = (result["metrics"].get("val") or {}).get(metric)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return math.inf
    return float(v) if better == "min" else -float(v)


class Halving:
    """A tuning round run by successive halving: its cells, each cell's pauses, and the record so far."""

    def __init__(self, d, stage: Path, cells: list, steps: dict, val_every: dict):
        self.d, self.stage, self.cells = d, Path(stage), cells
        self.h = schedule(d)
        self.pauses = [pause_steps(self.h["at"], steps[(c.arm, c.rung)], val_every[(c.arm, c.rung)]) for c in cells]
        self.path = self.stage / "halving.json"
        kept = read_json(self.path) if self.path.exists() else None
        self.record = kept if isinstance(kept, dict) else {"at": self.h["at"], "steps": self.pauses, "pauses": [],
                                                           "revived": []}
        if self.record.get("at") != self.h["at"] or self.record.get("steps", self.pauses) != self.pauses or \
                not isinstance(self.record.get("pauses"), list):
            raise ConfigError(f"{self.path}: it records halving at {self.record.get('at')} (steps "
                              f"{self.record.get('steps')}), the study now pauses at {self.h['at']} (steps "
                              f"{self.pauses}); a round's pauses are fixed once it ran: give the study a new dir=")

    def stopped(self) -> dict:
        """{cell index: the step it stopped at}: cells not kept at some pause, and not continued since."""
        out: dict = {}
        active = set(range(len(self.cells)))
        for j, p in enumerate(self.record["pauses"]):
            for i in active - set(p["kept"]):
                out[i] = self.pauses[i][j]
            active &= set(p["kept"])
        for i in self.record["revived"]:
            out.pop(i, None)
        return out

    def run(self, run_stage, read_stage) -> None:
        """Every pause not yet decided, then the survivors to the end (``run_stage(pause)`` runs the round's sweep
        with {cell: pause step}; ``read_stage()`` reads its jobs)."""
        d = self.d
        for j in range(len(self.record["pauses"]), len(self.h["at"])):
            stopped = self.stopped()
            pause = {**stopped, **{i: self.pauses[i][j] for i in range(len(self.cells)) if i not in stopped}}
            run_stage(pause)
            results = read_stage()
            active = [results[i] for i in range(len(self.cells)) if i not in stopped]
            if active and all(r["status"] == "interrupted" and d.metric not in ((r["pause"] or {}).get("val") or {})
                              for r in active):
                raise ConfigError(f"study.tune.halving: no run recorded {d.metric} at its pause (step "
                                  f"{self.pauses[0][j]}); halving ranks rates by a metric of every validation "
                                  "(a val/ metric the task logs there)")
            kept, ranks = [], []
            for (arm, rung), idx in self.groups(set(range(len(self.cells))) - set(stopped)).items():
                by_setting: dict = {}
                for i in idx:
                    by_setting.setdefault(self.cells[i].setting, []).append(score(results[i], d.metric, d.better))
                ranked = {k: (sum(v) / len(v)) for k, v in by_setting.items()}
                known = {self.cells[i].setting: {k: self.cells[i].overrides[k] for k in d.grid} for i in idx}
                keep = set(survivors(ranked, known, d.fit["key"], self.h["keep"], self.h["least"]))
                kept += [i for i in idx if self.cells[i].setting in keep]
                sign = 1.0 if d.better == "min" else -1.0
                ranks.append({"arm": arm, "rung": rung, "step": self.pauses[idx[0]][j],
                              "settings": {k: sign * v if math.isfinite(v) else None for k, v in ranked.items()},
                              "kept": sorted(keep, key=list(ranked).index)})
            self.record["pauses"].append({"kept": sorted(kept), "ranks": ranks})
            write_json(self.path, self.record)
        run_stage(self.stopped())

    def groups(self, idx: set) -> dict:
        out: dict = {}
        for i in sorted(idx):
            out.setdefault((self.cells[i].arm, self.cells[i].rung), []).append(i)
        return out

    def revive(self, cells_of: list) -> None:
        """Continue these stopped cells to the end from now on (kept in the record)."""
        self.record["revived"] = sorted({*self.record["revived"], *cells_of})
        write_json(self.path, self.record)

    def saved(self) -> dict:
        """What halving saved: {"runs", "stopped", "revived", "steps", "full_steps"} over the round's cells (steps
        trained, and what training every cell to its end would have taken)."""
        stopped = self.stopped()
        full = [int(c.overrides["trainer.max_steps"]) for c in self.cells]
        return {"runs": len(self.cells), "stopped": len(stopped), "revived": len(self.record["revived"]),
                "steps": sum(stopped.get(i, n) for i, n in enumerate(full)), "full_steps": sum(full)}


def expected_share(h: dict, n: int) -> float:
    """The share of a round's training steps that halving spends on ``n`` settings of one arm and rung, when no
    neighbour widens what is kept and nothing is continued (the plan's least)."""
    k, share, last = n, 0.0, 0.0
    for f in h["at"]:
        share += (f - last) * k
        k, last = min(k, max(h["least"], math.ceil(h["keep"] * k))), f
    return (share + (1 - last) * k) / n if n else 1.0


def revivals(h: Halving, fits: dict, known: dict, key: str) -> list:
    """The stopped cells to continue after a fit: per arm and rung, where the chosen slice's best finished rate is
    its lowest or highest finished one (or no finished rate is stable: below), the nearest stopped rate beyond it
    in that slice (every seed of it). -> cell indices."""
    stopped = h.stopped()
    out = []
    for (arm, rung), ch in fits.items():
        v = ch.valley
        side = "low" if not v.stable else (v.edge if not v.bracketed else None)
        if side is None or not v.points:
            continue
        others = next((o for o, sv in ch.slices.values() if sv is v), {})
        done = [x for x, _, _ in v.points]
        edge = min(done) if side == "low" else max(done)
        beyond = []
        for i in stopped:
            c = h.cells[i]
            s = known.get(c.setting) or {k: c.overrides[k] for k in h.d.grid}
            if (c.arm, c.rung) != (arm, rung) or any(not tuning._same(s.get(k), w) for k, w in others.items()):
                continue
            x = math.log2(float(s[key]))
            if (x < edge) if side == "low" else (x > edge):
                beyond.append((abs(x - edge), c.setting, i))
        if beyond:
            nearest = min(beyond)[1]
            out += [i for _, s, i in beyond if s == nearest]
    return sorted(out)
