"""Evaluation tasks in JSONL: the documented format, the built-in tasks, and one-line refusals of a bad file.

One JSON object per line, all of one kind:

* **multiple choice**: ``{"context": "...", "choices": ["...", "..."], "label": 1}`` (``id`` optional). Each
  choice is scored as the continuation of ``context``, exactly as written: put any space that separates them
  in the choices (lm-evaluation-harness's ``target_delimiter``);
* **text**: ``{"text": "..."}``: scored as a whole, in bits per UTF-8 byte.

A task is named by a built-in name (:func:`builtin_tasks`: the ``*.jsonl`` files shipped in
``modforge/evals/tasks/``) or by the path of a ``.jsonl`` file, whose stem names its metrics
(``val/<name>/acc``).
"""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from modforge.data.corpus import jsonl_objects
from modforge.errors import ConfigError
from modforge.utils.readers import regular_file

BUILTIN_DIR = Path(__file__).resolve().parent / "tasks"
CHOICE, TEXT = "choice", "text"


@dataclass
class EvalTask:
    name: str
    kind: str  # choice | text
    items: list  # the parsed lines
    source: str  # the file it came from

    def __len__(self) -> int:
        return len(self.items)


def builtin_tasks() -> dict:
    """{name: path} of the tasks shipped with modforge."""
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.jsonl"))}


def load_task(spec: Any, key: str = "tasks") -> EvalTask:
    """A task by built-in name or ``.jsonl`` path, parsed and checked (one ConfigError naming the line)."""
    spec = str(spec)
    known = builtin_tasks()
    if spec in known:
        path = known[spec]
    elif spec.endswith(".jsonl") or os.sep in spec or os.path.exists(spec):
        path = regular_file(os.path.expanduser(spec), key)
    else:
        raise ConfigError(f"{key}={spec}: not a built-in task ({', '.join(known) or 'none'}) nor a .jsonl file")
    items, kind = [], None
    for n, row in jsonl_objects(str(path), key, expected="a JSON object, with context/choices/label or text"):
        where = f"{key}={spec}: line {n}"
        k = _kind(row, where)
        if kind is not None and k != kind:
            raise ConfigError(f"{where} is a {k} item among {kind} items; a task file holds one kind")
        kind = k
        items.append(row)
    if not items:
        raise ConfigError(f"{key}={spec}: no items (one JSON object per line)")
    return EvalTask(Path(path).stem, kind, items, str(path))


def _kind(row: dict, where: str) -> str:
    if "choices" in row:
        ch, label = row.get("choices"), row.get("label")
        if not isinstance(row.get("context"), str):
            raise ConfigError(f"{where}: \"context\" must be text")
        if not (isinstance(ch, list) and len(ch) >= 2 and all(isinstance(c, str) and c for c in ch)):
            raise ConfigError(f"{where}: \"choices\" must be a list of at least 2 non-empty texts")
        if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(ch)):
            raise ConfigError(f"{where}: \"label\"={label!r} must be the index of the right choice, 0..{len(ch) - 1}")
        return CHOICE
    if isinstance(row.get("text"), str) and row["text"]:
        return TEXT
    raise ConfigError(f"{where}: neither a multiple-choice item (context, choices, label) nor a text item "
                      "(non-empty text)")


def load_tasks(specs: Iterable, key: str = "tasks") -> list:
    """Several tasks; two with one name would log into the same metrics: refused."""
    tasks = [load_task(s, key) for s in specs]
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{key}: two tasks named '{twice[0]}' (a file's stem names its metrics); rename one")
    return tasks


def metric_names(task: EvalTask) -> list:
    """The metrics a task reports, after ``<prefix>/<name>/``."""
    return ["acc", "acc_norm", "bpb"] if task.kind == CHOICE else ["bpb"]
