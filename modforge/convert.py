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
mapping cannot represent is refused in one line naming it.

Example:
  python -m modforge.convert hf=~/models/gpt2 out=pretrained/gpt2.ckpt
"""
from typing import Optional

from modforge.checkpoints.convert import DTYPES, convert
from modforge.cli.command import command
from modforge.cli.options import Option, Options

OPTIONS = Options("python -m modforge.convert", (
    Option("hf", "the model directory", required=True, metavar="model dir"),
    Option("out", "the checkpoint file to write (a directory: <dir>/model.ckpt)", required=True, metavar="file.ckpt"),
    Option("tokenizer", "a tokenizer.json elsewhere (default: <hf>/tokenizer.json)", metavar="tokenizer.json"),
    Option("dtype", "the weights' precision (keep: the file's own)", "float32", "choice", DTYPES),
))


def convert_command(argv: list) -> None:
    keys, _ = OPTIONS.parse(argv)
    path, s = convert(keys["hf"], keys["out"], keys["tokenizer"], keys["dtype"])
    print(f"converted {s['model_type']} ({', '.join(s['architectures'] or [])}) from {s['hf']}: "
          f"{s['params']:,} parameters, {s['dtype']}")
    print(f"  as: {' '.join(o for o in s['overrides'] if not o.startswith('model.init_std'))}")
    if s["left_out"]:
        print(f"  left out (not part of this model): {', '.join(s['left_out'])}")
    for note in s.get("notes", []):
        print(f"  note: {note}")
    print(f"wrote {path}")

def main(argv: Optional[list] = None) -> None:
    command(__doc__, convert_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
