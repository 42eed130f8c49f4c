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

    if not path.is_file():
        raise registry.ConfigError(
            f"tokenizer={path}: no tokenizer.json. Write one next to the model with transformers' "
            "AutoTokenizer.from_pretrained(dir).save_pretrained(dir), or give tokenizer=<path of a tokenizer.json>")
    tok = PretrainedTokenizer()
    tok.rows = int(c["vocab_size"])
    ids, names = specials_of(c, tok_dir)
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(path))
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
    from modforge.checkpoints.files import tied_names
    from modforge.utils.files import atomic_file
    from modforge.checkpoints.families import family_of, read_hf_dir, read_hf_weights

    if dtype not in DTYPES:
        raise registry.ConfigError(f"dtype={dtype!r}{registry.suggest(dtype, list(DTYPES))} Allowed: {', '.join(DTYPES)}.")
    load_all()
    d, c = read_hf_dir(hf)
    family = family_of(c, f"hf={hf}")
    overrides = family.overrides(c)
    tok = pretrained_tokenizer(Path(str(tokenizer)).expanduser() if tokenizer else d / "tokenizer.json", c, d)
    run_cfg = to_plain(compose(overrides))
    facts = DataFacts(tok, positions=int(run_cfg["model"]["max_len"]))
    state, left_out = family.to_ours(read_hf_weights(d), c, int(run_cfg["model"]["n_layers"]))
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
    if bad or missing:
        raise registry.ConfigError(f"hf={hf}: the weights do not fit the model config.json describes: "
                                   f"{'; '.join((bad + [f'{k} missing' for k in missing])[:3])}")
    task.model.load_state_dict(state)  # copies, cast to the model's precision
    del state
    task.model.to(target)  # also recomputes the position tables from float64 at this precision
    summary = {"hf": str(d), "model_type": family.model_type, "architectures": c.get("architectures"),
               "overrides": overrides, "left_out": left_out,
               "params": sum(p.numel() for p in task.model.parameters()), "dtype": dtype}
    ckpt = {"state_dict": task.state_dict(), "global_step": 0, "converted_from": summary,
            "hyper_parameters": {"run_cfg": run_cfg, "data_facts": facts.state()}}
    path = Path(str(out)).expanduser()
    if path.is_dir() or str(out).endswith("/"):
        path = path / "model.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as fh:
        torch.save(ckpt, fh)
    return path, summary
