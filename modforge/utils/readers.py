"""One reader per file format modforge reads from its users: every failure is one
:class:`~modforge.errors.ConfigError` naming the file, what is wrong with it and what to do, never a library's
traceback. Each reader first checks that the path is a regular file (not missing, not a folder, a FIFO, a
device or a link that leads nowhere), then parses it."""
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

from modforge.errors import ConfigError


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def regular_file(path: Any, what: str = "") -> Path:
    """``path`` as a regular file that can be read, or one line saying what it is instead."""
    p = Path(str(path)).expanduser()
    label = f"{what}={path}" if what else str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ConfigError(f"{label}: a symbolic link whose target does not exist") from None
        raise ConfigError(f"{label}: no such file") from None
    except OSError as e:  # ELOOP (a symbolic-link loop), ENAMETOOLONG, EACCES on a parent ...
        raise ConfigError(f"{label}: cannot be reached ({e.strerror or _first(e)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{label}: a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) \
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise ConfigError(f"{label}: {kind}; give a regular file (it is read more than once, and its size is needed)")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{label}: not readable (permission denied)")
    return p


def text(path: Any, what: str = "", encoding: str = "utf-8") -> str:
    p = regular_file(path, what)
    try:
        return p.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what + '=' if what else ''}{path}: not {encoding} text (byte {e.start}: "
                          f"{e.reason})") from None
    except OSError as e:
        raise ConfigError(f"{what + '=' if what else ''}{path}: cannot be read ({e.strerror or _first(e)})") from None


def json_file(path: Any, what: str = "", expect: type = dict) -> Any:
    """A JSON file whose top level is ``expect`` (dict by default)."""
    label = f"{what}={path}" if what else str(path)
    try:
        data = json.loads(text(path, what))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{label}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{label}: not a readable record (JSON nested too deeply)") from None
    if not isinstance(data, expect):
        raise ConfigError(f"{label}: expected a JSON {'object' if expect is dict else expect.__name__}, "
                          f"found {type(data).__name__}")
    return data


def yaml_file(path: Any, what: str = "", expect: type = dict) -> Any:
    """A YAML file whose top level is ``expect`` (dict by default; an empty file is an error)."""
    import yaml

    label = f"{what}={path}" if what else str(path)
    try:
        data = yaml.safe_load(text(path, what))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{label}: not valid YAML{where}: {getattr(e, 'problem', None) or _first(e)}") from None
    if not isinstance(data, expect):
        raise ConfigError(f"{label}: expected a YAML {'mapping' if expect is dict else expect.__name__}, "
                          f"found {type(data).__name__ if data is not None else 'nothing (an empty file)'}")
    return data


def safetensors_file(path: Any, what: str = "") -> dict:
    """Every tensor of a safetensors file (a truncated or foreign file is one line)."""
    from safetensors.torch import load_file

    p = regular_file(path, what)
    try:
        return load_file(str(p))
    except Exception as e:  # noqa: BLE001 - safetensors_rust.SafetensorError, OSError, ...
        raise ConfigError(f"{what + '=' if what else ''}{path}: not a readable safetensors file ({_first(e)}); "
                          "it may be truncated (an interrupted download) or another format: fetch or save it again") \
            from None


def torch_file(path: Any, what: str = "", map_location: str = "cpu", mmap: bool = False,
               refused: Callable[[str], str] = lambda glob: glob) -> Any:
    """A file ``torch.save`` wrote, loaded with ``weights_only=True``: a pickle that would run code is refused
    (naming the object it holds), and any other failure, whatever the library raises, is one line."""
    import pickle
    import re

    import torch

    p = regular_file(path, what)
    label = f"{what}={path}" if what else str(path)
    try:
        return torch.load(p, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found:
            raise ConfigError(
                f"{label}: refused: the file holds a pickled Python object ({found.group(1)}) besides tensors and "
                "plain data, and loading it could run code. modforge checkpoints never do; load only files you "
                "trust.") from None
        raise ConfigError(f"{label}: not a readable checkpoint (torch cannot unpickle it)") from None
    except Exception as e:  # noqa: BLE001 - RuntimeError, EOFError, IndexError, KeyError ... from a foreign file
        raise ConfigError(f"{label}: not a readable checkpoint ({_first(e)})") from None


def yaml_error(e: BaseException) -> str:
    """A PyYAML error (raised by Hydra composing a config file) as one line: the file, where, what."""
    mark = getattr(e, "problem_mark", None)
    if mark is None:
        return f"not valid YAML: {_first(e)}"
    return (f"{mark.name}: not valid YAML (line {mark.line + 1}, column {mark.column + 1}): "
            f"{getattr(e, 'problem', None) or _first(e)}")
