"""Sections 1 and 2 of experiments/shakespeare_char.md, run again and kept: nanoGPT's replay and modforge's
``experiment=shakespeare_char``, at the same five seeds, one after the other.

    python experiments/shakespeare_char_replay.py ../shared/data/tinyshakespeare/input.txt

For each seed (1337, 1, 2, 3, 4) it runs ``experiments/shakespeare_char_peer.py`` (nanoGPT's estimates every 250
steps and the loss over the whole validation split) and ``python -m modforge.train experiment=shakespeare_char``
(the loss over the whole validation split after the last step), each alone, and writes to
``experiments/results/shakespeare_char/replay/``: the replay's output as printed (``peer_<seed>.txt``), the
modforge run's ``metrics.json`` (``modforge_<seed>.json``), and ``replay.md``, the two tables the write-up quotes
with the CPU they ran on. A seed already written is not run again (delete its files to redo it).
"""
import argparse
import json
import platform
import re
import shutil
import statistics as st
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "shakespeare_char" / "replay"
SEEDS = (1337, 1, 2, 3, 4)
ESTIMATE = re.compile(r"step 2000: train loss (\d+\.\d+), val loss (\d+\.\d+)")
WHOLE = re.compile(r"val loss over the whole split (\d+\.\d+)")


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_peer(data: Path, seed: int) -> None:
    target = OUT / f"peer_{seed}.txt"
    if target.exists():
        return
    p = subprocess.run([sys.executable, str(HERE / "shakespeare_char_peer.py"), str(data), "--seed", str(seed)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"the replay at seed {seed} failed:\n{p.stderr[-2000:]}")
    tmp = target.with_suffix(".part")
    tmp.write_text(p.stdout)
    tmp.replace(target)


def run_modforge(data: Path, seed: int) -> None:
    target = OUT / f"modforge_{seed}.json"
    if target.exists():
        return
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([sys.executable, "-m", "modforge.train", "experiment=shakespeare_char",
                            f"data.path={data}", f"seed={seed}", "trainer.enable_progress_bar=false",
                            f"hydra.run.dir={d}/run"], capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"modforge at seed {seed} failed:\n{p.stderr[-2000:]}")
        tmp = target.with_suffix(".part")
        shutil.copyfile(Path(d) / "run" / "metrics.json", tmp)
        tmp.replace(target)


def table() -> str:
    rows, est, whole, mf = [], [], [], []
    for s in SEEDS:
        out = (OUT / f"peer_{s}.txt").read_text()
        e, w = ESTIMATE.search(out), WHOLE.search(out)
        if e is None or w is None:
            raise SystemExit(f"{OUT / f'peer_{s}.txt'}: no step-2000 estimate or whole-split loss in it; delete it "
                             "and run again")
        m = json.loads((OUT / f"modforge_{s}.json").read_text())
        v = (m.get("val") or {}).get("val/loss")
        if not isinstance(v, (int, float)):
            raise SystemExit(f"{OUT / f'modforge_{s}.json'}: the run ended {m.get('status')!r} with no val/loss")
        est.append(float(e.group(2)))
        whole.append(float(w.group(1)))
        mf.append(float(v))
        rows.append(f"| {s} | {e.group(1)} | {e.group(2)} | {w.group(1)} | {v:.4f} |")

    def ms(x):
        return f"{st.mean(x):.4f} ± {st.stdev(x):.4f}"
    return "\n".join([
        "# shakespeare_char, sections 1 and 2, run again", "",
        "Written by `python experiments/shakespeare_char_replay.py ../shared/data/tinyshakespeare/input.txt`; each run "
        f"alone. CPU: {cpu()}; torch {__import__('torch').__version__}.", "",
        "| seed | replay: train estimate at 2000 | replay: val estimate at 2000 | replay: whole val split | "
        "modforge: whole val split |", "|---|---|---|---|---|", *rows,
        f"| mean ± sd | | {ms(est)} | {ms(whole)} | {ms(mf)} |", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    a = ap.parse_args(argv)
    if not a.data.is_file():
        raise SystemExit(f"data={a.data}: no such file (the tiny Shakespeare text, ../shared/data/tinyshakespeare/input.txt)")
    OUT.mkdir(parents=True, exist_ok=True)
    data = a.data.resolve()
    for s in SEEDS:
        run_peer(data, s)
        print(f"replay seed {s} done", flush=True)
        run_modforge(data, s)
        print(f"modforge seed {s} done", flush=True)
    (OUT / "replay.md").write_text(table())
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
