"""``modforge prepare`` against a plain ``tokenizers`` loop, on the same documents, in one process.

    python benchmarks/prepare.py [--mb 40] [--workers 0] [--repeats 2]

The documents are the Python standard library's top-level ``*.py`` files (offline, everywhere), repeated to
about ``--mb`` megabytes of text, each file one document. A byte-level BPE of 16,384 ids is trained once on
them and saved as a ``tokenizer.json``; then, alternately and ``--repeats`` times each:

* **peer**: a plain loop, as a user would write it: ``Tokenizer.from_file``, ``encode_batch`` over batches of 256
  documents (the library's own Rust threads on every core), the ids with an end-of-text id appended written to
  one ``uint16`` file; **peer_fast**: the same with ``encode_batch_fast`` (no character offsets computed);
* **modforge**: ``prepare`` with that ``tokenizer.json`` (``tokenizer=pretrained``: the same ids), ``eod=end``,
  ``workers`` processes (0: one per core), shards of 100M tokens, ``meta.json``, progress bar off.

Both read the documents from the same list in memory. Prints the best wall time of each, MB/s of text and
the ratio (modforge's throughput over the peer's); checks that both wrote the same ids.
"""
import argparse
import glob
import os
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np


VAL = 0.01  # prepare's validation share (every 100th document)


def documents(mb: float) -> list:
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
    out, size = [], 0
    while size < mb * 1e6:
        for t in texts:
            out.append(t)
            size += len(t.encode("utf-8"))
    return out


def peer(docs: list, tokenizer_json: str, out: Path, eot: int, fast: bool = False) -> list:
    """Each document's token count (its ids and the end-of-text id written to ``out``)."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(tokenizer_json)
    encode = hf.encode_batch_fast if fast else hf.encode_batch
    lengths = []
    with open(out, "wb") as fh:
        for i in range(0, len(docs), 256):
            for enc in encode(docs[i : i + 256], add_special_tokens=False):
                ids = np.asarray(enc.ids + [eot], dtype=np.uint16)
                ids.tofile(fh)
                lengths.append(len(ids))
    return lengths


def ours(docs: list, tokenizer_json: str, out: Path, workers: int) -> int:
    import modforge.data.prepare as P

    class InMemory(P.Documents):  # the same list the peer reads, not files
        def __init__(self, cfg):
            self.cfg, self.ds, self.val_ds, self.paths = cfg, None, None, []

        def identity(self):
            return {"benchmark": len(docs)}

        def __iter__(self):
            return iter(docs)

    real, P.Documents = P.Documents, InMemory
    try:
        meta = P.prepare(P.PrepareConfig(out=str(out), input="-", tokenizer="pretrained", tokenizer_path=tokenizer_json,
                                         eod="end", val_fraction=VAL, workers=workers, progress=False),
                         log=lambda s: None)
    finally:
        P.Documents = real
    return sum(s["tokens"] for s in meta["splits"].values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=40.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = documents(args.mb)
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="mf-prepare-bench-"))
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(docs[: len(docs) // max(1, round(args.mb / 10))],
                           trainers.BpeTrainer(vocab_size=16384, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    tj = str(tmp / "tokenizer.json")
    hf.save(tj)
    eot = hf.token_to_id("<|endoftext|>")
    names = ("peer", "peer_fast", "modforge")
    times = {n: [] for n in names}
    counts = {}
    for r in range(args.repeats):
        for name in names:
            out = tmp / f"{name}-{r}"
            t0 = time.perf_counter()
            counts[name] = ours(docs, tj, out, args.workers) if name == "modforge" else \
                peer(docs, tj, out, eot, fast=name == "peer_fast")
            times[name].append(time.perf_counter() - t0)
    from modforge.data.sources import is_val

    lengths = counts["peer"]
    a = np.split(np.fromfile(tmp / "peer-0", dtype=np.uint16), np.cumsum(lengths)[:-1])
    split = {k: [x for i, x in enumerate(a) if is_val(i, VAL) == (k == "val")] for k in ("train", "val")}
    same = all(np.array_equal(np.concatenate(split[k]), np.concatenate(
        [np.fromfile(f, dtype="<u2", offset=1024) for f in sorted((tmp / "modforge-0").glob(f"{k}_*.bin"))]))
        for k in ("train", "val"))
    print(f"{len(docs):,} documents, {mb:.1f} MB of text, {sum(lengths):,} tokens; cores: {os.cpu_count()}, "
          f"workers: {args.workers or os.cpu_count()}")
    for name in names:
        best = min(times[name])
        print(f"{name:>9}: best of {args.repeats} {best:.2f} s ({mb / best:.2f} MB/s), all: "
              f"{', '.join(f'{t:.2f}' for t in times[name])}")
    for name in ("peer", "peer_fast"):
        print(f"ratio (modforge MB/s over {name}'s): {min(times[name]) / min(times['modforge']):.2f}")
    print(f"the same ids as the peer's, split as prepare splits: {same}")


if __name__ == "__main__":
    main()
