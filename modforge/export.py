"""``python -m modforge.export ckpt=<run dir or .ckpt> out=<dir>``: the trained model without pickles.

Writes two files into ``out``:

  model.safetensors   the model's weights (safetensors: tensors and a JSON header only, nothing that runs code);
                      a tied output head is stored once, as in the checkpoint's state dict
  config.json         what rebuilds it: the run's resolved config (components by registry name) and the data
                      facts (tokenizer state, positions, tokens per character, labels), plus modforge's version

``modforge.export.load_exported(out)`` rebuilds the task (model and tokenizer), in eval mode, from those two
files alone: the counterpart of :func:`modforge.checkpoints.load_checkpoint`. Keys (``key=value``):

  ckpt   a checkpoint file or a run directory (its checkpoints/last.ckpt)   (required)
  out    the directory to write (created; existing model.safetensors / config.json are replaced)  (required)

Example:
  python -m modforge.export ckpt=outputs/2026-11-23/14-03-22 out=exported/stdlib-small
"""
import json
from pathlib import Path
from typing import Any, Optional

from modforge import registry
from modforge.cli import command

FORMAT = "modforge-export-1"


def export(ckpt: Any, out: Any) -> Path:
    """Write ``model.safetensors`` and ``config.json`` for the checkpoint ``ckpt`` into ``out``."""
    from safetensors.torch import save

    from modforge import __version__
    from modforge.checkpoints import facts_state, find_checkpoint, load_checkpoint, read_checkpoint
    from modforge.io import atomic_file, write_json

    path = find_checkpoint("ckpt", ckpt)
    hp = read_checkpoint(path, "ckpt")["hyper_parameters"]
    task = load_checkpoint(str(path))
    state = {k: v.detach().contiguous() for k, v in task.model.state_dict().items()}
    shared = _tied(state)
    out = Path(str(out)).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "model.safetensors", "wb") as fh:
        fh.write(save({k: v for k, v in state.items() if k not in shared}, metadata={"format": FORMAT}))
    write_json(out / "config.json", {"format": FORMAT, "modforge_version": __version__, "run_cfg": hp["run_cfg"],
                                     "data_facts": facts_state({"hyper_parameters": hp}), "tied": shared},
               indent=2)
    return out


def _tied(state: dict) -> dict:
    """{name: the name it shares storage with}: safetensors refuses shared tensors, so each is stored once."""
    seen: dict = {}
    shared = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            shared[name] = seen[key]
        else:
            seen[key] = name
    return shared


def load_exported(directory: Any, map_location: str = "cpu") -> Any:
    """Rebuild the task (model and tokenizer) from an exported directory, in eval mode. Weights are read with
    safetensors (no pickle); a file that is not a modforge export is refused in one line."""
    from safetensors.torch import load_file

    from modforge.builtins import load_all
    from modforge.data.base import DataFacts

    d = Path(str(directory)).expanduser()
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise registry.ConfigError(f"{d}: no readable config.json ({type(e).__name__}: {e})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise registry.ConfigError(f"{d}/config.json: not a modforge export (format {cfg.get('format')!r})"
                                   if isinstance(cfg, dict) else f"{d}/config.json: not a modforge export")
    load_all()
    facts = DataFacts.from_state(cfg["data_facts"])
    entry, task_cfg = registry.make_config("task", cfg["run_cfg"]["task"])
    task = entry.cls(task_cfg, cfg["run_cfg"], facts)
    state = load_file(str(d / "model.safetensors"), device=map_location)
    for name, source in (cfg.get("tied") or {}).items():
        state[name] = state[source]
    task.model.load_state_dict(state)
    return task.eval()


def export_command(argv: list) -> None:
    keys = dict(a.split("=", 1) for a in argv if "=" in a)
    bad = [a for a in argv if "=" not in a] + [k for k in keys if k not in ("ckpt", "out")]
    if bad:
        raise registry.ConfigError(f"'{bad[0]}': expected ckpt=<run dir or .ckpt> and out=<dir> (see --help)")
    if "ckpt" not in keys or "out" not in keys:
        raise registry.ConfigError("both ckpt=<run dir or .ckpt> and out=<dir> are required (see --help)")
    out = export(keys["ckpt"], keys["out"])
    print(f"wrote {out / 'model.safetensors'} and {out / 'config.json'}")


def main(argv: Optional[list] = None) -> None:
    command(__doc__, export_command, argv)


if __name__ == "__main__":
    main()
