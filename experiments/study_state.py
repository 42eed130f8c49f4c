"""A long study's finished runs, kept small enough to commit and restored to continue it on a new machine.

A study continues where it stopped when its directory is there (finished runs are skipped: modforge.sweeps).
Where the directory does not survive (a fresh checkout each session, a preemptible node), ``save`` keeps what
the runner needs to skip every finished run: each stage's own files (``cells.json``, ``plan.json``, ...) and,
of each run that ended (its ``metrics.json``: finished, diverged or collapsed), its ``config.yaml``,
``metrics.json``, ``.modforge-run`` and ``.hydra/``; no checkpoints, logs or runs that did not end (those train
again, from the start, on the same seeds). About 0.6 KB a run, xz-compressed. ``restore`` unpacks it into an
empty study directory; the study command then continues.

    python experiments/study_state.py save studies/ladder_ffn experiments/results/ladder_ffn/state.tar.xz
    python experiments/study_state.py restore experiments/results/ladder_ffn/state.tar.xz studies/ladder_ffn
    python -m modforge.study experiment=ladder_ffn      # continues: the saved runs are not trained again
"""
import io
import os
import sys
import tarfile
from pathlib import Path

RUN_FILES = ("config.yaml", "metrics.json", "status.json", ".modforge-run")


def kept(study: Path) -> list[Path]:
    """The files ``save`` keeps, relative to the study's directory, in a stable order."""
    out = []
    for p in sorted(study.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(study)
        run = next((a for a in p.parents if (a / ".modforge-run").is_file() and a != study), None)
        if run is None:
            if not any(part in ("checkpoints", "logs") for part in rel.parts):
                out.append(rel)  # a stage's or the study's own record
            continue
        if not (run / "metrics.json").is_file():
            continue  # a run that did not end: it trains again
        inner = p.relative_to(run)
        if str(inner) in RUN_FILES or inner.parts[0] == ".hydra":
            out.append(rel)
    return out


def save(study: Path, target: Path) -> int:
    if not (study / "study.json").is_file():
        raise SystemExit(f"{study}: not a study's directory (no study.json); give the dir= the study ran in")
    files = kept(study)
    tmp = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp, "w:xz") as tar:
        for rel in files:
            data = (study / rel).read_bytes()
            info = tarfile.TarInfo(str(rel))
            info.size, info.mtime, info.mode = len(data), 0, 0o644  # the same runs give the same bytes
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, target)
    return sum(1 for r in files if r.name == "metrics.json")


def restore(source: Path, study: Path) -> int:
    if study.exists() and any(study.iterdir()):
        raise SystemExit(f"{study}: not empty; restore into a new directory (a study's runs are never mixed)")
    study.mkdir(parents=True, exist_ok=True)
    with tarfile.open(source, "r:xz") as tar:
        tar.extractall(study, filter="data")
    return sum(1 for _ in study.rglob("metrics.json"))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("save", "restore"):
        raise SystemExit("usage: python experiments/study_state.py save <study dir> <file.tar.xz> | restore "
                         "<file.tar.xz> <study dir>")
    verb, a, b = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    n = save(a, b) if verb == "save" else restore(a, b)
    print(f"{verb}: {n} finished runs ({b})")
