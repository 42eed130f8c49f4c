"""``python -m modforge.convert hf=<model dir> out=<file.ckpt>``: a pretrained Hugging Face checkpoint as a modforge one.

Reads a local model directory as ``save_pretrained`` writes it (``config.json``;
``model.safetensors`` or ``pytorch_model.bin``, sharded or not, the latter loaded
with ``weights_only=True``; ``tokenizer.json``) of the GPT-2, Llama (GQA included;
Mistral's checkpoints too) or BERT families, and writes one modforge checkpoint:
the run config the model maps to (components by registry name, as ``config.yaml`` of a run shows), the
weights under modforge's parameter names, and the tokenizer with the model's own
ids and special tokens (``data.tokenizer=pretrained``). That checkpoint is what
``python -m modforge.generate ckpt=``, ``load_checkpoint`` and fine-tuning with
``python -m modforge.train init_from=`` take. Nothing is downloaded: point ``hf=``
at a local copy (see README, "Pretrained models"). An architecture or option the
mapping cannot represent is refused in one line naming it. Keys (``key=value``):

  hf         the model directory                                                  (required)
  out        the checkpoint file to write (a directory: <dir>/model.ckpt)          (required)
  tokenizer  a tokenizer.json elsewhere (default: <hf>/tokenizer.json)
  dtype      float32 (default) | float64 | bfloat16 | float16 | keep (the file's own)

Example:
  python -m modforge.convert hf=~/models/gpt2 out=pretrained/gpt2.ckpt
"""
from pathlib import Path
from typing import Any, Optional

from modforge import registry
from modforge.cli import command

DTYPES = ("float32", "float64", "bfloat16", "float16", "keep")
KEYS = ("hf", "out", "tokenizer", "dtype")


def pretrained_tokenizer(path: Path, c: dict, tok_dir: Path):
    """The model's tokenizer, its special tokens named by config.json and the tokenizer's own files."""
    from modforge.data.tokenizers import PretrainedTokenizer
    from modforge.pretrained import specials_of

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

    from modforge.builtins import load_all
    from modforge.config import compose, to_plain
    from modforge.data.base import DataFacts
    from modforge.checkpoints import tied_names
    from modforge.io import atomic_file
    from modforge.pretrained import family_of, read_hf_dir, read_hf_weights

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


def convert_command(argv: list) -> None:
    keys = dict(a.split("=", 1) for a in argv if "=" in a)
    bad = [a for a in argv if "=" not in a] + [k for k in keys if k not in KEYS]
    if bad:
        raise registry.ConfigError(f"'{bad[0]}': expected {', '.join(k + '=' for k in KEYS)} (see --help)")
    if "hf" not in keys or "out" not in keys:
        raise registry.ConfigError("both hf=<model directory> and out=<file.ckpt> are required (see --help)")
    path, s = convert(keys["hf"], keys["out"], keys.get("tokenizer"), keys.get("dtype", "float32"))
    print(f"converted {s['model_type']} ({', '.join(s['architectures'] or [])}) from {s['hf']}: "
          f"{s['params']:,} parameters, {s['dtype']}")
    print(f"  as: {' '.join(o for o in s['overrides'] if not o.startswith('model.init_std'))}")
    if s["left_out"]:
        print(f"  left out (not part of this model): {', '.join(s['left_out'])}")
    print(f"wrote {path}")


def main(argv: Optional[list] = None) -> None:
    command(__doc__, convert_command, argv)


if __name__ == "__main__":
    main()
