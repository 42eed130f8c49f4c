"""Decision accuracy (issue 51, item 6): do a study's small rungs give the verdict its largest rung gives?

For every committed study report (``experiments/results/<study>/study/report.json``) run at more than one rung,
each compared arm's verdict at each smaller rung is set beside its verdict at the largest rung: the same word
(better / worse / equivalent / inconclusive), and the same sign of the estimate. A rung where the arm is the
baseline's own model (µP over its base shape at the base: every paired difference exactly 0) compares nothing
and is left out, as is a comparison that never ran (*undecided*: the runner found the arm's rate unbracketed
and compared nothing), which has no verdict to set beside another. The rates are the measure of how far a CPU-sized rung predicts a larger one here; they are
counts over the studies as run, not a designed sample (the studies, arms and rungs were chosen for their own
questions), and the largest rung is itself a small model.

    python experiments/decision_accuracy.py     # prints the table; writes experiments/results/decision_accuracy.md
"""
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


# a study amended after its results (a second, labelled design of the same question: experiments/README.md) counts
# once, as its amendment, when the amendment's report is committed: the same arms and rungs counted twice would
# weigh one question double, and the first design's flaws are what the amendment mends
AMENDED = {"ladder_norms": "ladder_norms_bracket",
           # prepost_ln_bracket is prepost_ln's third design (issue 51, item 4), prepost_ln_refit its amendment
           "prepost_ln": "prepost_ln_bracket", "prepost_ln_bracket": "prepost_ln_refit"}


def final(study: str) -> str:
    """The last committed amendment of ``study`` (itself if none), along AMENDED's chain."""
    while study in AMENDED and (RESULTS / AMENDED[study] / "study" / "report.json").exists():
        study = AMENDED[study]
    return study


def reports() -> dict:
    """{study: its report} for each committed study report with verdicts at two or more rungs (a study whose
    amendment is committed: the amendment only)."""
    out = {}
    for p in sorted(RESULTS.glob("*/study/report.json")):
        study = p.parent.parent.name
        if final(study) != study:
            continue
        rec = json.loads(p.read_text())
        if len({v["rung"] for v in rec.get("verdicts", [])}) >= 2:
            out[study] = rec
    return out


def rung_order(rec: dict) -> list:
    order = []
    for a in rec["arms"]:
        if a["rung"] not in order:
            order.append(a["rung"])
    return order  # as the study ran them: smallest first


def same_model(rec: dict, arm: str, rung: str) -> bool:
    """The arm's comparison runs equal the baseline's, seed for seed (the same model run twice)."""
    vals = {(a["arm"], a["rung"]): a["values"] for a in rec["arms"]}
    base = next(a["arm"] for a in rec["arms"] if a["arm"] not in {v["arm"] for v in rec["verdicts"]})
    mine, theirs = vals.get((arm, rung)) or {}, vals.get((base, rung)) or {}
    shared = set(mine) & set(theirs)
    return bool(shared) and all(mine[s] == theirs[s] for s in shared)


def rows() -> list:
    out = []
    for study, rec in reports().items():
        order = rung_order(rec)
        verdicts = {}
        for v in rec["verdicts"]:
            verdicts.setdefault((v["arm"], v["rung"]), v)  # (a depth study lists an arm once per rung)
        for arm in dict.fromkeys(v["arm"] for v in rec["verdicts"]):
            top = verdicts.get((arm, order[-1]))
            if top is None or top["verdict"] == "undecided":
                continue
            for rung in order[:-1]:
                v = verdicts.get((arm, rung))
                if v is None or v["verdict"] == "undecided" or same_model(rec, arm, rung):
                    continue
                est, top_est = v.get("estimate"), top.get("estimate")
                sign = (None if est is None or top_est is None or not (math.isfinite(est) and math.isfinite(top_est))
                        else (est > 0) == (top_est > 0))
                out.append({"study": study, "arm": arm, "rung": rung, "top_rung": order[-1],
                            "verdict": v["verdict"], "estimate": est, "top_verdict": top["verdict"],
                            "top_estimate": top_est, "same_verdict": v["verdict"] == top["verdict"],
                            "same_sign": sign})
    return out


def summary(rs: list) -> dict:
    decisive = [r for r in rs if r["verdict"] != "inconclusive" and r["top_verdict"] != "inconclusive"]
    signs = [r for r in rs if r["same_sign"] is not None]
    return {"pairs": len(rs), "same_verdict": sum(r["same_verdict"] for r in rs),
            "decisive_pairs": len(decisive), "decisive_same": sum(r["same_verdict"] for r in decisive),
            "signed_pairs": len(signs), "same_sign": sum(r["same_sign"] for r in signs)}


def kind(study: str) -> str:
    return "parametrisations" if study.startswith("mup_") else "architecture questions"


def groups_table(rs: list) -> list:
    """The summary table experiments/README.md quotes (a test checks that it does, line for line)."""
    lines = ["| studies | smaller rungs' verdicts | same verdict as the largest rung | where both are decided | "
             "same sign of Δ |", "|---|---|---|---|---|"]
    groups = [(f"all ({len({r['study'] for r in rs})} studies)", rs)]
    for k in dict.fromkeys(sorted(kind(r["study"]) for r in rs)):
        sub = [r for r in rs if kind(r["study"]) == k]
        groups.append((f"{k} ({', '.join(dict.fromkeys(r['study'] for r in sub))})", sub))
    for name, sub in groups:
        t = summary(sub)
        lines.append(f"| {name} | {t['pairs']} | {pct(t['same_verdict'], t['pairs'])} | "
                     f"{pct(t['decisive_same'], t['decisive_pairs'])} | {pct(t['same_sign'], t['signed_pairs'])} |")
    return lines


def pct(a: int, n: int) -> str:
    return f"{a} of {n}" + (f" ({100 * a / n:.0f}%)" if n else "")


def amended(rs: list) -> str:
    counted = [f"{a} as {final(a)}" for a in AMENDED if final(a) != a and any(r["study"] == final(a) for r in rs)]
    return f"; a study amended after its results counts once, as its amendment: {', '.join(counted)}" if counted else ""


def markdown(rs: list) -> str:
    s = summary(rs)
    fmt = lambda w, e: f"{w} ({e:+.4f})" if e is not None else w  # noqa: E731
    lines = ["# Decision accuracy: do small rungs give the largest rung's verdict?", "",
             "Written by `python experiments/decision_accuracy.py` from every committed study report run at more "
             "than one rung (rungs where an arm is the baseline's own model are left out" + amended(rs) + ").", "",
             f"- Same verdict as the largest rung: **{pct(s['same_verdict'], s['pairs'])}** of the smaller rungs' "
             "verdicts.",
             f"- Where both are decided (neither inconclusive): {pct(s['decisive_same'], s['decisive_pairs'])}.",
             f"- Same sign of the estimate: {pct(s['same_sign'], s['signed_pairs'])}.", "",
             *groups_table(rs), "", "By study (same verdict; where both are decided; same sign):", ""]
    for study in dict.fromkeys(r["study"] for r in rs):
        t = summary([r for r in rs if r["study"] == study])
        lines.append(f"- {study}: {pct(t['same_verdict'], t['pairs'])}; {pct(t['decisive_same'], t['decisive_pairs'])}"
                     f"; {pct(t['same_sign'], t['signed_pairs'])}")
    lines += ["",
             "| study | arm | rung | its verdict (Δ) | largest rung's verdict (Δ) | same verdict | same sign |",
             "|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['study']} | `{r['arm']}` | {r['rung']} | {fmt(r['verdict'], r['estimate'])} | "
                     f"{fmt(r['top_verdict'], r['top_estimate'])} | {'yes' if r['same_verdict'] else 'no'} | "
                     f"{'—' if r['same_sign'] is None else 'yes' if r['same_sign'] else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = markdown(rows())
    (RESULTS / "decision_accuracy.md").write_text(text)
    print(text)
