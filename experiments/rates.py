"""A study's success rate (``val/exact_match`` of a pair task), tested as a rate, beside the study's own metric.

The study runner compares arms on one metric by paired t intervals. A success rate whose runs are bimodal (a
decoder-only model that learns a task on some seeds and not on others: 0.0 on one, 1.0 on the next) has no
mean worth a t interval. This script reads the comparison runs of a study (its directory, or the state file
``experiments/study_state.py`` saved) and gives, for each arm at each rung:

* each run's successes, ``k`` of the ``data.n_val`` validation pairs, with Wilson's interval (a run that
  diverged or collapsed counts as 0 of them, and is listed);
* the arm's pooled rate (all its runs' pairs) with Wilson's interval;
* whether its runs are **bimodal** (declared rule: one run at or below 0.1 and another at or above 0.9); the
  mean with its t interval is given only where they are not;
* against the baseline: an **exact permutation test** of the difference of the mean per-run rates, over every
  split of the runs (p: the share of splits whose |difference| is at least the observed one), with the smallest
  p that its numbers of runs allow (the seed is the unit that repeats: a test that counted the pairs as
  independent trials would take one lucky seed's 512 successes as 512 pieces of evidence), Holm-adjusted over
  the comparisons, read in the project's words: **better** (a higher rate) or **worse** where it rejects, else
  **inconclusive** with its minimum detectable effect (the two-sample t's, on the per-run rates at the family's
  first Holm level: an approximation, said so) or, where no outcome of so few runs could pass, with "too few
  runs for this test" (no margin is declared for rates, so never *equivalent*); and Fisher's exact test of the pooled counts, which answers the narrower question "on these seeds", shown
  beside it, not used for a verdict.

    python experiments/rates.py experiments/results/architectures_long/state.tar.xz \
        experiments/results/architectures_long/study/report.json [--metric val/exact_match]
    python experiments/rates.py experiments/results/architectures/study/report.json \
        experiments/results/architectures/study/report.json --n-val 512    # a study whose metric is the rate

It prints a Markdown table (the write-up quotes it) and writes nothing.
"""
import argparse
import io
import json
import math
import sys
import tarfile
from pathlib import Path

import numpy as np
import yaml
from scipy import stats as sps

from modforge.results import stats

BIMODAL_LOW, BIMODAL_HIGH = 0.1, 0.9


def runs_of(source: Path) -> list:
    """[(overrides, config, metrics)] of the comparison runs that ended, from a study directory or its state."""
    files: dict = {}
    if source.is_dir():
        for p in source.rglob("*"):
            if p.is_file() and p.relative_to(source).parts[0] == "compare":
                files[str(p.relative_to(source))] = p.read_bytes()
    else:
        with tarfile.open(source, "r:*") as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.split("/")[0] == "compare":
                    files[m.name] = tar.extractfile(m).read()
    out = []
    for name, data in sorted(files.items()):
        if not name.endswith("/metrics.json"):
            continue
        run = name[: -len("metrics.json")]
        over = files.get(run + ".hydra/overrides.yaml")
        cfg = files.get(run + "config.yaml")
        if over is None or cfg is None:
            continue
        out.append((list(yaml.safe_load(io.BytesIO(over))), yaml.safe_load(io.BytesIO(cfg)), json.loads(data)))
    return out


def arm_of(overrides: list, report: dict) -> tuple:
    """(arm, rung) of a run: of the report's arms and rungs whose overrides the run's all include, the one that
    names the most (an arm ``pos=x`` and another ``pos=x,model.n_layers=4``: the second's runs are the second's)."""
    have = set(overrides)
    best, size = (None, None), -1
    for a in report["arms"]:
        need = [kv for part in (a["arm"], a["rung"]) for kv in part.split(",") if kv]
        need += [f"{k}={v}" for k, v in (a.get("setting") or {}).items()]
        if all(kv in have for kv in need) and len(need) > size:
            best, size = (a["arm"], a["rung"]), len(need)
    return best


def baseline_of(report: dict) -> str:
    """The arm that is in no verdict (the runner lists the compared arms there)."""
    compared = {v["arm"] for v in report.get("verdicts", [])}
    return next(a["arm"] for a in report["arms"] if a["arm"] not in compared)


def count(rate: float, n: int, metric: str) -> tuple:
    """(k, n) for a rate that is k of n, or one line saying it is not."""
    k = round(rate * n)
    if abs(k - rate * n) > 1e-6 * n:
        raise SystemExit(f"{metric}={rate} is not a count out of {n} validation pairs")
    return k, n


def exact_permutation_p(a: list, b: list) -> float:
    """Two-sided p: the share of all splits of the runs into groups of their sizes whose |difference of means|
    is at least the observed one (exact, no normality; for unequal groups this is not twice a one-sided p)."""
    if len(a) < 1 or len(b) < 1:
        return math.nan
    res = sps.permutation_test((np.asarray(a, float), np.asarray(b, float)),
                               lambda x, y: abs(np.mean(x) - np.mean(y)),
                               permutation_type="independent", n_resamples=np.inf, alternative="greater")
    return float(min(1.0, res.pvalue))


def smallest_p(m: int, n: int) -> float:
    """The smallest p the exact test can give with m and n runs: one split in all (the observed one) as far apart,
    or two where the groups are the same size (a split and its mirror have the same |difference|)."""
    return (2 if m == n else 1) / math.comb(m + n, m) if m and n else math.nan


def mde(a: list, b: list, alpha: float) -> float:
    """The difference of mean rates a two-sample t test at ``alpha`` would find with 80% power at these runs'
    spread (``stats.minimum_detectable``): an approximation for the exact test, which has no closed form."""
    if len(a) + len(b) < 3:
        return math.nan
    pooled = ((len(a) - 1) * (np.var(a, ddof=1) if len(a) > 1 else 0.0)
              + (len(b) - 1) * (np.var(b, ddof=1) if len(b) > 1 else 0.0)) / (len(a) + len(b) - 2)
    se = math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return stats.minimum_detectable(se, len(a) + len(b) - 2, alpha) if se > 0 else math.nan


def holm(ps: list) -> list:
    """Holm's step-down adjustment; a NaN p stays NaN and does not enter the steps."""
    real = [i for i, p in enumerate(ps) if not math.isnan(p)]
    order = sorted(real, key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(real) - rank) * ps[i]))
        out[i] = running
    return out


def from_report(report: dict, metric: str, n: int) -> dict:
    """{(rung, arm): {seed: (k, n)}} from a report whose own metric is ``metric`` (its per-seed values)."""
    if report.get("metric") != metric:
        raise SystemExit(f"the report's metric is {report.get('metric')}, not {metric}: give the study's runs")
    cells = {}
    for a in report["arms"]:
        for seed, rate in a["values"].items():
            cells.setdefault((a["rung"], a["arm"]), {})[int(seed)] = count(rate, n, metric)
    return cells


def table(source: Path, report: dict, metric: str = "val/exact_match", n_val: int = 0) -> dict:
    level = float(report.get("level", 0.95))
    cells: dict = from_report(report, metric, n_val) if source.suffix == ".json" else {}
    unread, failed = [], []
    for over, cfg, m in ([] if source.suffix == ".json" else runs_of(source)):
        arm, rung = arm_of(over, report)
        seed = next((int(kv.split("=", 1)[1]) for kv in over if kv.startswith("seed=")), int(cfg.get("seed", 0)))
        if arm is None:
            unread.append(",".join(over))
            continue
        if m.get("status") in ("diverged", "collapsed"):  # an outcome: it solved nothing
            cells.setdefault((rung, arm), {})[seed] = (0, int(cfg["data"]["n_val"]))
            failed.append(f"{arm} seed {seed} ({m['status']})")
            continue
        if m.get("status") != "finished" or metric not in m.get("val", {}):
            unread.append(",".join(over))
            continue
        cells.setdefault((rung, arm), {})[seed] = count(float(m["val"][metric]), int(cfg["data"]["n_val"]), metric)
    base = baseline_of(report)
    rows = []
    for (rung, arm), by_seed in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] != base, kv[0][1])):
        ks = [by_seed[s] for s in sorted(by_seed)]
        rates = [k / n for k, n in ks]
        K, N = sum(k for k, _ in ks), sum(n for _, n in ks)
        bimodal = min(rates) <= BIMODAL_LOW and max(rates) >= BIMODAL_HIGH
        row = {"rung": rung, "arm": arm, "seeds": sorted(by_seed), "k": [k for k, _ in ks], "n": [n for _, n in ks],
               "per_run_wilson": [stats.wilson(k, n, level) for k, n in ks], "pooled": (K, N),
               "pooled_wilson": stats.wilson(K, N, level), "bimodal": bimodal}
        if not bimodal and len(rates) >= 2:
            iv = stats.mean_interval(rates, level, 0.0, 1.0)
            row["mean"] = (iv.estimate, iv.low, iv.high)
        rows.append(row)
    tests = []
    for row in rows:
        if row["arm"] == base:
            continue
        b = next((r for r in rows if r["rung"] == row["rung"] and r["arm"] == base), None)
        if b is None:
            continue
        ra = [k / n for k, n in zip(row["k"], row["n"])]
        rb = [k / n for k, n in zip(b["k"], b["n"])]
        tests.append({"rung": row["rung"], "arm": row["arm"], "diff": float(np.mean(ra) - np.mean(rb)),
                      "p": exact_permutation_p(ra, rb), "runs": (len(ra), len(rb)),
                      "smallest_p": smallest_p(len(ra), len(rb)),
                      "_rates": (ra, rb),
                      "fisher_pooled_p": stats.fisher(row["pooled"][1] - row["pooled"][0], row["pooled"][1],
                                                      b["pooled"][1] - b["pooled"][0], b["pooled"][1])})
    for t, p in zip(tests, holm([t["p"] for t in tests])):
        t["p_holm"] = p
        t["verdict"] = ("better" if t["diff"] > 0 else "worse") if p <= 1 - level else "inconclusive"
        t["why"] = ("too few runs for this test" if t["verdict"] == "inconclusive"
                    and t["smallest_p"] * len(tests) > 1 - level else "")  # no outcome of these runs could pass
        ra, rb = t.pop("_rates")
        t["mde"] = mde(ra, rb, (1 - level) / len(tests)) if t["verdict"] == "inconclusive" else None
    return {"metric": metric, "level": level, "baseline": base, "rows": rows, "tests": tests,
            "failed_counted_as_0": failed, "unread": unread}


def reading(x: dict) -> str:
    if x["verdict"] != "inconclusive":
        return x["verdict"]
    return f"inconclusive ({x['why'] or 'MDE ' + format(x['mde'], '.3g') + ', t approximation'})"


def _p(p: float) -> str:
    return "< 1e-300" if p == 0 else f"{p:.3g}"


def markdown(t: dict) -> str:
    pc = f"{t['level']:.0%}"
    lines = [f"{t['metric']} as a rate: each run's successes of its validation pairs, the arm's pooled rate with "
             f"Wilson's {pc} interval, and the mean per run only where the runs are not bimodal (one at or below "
             f"{BIMODAL_LOW}, another at or above {BIMODAL_HIGH}).", "",
             "| rung | arm | per run (k/n) | pooled | Wilson | bimodal | mean [t interval] |", "|---|---|---|---|---|---|---|"]
    for r in t["rows"]:
        per = ", ".join(f"{k}/{n}" for k, n in zip(r["k"], r["n"]))
        lo, hi = r["pooled_wilson"]
        K, N = r["pooled"]
        mean = "—" if "mean" not in r else f"{r['mean'][0]:.4f} [{r['mean'][1]:.4f}, {r['mean'][2]:.4f}]".replace(
            "[nan, nan]", "(no interval: the runs are equal)")
        lines.append(f"| {r['rung'] or '—'} | {r['arm']} | {per} | {K}/{N} = {K / N:.4f} | [{lo:.4f}, {hi:.4f}] | "
                     f"{'yes' if r['bimodal'] else 'no'} | {mean} |")
    lines += ["", f"Against the baseline ({t['baseline']}): the exact permutation test of the mean per-run rate, "
              f"Holm-adjusted over {len(t['tests'])} comparison(s); Fisher's exact test of the pooled pairs "
              "(on these seeds only) beside it.", "",
              "| rung | arm | Δ mean rate | runs | p exact | smallest p possible | p Holm | reading | "
              "Fisher p (pooled pairs) |", "|---|---|---|---|---|---|---|---|---|"]
    for x in t["tests"]:
        lines.append(f"| {x['rung'] or '—'} | {x['arm']} | {x['diff']:+.4f} | {x['runs'][0]} vs {x['runs'][1]} | "
                     f"{x['p']:.3g} | {x['smallest_p']:.3g} | {x['p_holm']:.3g} | {reading(x)} | "
                     f"{_p(x['fisher_pooled_p'])} |")
    for key, words in (("failed_counted_as_0", "Diverged or collapsed runs, counted as 0 successes"),
                       ("unread", "Comparison runs not read (no arm of the report, or not ended)")):
        if t.get(key):
            lines += ["", f"{words}: " + "; ".join(t[key]) + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="the study's directory or its saved state (.tar.xz)")
    ap.add_argument("report", type=Path, help="the study's report.json (its arms, rungs, rates and level)")
    ap.add_argument("--metric", default="val/exact_match")
    ap.add_argument("--n-val", type=int, default=0, help="with SOURCE the report itself (a study whose own metric "
                    "is the rate): the validation pairs of a run")
    a = ap.parse_args(argv)
    if a.source.suffix == ".json" and a.n_val < 1:
        print("error: --n-val: give the validation pairs of a run (a positive integer) when SOURCE is a report",
              file=sys.stderr)
        return 2
    for p in (a.source, a.report):
        if not p.exists():
            print(f"error: {p}: no such file or directory", file=sys.stderr)
            return 2
    print(markdown(table(a.source, json.loads(a.report.read_text()), a.metric, a.n_val)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
