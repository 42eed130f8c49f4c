"""A ladder study's joint fit, computed again from its committed ``report.json`` with the code of this checkout.

The study runner writes the ladder's fit (each arm's compute multiplier with its interval, the per-arm-exponent
alternative, lack of fit, the held-out top rung, each rung's ranking) into ``report.json`` with the code the
study ran with. Where that code could not fit (ladder_norms ran with code that dropped a whole rung when one arm
had no runs there), this recomputes the fit from the per-seed values and training FLOPs the report keeps,
through the same function (``modforge.studies.ladder.record``), with the same number of draws. On a report
whose fit its own code made, it gives that fit again (a test checks ladder_ffn's, figure for figure).

    python experiments/ladder_fit.py experiments/results/ladder_norms/study/report.json

Prints the fit as JSON (the write-up quotes it; ``> file`` keeps it beside the report).
"""
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

from modforge.studies import ladder


def refit(report: dict) -> dict:
    rows = report["arms"]
    rungs = list(report["ladder"]["means"]) if report.get("ladder") else list(dict.fromkeys(r["rung"] for r in rows))
    compared = list(dict.fromkeys(v["arm"] for v in report["verdicts"]))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    baseline = next(a for a in arms if a not in compared)
    d = SimpleNamespace(rungs={r: {} for r in rungs}, arms=[baseline] + compared, baseline=baseline,
                        better=report["better"], level=report["level"], study=report["declared"],
                        metric=report["metric"])
    values = {(r["arm"], r["rung"]): {int(s): v for s, v in r["values"].items()} for r in rows}
    flops = {(r["arm"], r["rung"]): r["train_flops"] for r in rows}
    draws = (report.get("ladder") or {}).get("draws") or 1000
    return ladder.record(d, values, flops, report["verdicts"], draws)


def _plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python experiments/ladder_fit.py <a ladder study's report.json>", file=sys.stderr)
        return 2
    print(json.dumps(_plain(refit(json.loads(Path(argv[0]).read_text()))), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
