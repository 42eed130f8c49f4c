"""``python -m modforge prepare input=<files> out=<dir> [tokenizer=...] ...``: text into token shards.

Tokenizes text files, JSONL files or a cached Hugging Face dataset into llm.c-layout shards (``.bin`` with
its 256-int32 header; what modded-nanogpt reads) and a ``meta.json`` that names the tokenizer and the
end-of-document id, for ``data=tokens data.path=<dir>``. In parallel over the cores, resumable (run the same
command again after a kill), and atomic (a shard file is whole or absent; ``meta.json`` comes last).

Examples:
  python -m modforge prepare input='corpus/*.txt' out=shards/corpus vocab_size=8192
  python -m modforge prepare input=docs.jsonl text_field=text out=shards/docs tokenizer_path=gpt2/tokenizer.json
  python -m modforge prepare dataset=roneneldan/TinyStories out=shards/tinystories    (already in the HF cache)
"""
from typing import Optional

from modforge.cli.command import command
from modforge.cli.options import Option, Options

OPTIONS = Options("python -m modforge prepare", (
    Option("out", "the shard directory to write (created; a killed prepare resumes in it)", required=True,
           metavar="dir"),
    Option("input", "text or .jsonl files: paths or globs, comma-separated", metavar="files"),
    Option("dataset", "instead of input=: a Hugging Face dataset already in the local datasets cache",
           metavar="name"),
    Option("subset", "the dataset's configuration (dataset=)"),
    Option("split", "the dataset's split (dataset=)", "train"),
    Option("val_split", "with dataset=: validate on this split's rows instead of val_fraction of split's",
           metavar="split"),
    Option("text_field", "the text column of a dataset or key of a .jsonl object", "text"),
    Option("documents", "what one document of a text file is (a .jsonl line is one, always)", "file", "choice",
           ("file", "line", "blank_line")),
    Option("encoding", "of the text files", "utf-8"),
    Option("tokenizer", "a registered tokenizer (bpe, byte, char, pretrained); default pretrained with "
           "tokenizer_path=, else bpe trained here", metavar="name"),
    Option("vocab_size", "a trained BPE's vocabulary, its 5 specials and 256 bytes included (default 4096)",
           type="int", low=1),
    Option("tokenizer_path", "a Hugging Face tokenizer.json to encode with (ids as in the file)", metavar="path"),
    Option("fit_chars", "train the tokenizer on at most this many characters of the training documents",
           100_000_000, "int", low=1),
    Option("eod", "the end-of-text id after each document (end), before it (start: llm.c, modded-nanogpt), "
           "or none", "end", "choice", ("end", "start", "none")),
    Option("val_fraction", "the share of documents that validate, spread evenly", 0.01, "float"),
    Option("shard_tokens", "a shard closes once it holds this many tokens (whole documents)", 100_000_000, "int",
           low=1),
    Option("workers", "encoding processes; 0: one per core", 0, "int", low=0),
    Option("progress", "a progress bar on stderr", True, "bool"),
))


def prepare_command(argv: list) -> None:
    from modforge.data.prepare import PrepareConfig, prepare

    given, _ = OPTIONS.parse(argv)
    prepare(PrepareConfig(**given))


def main(argv: Optional[list] = None) -> None:
    command(__doc__, prepare_command, argv, OPTIONS)


if __name__ == "__main__":
    main()
