"""``python -m modforge <verb> [arguments]`` (also the ``modforge`` console script): one entry for every command.

Each verb runs a command's module as ``python -m modforge.<module>`` would; ``python -m modforge <verb> --help`` prints that command's help."""
import runpy
import sys
from typing import Optional

# verb -> (module, what it does); the module's main(argv) runs it
VERBS = {
    "train": ("modforge.train", "train one configuration, or sweep many with -m"),
    "generate": ("modforge.generate", "decode text from a trained or converted checkpoint"),
    "list": ("modforge.catalog", "every kind and option, their parameters and defaults; experiments, trainers"),
    "report": ("modforge.report", "a sweep's tables: means, intervals, differences from a baseline, costs"),
    "study": ("modforge.study", "a declared study end to end: tuned arms, adaptive seeds, a ladder, one report"),
    "export": ("modforge.export", "a checkpoint as safetensors and config.json, or a Hugging Face directory"),
    "convert": ("modforge.convert", "a Hugging Face model directory (GPT-2, Llama, BERT) as a modforge checkpoint"),
    "eval": ("modforge.evaluate", "score a checkpoint on downstream tasks: JSONL tasks, lm-evaluation-harness tasks"),
    "prepare": ("modforge.prepare", "text files or a cached dataset as token shards, for data=tokens"),
}

USAGE = "usage: python -m modforge <verb> [arguments]   (also: modforge <verb> ...)\n\nverbs:\n" + "\n".join(
    f"  {verb:<9} {what}" for verb, (_, what) in VERBS.items()) + \
    "\n\n'python -m modforge <verb> --help' describes one."


def main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        from modforge.registry import suggest

        print(f"error: '{verb}' is not a modforge verb.{suggest(verb, list(VERBS))} Verbs: {', '.join(VERBS)}.",
              file=sys.stderr)
        sys.exit(2)
    # run the command's module as __main__, exactly as `python -m modforge.<module>` would: its argv, and its
    # module spec (Lightning starts a DDP run's other ranks with `python -m <__main__'s module> argv[1:]`)
    sys.argv = [sys.argv[0], *rest]
    runpy.run_module(VERBS[verb][0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
