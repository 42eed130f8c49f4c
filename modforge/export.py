"""``python -m modforge.export ckpt=<run dir or .ckpt> out=<dir>``: the trained model without pickles.

Writes two files into ``out``:

  model.safetensors   the model's weights (safetensors: tensors and a JSON header only, nothing that runs code);
                      a tied output head is stored once, as in the checkpoint's state dict
  config.json         what rebuilds it: the run's resolved config (components by registry name) and the data
                      facts (tokenizer state, positions, tokens per character, labels), plus modforge's version

``modforge.export.load_exported(out)`` rebuilds the task (model and tokenizer), in eval mode, from those two
files alone: the counterpart of :func:`modforge.checkpoints.files.load_checkpoint`.

With ``format=hf`` it writes a Hugging Face model directory instead (config.json, model.safetensors, and
tokenizer.json when the model has a pretrained tokenizer), which ``transformers`` loads with
``from_pretrained`` and which computes the same logits: for models whose configuration is GPT-2's
(``GPT2LMHeadModel``) or Llama's (``LlamaForCausalLM``, grouped-query attention and RoPE scalings included).
Anything else is refused in one line naming what does not map.

Examples:
  python -m modforge.export ckpt=outputs/2026-11-23/14-03-22 out=exported/stdlib-small
  python -m modforge.export ckpt=outputs/2026-11-24/09-10-11 out=exported/gpt2-rms format=hf
"""
from typing import Optional

from modforge.checkpoints.export import export, export_hf, load_exported  # noqa: F401 - load_exported: public here
from modforge.cli.command import command
from modforge.cli.options import Option, Options

OPTIONS = Options("python -m modforge.export", (
    Option("ckpt", "a checkpoint file or a run directory (its checkpoints/last.ckpt)", required=True,
           metavar="run dir or .ckpt"),
    Option("out", "the directory to write (new, or an earlier export's: another tool's files are never replaced)",
           required=True, metavar="dir"),
    Option("format", "modforge: safetensors and config.json; hf: a Hugging Face model directory", "modforge",
           "choice", ("modforge", "hf")),
))


def export_command(argv: list) -> None:
    keys, _ = OPTIONS.parse(argv)
    if keys["format"] == "hf":
        out, arch, notes = export_hf(keys["ckpt"], keys["out"])
        print(f"wrote {out} as {arch}: transformers loads it with from_pretrained({str(out)!r})")
        for note in notes:
            print(f"  {note}")
        return
    out = export(keys["ckpt"], keys["out"])
    print(f"wrote {out / 'model.safetensors'} and {out / 'config.json'}")

def main(argv: Optional[list] = None) -> None:
    command(__doc__, export_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
