"""A study's two stages, round by round: tuning (every arm alike on the grid, extended past edge optima; each
arm's setting chosen by the fit rule, :mod:`modforge.studies.lrfit`, or the best-mean rule,
:mod:`modforge.studies.tuning`) and comparison (fresh seeds, looks, more seeds only where a comparison is open,
:mod:`modforge.studies.sequential`)."""
import math
from pathlib import Path
from typing import Optional

from modforge.results import blocks
from modforge.studies import boundaries, carry, halving, lrfit, sequential, tuning
from modforge.studies.design import Design
from modforge.studies.runner import Plan
from modforge.studies.stages import Cell, StageClock, read_stage, run_stage, stage_cells


def cell(d: Design, plan: Plan, arm: str, rung: str, setting: dict, seed: int) -> Cell:
    ov = {**d.arms[arm], **d.rungs[rung], **setting, "trainer.max_steps": plan.steps[(arm, rung)], "seed": seed}
    if plan.val_every[(arm, rung)] is not None:
        ov["trainer.val_check_interval"] = plan.val_every[(arm, rung)]
    return Cell(arm, rung, tuning.key_of(setting), seed, ov)


def tune(d: Design, study_dir: Path, plan: Plan, clock: StageClock) -> dict:
    """Stage one. -> {"chosen": {(arm, rung): setting | None}, "curves": {(arm, rung): {key: [values]}},
    "edges": {(arm, rung): {key: side}}, "grids": ..., "settings": {key: setting}, "transferred": bool}."""
    if not d.grid:
        return {"chosen": {(a, r): {} for a in d.arms for r in d.rungs}, "curves": {}, "edges": {}, "grids": {},
                "settings": {}, "runs": 0, "devices": [], "fits": {}}
    grids = {(a, r): d.grid_of(a) for a in d.arms for r in d.tuned_rungs_of(a)}
    curves: dict = {k: {} for k in grids}
    known: dict = {}
    devices: list = []  # each finished tuning run's metrics.json "devices": what it ran on
    runs = 0

    def absorb(stage: Path, cells: list, only: Optional[set] = None) -> None:
        """The stage's finished runs (``only`` these cells) into the curves; every cell's setting into the grid."""
        nonlocal runs
        for c in cells:
            s = {k: c.overrides[k] for k in d.grid}
            known[c.setting] = s
            for k, v in s.items():
                g = grids[(c.arm, c.rung)][k]
                if not any(tuning._same(v, x) for x in g):
                    g.append(v)
        for i, res in enumerate(read_stage(d, stage, cells)):
            if only is not None and i not in only:
                continue
            c = res["cell"]
            curves[(c.arm, c.rung)].setdefault(c.setting, []).append(res["value"])
            devices.append(res["metrics"].get("devices"))
            runs += 1

    first = [cell(d, plan, a, r, s, seed) for r in d.tuned_rungs for a in d.arms if r in d.tuned_rungs_of(a)
             for s in tuning.settings(d.grid_of(a)) for seed in d.tune_seeds]
    stage = study_dir / "tune" / "round-0"
    cells = stage_cells(stage, lambda: first)
    halved = halve(d, stage, cells, plan, clock)
    if halved is None:
        run_stage(d, stage, cells, d.jobs, clock)
        absorb(stage, cells)
    else:
        failed = {i for i, r in enumerate(read_stage(d, stage, cells)) if r["status"] in ("diverged", "collapsed")}
        absorb(stage, cells, (set(range(len(cells))) - set(halved.stopped())) | failed)  # a failure is data
        while True:  # a fitted best beside a stopped rate: that rate trains to its end, and the fit is made again
            more = halving.revivals(halved, lrfit.fit_all(curves, known, better=d.better, draws=0, **d.fit),
                                    known, d.fit["key"])
            if not more:
                break
            halved.revive(more)
            run_stage(d, stage, cells, d.jobs, clock, halved.stopped())
            absorb(stage, cells, set(more))
    for i in range(1, d.extend + 1):
        def more() -> list:
            out = []
            for (a, r), extra in extensions(d, curves, known, grids).items():
                out += [cell(d, plan, a, r, setting, seed) for setting in extra for seed in d.tune_seeds]
            return out

        stage = study_dir / "tune" / f"extend-{i}"
        cells = stage_cells(stage, more)
        if not cells:
            break
        run_stage(d, stage, cells, d.jobs, clock)
        absorb(stage, cells)
    chosen, edge, moved = {}, {}, {}
    fits = lrfit.fit_all(curves, known, better=d.better, **d.fit) if d.rule == "fit" else {}
    for (a, r), results in curves.items():
        if d.rule == "fit":
            v = fits[(a, r)].valley
            chosen[(a, r)] = fits[(a, r)].setting
            edge[(a, r)] = ({} if v.bracketed or v.edge is None else {d.fit["key"]: v.edge}) | \
                fits[(a, r)].slice_edges(grids[(a, r)])
            continue
        best = tuning.choose(results, d.better, known, d.cliff)
        plain = tuning.choose(results, d.better)
        if best is not None and plain != best:
            moved[(a, r)] = known[plain]  # the cliff rule stepped down from this best mean
        chosen[(a, r)] = None if best is None else known[best]
        edge[(a, r)] = {} if best is None else tuning.edges(known[best], grids[(a, r)])
    carried = carry_up(d, study_dir, plan, clock, fits, chosen, edge, curves, known, grids, absorb) if d.carry else {}
    small = d.tuned_rungs[0]
    for r in d.rungs:
        for a in d.arms:
            if r in d.tuned_rungs_of(a) or d.carry:
                continue
            rule = tuning.TRANSFER[d.transfer_of(a)]
            got = chosen[(a, small)]
            chosen[(a, r)] = None if got is None else rule(got, d.rungs[small], d.rungs[r],
                                                           d.study.get("width_key", "model.d_model"))
            if (a, small) in fits:
                fits[(a, r)] = fits[(a, small)]  # its rate carried up, with the tuning's noise
    return {"chosen": chosen, "curves": curves, "edges": edge, "grids": grids, "settings": known, "runs": runs,
            "moved": moved, "devices": devices, "fits": fits, "carried": carried,
            "halving": None if halved is None else {**halved.record, "saved": halved.saved()}}


def carry_up(d: Design, study_dir: Path, plan: Plan, clock: StageClock, fits: dict, chosen: dict, edge: dict,
             curves: dict, known: dict, grids: dict, absorb) -> dict:
    """``study.carry``: each arm's rate at the upper rungs from the power law through its tuned rungs' fitted
    optima, checked there at ``carry.check`` (:mod:`modforge.studies.carry`); fills ``chosen``, ``edge`` and
    ``fits`` for those rungs. -> {(arm, rung): what was predicted, run and decided}."""
    key = d.fit["key"]
    upper = [r for r in d.rungs if r not in d.tuned_rungs]
    top = d.tuned_rungs[-1]
    laws, wanted = {}, {}
    for a in d.arms:
        pts = []
        for r in d.tuned_rungs:
            ch = fits.get((a, r))
            if ch is None or ch.setting is None or not math.isfinite(ch.valley.x):
                continue
            v = ch.valley
            sd = (v.high - v.low) / (2 * 1.96) if math.isfinite(v.high - v.low) and v.high > v.low else 0.25
            pts.append((plan.flops[(a, r)], v.x, sd))
        laws[a] = carry.fit_law(pts)
        others = {k: x for k, x in ((fits.get((a, top)) and fits[(a, top)].setting) or {}).items() if k != key}
        for r in upper:
            if laws[a] is None:
                continue
            x, sd = laws[a].predict(plan.flops[(a, r)])
            wanted[(a, r)] = (x, sd, others, carry.check_rates(x, d.carry["check"]))
            grids.setdefault((a, r), {k: [] for k in d.grid})
            curves.setdefault((a, r), {})
    cells = [cell(d, plan, a, r, {**others, key: rate}, seed) for (a, r), (_, _, others, rates) in wanted.items()
             for rate in rates for seed in d.tune_seeds]
    stage = study_dir / "tune" / "carry"
    cells = stage_cells(stage, lambda: cells)
    if cells:
        run_stage(d, stage, cells, d.jobs, clock)
        absorb(stage, cells)
    out = {}

    def judged(a: str, r: str) -> dict:
        x = wanted[(a, r)][0]
        results = {float(known[k][key]): vals for k, vals in curves[(a, r)].items()}
        return carry.judge(results, carry.check_rates(x, [0.0])[0], d.fit["delta"], d.better)

    got = {k: judged(*k) for k in wanted}
    extended = {k: [] for k in wanted}
    for step in range(d.carry.get("extend", 0)):  # the best at the check's end: one more doubling past it
        beyond = {k: (min(r for r in known_rates(known, curves[k], key)) / 2 if g["edge"] == "low" else
                      max(r for r in known_rates(known, curves[k], key)) * 2)
                  for k, g in got.items() if g["edge"]}
        if not beyond:
            break
        more = [cell(d, plan, a, r, {**wanted[(a, r)][2], key: float(f"{rate:.4g}")}, seed)
                for (a, r), rate in beyond.items() for seed in d.tune_seeds]
        stage = study_dir / "tune" / f"carry-extend-{step + 1}"
        more = stage_cells(stage, lambda: more)
        if more:
            run_stage(d, stage, more, d.jobs, clock)
            absorb(stage, more)
        for k, rate in beyond.items():
            extended[k].append(float(f"{rate:.4g}"))
            got[k] = judged(*k)
    for a in d.arms:
        for r in upper:
            if (a, r) not in wanted:
                chosen[(a, r)], edge[(a, r)] = None, {}
                out[(a, r)] = {"why": "no law: fewer than two tuned rungs with a fitted rate"}
                continue
            x, sd, others, rates = wanted[(a, r)]
            g = got[(a, r)]
            chosen[(a, r)] = None if g["rate"] is None else {**others, key: g["rate"]}
            edge[(a, r)] = {key: g["edge"]} if g["edge"] else {}
            if (a, top) in fits:
                fits[(a, r)] = fits[(a, top)]  # the comparison adds the tuned rungs' noise in the rate
            law = laws[a]
            out[(a, r)] = {**g, "predicted": 2 ** x, "sd_doublings": sd, "rates": rates + extended[(a, r)],
                           "extended": len(extended[(a, r)]),
                           "law": {"a": law.a, "b": law.b, "extra_sd": law.extra_sd, "points": law.points},
                           "saved_runs": max(0, len(tuning.settings(d.grid)) - len(rates) - len(extended[(a, r)]))
                           * len(d.tune_seeds)}
    return out


def known_rates(known: dict, curve: dict, key: str) -> list:
    """The rates an arm-rung has run (its curve's settings)."""
    return [float(known[k][key]) for k in curve]


def halve(d: Design, stage: Path, cells: list, plan: Plan, clock: StageClock) -> Optional[halving.Halving]:
    """The tuning round by successive halving (``study.tune.halving``): its pauses run, the survivors to the end;
    None when the study does not halve."""
    if halving.schedule(d) is None:
        return None
    h = halving.Halving(d, stage, cells, plan.steps, plan.val_every)
    h.run(lambda pause: run_stage(d, stage, cells, d.jobs, clock, pause), lambda: read_stage(d, stage, cells))
    return h


def _past(values: list, side: Optional[str]) -> Optional[float]:
    """The grid value one step past ``side``'s end of ``values``, or None (no side, no step, or tried already)."""
    value = tuning.beyond(values, side) if side else None
    return None if value is None or any(tuning._same(value, x) for x in values) else value


def extensions(d: Design, curves: dict, known: dict, grids: dict) -> dict:
    """{(arm, rung): [settings]}: one grid step past each edge optimum (rule: fit, also below the grid of an arm
    with no rate under its failure level, and a whole slice at the grid's rates past a chosen slice at an end of
    another key, e.g. the longest warm-up tried), that is not tested yet."""
    out: dict = {}
    if d.rule == "fit":
        key = d.fit["key"]
        for (a, r), ch in lrfit.fit_all(curves, known, better=d.better, draws=0, **d.fit).items():
            v = ch.valley
            others = next((o for o, sv in ch.slices.values() if sv is v), {})
            side = "low" if not v.stable else (v.edge if not v.bracketed else None)
            value = _past(grids[(a, r)][key], side)
            if value is not None:
                out[(a, r)] = [{**others, key: value}]
            for k, side in ch.slice_edges(grids[(a, r)]).items():  # the chosen slice at an end: a whole slice past it
                value = _past(grids[(a, r)][k], side)
                if value is not None:
                    out.setdefault((a, r), []).extend({**others, k: value, key: rate}
                                                      for rate in sorted(grids[(a, r)][key], key=float))
        return out
    for (a, r), results in curves.items():
        best = tuning.choose(results, d.better, known, d.cliff)
        if best is None:
            continue
        for k, side in tuning.edges(known[best], grids[(a, r)]).items():
            v = tuning.beyond(grids[(a, r)][k], side)
            if v is not None and not any(tuning._same(v, x) for x in grids[(a, r)][k]):
                out.setdefault((a, r), []).append({**known[best], k: v})
    return out


def compare(d: Design, study_dir: Path, plan: Plan, chosen: dict, clock: StageClock,
            fits: Optional[dict] = None) -> dict:
    """Stage two: fresh seeds, looks at the planned numbers of pairs, more seeds only where a comparison is open.
    ``fits`` (rule: fit): each arm's choice, whose tuning variance each interval adds, and an arm or baseline
    whose optimum is not bracketed gets no verdict (nor seeds).
    -> {"values": {(arm, rung): {seed: value}}, "results": [...], "decisions": {(arm, rung): Decision | str},
    "rounds": [[(arm, rung), ...] per round], "runs": n, "critical": [c per look], "prone": {rung: {arm: spike
    size}}, "borrowed": {rung: (sum of squares, df)}, "family_on_seeds": the comparisons the boundaries are for}."""
    values: dict = {(a, r): {} for a in d.arms for r in d.rungs}
    results: list = []
    decisions: dict = unbracketed(d, fits or {})
    for r in d.rungs:
        if chosen.get((d.baseline, r), {}) is None:
            for a in d.compared:
                decisions[(a, r)] = "the baseline has no setting that trained (every tuning run diverged or collapsed)"
        for a in d.compared:
            if chosen.get((a, r), {}) is None and (a, r) not in decisions:
                decisions[(a, r)] = "no setting that trained (every tuning run diverged or collapsed)"
    fits = fits or {}
    members = {r: [a for a in d.compared if (a, r) not in decisions] for r in d.rungs}  # compared on seeds
    borrowed = {r: borrowed_variance(d, fits, [d.baseline, *members[r]], r) for r in d.rungs}
    layout = boundaries.Layout(tuple(len(m) + 1 for m in members.values() if m), tuple(d.looks), d.level,
                               borrowed=tuple(borrowed[r][1] for r in d.rungs if members[r]))
    crit = boundaries.critical_values(layout, study_dir / "boundaries.json") if layout.arms else []
    prone = {r: {a: size for a in [d.baseline, *members[r]] if (a, r) in fits and
                 (size := lrfit.trouble_near(fits[(a, r)].valley, d.fit["spike"])) is not None} for r in d.rungs}
    rounds = []
    have = 0
    span = math.inf
    for j, n in enumerate(d.looks):
        open_ = [(a, r) for r in d.rungs for a in d.compared if (a, r) not in decisions or
                 (not isinstance(decisions[(a, r)], str) and not decisions[(a, r)].final)]
        if not open_:
            break
        todo = sorted({*open_, *((d.baseline, r) for _, r in open_)},
                      key=lambda k: (list(d.rungs).index(k[1]), list(d.arms).index(k[0])))
        seeds = range(d.seeds["start"] + have, d.seeds["start"] + n)
        stage = study_dir / "compare" / f"round-{j + 1}"
        cells = stage_cells(stage, lambda: [cell(d, plan, a, r, chosen[(a, r)], s) for (a, r) in todo for s in seeds])
        run_stage(d, stage, cells, d.jobs, clock)
        for res in read_stage(d, stage, cells):
            c = res["cell"]
            values[(c.arm, c.rung)][c.seed] = res["value"]
            results.append(res)
            info = (res["metrics"].get("metric_info") or {}).get(d.metric) or {}
            if info.get("low") is not None and info.get("high") is not None:
                span = float(info["high"]) - float(info["low"])
        rounds.append(sorted({(c.arm, c.rung) for c in cells}))
        have = n
        for r in d.rungs:
            here = [a for a, rr in open_ if rr == r]
            if not here:
                continue
            got = sequential.decide_rung({a: values[(a, r)] for a in [d.baseline, *members[r]]}, d.baseline,
                                         members[r], here, j, crit, d.better, d.margin, span,
                                         {a: tuning_var(fits, (a, r)) + tuning_var(fits, (d.baseline, r))
                                          for a in here}, planned=d.looks, spike=d.fit["spike"],
                                         prone=prone[r], family=max(1, layout.family), level=d.level,
                                         borrowed=borrowed[r])
            for a, dec in got.items():
                decisions[(a, r)] = dec
    return {"values": values, "results": results, "decisions": decisions, "rounds": rounds, "runs": len(results),
            "critical": crit, "prone": prone, "borrowed": borrowed, "family_on_seeds": layout.family}


def borrowed_variance(d: Design, fits: dict, arms: list, rung: str) -> tuple:
    """(sum of squares, df) the rung's comparison pools from its arms' tuning runs near their chosen rates
    (``study.borrow_variance: true``): per arm, the residual of a block model of its runs there, rates as
    treatments and tuning seeds as blocks (the seed's effect is not noise: the comparison's model removes it
    too; :func:`modforge.studies.lrfit.near_runs`), else (0, 0). Only a rung that
    was tuned has such runs (a rate carried up by ``transfer`` has none there)."""
    if not d.study.get("borrow_variance") or rung not in d.tuned_rungs:
        return 0.0, 0
    import numpy as np

    ss, df = 0.0, 0
    for a in arms:
        if (a, rung) not in fits or rung not in d.tuned_rungs_of(a):  # (a fit carried up has its runs below)
            continue
        table = lrfit.near_runs(fits[(a, rung)].valley)
        if len(table) < 2:
            continue
        width = max(map(len, table))
        y = np.array([[row[i] if i < len(row) else math.nan for i in range(width)] for row in table])[None]
        _, _, s2, d_, _ = blocks.block_fit(y, np.isfinite(y))  # rates as arms, tuning seeds as blocks
        if d_[0] > 0:
            ss, df = ss + float(s2[0]) * float(d_[0]), df + int(d_[0])
    return ss, df


def tuning_var(fits: dict, ar: tuple) -> float:
    """The variance an arm's loss has over re-tunings of its rate (0 without a fit)."""
    ch = fits.get(ar)
    return ch.valley.tuning_sd ** 2 if ch is not None and ch.setting is not None else 0.0


def unbracketed(d: Design, fits: dict) -> dict:
    """{(arm, rung): why} for the comparisons that get no verdict because an optimum is not known to be inside
    the grid (its best rate at an end after the allowed extensions) or no rate trained stably: a verdict over an
    unbracketed arm would compare it at a rate that is not its best."""
    key = d.fit["key"]

    def why(arm: str, r: str, role: str) -> Optional[str]:
        ch = fits.get((arm, r))
        if ch is None:
            return None
        v = ch.valley
        if not v.stable:
            return (f"{role} unstable: no {key} tried is below the failure level (study.tune.fail_level="
                    f"{d.fit['fail_level']:g}; {v.note or 'every run failed'}); extend study.tune.params.{key} below "
                    f"{2 ** min(x for x, _, _ in v.points):.4g}" if v.points else f"{role}: no tuning run")
        if not v.bracketed:
            return edge_why(role, key, v.edge, f"{2 ** v.best_x:.4g}", sorted({2 ** x for x, _, _ in v.points}))
        k, side = next(iter(ch.slice_edges(d.grid_of(arm)).items()), (None, None))  # another key's (a warm-up's)
        return edge_why(role, k, side, ch.setting[k], ch.tried(k, d.grid_of(arm))) if k else None

    def edge_why(role: str, k: str, side: str, shown: object, tried: list) -> str:
        """An optimum of key ``k`` at the ``side`` end of the values ``tried``, and how to bracket it."""
        way = "below" if side == "low" else "above"
        fix = (f"extend study.tune.params.{k} {way} it (or raise study.tune.extend)"
               if tuning.beyond(tried, side) is not None else
               f"the runner cannot step past it (a geometric step from {tried[0] if side == 'low' else tried[-1]} "
               f"and its neighbour gives no value): add a value {way} it to study.tune.params.{k}")
        return (f"{role} unbracketed: its best {k} is the {'lowest' if side == 'low' else 'highest'} tried "
                f"({shown}) after {d.extend} extension(s); {fix}")

    out = {}
    for r in d.rungs:
        base = why(d.baseline, r, "baseline")
        for a in d.compared:
            reason = base or why(a, r, "arm")
            if reason:
                out[(a, r)] = reason
    return out
