"""Which weights and which config a run starts from: ``resume=`` (continue a run: its config, with what the
command line may change on top) and ``init_from=`` (start a new run from another model's weights, the
checkpoint's architecture under this command line's overrides)."""
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from modforge import registry
from modforge.checkpoints.files import check_training_state, find_checkpoint, init_config, read_checkpoint
from modforge.run.dirs import ABSENT, CONTROL_KEYS, FINAL, RESUME_FREE_KEYS, option_default, read_state

def resumed_config(cfg: DictConfig, resume: str, user_keys: Optional[list], ckpt: Optional[dict] = None,
                   finished_ok: bool = False) -> DictConfig:
    """The config a resumed run trains with: the saved run's, with the keys this command line sets on top
    (trainer.*, seed, where the data lives ...; keys the run predates take today's defaults). When the keys set
    are not known (``user_keys`` None: a config composed in-process), every key but the components is ``cfg``'s.
    A command-line key that would change a component is refused, naming it; so is a run that has finished
    (unless ``finished_ok``: a run killed after its last checkpoint and before its final record). The caller
    validates the result (:func:`modforge.config.checks.validate`)."""
    from omegaconf import open_dict

    if ckpt is None:  # weights only: a file that would run code is refused, in one line
        ckpt = read_checkpoint(resume, "resume")
    if "converted_from" in ckpt:
        raise registry.ConfigError(f"resume={resume}: a converted pretrained checkpoint holds weights only (no "
                                   f"optimizer, no step); fine-tune from it with init_from={resume}")
    check_training_state(ckpt, f"resume={resume}")
    saved = carried(ckpt["hyper_parameters"]["run_cfg"], cfg, f"resume={resume}")
    groups = [g for g in registry.group_kinds() if g in saved]
    if user_keys is None:
        saved = {g: saved[g] for g in groups}
        user_keys = [k for k in cfg if k not in groups and k != "hydra"]
    for key in user_keys:
        head = key.split(".")[0].split("/")[0]
        if head not in groups or key in RESUME_FREE_KEYS:
            continue
        if "." in key and OmegaConf.select(OmegaConf.create(saved), key, default="<absent>") == "<absent>":
            predated(key, cfg, saved, resume)  # a key the saved run did not have yet: it trained at its default
            continue
        now = OmegaConf.select(cfg, key if "." in key else f"{key}.name")
        was = OmegaConf.select(OmegaConf.create(saved), key if "." in key else f"{key}.name")
        if now != was and not (isinstance(now, (DictConfig,)) and OmegaConf.to_container(now) == was):
            raise registry.ConfigError(
                f"{key}={now}: the run being resumed has {key}={was}; a resumed run keeps its model, data, "
                "tokenizer, task and optimizer (only trainer.*, seed and the like may change). "
                "To train a changed configuration, start a new run without resume=")
    # the run as it was (keys it did not have yet: today's defaults), then what this command line sets
    base = cfg.copy()
    with open_dict(base):
        base.pop("hydra", None)
        for g in groups:  # another option of a group than today's default: the saved option whole, not merged
            if g in base and isinstance(saved.get(g), dict) and saved[g].get("name") != base[g].get("name"):
                base[g] = OmegaConf.create({})  # into the typed schema of the option the command line composed
        try:
            merged = OmegaConf.merge(base, OmegaConf.create(saved))
        except Exception as e:  # noqa: BLE001 - omegaconf's ValidationError, ConfigKeyError: a value of another type
            from modforge.config.composition import one_line

            where = getattr(e, "full_key", None) or "its run config"
            raise registry.ConfigError(f"resume={resume}: the checkpoint's {where} does not fit today's config "
                                       f"({one_line(e)[:160]})") from None
    with open_dict(merged):
        for key in user_keys:
            head = key.split(".")[0].split("/")[0]
            if (head in groups and key not in RESUME_FREE_KEYS) or key == "resume":
                continue  # components stay the checkpoint's (checked above)
            value = OmegaConf.select(cfg, key, default="<absent>")
            if not isinstance(value, str) or value != "<absent>":
                OmegaConf.update(merged, key, value, merge=False)
        for key in CONTROL_KEYS:  # how this command runs (resume=, pause_at=, ...): this command's, never the saved run's
            if key in cfg:
                merged[key] = cfg.get(key)
    step, max_steps = int(ckpt.get("global_step", 0)), merged.trainer.max_steps
    if max_steps > 0 and step >= max_steps and not finished_ok:
        raise registry.ConfigError(
            f"resume={resume}: that run has finished (step {step} of trainer.max_steps={max_steps}); to train it "
            f"further, raise the limit, e.g. resume={resume} trainer.max_steps={2 * step}")
    return merged

# a resumed run's callbacks and loggers are this command line's (built from the shipped groups or the user's own
# callbacks.NAME._target_), never the checkpoint's: a file's config is data; so are the command's own switches
_NOTED: set = set()
NOT_CARRIED = ("callbacks", "logger", "hydra", "resume", "init_from", "dry_run", "skip_invalid", "retry_failed")


def carried(saved: Any, cfg: DictConfig, source: str) -> dict:
    """What a resumed run takes from its checkpoint's stored config: every root key today's config knows but
    :data:`NOT_CARRIED` (components by name through the registry, data, optimizer, schedule, trainer settings,
    seed ...; :func:`~modforge.checkpoints.files.read_checkpoint` has refused any ``_target_`` or interpolation
    in it). A run whose callbacks or loggers differ from this command line's gets a note saying how to keep
    them."""
    from modforge.utils.console import say

    kept = {k: v for k, v in saved.items() if isinstance(k, str) and k in cfg and k not in NOT_CARRIED}
    for key in ("callbacks", "logger"):
        was = sorted(k for k, v in (saved.get(key) or {}).items() if isinstance(v, dict) and "_target_" in v) \
            if isinstance(saved.get(key), dict) else []
        now = sorted(k for k, v in (cfg.get(key) or {}).items() if OmegaConf.is_dict(v) and "_target_" in v)
        if was != now and (source, key) not in _NOTED:
            _NOTED.add((source, key))  # the pre-flight and the run both read the checkpoint: one note
            say(f"[modforge] {source}: {key} are this command line's ({', '.join(now) or 'none'}); the run had "
                f"{', '.join(was)} (a checkpoint's {key} are never built): add {key}=[...] to keep them")
    return kept


def resume_path(value: Any) -> Optional[str]:
    """``resume=``: a checkpoint file, or a run directory (its ``checkpoints/last.ckpt``); None for a fresh run."""
    return None if value in (None, "", False) else str(find_checkpoint("resume", value))

def predated(key: str, cfg: DictConfig, saved: dict, resume: str) -> None:
    """A component key the resumed run never recorded (added to modforge after it started): the command may name
    it only at the default the run trained with, that of the run's own option (one line otherwise)."""
    head, rest = key.split(".", 1)
    default: Any = option_default(head, (saved.get(head) or {}).get("name"))
    for part in rest.split("."):
        default = default.get(part, ABSENT) if isinstance(default, dict) else ABSENT
    now = OmegaConf.select(cfg, key)
    now = OmegaConf.to_container(now) if OmegaConf.is_config(now) else now
    if default is ABSENT or now != default:
        was = f"its default {default!r}" if default is not ABSENT else "a default modforge no longer knows"
        raise registry.ConfigError(
            f"{key}={now}: the run being resumed predates {key}, so it trained at {was}; a resumed run keeps its "
            "model, data, tokenizer, task and optimizer. To train a changed configuration, start a new run "
            "without resume=")


def unrecorded(ckpt: Any) -> bool:
    """Whether ``ckpt`` is the ``last.ckpt`` of a run that never wrote its final record (killed after its last
    checkpoint): resuming it only completes it, so a step count at its limit is no reason to refuse."""
    p = Path(str(ckpt))
    return p.name == "last.ckpt" and p.parent.name == "checkpoints" and \
        read_state(p.parent.parent).status not in FINAL

def with_init_from(cfg: DictConfig, user_keys: Optional[list]) -> tuple:
    """-> (the config to run, the ``init_from=`` checkpoint or None): the checkpoint's architecture with this
    command line's overrides on top (:func:`~modforge.checkpoints.files.init_config`). Its tensors are memory-mapped,
    read when copied."""
    if not cfg.get("init_from") or cfg.get("resume"):
        return cfg, None
    init = read_checkpoint(find_checkpoint("init_from", cfg.init_from), "init_from", mmap=True)
    return init_config(cfg, init, user_keys), init
