"""The primary measure of experiments/qk_norm_stability.md, as declared: each arm's learning-rate sensitivity
(Wortsman et al. 2023, §3.1) per tuning seed, and each fix against the plain decoder, paired by seed.

    python experiments/qk_norm_stability.py studies/qk_norm_stability

reads every tuning run's ``config.yaml`` and ``metrics.json`` under the study's ``tune/`` (a restored
``experiments/results/qk_norm_stability/state.tar.xz`` serves: experiments/study_state.py) and writes
``experiments/results/qk_norm_stability/sensitivity.{md,json}``. S(arm, seed) = the mean over the grid of
min(L, L0) - L*, L a run's final val/loss (L0 where it diverged, collapsed or ended non-finite), L0 its
val_loss_at_start, L* the least L of that arm and seed; Δ = S(fix) - S(plain) over the shared seeds, a paired t
interval at 95% over the family of two (modforge.results.stats.compare), the verdict in four words, margin 0.02.
"""
import json
import math
import sys
from pathlib import Path

import yaml

from modforge.results.stats import compare, verdict

ARMS = {"plain": "attention.qk_norm=null", "qk_norm": "attention.qk_norm=layer", "z_loss": "task.z_loss=0.0001"}
OUT = Path(__file__).resolve().parent / "results" / "qk_norm_stability"
MARGIN, FAMILY = 0.02, 2


def arm_of(cfg: dict) -> str:
    if (cfg.get("attention") or {}).get("qk_norm"):
        return "qk_norm"
    if (cfg.get("task") or {}).get("z_loss"):
        return "z_loss"
    return "plain"


def runs(study: Path) -> list[dict]:
    out = []
    for m in sorted((study / "tune").rglob("metrics.json")):
        cfg = yaml.safe_load((m.parent / "config.yaml").read_text())
        rec = json.loads(m.read_text())
        start = rec.get("val_loss_at_start")
        loss = (rec.get("val") or {}).get("val/loss")
        ok = rec.get("status") == "finished" and loss is not None and math.isfinite(loss)
        out.append({"arm": arm_of(cfg), "lr": cfg["optim"]["lr"], "seed": cfg["seed"], "status": rec.get("status"),
                    "loss": loss if ok else None, "start": start})
    return out


def sensitivity(rs: list[dict]) -> dict:
    """{arm: {seed: S}} over the runs (each arm and seed must have run every rate of the grid)."""
    grid = sorted({r["lr"] for r in rs})
    out: dict = {}
    for arm in ARMS:
        for seed in sorted({r["seed"] for r in rs if r["arm"] == arm}):
            mine = {r["lr"]: r for r in rs if r["arm"] == arm and r["seed"] == seed}
            if sorted(mine) != grid:
                raise SystemExit(f"{arm} seed {seed}: ran {sorted(mine)}, not the grid {grid}")
            capped = [min(r["loss"], r["start"]) if r["loss"] is not None else r["start"] for r in mine.values()]
            best = min(r["loss"] for r in mine.values() if r["loss"] is not None)
            out.setdefault(arm, {})[seed] = sum(c - best for c in capped) / len(capped)
    return out


def main(argv: list) -> None:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    rs = runs(Path(argv[0]))
    s = sensitivity(rs)
    rows, record = [], {"sensitivity": {a: {str(k): v for k, v in d.items()} for a, d in s.items()}, "verdicts": {}}
    for arm in ("qk_norm", "z_loss"):
        c = compare(s[arm], s["plain"], level=0.95, family=FAMILY, paired=True)
        word, why = verdict(c, better="min", margin=MARGIN)
        record["verdicts"][arm] = {"delta": c.estimate, "low": c.low, "high": c.high, "verdict": word, "why": why}
        rows.append(f"| {ARMS[arm]} | {c.estimate:+.4f} | [{c.low:+.4f}, {c.high:+.4f}] | **{word}** | {why} |")
    fails = {a: sum(1 for r in rs if r["arm"] == a and r["loss"] is None) for a in ARMS}
    lines = ["# qk_norm_stability: learning-rate sensitivity (the declared primary measure)", "",
             "Written by `python experiments/qk_norm_stability.py <study directory>` from the tuning runs.", "",
             "| arm | S by seed | mean S | runs that failed |", "|---|---|---|---|"]
    for arm, d in s.items():
        lines.append(f"| {ARMS[arm]} | {', '.join(f'{d[k]:.4f}' for k in sorted(d))} | "
                     f"{sum(d.values()) / len(d):.4f} | {fails[arm]} of {sum(1 for r in rs if r['arm'] == arm)} |")
    lines += ["", "Δ = S(fix) − S(plain), paired by seed, 95% over the family of two, margin ±0.02:", "",
              "| fix | Δ | interval | verdict | rests on |", "|---|---|---|---|---|", *rows, ""]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sensitivity.md").write_text("\n".join(lines))
    (OUT / "sensitivity.json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
