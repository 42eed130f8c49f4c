"""What the comparison design spends on the shipped studies' own truths (issue 48), as docs/studies.md quotes it.

For each committed study (``experiments/results/*/study*/report.json``) each comparison's truth is what it
measured: its Δ (the committed estimate) and its rung's noise (the sd of a run, pooled over the rung's arms).
The family (every compared arm at every rung) is simulated under the sequential design with seeds
``--looks`` (default 3 to 12) and its expected number of correct decisions and comparison runs measured; the
*smallest fixed design that makes as many decisions* is the fewest seeds n at which a single look (the same
block model, Dunnett's critical value for the family) reaches that expected number; its runs are n per arm.

    python experiments/comparison_savings.py [--families 4000] [--looks 3,12] [--borrow 0] [--paired]

The fixed design never borrows (it is today's report on a sweep). A comparison whose true Δ lies inside the
margin is decided rightly as equivalent or as a difference of its sign.
"""
import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> None:
    from modforge.studies.simulation import against_fixed, plug_in

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", type=int, default=4000)
    p.add_argument("--looks", default="3,12", help="first,last seeds of the sequential design (a look at each)")
    p.add_argument("--borrow", type=int, default=0, help="df of variance borrowed from the tuning runs, per rung")
    p.add_argument("--paired", action="store_true", help="the fixed design: each comparison's own paired t")
    a = p.parse_args(argv)
    first, last = (int(x) for x in a.looks.split(","))
    looks = list(range(first, last + 1))
    warnings.simplefilter("ignore", RuntimeWarning)
    rows = []
    for f in sorted(ROOT.glob("experiments/results/*/study*/report.json")):
        report = json.loads(f.read_text())
        rungs, margin = plug_in(report["verdicts"], report["arms"], a.borrow), report.get("margin")
        if not rungs:
            continue
        s = against_fixed(rungs, looks, margin, families=a.families, paired=a.paired)
        s["comparisons"] = sum(len(r.effects) for r in rungs)
        rows.append((str(f.parent.relative_to(ROOT / "experiments" / "results")), s))
    print(f"| study | comparisons | expected decisions | runs, sequential {first}-{last} | smallest fixed design "
          "with as many | ratio | false claims |")
    print("|---|---|---|---|---|---|---|")
    for name, s in rows:
        print(f"| {name} | {s['comparisons']} | {s['decisions']:.2f} | {s['runs']:.1f} | {s['fixed_seeds']} seeds, "
              f"{s['fixed_runs']} runs | {s['ratio']:.2f} | {s['false']:.3f} |")
    kept = [s for _, s in rows if math.isfinite(s["fixed_runs"])]
    total = sum(s["runs"] for s in kept) / sum(s["fixed_runs"] for s in kept)
    print(f"\nall studies: {total:.2f} x the runs of the fixed designs; median ratio "
          f"{statistics.median(s['ratio'] for s in kept):.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
