"""Successive halving of a study's tuning round (modforge.studies.halving): on planted curves (a valley whose
part-way optimum sits at larger rates than its final one, as short runs favour), without training; its study
keys checked in one line; end to end on a toy study (slow)."""
import json
import math
import random
import re
from pathlib import Path

import pytest

from conftest import run_module
from modforge.errors import ConfigError
from modforge.studies import halving, lrfit, rounds, stages, tuning
from modforge.studies.design import design_of

BLOCK = {"question": "q?", "baseline": "norm=layer", "compare": ["norm=rms"]}
GRID = [round(0.001 * 2 ** (i / 2), 6) for i in range(8)]  # eight rates, sqrt(2) apart: 0.001 to 0.0113


def curve(x: float, frac: float, centre: float, noise: float) -> float:
    """A planted run's metric at ``frac`` of its steps: a valley in log2(lr) that falls as it trains, its optimum
    larger part way than at the end by 0.5 (1 - frac) in log2 (3/4 of a grid step at a quarter of the run)."""
    return 2.0 + 1.5 * (1 - frac) + 0.08 * (x - centre - 0.5 * (1 - frac)) ** 2 + noise


def test_a_pause_keeps_the_final_best_rate_and_an_unbroken_valley_around_it():
    """Planted: eight rates, the final optimum anywhere inside the grid, the part-way optimum half a step larger,
    noise 0.01 at the pause. The finished best rate is among those kept in >= 99% of draws, the kept rates are
    always one unbroken run of the grid with the part-way best's neighbours, and never fewer than three."""
    rng = random.Random(0)
    xs = [math.log2(v) for v in GRID]
    kept_best, draws = 0, 2000
    for _ in range(draws):
        centre = rng.uniform(xs[1], xs[-2])
        ranked = {tuning.key_of({"optim.lr": v}): curve(x, 0.25, centre, rng.gauss(0, 0.01)) for v, x in zip(GRID, xs)}
        known = {tuning.key_of({"optim.lr": v}): {"optim.lr": v} for v in GRID}
        keep = halving.survivors(ranked, known, "optim.lr", 0.5, 3)
        idx = sorted(GRID.index(known[k]["optim.lr"]) for k in keep)
        assert idx == list(range(idx[0], idx[-1] + 1)) and len(idx) >= 4  # unbroken; half of eight
        best_now = GRID.index(known[min(ranked, key=ranked.get)]["optim.lr"])
        assert {max(0, best_now - 1), min(len(GRID) - 1, best_now + 1)} <= set(idx)
        final = min(range(len(GRID)), key=lambda i: curve(xs[i], 1.0, centre, 0.0))
        kept_best += final in idx
    assert kept_best / draws >= 0.99, kept_best / draws


def test_survivors_fill_each_slice_of_the_other_keys_and_a_failed_rate_ranks_last():
    known, ranked = {}, {}
    for w in (10, 20):
        for i, v in enumerate(GRID[:6]):
            s = {"optim.lr": v, "scheduler.warmup_steps": w}
            k = tuning.key_of(s)
            known[k] = s
            ranked[k] = math.inf if i == 2 and w == 10 else abs(i - 3) + (0.5 if w == 20 else 0.0)
    keep = halving.survivors(ranked, known, "optim.lr", 0.25, 3)
    by = {w: sorted(GRID.index(known[k]["optim.lr"]) for k in keep if known[k]["scheduler.warmup_steps"] == w)
          for w in (10, 20)}
    assert by[10] == [2, 3, 4] and by[20] == [2, 3, 4]  # the failed rate stays only as the best's neighbour
    assert halving.survivors({"a": 1.0, "b": 0.5}, {"a": {"optim.lr": 1}, "b": {"optim.lr": 2}}, "optim.lr", 0.5, 3) \
        == ["a", "b"]


def test_the_plan_s_share_of_steps():
    h = {"at": [0.25, 0.5], "keep": 0.5, "least": 3}
    assert halving.expected_share(h, 8) == pytest.approx((0.25 * 8 + 0.25 * 4 + 0.5 * 3) / 8)
    assert halving.expected_share(h, 3) == 1.0
    assert halving.pause_steps([0.25, 0.5], 400, 100) == [100, 200]
    assert halving.pause_steps([0.1], 400, 100) == [100]


class Planted:
    """A tuning round's sweep, simulated: each cell's run reaches the step it is told to pause at (or its end)
    and reads the planted curve there; a cell's noise is fixed by its seed and step."""

    def __init__(self, centre: float, noise: float = 0.01):
        self.centre, self.noise, self.reached, self.calls = centre, noise, {}, []

    def value(self, c, step: int) -> float:
        rng = random.Random(hash((c.setting, c.seed, step)) & 0xFFFF)
        frac = step / c.overrides["trainer.max_steps"]
        return curve(math.log2(float(c.overrides["optim.lr"])), frac, self.centre, rng.gauss(0, self.noise))

    def run_stage(self, d, stage_dir, cells, jobs, clock, pause=None):
        pause = pause or {}
        self.calls.append(dict(pause))
        for i, c in enumerate(cells):
            self.reached[(str(stage_dir), i)] = max(self.reached.get((str(stage_dir), i), 0),
                                                    pause.get(i, c.overrides["trainer.max_steps"]))

    def read_stage(self, d, stage_dir, cells):
        out = []
        for i, c in enumerate(cells):
            step, end = self.reached.get((str(stage_dir), i), 0), c.overrides["trainer.max_steps"]
            v = self.value(c, step) if step else math.nan
            done = step >= end
            out.append({"cell": c, "status": "finished" if done else "interrupted" if step else "unfinished",
                        "value": v if done else math.nan, "metrics": {"val": {"val/loss": v}} if done else {},
                        "name": f"#{i}", "error": None, "pause": None if done or not step else
                        {"step": step, "val": {"val/loss": v}}})
        return out


def tune(tmp_path, monkeypatch, block, sim):
    d = design_of("x", [], {**BLOCK, "tune": block})
    monkeypatch.setattr(rounds, "run_stage", sim.run_stage)
    monkeypatch.setattr(rounds, "read_stage", sim.read_stage)
    plan = type("P", (), {"steps": {(a, ""): 400 for a in d.arms}, "val_every": {(a, ""): 50 for a in d.arms}})()
    return rounds.tune(d, tmp_path, plan, stages.StageClock(tmp_path, {}))


def test_a_halved_round_chooses_the_rate_the_full_grid_chooses_for_fewer_steps(tmp_path, monkeypatch):
    """Planted curves, each arm's final optimum anywhere in the grid: the halved round's lr* is inside the basin
    of the full round's (same runs, all trained to the end) in every draw, for about 60% of its steps; a final
    best beside a stopped rate continues that rate (it happens in some draws); a resumed round decides nothing
    again."""
    rng = random.Random(1)
    shares, revived = [], 0
    for draw in range(12):
        centre = rng.uniform(math.log2(GRID[1]), math.log2(GRID[-2]))
        block = {"params": {"optim.lr": GRID}, "seeds": [1, 2]}
        full = tune(tmp_path / f"f{draw}", monkeypatch, block, Planted(centre))
        sim = Planted(centre)
        halved = tune(tmp_path / f"h{draw}", monkeypatch, {**block, "halving": {"at": [0.25, 0.5]}}, sim)
        for ar, ch in full["fits"].items():
            lo, hi = ch.valley.basin
            assert lo - 1e-9 <= halved["fits"][ar].valley.x <= hi + 1e-9, (draw, ar)
        h = halved["halving"]
        shares.append(h["saved"]["steps"] / h["saved"]["full_steps"])
        revived += h["saved"]["revived"] > 0
        assert [sorted(set(c.values())) for c in sim.calls[:2]] == [[100], [100, 200]]
        record = json.loads((tmp_path / f"h{draw}" / "tune" / "round-0" / "halving.json").read_text())
        assert len(record["pauses"]) == 2 and record["revived"] == h["revived"]
    assert max(shares) < 0.75 and revived >= 1, (shares, revived)
    sim = Planted(centre)
    sim.reached = {k: 400 for k in [(str(tmp_path / f"h{draw}" / "tune" / "round-0"), i) for i in range(32)]}
    tune(tmp_path / f"h{draw}", monkeypatch, {**block, "halving": {"at": [0.25, 0.5]}}, sim)
    assert len(sim.calls) == 1 and set(sim.calls[0].values()) <= {100, 200}  # no pause again: the stopped stay


@pytest.mark.parametrize("tune_block, says", [
    ({"halving": {"at": [0.5, 0.25]}}, "study.tune.halving={'at': [0.5, 0.25]}: true, or a mapping of at"),
    ({"halving": {"at": [1.0]}}, "each in (0, 1)"),
    ({"halving": {"keep": 1}}, "keep (the share that trains on"),
    ({"halving": {"least": 2}}, "least (the fewest settings of an arm kept, an integer >= 3"),
    ({"halving": {"every": 2}}, "study.tune.halving={'every': 2}"),
    ({"halving": "yes"}, "study.tune.halving='yes': true, or a mapping"),
    ({"halving": True, "rule": "best"}, "study.tune.halving: goes with rule: fit"),
])
def test_a_bad_halving_key_is_one_line(tune_block, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        design_of("x", [], {**BLOCK, "tune": {"params": {"optim.lr": GRID[:4]}, **tune_block}})


def test_pauses_that_are_not_validations_before_the_end_are_refused():
    d = design_of("x", [], {**BLOCK, "tune": {"params": {"optim.lr": GRID[:4]}, "halving": {"at": [0.25, 0.3]}}})
    arms = {(a, ""): 400 for a in d.arms}
    with pytest.raises(ConfigError, match=re.escape("study.tune.halving.at=[0.25, 0.3]: norm=layer trains 400 steps "
                                                    "and validates every 100, so its pauses would be at steps "
                                                    "[100, 100]")):
        halving.check(d, arms, {k: 100 for k in arms})
    with pytest.raises(ConfigError, match="runs pause at a validation, and norm=layer validates every"):
        halving.check(d, arms, {k: None for k in arms})
    halving.check(d, arms, {k: 20 for k in arms})  # steps 100 and 120
    with pytest.raises(ConfigError, match="pause_at=100: the study pauses and continues its runs itself"):
        design_of("x", ["pause_at=100"], BLOCK)


@pytest.mark.slow
def test_a_toy_study_tunes_by_successive_halving_and_resumes_with_nothing_to_do(tmp_path):
    """study_halving_toy: six rates per arm on one seed, paused at steps 20 and 40 of 80. The stopped runs keep
    their pause (interrupted, with the validation there); the survivors finish; the report says what was ranked,
    kept and saved; run again, nothing trains."""
    d = tmp_path / "h"
    args = ["experiment=study_halving_toy", f"dir={d}", "jobs=1", "trainer.enable_progress_bar=false", "force=true"]
    p = run_module("modforge.study", tmp_path, *args, threads=None, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "by successive halving at [0.25, 0.5] of each run's steps, as few as" in p.stdout
    rec = json.loads((d / "report.json").read_text())
    h = rec["halving"]
    assert [r["step"] for p_ in h["pauses"] for r in p_["ranks"]] == [20, 20, 40, 40]
    assert 1 <= h["saved"]["stopped"] and h["saved"]["steps"] < h["saved"]["full_steps"] == 12 * 80
    jobs = sorted((d / "tune" / "round-0").glob("*/status.json"))
    assert len(jobs) == h["saved"]["stopped"]
    for f in jobs:
        st = json.loads(f.read_text())
        assert st["status"] == "interrupted" and st["paused_at"] in (20, 40) and "val/loss" in st["val"]
    assert len(list((d / "tune" / "round-0").glob("*/metrics.json"))) == 12 - len(jobs)
    assert all(f["bracketed"] and f["stable"] for f in rec["fits"])
    md = (d / "study.md").read_text()
    assert "Successive halving (`study.tune.halving`, at [0.25, 0.5]" in md and "| pause at step |" in md
    kept = {p_: p_.stat().st_mtime_ns for p_ in d.rglob("*.json") if "round-0" in str(p_)}
    p = run_module("modforge.study", tmp_path, *args, threads=None, timeout=600)
    assert p.returncode == 0 and "jobs (" not in p.stdout
    assert {p_: p_.stat().st_mtime_ns for p_ in d.rglob("*.json") if "round-0" in str(p_)} == kept


def test_a_run_that_failed_before_a_pause_reaches_the_failure_model(tmp_path, monkeypatch):
    """The grid's top rate diverges before the first pause: it ranks last and stops there, yet its failures are
    in the arm's curve (the failure model's data), not dropped with the runs halving stopped."""

    class Diverging(Planted):
        def read_stage(self, d, stage_dir, cells):
            out = super().read_stage(d, stage_dir, cells)
            for r in out:
                if float(r["cell"].overrides["optim.lr"]) == GRID[-1]:
                    r.update(status="diverged", value=math.nan, pause=None)
            return out

    rng = random.Random(3)
    centre = rng.uniform(math.log2(GRID[1]), math.log2(GRID[3]))
    got = tune(tmp_path, monkeypatch, {"params": {"optim.lr": GRID}, "seeds": [1, 2], "halving": {"at": [0.25]}},
               Diverging(centre))
    top = tuning.key_of({"optim.lr": GRID[-1]})
    for ar, curve_ in got["curves"].items():
        assert top in curve_ and all(math.isnan(v) for v in curve_[top]), (ar, sorted(curve_))
    record = got["halving"]["pauses"][0]["ranks"]
    assert all(r["settings"][top] is None and top not in r["kept"] for r in record)


def test_the_tuning_plot_marks_the_rates_halving_stopped():
    from modforge.studies.figures import stopped_by_halving

    rec = {"halving": {"pauses": [{"ranks": [{"arm": "a", "rung": "", "step": 10,
                                              "settings": {"optim.lr=0.001": 3.0, "optim.lr=0.002": 2.5,
                                                           "optim.lr=0.004": 2.4, "optim.lr=0.008": 2.9},
                                              "kept": ["optim.lr=0.002", "optim.lr=0.004"]}]}]}}
    rows = [{"arm": "a", "rung": "", "setting": {"optim.lr": v}} for v in (0.002, 0.004, 0.008)]  # 0.008 revived
    assert stopped_by_halving(rec, "", rows) == [("a", 0.001)]
    assert stopped_by_halving({}, "", rows) == []
