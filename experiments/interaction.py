"""A 2x2 interaction from a study's comparison runs: does factor B help under one level of factor A more than under
the other?

    python experiments/interaction.py experiments/results/positions_2x2/study/report.json \
        "pos=learned,model.scale_embeddings=true" pos=learned \
        "pos=sinusoidal,model.scale_embeddings=true" pos=sinusoidal

reads the four arms' comparison values (``report.json``'s ``arms[].values``: the study's metric, one per fresh
seed) and gives, paired by seed over the seeds all four arms finished,

    d_s = (a1_s - a0_s) - (b1_s - b0_s)

its mean with a Student t interval (``--level``, 0.95 by default; one interval, its own family) and the paired t
test's p. The seed is the unit: the four runs of one seed share their data order and initial draws, so the
per-seed contrast removes what they share. Read in the project's words, with no margin (none is declared for an
interaction): the interval above 0 "a1 - a0 is larger than b1 - b0", below 0 "smaller", else **inconclusive** with
its minimum detectable effect (the true interaction this t test detects with 80% power, from the noncentral t:
:func:`modforge.results.stats.minimum_detectable`, as the study runner's MDEs). Seeds whose contrasts do not vary
at all give no interval: that is refused in one line. It prints a Markdown table and writes nothing.
"""
import argparse
import json
import math
import sys
from pathlib import Path

from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere in the repo
from modforge.results.stats import minimum_detectable  # noqa: E402


def arm_values(report: dict, arm: str) -> dict:
    """{seed: value} of ``arm``'s comparison runs (at the study's one rung)."""
    rows = [a for a in report["arms"] if a["arm"] == arm]
    if not rows:
        raise SystemExit(f"arm={arm!r}: not in the report (its arms: {', '.join(a['arm'] for a in report['arms'])})")
    if len(rows) > 1:
        raise SystemExit(f"arm={arm!r}: at {len(rows)} rungs; this script reads a one-rung study")
    return {str(k): float(v) for k, v in rows[0]["values"].items() if v is not None and math.isfinite(v)}


def interaction(report: dict, a1: str, a0: str, b1: str, b0: str, level: float = 0.95) -> dict:
    vals = [arm_values(report, x) for x in (a1, a0, b1, b0)]
    seeds = sorted(set.intersection(*(set(v) for v in vals)), key=lambda s: int(s) if s.isdigit() else s)
    if len(seeds) < 2:
        raise SystemExit(f"{len(seeds)} seed(s) finished in all four arms: an interval needs 2 at least")
    d = [(vals[0][s] - vals[1][s]) - (vals[2][s] - vals[3][s]) for s in seeds]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    if not sd > 0:
        raise SystemExit(f"the interaction is {mean:+.6g} at every one of {n} seeds: no spread, so no interval "
                         "(were the four arms given as two pairs of the same runs?)")
    t = sps.ttest_1samp(d, 0.0)
    ci = t.confidence_interval(level)
    mde = minimum_detectable(sd / math.sqrt(n), n - 1, 1 - level)
    if ci.low > 0:
        reading = "a1 - a0 is larger than b1 - b0"
    elif ci.high < 0:
        reading = "a1 - a0 is smaller than b1 - b0"
    else:
        reading = f"inconclusive (MDE {mde:.4f})"
    return {"arms": {"a1": a1, "a0": a0, "b1": b1, "b0": b0}, "seeds": seeds, "differences": d, "mean": mean,
            "sd": sd, "low": float(ci.low), "high": float(ci.high), "level": level, "p": float(t.pvalue),
            "mde": mde, "reading": reading, "simple": {"a": [vals[0][s] - vals[1][s] for s in seeds],
                                                       "b": [vals[2][s] - vals[3][s] for s in seeds]}}


def markdown(x: dict, metric: str) -> str:
    a, s = x["arms"], x["simple"]
    ma, mb = sum(s["a"]) / len(s["a"]), sum(s["b"]) / len(s["b"])
    lines = [f"({a['a1']} − {a['a0']}) − ({a['b1']} − {a['b0']}) in {metric}, paired by seed over "
             f"{len(x['seeds'])} seeds ({', '.join(x['seeds'])}):", "",
             "| contrast | mean | per seed |", "|---|---|---|",
             f"| a1 − a0 | {ma:+.4f} | {', '.join(f'{v:+.4f}' for v in s['a'])} |",
             f"| b1 − b0 | {mb:+.4f} | {', '.join(f'{v:+.4f}' for v in s['b'])} |",
             f"| interaction | {x['mean']:+.4f} | {', '.join(f'{v:+.4f}' for v in x['differences'])} |", "",
             f"Interaction {x['mean']:+.4f} [{x['low']:+.4f}, {x['high']:+.4f}] at {x['level']:g} "
             f"(t, {len(x['seeds']) - 1} df; sd {x['sd']:.4f}; p {x['p']:.3g}): {x['reading']}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("a1")
    ap.add_argument("a0")
    ap.add_argument("b1")
    ap.add_argument("b0")
    ap.add_argument("--level", type=float, default=0.95)
    args = ap.parse_args(argv)
    if not 0 < args.level < 1:
        raise SystemExit(f"--level={args.level}: must be between 0 and 1")
    report = json.loads(args.report.read_text())
    x = interaction(report, args.a1, args.a0, args.b1, args.b0, args.level)
    print(markdown(x, report.get("metric", "the metric")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
