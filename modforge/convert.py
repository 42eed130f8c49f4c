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
mapping cannot represent is refused in one line naming it. Keys (``key=value``, each once):

  hf         the model directory                                                  (required)
  out        the checkpoint file to write (a directory: <dir>/model.ckpt)          (required)
  tokenizer  a tokenizer.json elsewhere (default: <hf>/tokenizer.json)
  dtype      float32 (default) | float64 | bfloat16 | float16 | keep (the file's own)

Example:
  python -m modforge.convert hf=~/models/gpt2 out=pretrained/gpt2.ckpt
"""
from typing import Optional

from modforge import registry
from modforge.checkpoints.convert import convert
from modforge.cli.command import command, key_values

KEYS = ("hf", "out", "tokenizer", "dtype")


def convert_command(argv: list) -> None:
    keys = key_values(argv, KEYS, f"{', '.join(k + '=' for k in KEYS)} (see --help)")
    if "hf" not in keys or "out" not in keys:
        raise registry.ConfigError("both hf=<model directory> and out=<file.ckpt> are required (see --help)")
    path, s = convert(keys["hf"], keys["out"], keys.get("tokenizer"), keys.get("dtype", "float32"))
    print(f"converted {s['model_type']} ({', '.join(s['architectures'] or [])}) from {s['hf']}: "
          f"{s['params']:,} parameters, {s['dtype']}")
    print(f"  as: {' '.join(o for o in s['overrides'] if not o.startswith('model.init_std'))}")
    if s["left_out"]:
        print(f"  left out (not part of this model): {', '.join(s['left_out'])}")
    for note in s.get("notes", []):
        print(f"  note: {note}")
    print(f"wrote {path}")

def main(argv: Optional[list] = None) -> None:
    command(__doc__, convert_command, argv)


if __name__ == "__main__":
    main()
