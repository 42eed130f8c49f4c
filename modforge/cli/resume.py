"""``resume=`` on the command line, rewritten to what it means before Hydra sees it: a sweep's directory
continues that sweep as it was started; a single run's directory continues that run in place."""
from pathlib import Path

from modforge import registry
from modforge.config.overrides import hydra_value
from modforge.run.dirs import SWEEP_KEYS
from modforge.sweeps.sweeper import sweep_command

def continue_where_recorded(argv: list, multirun: bool) -> list:
    """``resume=`` rewritten to what it means. With ``-m`` and a sweep directory: the sweep's recorded command
    again, in that directory (finished jobs skipped, interrupted ones resumed in place); only the sweep's own
    switches (retry_failed, skip_invalid, dry_run) and hydra.* settings may be added. For a single run's
    directory: ``hydra.run.dir`` becomes that directory, and Hydra's record of this command goes to
    ``.hydra/resume-N`` (the run's original command stays in ``.hydra``)."""
    given = [a for a in argv if a.split("=", 1)[0] == "resume"]
    if not given:
        return argv
    value = given[-1].split("=", 1)[1]
    target = Path(value).expanduser()
    if multirun and (target / "multirun.yaml").is_file():
        task, hydra_overrides = sweep_command(target)
        extra = [a for a in argv if a not in given and a not in ("-m", "--multirun")]
        for a in extra:
            key = a.split("=", 1)[0].lstrip("+~")
            if "=" in a and key not in SWEEP_KEYS and not key.startswith("hydra"):
                raise registry.ConfigError(
                    f"{a}: resume={value} continues the sweep recorded there as it was started; {key} would change "
                    f"its jobs. Start a new sweep for that (only {', '.join(SWEEP_KEYS)} and hydra.* may be "
                    "added)")
        mine = {a.split("=", 1)[0] for a in extra}
        kept = [o for o in hydra_overrides if o.split("=", 1)[0] not in mine]
        return ["-m", *task, *kept, *extra, f"hydra.sweep.dir={hydra_value(str(target))}"]
    if multirun or any(a.split("=", 1)[0] == "hydra.run.dir" for a in argv):
        return argv  # a sweep of runs that each start from the checkpoint, or a directory of the user's choice
    run_dir = target if target.is_dir() else target.parent.parent
    if not ((run_dir / "config.yaml").is_file() and
            (target.is_dir() or target.name == "last.ckpt" and target.parent.name == "checkpoints")):
        return argv  # another checkpoint file (best.ckpt, someone else's): a new run starts from it
    n = 1 + sum(1 for p in (run_dir / ".hydra").glob("resume-*"))
    return [*argv, f"hydra.run.dir={hydra_value(str(run_dir))}", f"hydra.output_subdir=.hydra/resume-{n}"]
