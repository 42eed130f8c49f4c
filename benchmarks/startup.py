"""Start-up: from the command to the first training step, against the import floor, measured in one run.

    python benchmarks/startup.py [--rounds 5] [overrides ...]

Each round runs, one after the other in fresh interpreters:

* the floor: ``python -c "import torch, lightning"``, timed inside the interpreter
  from its first statement to the end of the imports;
* the command: ``python -m modforge.train trainer.max_steps=1 sample=false
  eval_at_start=false <overrides>`` into a temporary directory; its ``metrics.json`` reports
  ``seconds_to_first_step``, timed the same way, from the first statement of
  ``modforge.train`` to the start of the first training batch, and
  ``session_seconds``, the phases before it.

The report is the median of each, their difference (what modforge adds to the
imports every Lightning program pays), and the median phases. The first round
also builds the token cache if it is cold; pass ``--rounds`` of at least 3 so
the median is a warm start. The step-0 evaluation (``eval_at_start``, on by
default in a run) is work the user asked for, not start-up, so it is off here;
``eval_at_start=true`` as an override puts it back in.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR = "import time; t = time.perf_counter(); import torch, lightning; print(time.perf_counter() - t)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for the run")
    a = ap.parse_args()
    floors, firsts, phases = [], [], []
    for r in range(a.rounds):
        floors.append(float(subprocess.run([sys.executable, "-c", FLOOR], check=True, capture_output=True,
                                           text=True).stdout))
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "modforge.train", "trainer.max_steps=1", "sample=false",
                   "eval_at_start=false", f"hydra.run.dir={tmp}/run", *a.overrides]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the run failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            m = json.loads(Path(tmp, "run", "metrics.json").read_text())
        firsts.append(m["seconds_to_first_step"])
        phases.append(m["session_seconds"])
        print(f"round {r + 1}: import floor {floors[-1]:.2f} s, command to first step {firsts[-1]:.2f} s", flush=True)
    f, s = statistics.median(floors), statistics.median(firsts)
    keys = [k for k in phases[0] if k in ("before_run", "setup", "data", "model", "trainer", "eval_at_start")]
    med = {k: statistics.median(p.get(k, 0.0) for p in phases) for k in keys}
    import torch

    print(f"\nmedians of {a.rounds} rounds (torch {torch.__version__}): import floor (torch + lightning) {f:.2f} s; "
          f"command to first training step {s:.2f} s: **{s - f:+.2f} s** over the floor")
    print("phases before the first step: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))


if __name__ == "__main__":
    main()
