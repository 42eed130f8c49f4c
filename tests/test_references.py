"""Every reference to modforge's own code in its docstrings, comments and docs resolves: a dotted name
(``modforge.data.text.safe_cut``) imports, a path (``modforge/run/dirs.py``, ``tests/test_x.py``,
``benchmarks/gpu.py``) exists. Names drift when modules move; a reader who follows a stale one is lost."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOTTED = re.compile(r"(?<![\w./-])modforge(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])((?:modforge|tests|benchmarks|conf|docs|examples)/[\w./-]*\w)")
SOURCES = sorted([*ROOT.glob("modforge/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
                  *ROOT.glob("benchmarks/*.py"), ROOT / "benchmarks" / "README.md"])


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def references() -> list:
    out = []
    for f in SOURCES:
        text = f.read_text(encoding="utf-8")
        for m in DOTTED.finditer(text):
            out.append((f.relative_to(ROOT), "name", m.group(0).rstrip(".")))
        for m in PATH.finditer(text):
            out.append((f.relative_to(ROOT), "path", m.group(1).rstrip(".")))
    return sorted(set(out))


def test_every_reference_to_modforges_code_resolves():
    stale = []
    for where, kind, ref in references():
        ok = resolves(ref) if kind == "name" else (ROOT / ref).exists() or any(ROOT.glob(ref + "*"))  # gpu.{json,md}
        if not ok:
            stale.append(f"{where}: {ref}")
    assert not stale, "references to nothing:\n" + "\n".join(stale)


def test_the_check_sees_references():
    found = {ref for _, _, ref in references()}
    assert "modforge.data.text.safe_cut" in found and "modforge/models/flops.py" in found
    assert not resolves("modforge.data.tokenizers.safe_cut") and resolves("modforge.data.text.safe_cut")
