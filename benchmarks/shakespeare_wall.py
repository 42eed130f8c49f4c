"""Wall time of ``experiment=shakespeare_char`` against the plain-torch replay doing the same evaluation work.

    python benchmarks/shakespeare_wall.py [--data ../shared/data/tinyshakespeare/input.txt] [--rounds 2]

Runs, one after the other, each timed from the outside (process start to exit):

* ``python -m modforge.train experiment=shakespeare_char data.path=<data>``: 2,000
  steps, the whole validation split at step 0 and every 250 steps (the one at
  step 2,000 is the final result), a checkpoint at each validation, the sample;
* ``python experiments/shakespeare_char_peer.py <data> --eval whole``: the same
  recipe in plain torch with the same evaluations (whole split at step 0 and
  every 250 steps), no checkpoints, no logging.

It prints both wall times, their ratio, modforge's ``session_seconds`` (where
its time went) and the replay's own breakdown. Rounds alternate which command
goes first (ABBA), so drift does not favour one. One round is about 2.5 minutes
on 2 cores.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"))
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not Path(a.data).is_file():
        sys.exit(f"--data {a.data}: no such file (tinyshakespeare's input.txt)")
    ours, peer = [], []
    for r in range(a.rounds):
        for side in ("modforge", "replay") if r % 2 == 0 else ("replay", "modforge"):
            (run_ours if side == "modforge" else run_peer)(a, r, ours, peer)
    o, p = statistics.median(ours), statistics.median(peer)
    print(f"\nmedian wall: modforge {o:.1f} s, replay {p:.1f} s: modforge / replay = **{o / p:.3f}**")


def run_ours(a, r: int, ours: list, peer: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wall, _ = timed([sys.executable, "-m", "modforge.train", "experiment=shakespeare_char",
                         f"data.path={a.data}", f"hydra.run.dir={tmp}/run"])
        m = json.loads(Path(tmp, "run", "metrics.json").read_text())
    ours.append(wall)
    print(f"round {r + 1}: modforge {wall:.1f} s (val loss {m['val']['val/loss']:.4f}, "
          f"{m['tokens_per_sec']:,.0f} tokens/s); session_seconds {m['session_seconds']}", flush=True)


def run_peer(a, r: int, ours: list, peer: list) -> None:
    wall, out = timed([sys.executable, "experiments/shakespeare_char_peer.py", a.data, "--eval", "whole"])
    peer.append(wall)
    print(f"round {r + 1}: plain-torch replay {wall:.1f} s; " + " ".join(out.strip().splitlines()[-2:]), flush=True)


if __name__ == "__main__":
    main()
