"""Tokenization throughput and peak memory of the token cache, on one text file.

    python benchmarks/tokenize_cache.py FILE [--tokenizer char|byte|bpe] [--vocab-size 4096] [--val-fraction 0.1]
        [--chunk-chars N]

Runs exactly what a text datamodule's ``prepare()`` runs on a cache miss, in a
fresh temporary cache directory: one pass to count and hash the text, fitting
the tokenizer on the training split, then tokenizing both splits chunk by chunk
into the memory-mapped cache; then once more on the now warm cache. Prints the
throughput of each phase in MB/s (of the file's size) and the process's peak
resident memory (``resource.getrusage``), before and after the work. Only numpy,
``tokenizers`` and modforge's data modules are imported (no torch), so the RSS
is the tokenizer pipeline's own.

Make a 100 MB file by repeating Tiny Shakespeare (outside the repository)::

    python -c "import sys; t=open(sys.argv[1]).read(); open('/tmp/ts100.txt','w').write(t*94)" \\
        ../shared/data/tinyshakespeare/input.txt
"""
import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from modforge.data import cache
from modforge.data import corpus as corpus_mod
from modforge.data.config import make_tokenizer
from modforge.data.text import rechunk


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--tokenizer", default="char")
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--chunk-chars", type=int, default=None, help=f"default {cache.CHUNK_CHARS}")
    args = ap.parse_args(argv)
    if args.chunk_chars:
        cache.CHUNK_CHARS = args.chunk_chars

    path = Path(args.path)
    if not path.is_file():
        sys.exit(f"error: {path}: no such file")
    mb = path.stat().st_size / 1e6
    rss0 = peak_rss_mb()
    cfg = SimpleNamespace(tokenizer=args.tokenizer, vocab_size=args.vocab_size, tokenizer_path=None)
    with tempfile.TemporaryDirectory(prefix="modforge-bench-") as tmp:
        root = Path(tmp)
        corpus = corpus_mod.FilesCorpus([str(path)])
        t0 = time.perf_counter()
        info = cache.corpus_info(corpus, None, root)
        t1 = time.perf_counter()
        cut = int(info.n_chars * (1 - args.val_fraction))
        tok = cache.fit_tokenizer(make_tokenizer(cfg), lambda: rechunk(corpus_mod.window(corpus.pieces(), 0, cut),
                                                                       cache.CHUNK_CHARS),
                                  {"sha": info.sha, "n_chars": info.n_chars, "cut": cut}, root)
        t2 = time.perf_counter()
        rss_fit = peak_rss_mb()
        tc = cache.token_cache(corpus, info, cut, tok, root)
        t3 = time.perf_counter()
        assert tc.built
        # warm: what every later run pays (identity lookup, cached tokenizer, memory map)
        info2 = cache.corpus_info(corpus, None, root)
        tok2 = cache.fit_tokenizer(make_tokenizer(cfg), lambda: [], {"sha": info2.sha, "n_chars": info2.n_chars,
                                                                      "cut": cut}, root)
        tc2 = cache.token_cache(corpus, info2, cut, tok2, root)
        t4 = time.perf_counter()
        assert not tc2.built and len(tc2.train) == len(tc.train)
        n_tokens = len(tc.train) + len(tc.val)
        disk = sum(f.stat().st_size for f in tc.directory.glob("*.bin")) / 1e6

    print(f"file            {path} ({mb:.1f} MB, {info.n_chars:,} characters)")
    print(f"tokenizer       {args.tokenizer} (vocab {tok.vocab_size:,}, {tok.token_dtype}); "
          f"{n_tokens:,} tokens, {disk:.1f} MB on disk; chunks of {cache.CHUNK_CHARS:,} characters")
    print(f"count + hash    {t1 - t0:7.2f} s  {mb / (t1 - t0):8.1f} MB/s")
    print(f"fit tokenizer   {t2 - t1:7.2f} s  {mb / max(t2 - t1, 1e-9):8.1f} MB/s  (on the train split; "
          f"peak RSS so far {rss_fit:.0f} MB)")
    print(f"tokenize+write  {t3 - t2:7.2f} s  {mb / (t3 - t2):8.1f} MB/s")
    print(f"cold total      {t3 - t0:7.2f} s  {mb / (t3 - t0):8.1f} MB/s")
    print(f"warm (cached)   {t4 - t3:7.3f} s")
    print(f"peak RSS        {peak_rss_mb():.0f} MB  (after imports, before any work: {rss0:.0f} MB); "
          f"pid {os.getpid()}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
