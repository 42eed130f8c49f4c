"""A trained model out of modforge: ``model.safetensors`` and ``config.json`` (:func:`export`, and
:func:`load_exported` that rebuilds the task from them alone), or a Hugging Face model directory
(:func:`export_hf`, by the families' mappings in :mod:`modforge.checkpoints.families`). The command is
:mod:`modforge.export`."""
import json
from pathlib import Path
from typing import Any

from modforge import registry

FORMAT = "modforge-export-1"
MARK = ".modforge-export"  # in a format=hf export's directory: the files modforge wrote there, which a new export
# may replace (a format=modforge export is known by its config.json's "format")


def claim_out(out: Any, names: tuple) -> Path:
    """The directory an export will write ``names`` into, checked before any work: new, or one whose files of
    those names a modforge export wrote (its mark lists them; a format=modforge export: its config.json's
    "format"). Another tool's files are never replaced: refused in one line."""
    from modforge.utils.files import read_json

    if not str(out).strip():
        raise registry.ConfigError("out=: an empty path; give the directory to write, e.g. out=exported/my-model")
    d = Path(str(out)).expanduser()
    if d.exists() and not d.is_dir():
        raise registry.ConfigError(f"out={out}: a file, not a directory")
    mark, config = read_json(d / MARK), read_json(d / "config.json")
    if isinstance(mark, dict):
        ours = set(mark.get("files") or [])
    elif isinstance(config, dict) and config.get("format") == FORMAT:
        ours = {"model.safetensors", "config.json"}
    else:
        ours = set()
    foreign = [n for n in names if (d / n).exists() and n not in ours]
    if foreign:
        raise registry.ConfigError(f"out={out}: it already holds {', '.join(foreign)}, not written by a modforge "
                                   "export; choose a new directory (an export replaces only its own files)")
    return d


def export(ckpt: Any, out: Any) -> Path:
    """Write ``model.safetensors`` and ``config.json`` for the checkpoint ``ckpt`` into ``out``."""
    from safetensors.torch import save

    from modforge import __version__
    from modforge.checkpoints.files import facts_state, find_checkpoint, load_checkpoint, read_checkpoint, tied_names
    from modforge.utils.files import atomic_file, write_json

    out = claim_out(out, ("model.safetensors", "config.json"))
    path = find_checkpoint("ckpt", ckpt)
    hp = read_checkpoint(path, "ckpt")["hyper_parameters"]
    task = load_checkpoint(str(path))
    state = {k: v.detach().contiguous() for k, v in task.model.state_dict().items()}
    shared = tied_names(state)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "model.safetensors", "wb") as fh:
        fh.write(save({k: v for k, v in state.items() if k not in shared}, metadata={"format": FORMAT}))
    write_json(out / "config.json", {"format": FORMAT, "modforge_version": __version__, "run_cfg": hp["run_cfg"],
                                     "data_facts": facts_state({"hyper_parameters": hp}), "tied": shared},
               indent=2)  # its "format" marks the directory as a modforge export's (claim_out)
    return out

def export_hf(ckpt: Any, out: Any) -> tuple[Path, str, list]:
    """Write a Hugging Face model directory for the checkpoint ``ckpt`` -> (out, the HF architecture, notes)."""
    from safetensors.torch import save

    from modforge.checkpoints.files import find_checkpoint, load_checkpoint
    from modforge.utils.files import atomic_file, write_json
    from modforge.checkpoints.families import FAMILIES
    from modforge.models.param import multipliers

    written = ("model.safetensors", "config.json", "tokenizer.json")
    out = claim_out(out, written)
    task = load_checkpoint(str(find_checkpoint("ckpt", ckpt)))
    run = task.run_cfg
    why = {name: FAMILIES[name].mismatch(run) for name in ("gpt2", "llama")}
    family = next((FAMILIES[n] for n, w in why.items() if w is None), None)
    if family is None:
        raise registry.ConfigError(f"format=hf: this model maps onto neither GPT-2 ({why['gpt2']}) nor Llama "
                                   f"({why['llama']}); export it with format=modforge")
    model, tok = task.model, task.tokenizer
    extra = multipliers(model)
    if extra:
        raise registry.ConfigError(f"format=hf: the run's parametrisation (param=mup) multiplies {extra[0]}"
                                   f"{f' and {len(extra) - 1} more' if len(extra) > 1 else ''}, which a Hugging "
                                   "Face model has no place for; export it with format=modforge")
    specials = dict(getattr(tok, "specials", {}) or {})
    if not specials:  # modforge's own tokenizers: the five reserved ids
        specials = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id}
    kw = {"ffn_hidden": model.decoder.blocks[0].ffn.hidden} if family.model_type == "llama" else {}
    config = family.hf_config(run, model.vocab_size, specials, **kw)
    dtype = next(model.parameters()).dtype
    config["torch_dtype"] = str(dtype).replace("torch.", "")
    state = {k: v.detach().contiguous() for k, v in family.to_theirs(model.state_dict(), run["model"]["n_layers"],
                                                                      run).items()}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "model.safetensors", "wb") as fh:
        fh.write(save(state, metadata={"format": "pt"}))
    write_json(out / "config.json", config, indent=2)
    notes = []
    if getattr(tok, "name", "") == "pretrained":
        with atomic_file(out / "tokenizer.json", "wb") as fh:
            fh.write(tok.hf.to_str().encode("utf-8"))
    else:
        notes.append(f"no tokenizer.json: the model's tokenizer ({tok.name}) is modforge's own, with ids no "
                     "Hugging Face tokenizer has; ids in, ids out")
    write_json(out / MARK, {"format": FORMAT, "files": list(written)}, indent=2)
    return out, config["architectures"][0], notes

def load_exported(directory: Any, map_location: str = "cpu") -> Any:
    """Rebuild the task (model and tokenizer) from an exported directory, in eval mode. Weights are read with
    safetensors (no pickle); a file that is not a modforge export is refused in one line."""
    from safetensors.torch import load_file

    from modforge.plugins import load_all
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
