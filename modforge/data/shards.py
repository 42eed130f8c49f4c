"""Token shard files: the formats modforge reads and writes, and a directory of them as one memory map (no torch).

A *shard* is a file of token ids. Three layouts are read:

* ``.bin`` with llm.c's header (also modded-nanogpt's FineWeb shards): 256 little-endian int32, of which
  ``[0]`` is the magic (:data:`MAGIC_U16` = 20240520 for uint16 tokens, version 1; :data:`MAGIC_U32` =
  20240801 for uint32 tokens, version 7) and ``[2]`` the token count; the tokens follow at byte 1024.
* ``.bin`` without a header (nanoGPT's ``train.bin`` / ``val.bin``): raw ids, uint16 unless declared uint32.
* ``.npy``: a one-dimensional integer array (read with ``mmap_mode="r"``).

Every shard is memory-mapped read-only, so a corpus of any size trains with flat memory, and pickles as its
path (DataLoader workers map the file themselves). :func:`open_shard` checks the file before any training:
a wrong magic, a header whose count disagrees with the file's size, a dtype that is not an unsigned integer
are each one :class:`~modforge.registry.ConfigError` naming the file.

``modforge prepare`` writes the first layout (uint16 where the vocabulary fits, else uint32) beside a sidecar,
``meta.json`` (:data:`META`), that names the tokenizer, the end-of-document id and every shard with its
token count and largest id; it is written last, so a directory without it is a prepare that did not finish.
"""
import glob
import os
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

from modforge.data.cache import TokenArray
from modforge.registry import ConfigError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAGIC_U16, VERSION_U16 = 20240520, 1  # llm.c's GPT-2 shards (uint16); modded-nanogpt reads these
MAGIC_U32, VERSION_U32 = 20240801, 7  # llm.c's Llama 3 shards (uint32)
MAGICS = {MAGIC_U16: (VERSION_U16, np.dtype("<u2")), MAGIC_U32: (VERSION_U32, np.dtype("<u4"))}
META = "meta.json"
PREPARE_STATE = ".prepare.json"  # an unfinished prepare's record (removed when meta.json is written)
META_FORMAT = "modforge-tokens"
META_VERSION = 1
RAW_DTYPES = ("uint16", "uint32")


class Shard(TokenArray):
    """One shard: ``n`` tokens of ``dtype`` at byte ``offset`` of ``path``, memory-mapped on first use (a
    :class:`~modforge.data.cache.TokenArray`); ``layout`` says which of the three it is."""

    def __init__(self, path: Path, dtype: Any, n: int, offset: int = 0, layout: str = "llmc"):
        super().__init__(path, dtype, n, offset)
        self.layout = layout  # llmc | raw | npy

    def max_id(self, chunk: int = 1 << 24) -> int:
        """The largest id in the shard (read in chunks: flat memory)."""
        top = -1
        for i in range(0, self.n, chunk):
            top = max(top, int(self.array[i : i + chunk].max()))
        return top


def write_shard(fh: BinaryIO, ids: np.ndarray, dtype: np.dtype) -> None:
    """``ids`` as an llm.c shard: the header, then the tokens (``dtype`` uint16 or uint32)."""
    dtype = np.dtype(dtype).newbyteorder("<")
    magic = MAGIC_U16 if dtype.itemsize == 2 else MAGIC_U32
    if len(ids) >= 2 ** 31:
        raise ValueError(f"a shard holds fewer than 2^31 tokens (its header counts them in an int32); got {len(ids)}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = magic, MAGICS[magic][0], len(ids)
    fh.write(header.tobytes())
    fh.write(memoryview(np.ascontiguousarray(np.asarray(ids).astype(dtype, copy=False))))  # no second copy


def open_shard(path: Any, raw_dtype: str = "uint16", key: str = "data.path") -> Shard:
    """A shard file as a :class:`Shard`, its layout told by its suffix and header; one line if it is not one."""
    p = Path(path)
    label = f"{key}: {p}"
    size = p.stat().st_size
    if p.suffix == ".npy":
        try:
            arr = np.load(p, mmap_mode="r")
        except Exception as e:  # noqa: BLE001 - numpy's many parse errors: one line
            raise ConfigError(f"{label}: not a readable .npy array ({type(e).__name__}: {e})") from None
        if arr.ndim != 1 or arr.dtype.kind != "u":
            raise ConfigError(f"{label}: a .npy shard is a 1-d array of unsigned integers (uint16, uint32); this "
                              f"one is {arr.ndim}-d {arr.dtype}")
        return Shard(p, arr.dtype, int(arr.shape[0]), int(arr.offset), "npy")
    head = np.fromfile(p, dtype="<i4", count=3) if size >= 12 else np.zeros(0, dtype="<i4")
    if len(head) == 3 and int(head[0]) in MAGICS:
        version, dtype = MAGICS[int(head[0])]
        if int(head[1]) != version:
            raise ConfigError(f"{label}: an llm.c shard with magic {int(head[0])} has version {version}, not "
                              f"{int(head[1])}")
        n = int(head[2])
        if size != HEADER_BYTES + n * dtype.itemsize:
            raise ConfigError(f"{label}: its header counts {n:,} tokens ({HEADER_BYTES + n * dtype.itemsize:,} "
                              f"bytes with the header) but the file has {size:,} bytes: truncated or not a shard")
        return Shard(p, dtype, n, HEADER_BYTES, "llmc")
    if raw_dtype == "llmc":
        got = int(head[0]) if len(head) else None
        raise ConfigError(f"{label}: not an llm.c shard (its first int32 is {got}; the magic is {MAGIC_U16} for "
                          f"uint16 tokens or {MAGIC_U32} for uint32). Set data.dtype=uint16|uint32 for raw "
                          "token files without a header")
    dtype = np.dtype(raw_dtype).newbyteorder("<")
    if size % dtype.itemsize:
        raise ConfigError(f"{label}: {size:,} bytes is not a whole number of {raw_dtype} tokens; the file is "
                          "truncated, or its tokens are another width (data.dtype=uint16|uint32)")
    return Shard(p, dtype, size // dtype.itemsize, 0, "raw")


def find_shards(root: Path, pattern: str, key: str) -> list[Path]:
    """The shard files of ``root`` that ``pattern`` (a glob relative to it) names, sorted; one line if none."""
    found = sorted(Path(p) for p in glob.glob(str(root / pattern), recursive=True)
                   if os.path.isfile(p) and not os.path.basename(p).startswith(".")
                   and Path(p).suffix in (".bin", ".npy"))
    if not found:
        raise ConfigError(f"{key}={pattern}: no .bin or .npy shard under {root} matches it. Write shards with "
                          "'python -m modforge prepare', or point the glob at nanoGPT/modded-nanogpt shards")
    return found


def check_meta(meta: Optional[dict], root: Path) -> Optional[dict]:
    """``meta`` if it is modforge's sidecar of a finished prepare, None if there is none; one line if it is
    someone else's file or a newer format."""
    if meta is None:
        return None
    if meta.get("format") != META_FORMAT:
        raise ConfigError(f"data.path={root}: its {META} is not modforge's token sidecar (no \"format\": "
                          f"\"{META_FORMAT}\"); move it aside, or write the directory with 'python -m modforge prepare'")
    if int(meta.get("version", 0)) > META_VERSION:
        raise ConfigError(f"data.path={root}: {META} has version {meta.get('version')}, newer than this modforge "
                          f"reads ({META_VERSION}); upgrade modforge")
    return meta
