"""Learning rates carried up a ladder (modforge.studies.carry): the optimal rate's power law in compute is
recovered from the tuned rungs' optima, and the check at an upper rung accepts a predicted rate inside the basin
and flags one outside it."""
import math

import numpy as np
import pytest

from modforge.studies import carry


def test_a_planted_power_law_is_recovered_and_its_prediction_holds_its_sd():
    """log2 lr* = -1 - 0.25 log2 C through 3 tuned rungs (optima with sd 0.15 doublings): the law's slope and
    the prediction two rungs up are recovered, and the prediction's error is within 2 of its sds 90%+ of the
    time (3 points: 1 df for the scatter)."""
    rng = np.random.default_rng(0)
    computes = [1e12, 3e12, 1e13]
    errors, slopes = [], []
    for _ in range(400):
        pts = [(c, -1 - 0.25 * math.log2(c) + rng.normal(0, 0.15), 0.15) for c in computes]
        law = carry.fit_law(pts)
        x, sd = law.predict(1e14)
        errors.append((x - (-1 - 0.25 * math.log2(1e14))) / sd)
        slopes.append(law.b)
    assert np.median(slopes) == pytest.approx(-0.25, abs=0.02)
    assert np.mean(np.abs(errors) <= 2) >= 0.9
    exact = carry.fit_law([(c, -1 - 0.25 * math.log2(c), 0.1) for c in computes])
    assert (exact.a, exact.b, exact.extra_sd) == (pytest.approx(-1), pytest.approx(-0.25), 0.0)
    scattered = carry.fit_law([(1e12, 0.0, 0.01), (3e12, 1.0, 0.01), (1e13, 0.0, 0.01), (3e13, 1.0, 0.01)])
    assert scattered.extra_sd > 0.3  # optima that scatter past their own sds widen every prediction
    assert carry.fit_law([(1e12, -3.0, 0.1)]) is None


def loss(x, best, noise, rng, seeds=2):
    """A valley in log2 rate: 0.02 nats per squared doubling from the best (the basin at 0.02: +-1 doubling)."""
    return [2.0 + 0.02 * (x - best) ** 2 + rng.normal(0, noise) for _ in range(seeds)]


def test_the_check_accepts_a_rate_inside_the_basin_and_flags_one_outside_it():
    rng = np.random.default_rng(1)
    best = math.log2(3e-3)
    accepted = flagged = 0
    for _ in range(500):
        for off, want in ((0.5, True), (2.5, False)):
            pred = best + off
            rates = carry.check_rates(pred)
            got = carry.judge({r: loss(math.log2(r), best, 0.004, rng) for r in rates}, 2 ** pred, 0.02)
            if want:
                accepted += got["accepted"] and got["rate"] == rates[1]
            else:
                flagged += (not got["accepted"]) and got["edge"] == "low" and got["rate"] == rates[0]
    assert accepted / 500 >= 0.95 and flagged / 500 >= 0.95
    failed = carry.judge({1e-3: [2.0, 2.0], 2e-3: [2.0, math.nan], 4e-3: [2.1, 2.1]}, 2e-3, 0.02)
    assert not failed["accepted"] and failed["rate"] == 1e-3 and "failed" in failed["why"]
    assert carry.judge({1e-3: [math.nan], 2e-3: [math.nan]}, 1e-3, 0.02)["rate"] is None


GRID = [round(0.001 * 2 ** (i / 2), 7) for i in range(9)]  # 0.001 to 0.016, sqrt(2) apart


class Ladder:
    """A ladder's tuning runs, simulated: at rung r (compute 10^r) the loss is a valley in log2(rate) whose
    optimum follows a planted power law (``jump`` moves the top rung's off it), noise fixed by seed and rate."""

    def __init__(self, jump: float = 0.0, noise: float = 0.004):
        self.jump, self.noise, self.cells = jump, noise, []

    def optimum(self, rung: int) -> float:
        return math.log2(0.004) - 0.25 * (rung - 2) * math.log2(10) / 2 + (self.jump if rung == 4 else 0.0)

    def run_stage(self, d, stage_dir, cells, jobs, clock, pause=None):
        self.cells.append((stage_dir.name, [c.rung for c in cells]))

    def read_stage(self, d, stage_dir, cells):
        out = []
        for c in cells:
            rung = int(c.overrides["model.n_layers"])
            x = math.log2(float(c.overrides["optim.lr"]))
            rng = np.random.default_rng(abs(hash((c.seed, round(x, 6), rung))) % 2 ** 32)
            v = 3.0 - 0.1 * rung + 0.02 * (x - self.optimum(rung)) ** 2 + rng.normal(0, self.noise)
            out.append({"cell": c, "status": "finished", "value": v, "metrics": {"val": {"val/loss": v}},
                        "name": "", "error": None, "pause": None})
        return out


def carried_tuning(tmp_path, monkeypatch, sim, extend: int = 0):
    from modforge.config.study import check_study
    from modforge.studies import rounds, stages
    from modforge.studies.design import design_of

    block = check_study({"question": "q?", "baseline": "norm=layer", "compare": ["norm=rms"],
                         "tune": {"params": {"optim.lr": GRID}, "seeds": [1, 2]},
                         "carry": {"tuned": 3, **({"extend": extend} if extend else {})},
                         "sizes": [{"model.n_layers": n} for n in range(5)]})
    d = design_of("x", [], block)
    monkeypatch.setattr(rounds, "run_stage", sim.run_stage)
    monkeypatch.setattr(rounds, "read_stage", sim.read_stage)
    keys = [(a, r) for a in d.arms for r in d.rungs]
    plan = type("P", (), {"steps": {k: 100 for k in keys}, "val_every": {k: None for k in keys},
                          "flops": {(a, r): 10.0 ** (i + 9) for a in d.arms for i, r in enumerate(d.rungs)}})()
    return d, rounds.tune(d, tmp_path, plan, stages.StageClock(tmp_path, {}))


def test_a_study_tunes_the_lower_rungs_and_checks_the_carried_rate_above(tmp_path, monkeypatch):
    """Five rungs, the optimum a power law in compute: the two upper rungs run only three rates each (on both
    tuning seeds), the predicted rate is accepted and compared there, within half a doubling of the truth; when
    the top rung's optimum jumps four doublings down the check flags it at its low end."""
    sim = Ladder()
    d, got = carried_tuning(tmp_path / "ok", monkeypatch, sim)
    upper = list(d.rungs)[3:]
    assert [name for name, _ in sim.cells] == ["round-0", "carry"]
    assert set(sim.cells[1][1]) == set(upper) and len(sim.cells[1][1]) == 2 * 2 * 3 * 2
    for a in d.arms:
        for i, r in enumerate(upper, start=3):
            c = got["carried"][(a, r)]
            assert c["accepted"] and got["chosen"][(a, r)]["optim.lr"] == c["rate"] == c["rates"][1]
            assert abs(math.log2(c["rate"]) - sim.optimum(i)) < 0.5
            assert c["saved_runs"] == (len(GRID) - 3) * 2
    from modforge.studies.writeup import fits_record

    # the report's fit table: the tuned rungs only (a carried rung's entry repeated the highest tuned rung's rate)
    assert d.fit and {f["rung"] for f in fits_record(d, got)} == set(list(d.rungs)[:3])
    sim = Ladder(jump=-4.0)
    d, got = carried_tuning(tmp_path / "jump", monkeypatch, sim)
    top = got["carried"][(d.baseline, list(d.rungs)[4])]
    assert not top["accepted"] and top["edge"] == "low" and top["rate"] == top["rates"][0]
    assert got["edges"][(d.baseline, list(d.rungs)[4])] == {"optim.lr": "low"}


def test_a_flagged_check_extends_past_its_end_until_it_brackets_the_best(tmp_path, monkeypatch):
    """carry.extend: the top rung's optimum four doublings below the law. The check (-1, 0, +1) finds its best at
    the low end; each extension runs one doubling lower, for the flagged arm-rungs only, until the best is inside
    the rates run: then the rung compares at a bracketed rate near the truth (still flagged: the law missed)."""
    sim = Ladder(jump=-4.0)
    d, got = carried_tuning(tmp_path, monkeypatch, sim, extend=4)
    top = list(d.rungs)[4]
    names = [name for name, _ in sim.cells]
    assert names[:2] == ["round-0", "carry"] and names[2:] and all(n.startswith("carry-extend-") for n in names[2:])
    assert all(set(rungs) == {top} for _, rungs in sim.cells[2:])  # only the flagged rung runs more
    for a in d.arms:
        c = got["carried"][(a, top)]
        assert not c["accepted"] and c["edge"] is None and c["extended"] >= 2
        assert c["rate"] not in (min(c["rates"]), max(c["rates"]))  # bracketed
        assert abs(math.log2(c["rate"]) - sim.optimum(4)) < 0.75
        assert got["edges"][(a, top)] == {}
    d0, got0 = carried_tuning(tmp_path / "plain", monkeypatch, Ladder(jump=-4.0))  # the default: no extension
    assert got0["carried"][(d0.baseline, top)]["edge"] == "low"


def test_the_excess_scatter_matches_its_degrees_of_freedom():
    """Optima far more scattered than their sds (Paule-Mandel): the excess variance is where the weighted
    residuals equal their df (the bisection's bracket used to stop short of it)."""
    law = carry.fit_law([(1e12, -10.0, 0.25), (3e12, -8.0, 0.25), (1e13, -10.0, 0.25)])
    z = np.log2([1e12, 3e12, 1e13])
    resid = np.array([-10.0, -8.0, -10.0]) - (law.a + law.b * z)
    assert float((resid ** 2 / (0.25 ** 2 + law.extra_sd ** 2)).sum()) == pytest.approx(1.0, rel=1e-6)
    x, sd = law.predict(1e14)
    assert sd > law.extra_sd  # a new optimum scatters about the law as the tuned ones did
