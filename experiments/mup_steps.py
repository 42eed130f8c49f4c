"""H2 of mup_ladder and mup_depth (issue 50, items 3 and 5): is a bigger model always better at the carried setting?

For one arm of a study, each step up its ladder (width or depth) is read as the paired difference of the arm's
comparison runs at the two rungs over the seeds both share (the same seed draws the same data order at every
rung: common random numbers), with a t interval at the family's level: Bonferroni over the steps, two-sided 95%
in all. A step "is better" when the interval lies below 0 (lower loss), "is worse" when above, else it is not
resolved at these seeds.

    python experiments/mup_steps.py experiments/results/mup_ladder/study/report.json "param.base.d_model=64,param.base.n_heads=2"

Prints a markdown table (the write-ups quote it).
"""
import json
import math
import statistics
import sys

from scipy import stats


def steps(report: dict, arm: str, level: float = 0.95) -> list[dict]:
    rows = [r for r in report["arms"] if r["arm"] == arm]
    if len(rows) < 2:
        raise SystemExit(f"{arm}: fewer than two rungs in this report (arms: {sorted({r['arm'] for r in report['arms']})})")
    alpha = (1 - level) / (len(rows) - 1)  # Bonferroni over the steps
    out = []
    for lo, hi in zip(rows, rows[1:]):
        shared = sorted(set(lo["values"]) & set(hi["values"]))
        d = [hi["values"][s] - lo["values"][s] for s in shared
             if math.isfinite(hi["values"][s]) and math.isfinite(lo["values"][s])]
        n = len(d)
        mean = statistics.fmean(d) if d else math.nan
        if n >= 2:
            half = stats.t.ppf(1 - alpha / 2, n - 1) * statistics.stdev(d) / math.sqrt(n)
            low, high = mean - half, mean + half
        else:
            low = high = math.nan
        word = "better" if high < 0 else "worse" if low > 0 else "not resolved"
        out.append({"from": lo["rung"], "to": hi["rung"], "pairs": n, "mean_from": lo["mean"], "mean_to": hi["mean"],
                    "diff": mean, "low": low, "high": high, "bigger is": word})
    return out


def table(rows: list) -> str:
    lines = ["| step | pairs | mean before | mean after | Δ (after − before) | interval (95%, Bonferroni) | bigger is |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['from']}` → `{r['to']}` | {r['pairs']} | {r['mean_from']:.4f} | {r['mean_to']:.4f} | "
                     f"{r['diff']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] | {r['bigger is']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-3].strip())
    print(table(steps(json.load(open(sys.argv[1])), sys.argv[2])))
