"""A comparison where an arm had trouble, read a second way: the Hodges-Lehmann estimate of its paired
differences with Wilcoxon's signed-rank interval, beside the verdict (issue 48, item 1).

Why this robust alternative and not another: a spike is one large paired difference. It moves a mean (and
the verdict's Δ, and a sign-flip permutation test of the mean, which is exact but as sensitive to it) by
spike / n; the median of the Walsh averages barely moves (breakdown point 29%), and the signed-rank interval
is exact for differences symmetric about their centre, with no normality. A trimmed mean would need 5 or more
pairs to trim anything at 20%; comparisons here are often decided at 2 to 6. The check does not decide
anything: the verdict stays the one its design's error rate is simulated for (:mod:`modforge.studies.
simulation`); where the two disagree the report says so, for a reader to weigh."""
import math

from modforge.results import stats
from modforge.results.formats import markdown_table


def check(x: dict, base: dict, level: float) -> dict:
    """A comparison where either arm had trouble (failed or spiked runs), read robustly: the Hodges-Lehmann
    estimate of its paired differences with Wilcoxon's signed-rank interval at the verdict's own level
    (:func:`modforge.results.stats.hodges_lehmann`). A spike is one large difference; it moves the mean (and the
    verdict's Δ) by spike / n, this estimate barely, and the interval needs no normality."""
    seeds = [k for k in x if k in base and math.isfinite(x[k]) and math.isfinite(base[k])]
    est, low, high, coverage = stats.hodges_lehmann([x[k] - base[k] for k in seeds], level)
    return {"estimate": est, "low": low, "high": high, "coverage": coverage, "pairs": len(seeds)}


def agrees(v: dict, margin) -> str:
    """Whether the robust interval tells the verdict's story: 'yes', or how it differs."""
    r = v["robust"]
    if not math.isfinite(r["low"]):
        return f"no interval at {r['pairs']} pairs for this level"
    if v["verdict"] in ("better", "worse"):
        same = (r["low"] > 0 and v["low"] > 0) or (r["high"] < 0 and v["high"] < 0)
        return "yes" if same else "no: it does not exclude 0 on the verdict's side"
    if v["verdict"] not in ("equivalent", "inconclusive"):
        return "—"  # open or undecided: no story to tell
    if v["verdict"] == "equivalent":
        return "yes" if margin and -margin < r["low"] and r["high"] < margin else f"no: it leaves ±{margin:g}"
    return "yes" if r["low"] <= 0 <= r["high"] else "no: it excludes 0"


def section(rec: dict) -> list:
    """The report's table of the comparisons with trouble, each with its robust check."""
    rows = [v for v in rec["verdicts"] if v.get("robust")]
    if not rows:
        return []
    head = ["rung", "arm", "verdict", "Δ (mean)", "trouble: arm / baseline", "Hodges-Lehmann Δ",
            "signed-rank interval", "coverage", "pairs", "same story"]
    body = [[v["rung"] or "—", v["arm"], v["verdict"], f"{v['estimate']:+.4f}",
             f"{v['trouble'][0]}/{v['trouble'][1]} / {v['trouble_base'][0]}/{v['trouble_base'][1]}",
             f"{v['robust']['estimate']:+.4f}",
             f"[{v['robust']['low']:+.4f}, {v['robust']['high']:+.4f}]" if math.isfinite(v["robust"]["low"]) else "—",
             f"{v['robust']['coverage']:.4f}" if math.isfinite(v["robust"]["low"]) else "",
             str(v["robust"]["pairs"]), agrees(v, rec.get("margin"))] for v in rows]
    return ["", "### Comparisons with trouble, read robustly", "",
            "Where either arm had failed or spiked runs, the paired differences are read a second way: the "
            "Hodges-Lehmann estimate (the median of the Walsh averages, which a spike barely moves) with "
            "Wilcoxon's signed-rank interval at the verdict's level (exact for symmetric differences; its coverage "
            "is the one the ranks allow, exact without ties). It decides nothing; where it tells another story than the verdict, "
            "read the verdict with care.", "", markdown_table(head, body)]
