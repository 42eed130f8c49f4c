"""Files written whole or not at all: atomic writes, and the JSON and text helpers built on them.

The ground floor of file I/O (no torch, nothing else of modforge): run
directories (``config.yaml``, ``metrics.json``), checkpoints and every cache
write through :func:`atomic_file`.
"""
import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Optional


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", durable: bool = False):
    """Open a temporary file beside ``path``; on success rename it to ``path`` (atomic), else delete it.

    Readers see the old file or the whole new one, never a part. ``durable``
    also fsyncs the data before the rename and the directory after it, so the
    new file survives a power cut too (checkpoints use it; caches, which can be
    rebuilt, don't pay for it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with _named(path), open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable and hasattr(os, "O_DIRECTORY"):
            with contextlib.suppress(OSError):  # some network / FUSE file systems refuse; the file is saved anyway
                fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def _named(path: Path):
    """An OSError without a file name (a full disk while writing) gets ``path``, so its message names it."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


def remove_stale_temporaries(path: Path) -> None:
    """Delete temporary files that ``atomic_file`` left beside ``path`` in processes that no longer run (killed)."""
    path = Path(path)
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but not ours (EPERM)
        return True
    return True


CACHE_ENV = "MODFORGE_CACHE"
DEFAULT_CACHE = "~/.cache/modforge"


def cache_dir(given: Optional[str] = None) -> Path:
    """modforge's cache directory (token and tokenizer caches, the registry manifest): ``given``, else
    ``$MODFORGE_CACHE``, else ``~/.cache/modforge``. Not created here."""
    return Path(os.path.expanduser(str(given or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)))


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (readers, and other DDP ranks writing the same file, see whole files)."""
    with atomic_file(path, "w") as fh:
        fh.write(text)


def write_json(path: Path, obj: Any, indent: Optional[int] = None) -> None:
    """Strict JSON, atomically: a non-finite number (NaN, inf) is written as null (the record says why)."""
    write_text(path, json.dumps(finite(obj), indent=indent, allow_nan=False) + ("\n" if indent else ""))


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def read_json(path: Path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
