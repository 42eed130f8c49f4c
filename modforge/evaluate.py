"""``python -m modforge eval ckpt=<run dir or .ckpt> tasks=<names or .jsonl> [harness=<lm-eval tasks>] ...``

Scores a trained causal model on downstream tasks: multiple-choice tasks by ranked log-likelihood (accuracy,
length-normalised accuracy) and bits per byte, text tasks by bits per byte (docs/data.md gives the JSONL
format; ``pycloze`` is built in), and, with the optional extra ``modforge[evals]``, any task of
lm-evaluation-harness whose dataset is in the local cache. Prints a table; ``out=`` also writes it as JSON.

Examples:
  python -m modforge eval ckpt=outputs/<date>/<time> tasks=pycloze
  python -m modforge eval ckpt=outputs/<date>/<time> tasks=my_task.jsonl out=evals.json
  python -m modforge eval ckpt=outputs/<date>/<time> harness=hellaswag,arc_easy limit=200
"""
from typing import Optional

from modforge.cli.command import command
from modforge.cli.options import Option, Options, missing
from modforge.errors import ConfigError

OPTIONS = Options("python -m modforge eval", (
    Option("ckpt", "a checkpoint file or a run directory (its checkpoints/last.ckpt)", required=True,
           metavar="run dir or .ckpt"),
    Option("tasks", "built-in task names or .jsonl task files, comma-separated", metavar="tasks"),
    Option("harness", "lm-evaluation-harness task names, comma-separated (needs modforge[evals])",
           metavar="tasks"),
    Option("harness_include", "a directory of your own harness task YAML files (harness=)", metavar="dir"),
    Option("limit", "harness tasks: at most this many items each (0: all)", 0, "int", low=0),
    Option("batch_size", "sequences per forward pass", 16, "int", low=1),
    Option("device", "where the model runs: cpu, cuda, cuda:1, mps", "cpu"),
    Option("out", "also write the results to this JSON file", metavar="path"),
))


def run(ckpt: str, tasks: list, harness: list, limit: int = 0, batch_size: int = 16, device: str = "cpu",
        include: Optional[str] = None) -> dict:
    """{task: {metric: value, "n": items}} for the JSONL tasks and the harness tasks."""
    from modforge.checkpoints.files import find_checkpoint, load_checkpoint, non_finite_weight
    from modforge.evals.scoring import score
    from modforge.evals.tasks import load_tasks

    loaded = load_tasks(tasks, "tasks")  # every task file read and checked before the model is loaded
    if harness:
        from modforge.harness import require_harness

        require_harness()
    path = find_checkpoint("ckpt", ckpt)
    task = load_checkpoint(str(path), map_location=device).to(device).eval()
    if not getattr(task.model, "can_generate", False):
        raise ConfigError(f"ckpt={ckpt}: a {type(task.model).__name__} is not a causal language model; these "
                          "evaluations score decoder-only models")
    bad = non_finite_weight(task)
    if bad:
        raise ConfigError(f"ckpt={path}: its weight {bad} holds non-finite values (NaN or inf)")
    results = {}
    for t in loaded:
        s = score(task.model, task.tokenizer, t, task.context_len, batch_size, device)
        results[t.name] = {**s.metrics(), "n": len(t)}
    if harness:
        results.update(harness_results(task, harness, limit, batch_size, device, include))
    return results


def harness_results(task, names: list, limit: int = 0, batch_size: int = 16, device: str = "cpu",
                    include: Optional[str] = None) -> dict:
    """{task: {metric: value, "n": items}} from lm-evaluation-harness's own evaluation loop (``evaluate``:
    ``simple_evaluate`` would also record the environment, running ``pip list``), on ``task``'s model."""
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager, get_task_dict

    from modforge.harness import ModforgeLM

    try:
        manager = TaskManager(include_path=include) if include else TaskManager()
        tasks = manager.load(names) if hasattr(manager, "load") else get_task_dict(names, manager)  # (0.4.13; older)
        out = evaluate(ModforgeLM(task=task, device=device, batch_size=batch_size), tasks,
                       limit=limit or None, bootstrap_iters=0, log_samples=False, verbosity="WARNING")
    except Exception as e:  # noqa: BLE001 - the harness's many failures (a task unknown, a dataset not cached)
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"harness={','.join(names)}: lm-evaluation-harness failed: {type(e).__name__}: {first}. "
                          "A task's dataset must already be in the Hugging Face datasets cache (then set "
                          "HF_DATASETS_OFFLINE=1)") from None
    rows = {}
    for name, metrics in (out or {}).get("results", {}).items():
        rows[name] = {(k.split(",")[0] if k.endswith(",none") else k): v for k, v in metrics.items()
                      if "," in k and "stderr" not in k and isinstance(v, (int, float))}  # a filter other than
        # none stays in the name (gsm8k's exact_match,strict-match and exact_match,flexible-extract are two)
        n = (out.get("n-samples") or {}).get(name, {})
        rows[name]["n"] = n.get("effective", n.get("original"))
    return rows


def table(results: dict) -> str:
    metrics = [m for m in ("acc", "acc_norm", "bpb") if any(m in r for r in results.values())]
    extra = sorted({k for r in results.values() for k in r if k not in (*metrics, "n")})
    cols = ["task", "n", *metrics, *extra]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, r in results.items():
        cells = [name, str(r.get("n", ""))] + [f"{r[m]:.4f}" if isinstance(r.get(m), (int, float)) else ""
                                             for m in (*metrics, *extra)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def eval_command(argv: list) -> None:
    given, _ = OPTIONS.parse(argv)
    tasks = [t for t in (given["tasks"] or "").split(",") if t]
    harness = [t for t in (given["harness"] or "").split(",") if t]
    if not tasks and not harness:
        raise ConfigError("tasks= or harness=: name at least one task (tasks=pycloze is built in)")
    if not given["ckpt"]:
        raise missing(OPTIONS.options[0])
    results = run(given["ckpt"], tasks, harness, given["limit"], given["batch_size"], given["device"],
                  given["harness_include"])
    print(table(results))
    if given["out"]:
        from pathlib import Path

        from modforge.utils.files import write_json

        write_json(Path(given["out"]), results, indent=1)


def main(argv: Optional[list] = None) -> None:
    command(__doc__, eval_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
