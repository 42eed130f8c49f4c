"""Checkpoints: finding one from what a user types, and rebuilding a trained task from it alone.

Every checkpoint carries the resolved run config and the data facts
(tokenizer, positions, tokens per character, labels) as hyper-parameters, so
:func:`load_checkpoint` needs nothing else: no data, no config files.

Loading never executes code: every load is ``torch.load(..., weights_only=True)``,
which unpickles tensors and plain containers only, and what modforge stores in
a checkpoint is exactly that (checked by a test). A file that holds anything
else (a pickled object whose loading would run code) is refused in one line.
"""
from pathlib import Path
from typing import Any, Optional

from modforge.config.untrusted import BUILT, refuse_code
from modforge.registry import ConfigError


def find_checkpoint(key: str, value: Any) -> Path:
    """``key=value`` names a checkpoint: a .ckpt file, or a run directory (its ``checkpoints/last.ckpt``)."""
    path = Path(str(value)).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    if not path.is_file():
        raise ConfigError(
            f"{key}={value}: no checkpoint at {path}; give a .ckpt file or a run directory that has "
            f"checkpoints/last.ckpt (e.g. {key}=outputs/<date>/<time>)"
        )
    return path


def read_checkpoint(path: Any, key: str = "ckpt", map_location: str = "cpu", mmap: bool = False) -> dict:
    """The checkpoint's contents, loaded with ``weights_only=True``; anything else is one ConfigError. ``mmap``:
    tensors are read from the file when used (a large checkpoint read for its config costs no memory)."""
    from modforge.utils.readers import torch_file

    ckpt = torch_file(path, key, map_location=map_location, mmap=mmap)
    hp = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    if not isinstance(hp, dict) or "run_cfg" not in hp or "state_dict" not in ckpt:
        raise ConfigError(f"{key}={path}: not a modforge checkpoint (it has no run config and state dict)")
    run_cfg = hp["run_cfg"]
    if not isinstance(run_cfg, dict):
        raise ConfigError(f"{key}={path}: not a modforge checkpoint (its run config is not a mapping)")
    import torch

    state = ckpt["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConfigError(f"{key}={path}: not a modforge checkpoint (its state_dict is not a mapping of names to "
                          "tensors)")
    for field in ("global_step", "tokens_seen", "epoch"):
        v = ckpt.get(field, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{key}={path}: its {field} is {str(v)[:40]!r}, not a count (a whole number >= 0)")
    # its config is data: a _target_ or ${...} anywhere in what may be built from it is refused (its callbacks and
    # loggers never are: modforge.run.resume takes them from the command line)
    refuse_code({k: v for k, v in run_cfg.items() if k not in BUILT}, f"{key}={path}", "the checkpoint's run config")
    return ckpt


def load_checkpoint(path: str, map_location: str = "cpu", key: str = "ckpt"):
    """Rebuild a task (model, tokenizer, data facts) from a checkpoint file alone, in eval mode. A file whose
    parts do not fit together (a checkpoint of another version, an edited state dict or data facts) is one
    ConfigError naming it."""
    from modforge.errors import ModforgeError

    try:
        return _rebuild(path, map_location, key)
    except ModforgeError:
        raise
    except Exception as e:  # noqa: BLE001 - a mismatched state dict, data facts of another shape ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"{key}={path}: cannot rebuild its model ({type(e).__name__}: {first[:200]})") from None


def _rebuild(path: str, map_location: str, key: str):
    from modforge.plugins import load_all
    from modforge.data.base import DataFacts
    from modforge.registry import make_config

    load_all()  # built-ins and plugins: the checkpoint names its components
    ckpt = read_checkpoint(path, key, map_location)
    hp = ckpt["hyper_parameters"]
    facts = DataFacts.from_state(facts_state(ckpt))
    entry, task_cfg = make_config("task", hp["run_cfg"]["task"])
    task = entry.cls(task_cfg, hp["run_cfg"], facts)
    dtypes = {v.dtype for v in ckpt["state_dict"].values() if v.is_floating_point()}
    if len(dtypes) == 1:  # weights in one dtype (float64 from convert dtype=float64, bf16 from bf16-true): kept
        task.to(dtypes.pop())
    task.load_state_dict(ckpt["state_dict"])
    task.tokens_seen = int(ckpt.get("tokens_seen", 0))
    return task.eval()


def check_training_state(ckpt: dict, source: str) -> None:
    """What Lightning restores to continue a run, present and of its type: the optimizer's and the schedules'
    states and the version that wrote them; and the random states the run continues from, restorable. A
    checkpoint without them holds weights only: ``init_from=``."""
    from packaging.version import InvalidVersion, Version

    from modforge.utils.seeds import restore_fault

    why = None
    opt, sched, version = ckpt.get("optimizer_states"), ckpt.get("lr_schedulers"), ckpt.get("pytorch-lightning_version")
    if not isinstance(opt, list) or not opt or not all(isinstance(o, dict) and isinstance(o.get("param_groups"), list)
                                                       and o["param_groups"] for o in opt):
        why = "no optimizer state (optimizer_states)"
    elif not isinstance(sched, list):
        why = "no learning-rate schedule state (lr_schedulers)"
    elif not isinstance(version, str):
        why = "no record of the Lightning version that wrote it"
    else:
        try:
            Version(version)
        except InvalidVersion:
            why = f"a Lightning version that is none ({version[:40]!r})"
        else:
            why = restore_fault(ckpt)
    if why:
        raise ConfigError(f"{source}: not a complete training checkpoint ({why}); to start a new run from its "
                          "weights use init_from= instead")


def non_finite_weight(module: Any) -> Optional[str]:
    """The name of the first parameter of ``module`` that holds a NaN or an infinity, or None when every one is
    finite (buffers are not weights: a mask may hold -inf)."""
    import torch

    return next((name for name, p in module.named_parameters()
                 if p.is_floating_point() and not bool(torch.isfinite(p).all())), None)


def shapes_of(state: dict) -> dict:
    """{name: shape} of a state dict: what :func:`weights_mismatch` compares (kept instead of the tensors)."""
    return {name: tuple(t.shape) for name, t in state.items()}


def weights_mismatch(ours: dict, theirs: dict) -> Optional[str]:
    """The first difference between a model's {name: shape} and a checkpoint's (a name missing on either side, or
    another shape), or None when the checkpoint's weights fit the model exactly."""
    for name, shape in ours.items():
        if name not in theirs:
            return f"it has no {name}"
        if theirs[name] != shape:
            return f"{name} is {theirs[name]} there, {shape} in the model it names"
    extra = [n for n in theirs if n not in ours]
    return f"it has {extra[0]}, which the model it names has not" if extra else None


def facts_of(ckpt: dict, source: str):
    """The checkpoint's data facts (its tokenizer above all) rebuilt, or one line naming the file when its
    record of them is not what modforge writes."""
    from modforge.data.base import DataFacts
    from modforge.errors import ModforgeError

    try:
        return DataFacts.from_state(facts_state(ckpt))
    except ModforgeError:
        raise
    except Exception as e:  # noqa: BLE001 - a tokenizer state of another shape, a field of another type
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{source}: its data facts (tokenizer, positions, labels) cannot be read "
                          f"({type(e).__name__}: {first[:160]})") from None


def facts_state(ckpt: dict) -> dict:
    """The data facts a checkpoint carries (rebuilt from the tokenizer state for checkpoints older than them)."""
    hp = ckpt["hyper_parameters"]
    return hp["data_facts"] if "data_facts" in hp else _facts_of_old_checkpoint(hp)


def _facts_of_old_checkpoint(hp: dict) -> dict:
    """Checkpoints written before the data facts existed carry only the tokenizer state (labels in its
    ``meta``); their tokens per character are unknown, so ``val/bpc`` is not reported for them."""
    from modforge.registry import make_config

    state = dict(hp["tokenizer_state"])
    meta = state.pop("meta", None) or {}
    model_len = make_config("model", hp["run_cfg"]["model"])[1].max_len
    try:
        positions = getattr(make_config("data", hp["run_cfg"]["data"])[1], "positions", None) or model_len
    except (ConfigError, KeyError):  # e.g. its data plugin is not installed here
        positions = model_len
    return {"tokenizer": state, "positions": positions, "tokens_per_char": None, "labels": meta.get("labels")}


# ------------------------------------------------------------------------------------------------- init_from

def init_config(cfg: Any, ckpt: dict, user_keys: Optional[list]) -> Any:
    """The config of a run started from a checkpoint's weights (``init_from=``): the checkpoint's architecture
    (its model, task and parts), with this command line's own model/task/part overrides on top. A group switched
    on the command line (``norm=rms``) is that option as composed; a key set (``model.dropout=0.1``) changes
    only that key of the checkpoint's. Data, optimizer, schedule and trainer are the command line's.
    ``user_keys`` None (a config composed in-process): the checkpoint's groups as they are."""
    from omegaconf import OmegaConf, open_dict

    from modforge.registry import part_kinds

    saved = ckpt["hyper_parameters"]["run_cfg"]
    keys = user_keys or []
    merged = cfg.copy()
    with open_dict(merged):
        for group in ("model", "task", *part_kinds()):
            if group not in saved or group in keys:
                continue
            node = OmegaConf.create(saved[group])
            for key in keys:
                if key.startswith(group + "."):
                    OmegaConf.update(node, key[len(group) + 1:], OmegaConf.select(cfg, key), merge=False)
            merged[group] = node
        # the text is read with the checkpoint's own tokenizer (its embeddings were trained on those ids): the
        # config says so, and a command line that asks for another one is refused
        saved_data = saved.get("data") or {}
        for key in ("tokenizer", "tokenizer_path", "vocab_size"):
            if key not in saved_data or "data" not in merged or key not in merged.data:
                continue
            asked = OmegaConf.select(cfg, f"data.{key}")
            if f"data.{key}" in keys and asked != saved_data[key]:
                raise ConfigError(f"data.{key}={asked}: init_from={cfg.get('init_from')} reads text with its own "
                                  f"tokenizer (data.{key}={saved_data[key]}): its embeddings were trained on those "
                                  f"ids; leave data.{key} out")
            merged.data[key] = saved_data[key]
    return merged


def tied_names(state: dict) -> dict:
    """{name: the name it shares storage with}: safetensors refuses shared tensors, so each is stored once."""
    seen: dict = {}
    shared = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            shared[name] = seen[key]
        else:
            seen[key] = name
    return shared


def load_matching(model: Any, ckpt: dict) -> dict:
    """Copy into ``model`` every tensor of the checkpoint whose name and shape match; -> what was ``loaded``,
    what is ``new`` (left to its component's own initialisation), what was ``dropped`` (in the checkpoint only),
    and ``reshaped`` (a name in both, another shape: new here and dropped there). A tensor several names share
    (a tied head) counts once, under its first name."""
    theirs = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    theirs_alias = tied_names(theirs)
    ours = model.state_dict()
    ours_alias = tied_names(ours)
    take, new, reshaped = {}, [], []
    for name, t in ours.items():
        if name in ours_alias:
            continue
        got = theirs.get(name)
        if got is not None and got.shape == t.shape:
            take[name] = got.to(t.dtype)
        else:
            new.append(name)
            if got is not None:
                reshaped.append(name)
    model.load_state_dict(take, strict=False)
    dropped = [k for k in theirs if k not in take and k not in theirs_alias]
    return {"loaded": list(take), "new": new, "dropped": dropped, "reshaped": reshaped}
