"""The house imports only downward: no import circle in modforge/, the registry on the ground floor.

Every ``import`` statement of every module counts, also those inside functions
(a lazy import is still a dependency). Run ``python -m pytest tests/test_layering.py -q``
to check; a failure names the modules of the circle or the import that goes up.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "modforge"

# floor of each module (prefix match, longest first); a module imports only from its floor or below
FLOORS = {
    "modforge.registry": 0, "modforge.io": 0, "modforge.stats": 0, "modforge.slots": 0, "modforge.devices": 0,
    "modforge.launchers": 1,
    "modforge.runs": 1, "modforge.data.loading": 1, "modforge.output": 0,
    "modforge.cli": 1, "modforge.plots": 1, "modforge.components": 1, "modforge.optim": 1, "modforge.trainer_schema": 1,
    "modforge.decoding": 1, "modforge.data.tokenizers": 1, "modforge.data.corpus": 1,
    "modforge.models": 2, "modforge.data.cache": 2, "modforge.data.base": 2,
    "modforge.data": 3,
    "modforge.tasks": 4, "modforge.callbacks": 4, "modforge.monitoring": 4, "modforge.sweep": 4,
    "modforge.builtins": 5, "modforge.checkpoints": 5, "modforge.config": 5, "modforge.manifest": 5,
    "modforge.train": 6, "modforge.generate": 6, "modforge.list": 6, "modforge.report": 6, "modforge.export": 6, "modforge.frontdoor": 6, "modforge": 6,
}
NO_LIGHTNING_OR_HYDRA = ("modforge.io", "modforge.stats", "modforge.plots", "modforge.report", "modforge.components",
                         "modforge.models", "modforge.decoding", "modforge.slots", "modforge.devices")


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in the file (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from modforge.data import lm` names a module
    return out


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
GRAPH = {m: {i for i in imports_of(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def floor(module: str) -> int:
    for prefix in sorted(FLOORS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return FLOORS[prefix]
    raise AssertionError(f"{module}: give it a floor in FLOORS")


def test_no_import_circle():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                circle = path[path.index(n):] + [n]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_only_down(module):
    up = sorted(i for i in GRAPH[module] if floor(i) > floor(module) and i != "modforge")
    assert not up, f"{module} (floor {floor(module)}) imports from above: " + ", ".join(f"{i} ({floor(i)})" for i in up)


def test_the_registry_imports_nothing_of_modforge():
    assert GRAPH["modforge.registry"] == set()


def test_the_slot_allocator_is_plain_python():
    assert not {i.split(".")[0] for i in imports_of(MODULES["modforge.slots"])} - {"os", "dataclasses", "typing"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(NO_LIGHTNING_OR_HYDRA)))
def test_components_and_models_know_no_lightning_or_hydra(module):
    heavy = sorted(i for i in imports_of(MODULES[module]) if i.split(".")[0] in ("lightning", "hydra", "omegaconf"))
    assert not heavy, f"{module} imports {heavy}"
