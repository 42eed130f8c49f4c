"""The house imports only downward: rooms (the folders of modforge/, and its top-level modules) stand on
floors, a module imports only from its own room or from rooms on lower floors, and no import circle.

Every ``import`` statement of every module counts, also those inside functions (a lazy import is still a
dependency). Run ``python -m pytest tests/test_layering.py -q`` to check; a failure names the modules of the
circle or the import that goes up. README's map is this table, drawn (:func:`drawn_map`): the test fails
when they differ.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "modforge"

# (floor, room, what it holds); a room is a folder of modforge/ or a top-level module; the commands share the
# top floor. Floors from the top down; the drawn map in README.md is this table.
ROOMS = [
    (13, "train.py generate.py catalog.py report.py study.py export.py convert.py prepare.py evaluate.py "
         "__main__.py",
     "the commands: python -m modforge.<module>, python -m modforge <verb>, modforge <verb>"),
    (12, "cli/ harness.py", "what commands share: one-line errors, train's help and Tab completion, the registry as cached "
                 "data, the pre-flight of the command line, resume= on the command line; lm-evaluation-harness's model adapter"),
    (11, "studies/", "a study's design, stages (each an in-process sweep), tuning, adaptive seeds, ladder fits and "
                     "report"),
    (10, "sweeps/", "a command's jobs planned once (grid, composition, checks, each directory's state), the plan "
                    "run with a launcher (the entry point of train and studies), one job inside Hydra, the "
                    "gpus/ray launchers, GPU slots, cluster settings"),
    (9, "results/", "a sweep's tables, statistics and plots (no Lightning, no Hydra)"),
    (8, "run/", "one run's story in named steps, run directories and locks, resume and init_from rules, DDP rank "
                "decisions, callbacks, progress and loggers, final measurements"),
    (7, "checkpoints/", "find, read and load checkpoints; convert Hugging Face models in, export models out; one "
                        "module per pretrained family"),
    (6, "config/", "composition with Hydra, every check of a config, the root keys and the Trainer's schema, a "
                   "sweep's jobs, Hydra's command-line words, directory resolvers"),
    (5, "plugins.py", "loads the built-in components, then every installed plugin"),
    (4, "tasks/", "the LightningModules: objectives, metrics, sampling"),
    (3, "models/ evals/", "blocks, stacks and the three architectures; decoding (greedy, sampling, beam, KV cache); parametrisations (standard, µP, u-µP) and their coordinate checks; downstream tasks in JSONL and their scoring"),
    (2, "components/ data/", "one file per kind of component (norms, residual, ffn, activations, positions, "
                             "attention, optim); datamodules, tokenizers, caches, loaders, token shards and prepare"),
    (1, "registry/ utils/", "kinds, declare, @register, build: the single source of truth; files, readers of "
                              "every format (one line per failure), console output, device decisions"),
    (0, "errors.py", "the error classes every layer raises"),
]
NO_LIGHTNING_OR_HYDRA = ("modforge.errors", "modforge.registry", "modforge.utils", "modforge.results",
                         "modforge.components", "modforge.models", "modforge.sweeps.slots")


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "modforge"
    return parts[1] + ("/" if (PKG / parts[1]).is_dir() else ".py")


FLOOR = {room: floor for floor, rooms, _ in ROOMS for room in rooms.split()}


def floor(module: str) -> int:
    room = room_of(module)
    assert room in FLOOR, f"{module}: its room {room} has no floor in ROOMS (tests/test_layering.py)"
    return FLOOR[room]


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


def _edges(m: str) -> set:
    # a package's face (its __init__) is not a dependency of the modules inside it: `from modforge.config
    # import resolvers` inside modforge/config/ names the module, and the face only hands names on
    return {i for i in imports_of(MODULES[m]) if i in MODULES and i != m and not m.startswith(i + ".")}


GRAPH = {m: _edges(m) for m in MODULES}


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "modforge"))
def test_imports_go_only_down(module):
    """Into its own room, or down; ``modforge`` itself (the version, the registry's names) from anywhere."""
    mine = room_of(module)
    up = sorted(i for i in GRAPH[module]
                if i != "modforge" and room_of(i) != mine and floor(i) >= floor(module))
    assert not up, f"{module} ({mine}, floor {floor(module)}) imports from its floor or above: " + ", ".join(
        f"{i} ({room_of(i)}, {floor(i)})" for i in up)


def test_every_room_has_a_floor():
    rooms = {room_of(m) for m in MODULES} - {"modforge"}
    assert rooms == set(FLOOR), f"rooms without a floor: {sorted(rooms - set(FLOOR))}; " \
                                f"floors without a room: {sorted(set(FLOOR) - rooms)}"


def test_the_registry_imports_only_the_errors():
    inside = {m for m in GRAPH if m == "modforge.registry" or m.startswith("modforge.registry.")}
    assert inside >= {"modforge.registry", "modforge.registry.core"}
    assert set().union(*(GRAPH[m] for m in inside)) - inside == {"modforge.errors"}


def test_the_errors_import_nothing():
    assert not {i for i in imports_of(MODULES["modforge.errors"])}


def test_the_slot_allocator_is_plain_python():
    assert not {i.split(".")[0] for i in imports_of(MODULES["modforge.sweeps.slots"])} - {"os", "dataclasses", "typing"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(NO_LIGHTNING_OR_HYDRA)))
def test_lower_floors_and_results_know_no_lightning_or_hydra(module):
    heavy = sorted(i for i in imports_of(MODULES[module]) if i.split(".")[0] in ("lightning", "hydra", "omegaconf"))
    assert not heavy, f"{module} imports {heavy}"


def test_no_module_is_named_like_the_standard_library_or_a_builtin():
    import builtins
    import sys

    taken = set(sys.stdlib_module_names) | set(dir(builtins))
    clash = sorted(m for m in MODULES if m.rpartition(".")[2] in taken and m.rpartition(".")[2] != "__main__")
    assert not clash, f"modules named like a standard-library module or a builtin: {clash}"


def drawn_map() -> str:
    """The map README.md shows: the floors from the top down, each room with what it holds."""
    return "\n".join(f"{floor:>2}  {rooms}\n    {what}" for floor, rooms, what in ROOMS)


def test_readme_map_is_the_layering_table():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("<!-- map: filled from tests/test_layering.py -->")
    block = text[start:].split("```text\n", 1)[1].split("\n```", 1)[0]
    assert block == drawn_map(), "README's map differs from tests/test_layering.py's ROOMS; paste:\n" + drawn_map()


def test_every_package_is_in_the_wheel():
    """pyproject lists its packages: one left out is missing from a non-editable install (pip install .)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PKG.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml's list: {sorted(found - listed)}"
