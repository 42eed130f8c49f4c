"""A Hugging Face model directory (GPT-2, Llama, BERT) as a modforge checkpoint: the run config it maps to,
the weights under modforge's names, the model's own tokenizer (:func:`convert`). The mappings are
:mod:`modforge.checkpoints.families`'; the command is :mod:`modforge.convert`."""
from pathlib import Path
from typing import Any, Optional

from modforge import registry

DTYPES = ("float32", "float64", "bfloat16", "float16", "keep")

def pretrained_tokenizer(path: Path, c: dict, tok_dir: Path):
    """The model's tokenizer, its special tokens named by config.json and the tokenizer's own files."""
    from modforge.data.tokenizers import PretrainedTokenizer
    from modforge.checkpoints.families import specials_of

    if not path.exists():
        raise registry.ConfigError(
            f"tokenizer={path}: no tokenizer.json. Write one next to the model with transformers' "
            "AutoTokenizer.from_pretrained(dir).save_pretrained(dir), or give tokenizer=<path of a tokenizer.json>")
    rows = c.get("vocab_size")
    if isinstance(rows, bool) or not isinstance(rows, int):  # too few rows for the tokenizer: refused below
        raise registry.ConfigError(f"hf={tok_dir / 'config.json'}: vocab_size={rows!r}: must be a whole number "
                                   "(the model's embedding rows)")
    tok = PretrainedTokenizer()
    tok.rows = rows
    ids, names = specials_of(c, tok_dir)
    from tokenizers import Tokenizer as HFTokenizer

    from modforge.utils import readers

    readers.json_file(path, "tokenizer")  # valid JSON first: the library's own parse errors are not one line
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - a JSON file that is not a tokenizer the library reads
        raise registry.ConfigError(f"tokenizer={path}: not a tokenizer.json the tokenizers library reads "
                                   f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    for role, name in names.items():
        if ids.get(role) is None and hf.token_to_id(name) is not None:
            ids[role] = hf.token_to_id(name)
    tok.specials = {k: v for k, v in ids.items() if v is not None}
    tok._set(hf)
    size = hf.get_vocab_size(with_added_tokens=True)
    if size > tok.rows:
        raise registry.ConfigError(f"tokenizer={path}: {size} tokens, but the model has {tok.rows} embedding rows "
                                   "(config.json vocab_size): not this model's tokenizer")
    return tok

def convert(hf: Any, out: Any, tokenizer: Optional[Any] = None, dtype: str = "float32") -> tuple[Path, dict]:
    """Convert the model directory ``hf`` into the modforge checkpoint ``out``; -> (its path, a summary)."""
    import torch

    from modforge.plugins import load_all
    from modforge.config import compose, to_plain
    from modforge.data.base import DataFacts
    from modforge.checkpoints.files import non_finite_weight, tied_names
    from modforge.utils.files import atomic_file
    from modforge.checkpoints.families import family_of, read_hf_dir, read_hf_weights
    from modforge.checkpoints.families.base import weight_files

    if dtype not in DTYPES:
        raise registry.ConfigError(f"dtype={dtype!r}{registry.suggest(dtype, list(DTYPES))} Allowed: {', '.join(DTYPES)}.")
    load_all()
    d, c = read_hf_dir(hf)
    tok_path = Path(str(tokenizer)).expanduser() if tokenizer else d / "tokenizer.json"
    if not str(out).strip():
        raise registry.ConfigError("out=: an empty path; give the checkpoint file to write, e.g. out=gpt2.ckpt")
    path = Path(str(out)).expanduser()
    if path.is_dir() or str(out).endswith("/"):
        path = path / "model.ckpt"
    family = family_of(c, f"hf={hf}")
    try:
        overrides = family.overrides(c)
    except KeyError as e:
        raise registry.ConfigError(f"hf={d / 'config.json'}: has no {e.args[0]!r}, which a {family.model_type} "
                                   "config needs") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise registry.ConfigError(f"hf={d / 'config.json'}: a value of the wrong type or range "
                                   f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    inputs = [d / "config.json", tok_path, *weight_files(d), *(d / i for i in ("model.safetensors.index.json",
                                                                                "pytorch_model.bin.index.json"))]
    if any(path.resolve() == i.resolve() for i in inputs):
        raise registry.ConfigError(f"out={out}: that is a file conversion reads ({path.name} of the model); write "
                                   "the checkpoint somewhere else, e.g. out=pretrained/model.ckpt")
    if path.exists() and path.suffix != ".ckpt":
        raise registry.ConfigError(f"out={out}: {path} exists and is not a checkpoint (.ckpt); convert replaces "
                                   "only a .ckpt file; choose another out=")
    notes = []
    if c.get("auto_map"):
        notes.append(f"config.json names custom code (auto_map: {', '.join(sorted(c['auto_map']))}); it is never "
                     f"run: the standard {c.get('model_type')} architecture is converted")
    tok = pretrained_tokenizer(tok_path, c, d)
    if tok.hf.get_vocab_size(with_added_tokens=True) < tok.rows - 256:
        notes.append(f"the tokenizer has {tok.hf.get_vocab_size(with_added_tokens=True)} tokens for the model's "
                     f"{tok.rows} embedding rows (config.json vocab_size): check that it is this model's tokenizer")
    run_cfg = to_plain(compose(overrides))
    facts = DataFacts(tok, positions=int(run_cfg["model"]["max_len"]))
    try:
        state, left_out = family.to_ours(read_hf_weights(d), c, int(run_cfg["model"]["n_layers"]))
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError) as e:  # a tensor of the wrong shape or name
        raise registry.ConfigError(f"hf={hf}: the weights do not fit the model config.json describes "
                                   f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})") from None
    target = next(iter(state.values())).dtype if dtype == "keep" else getattr(torch, dtype)
    entry, task_cfg = registry.make_config("task", run_cfg["task"])
    default = torch.get_default_dtype()
    torch.set_default_dtype(target)  # built in the target precision: the weights and one model in memory, no more
    try:
        task = entry.cls(task_cfg, run_cfg, facts)
    finally:
        torch.set_default_dtype(default)
    want = task.model.state_dict()
    for alias, name in tied_names(want).items():  # one tensor under several names (a tied head, embed.tokens)
        if name in state:
            state[alias] = state[name]
        elif alias in state:
            state[name] = state[alias]
    bad = [f"{k} {tuple(v.shape)} (modforge {tuple(want[k].shape)})" for k, v in state.items()
           if k in want and v.shape != want[k].shape]
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]  # e.g. token-type embeddings where config.json says there are none
    if bad or missing or extra:
        raise registry.ConfigError(f"hf={hf}: the weights do not fit the model config.json describes: "
                                   f"{'; '.join((bad + [f'{k} missing' for k in missing] + [f'{k} not in the model' for k in extra])[:3])}")
    task.model.load_state_dict(state)  # copies, cast to the model's precision
    del state
    task.model.to(target)  # also recomputes the position tables from float64 at this precision
    bad = non_finite_weight(task.model)
    if bad:  # NaN in the file, or values beyond the range of dtype=: a model that computes nothing
        raise registry.ConfigError(f"hf={hf}: the weight {bad} (modforge's name) holds non-finite values (NaN or "
                                   f"inf) as {str(target).replace('torch.', '')}; nothing written")
    summary = {"hf": str(d), "model_type": family.model_type, "architectures": c.get("architectures"),
               "overrides": overrides, "left_out": left_out,
               "params": sum(p.numel() for p in task.model.parameters()), "dtype": dtype, "notes": notes}
    ckpt = {"state_dict": task.state_dict(), "global_step": 0, "converted_from": summary,
            "hyper_parameters": {"run_cfg": run_cfg, "data_facts": facts.state()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as fh:
        torch.save(ckpt, fh)
    return path, summary
