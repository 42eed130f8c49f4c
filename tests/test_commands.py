"""The commands as a whole: ``python -m modforge <verb>``, the files the command and its sweeper exchange
instead of shared module state, and a job's config validated once."""
import json
import math
import os
import subprocess
import sys

import pytest
from pathlib import Path

from conftest import python, run_in_process

from modforge.__main__ import VERBS, main as verb_main

TINY = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "data.block_size=16",
        "data.batch_size=4", "data.max_chars=4000", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
        "sample=false", "eval_at_start=false", "callbacks.progress=none"]


def test_every_verb_names_a_command_module_with_a_main():
    import importlib

    for verb, (module, what) in VERBS.items():
        assert callable(importlib.import_module(module).main) and what, verb


def test_the_verb_table_answers_help_and_refuses_an_unknown_verb(capsys):
    verb_main(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in VERBS)
    with pytest.raises(SystemExit) as e:
        verb_main(["lsit"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: 'lsit' is not a modforge verb. Did you mean 'list'?")
    assert err.count("\n") == 1


@pytest.mark.process  # python -m modforge itself: the module's entry point
def test_a_verb_runs_its_command():
    p = python("-m", "modforge", "list", "norm", cwd=Path.cwd())
    assert p.returncode == 0 and "rms" in p.stdout, p.stderr[-2000:]
    p = run_in_process("modforge", Path.cwd(), "train", "norm=rmss")  # the verb's dispatch, without a second start
    assert p.returncode == 2 and p.stderr.startswith("error: Unknown norm 'rmss'"), p.stderr[-2000:]


def test_a_sweep_is_planned_once_each_job_composed_and_validated_once(tmp_path, monkeypatch):
    """``train -m``: the grid is expanded once and each job composed and validated once in the command's process
    (its job then runs from that config); the plan is kept in the sweep directory, no channel in the environment."""
    import modforge.sweeps.planning as planning
    import modforge.run.story as story
    from modforge.train import main

    composed, validated = [], []

    def counting(fn, calls):
        def wrapped(*a, **k):
            calls.append(1)
            return fn(*a, **k)
        return wrapped

    import hydra._internal.config_loader_impl as loader_impl

    loads = []
    monkeypatch.setattr(loader_impl.ConfigLoaderImpl, "load_configuration",
                        counting(loader_impl.ConfigLoaderImpl.load_configuration, loads))
    monkeypatch.setattr(planning, "compose_sweep_job", counting(planning.compose_sweep_job, composed))
    monkeypatch.setattr(planning, "validate", counting(planning.validate, validated))
    monkeypatch.setattr(story, "validate", counting(story.validate, validated))
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ)
    main(["-m", *TINY, "trainer.max_steps=2", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert len(composed) == 2 and len(validated) == 2
    assert len(loads) == 3  # the sweep's own config, then each job's: nothing composed twice
    assert dict(os.environ) == env  # nothing named in the environment
    plan = json.loads((tmp_path / "sweep" / "plan.json").read_text())
    assert [j["overrides"][-1] for j in plan["jobs"]] == ["seed=1", "seed=2"]
    assert all((tmp_path / j["dir"] / "metrics.json").is_file() for j in plan["jobs"])  # each ran where planned
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["counts"]["finished"] == 2


def test_the_study_runner_runs_a_sweep_in_process_and_gets_its_outcome(tmp_path, monkeypatch):
    """``modforge.sweeps.launch.sweep``: the entry point a study's stage calls; one job failing is counted in
    the outcome it returns (exit 1), a mistake is one ConfigError before any job."""
    from modforge.errors import ConfigError
    from modforge.sweeps.launch import sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODFORGE_FAULT", "raise@step=1@job=1")
    out = sweep([*TINY, "trainer.max_steps=2", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    assert out["exit"] == 1 and out["counts"] == {"finished": 1, "failed": 1, "diverged": 0, "interrupted": 0, "paused": 0}
    assert "#1 failed: RuntimeError: fault injected at step 1" in out["summary"]
    with pytest.raises(ConfigError, match="Unknown norm 'rmss'"):
        sweep(["norm=rmss", f"hydra.sweep.dir={tmp_path / 'other'}"])
    with pytest.raises(ConfigError, match="trainer.devices=2: this sweep runs its jobs in this process"):
        sweep([*TINY, "trainer.devices=2", "trainer.accelerator=cpu", f"hydra.sweep.dir={tmp_path / 'other'}"])
    assert not (tmp_path / "other").exists()


def test_a_resumed_run_is_validated_once(tmp_path, monkeypatch):
    """The pre-flight validates the config the job trains with (the resumed run's); the run does not again."""
    import modforge.sweeps.planning as preflight
    import modforge.run.story as story
    from modforge.train import main

    calls = []

    def counting(validate):
        def wrapped(cfg, *a, **k):
            calls.append(cfg.trainer.max_steps)
            return validate(cfg, *a, **k)
        return wrapped

    monkeypatch.setattr(preflight, "validate", counting(preflight.validate))
    monkeypatch.setattr(story, "validate", counting(story.validate))
    monkeypatch.chdir(tmp_path)
    tiny = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=16", "data.block_size=16",
            "data.batch_size=4", "data.max_chars=4000", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
            "sample=false", "eval_at_start=false", "callbacks.progress=none"]
    main([*tiny, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}"])
    assert calls == [2]
    import torch

    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert "RunRecord" in saved["callbacks"]  # the carried state's key as before its class was renamed: old runs resume
    calls.clear()
    main([f"resume={tmp_path / 'run'}", "trainer.max_steps=4", "trainer.limit_val_batches=1"])
    assert calls == [4]  # once, the resumed config (before: four times)
    from modforge.utils.files import read_json

    assert read_json(tmp_path / "run" / "metrics.json")["steps"] == 4


@pytest.mark.parametrize("module,argv", [
    ("export", ["ckpt=run", "out=e1", "out=e2"]),
    ("convert", ["hf=gpt2", "out=a.ckpt", "+out=b.ckpt"]),
    ("generate", ["ckpt=run", "prompt=a", "ckpt=other"]),
])
def test_a_key_given_twice_is_refused_by_every_key_value_command(module, argv, tmp_path, capsys, monkeypatch):
    """export, convert and generate read their key=value options with one parser: a key given twice is one line
    naming it (the last one no longer wins without a word), before any file is read."""
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"modforge.{module}").main(argv)
    err = capsys.readouterr().err
    key = argv[-1].lstrip("+").split("=")[0]
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {key}= given twice ({key}=") and "give it once" in err, err


def test_a_sweep_that_hydras_own_app_runs_is_planned_and_resumed_alike(tmp_path, monkeypatch, capsys):
    """``--config-path``: Hydra's app composes and runs the sweep, through modforge's sweeper, which plans it with
    the same functions: every job run once, then, run again, every job skipped (planned from its directory)."""
    from modforge.config.composition import CONF_DIR
    from modforge.train import main

    monkeypatch.chdir(tmp_path)
    argv = ["--config-path", str(CONF_DIR), "-m", *TINY, "trainer.max_steps=2", "seed=1,2",
            f"hydra.sweep.dir={tmp_path / 's'}"]
    main(argv)
    assert "2 jobs: 2 finished, 0 failed" in capsys.readouterr().out
    main(argv)
    out = capsys.readouterr().out
    assert "2 jobs (0 to run)" in out and out.count("skip (finished)") == 2, out


def test_a_run_paused_at_a_step_continues_to_the_uninterrupted_runs_result(tmp_path, monkeypatch, capsys):
    """``pause_at=4`` of 8 steps (validation every 4): the run stops there as interrupted, with its checkpoint, and
    no final record; run again without it, it continues in place and ends bit for bit where a run that never
    paused ends. A sweep's jobs pause and continue alike, named without it. Bad values: one line each."""
    from modforge.errors import ConfigError
    from modforge.sweeps.launch import sweep
    from modforge.train import main
    from modforge.utils.files import read_json

    monkeypatch.chdir(tmp_path)
    base = [*TINY, "trainer.max_steps=8", "trainer.val_check_interval=4"]
    main([*base, "pause_at=4", f"hydra.run.dir={tmp_path / 'p'}"])
    assert "paused at step 4 (pause_at)" in capsys.readouterr().out
    st = read_json(tmp_path / "p" / "status.json")  # with its validation there: what successive halving ranks by
    assert st["status"] == "interrupted" and st["paused_at"] == 4 and math.isfinite(st["val"]["val/loss"])
    assert not (tmp_path / "p" / "metrics.json").exists() and (tmp_path / "p" / "checkpoints" / "last.ckpt").is_file()
    main([*base, f"hydra.run.dir={tmp_path / 'p'}"])
    main([*base, f"hydra.run.dir={tmp_path / 'u'}"])
    paused, straight = read_json(tmp_path / "p" / "metrics.json"), read_json(tmp_path / "u" / "metrics.json")
    assert paused["steps"] == straight["steps"] == 8
    assert paused["val"]["val/loss"] == straight["val"]["val/loss"]  # exactly
    out = sweep([*base, "seed=1,2", "pause_at=4", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert out["counts"]["paused"] == 2 and all("pause_at" not in j["dir"] for j in out["jobs"])
    out = sweep([*base, "seed=1,2", "pause_at=4", f"hydra.sweep.dir={tmp_path / 's'}"])  # paused there: skipped
    assert [(j["action"], j["why"]) for j in out["jobs"]] == [("skip", "paused at step 4 (pause_at=4)")] * 2
    # killed after its checkpoint at the pause, before its record: not skipped, and its record is written then,
    # with the validation its checkpoint kept
    first = next(p for p in (tmp_path / "s").iterdir() if p.name.startswith("0_"))
    (first / "status.json").write_text('{"status": "interrupted"}')
    out = sweep([*base, "seed=1,2", "pause_at=4", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert [j["action"] for j in out["jobs"]] == ["resume", "skip"] and out["counts"]["paused"] == 2
    st = read_json(first / "status.json")
    assert st["paused_at"] == 4 and math.isfinite(st["val"]["val/loss"])
    out = sweep([*base, "seed=1,2", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert out["counts"]["finished"] == 2 and [j["action"] for j in out["jobs"]] == ["resume", "resume"]
    for bad, says in (("pause_at=0", "pause_at=0: pause_at must be >= 1"), ("pause_at=8", "pause_at=8: the run ends"),
                      ("pause_at=3", "pause_at=3: pause at a validation step")):
        with pytest.raises(ConfigError, match=says):
            sweep([*base, bad, f"hydra.sweep.dir={tmp_path / 'bad'}"])


def test_two_of_hydras_modes_at_once_is_one_line_not_hydras_traceback():
    """-m with --cfg job (a sweep's config asked for): Hydra raises a ValueError with its traceback; modforge
    says which two flags, and what to use instead, before Hydra sees the command."""
    p = run_in_process("modforge.train", Path.cwd(), "-m", "optim.lr=0.1,0.2", "--cfg", "job")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == ["error: --multirun and --cfg: one of --run, --multirun, --cfg, --info, "
                                             "--shell-completion at a time (to see a sweep's jobs without running "
                                             "them: -m ... dry_run=true; one job's config: --cfg job without -m)"]


def test_a_sweep_adopts_an_ended_run_whose_config_is_its_job_s_and_trains_the_rest(tmp_path, monkeypatch):
    """``sweep(..., adopter)`` (a study's ``reuse=``): a new job whose config an ended run under the source
    recorded takes a copy of it (its records unchanged, no checkpoint, ``adopted.json`` naming the run), planned
    as a skip; a job no run matches trains; a study block or a progress bar is no difference, a seed is."""
    from modforge.sweeps.adopt import Adopter
    from modforge.sweeps.launch import sweep
    from modforge.utils.files import read_json

    monkeypatch.chdir(tmp_path)
    base = [*TINY, "trainer.max_steps=2"]
    first = sweep([*base, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'a'}"])
    assert first["counts"]["finished"] == 2
    (ran1,) = [p.parent for p in (tmp_path / "a").glob("0_*/metrics.json")]  # job 0: seed 1
    a = Adopter(tmp_path / "a")
    out = sweep([*base, "seed=1,3", "trainer.enable_progress_bar=false", "+study.question=another",
                 f"hydra.sweep.dir={tmp_path / 'b'}"], a)
    assert out["counts"]["finished"] == 2
    (got1,) = [p.parent for p in (tmp_path / "b").glob("0_*/metrics.json")]  # seed 1: the same config
    (got3,) = [p.parent for p in (tmp_path / "b").glob("1_*/metrics.json")]  # seed 3: none ran
    assert (got1 / "metrics.json").read_bytes() == (ran1 / "metrics.json").read_bytes()  # copied, not trained
    rec = read_json(got1 / "adopted.json")
    assert rec["from"] == str(ran1.resolve()) and rec["source"] == str((tmp_path / "a").resolve())
    assert "seed=1" in rec["overrides_it_ran_with"] and "+study.question=another" not in rec["overrides_it_ran_with"]
    import yaml
    assert "+study.question=another" in yaml.safe_load((got1 / ".hydra" / "overrides.yaml").read_text())  # the job's
    assert yaml.safe_load((got1 / ".hydra" / "config.yaml").read_text())["study"] == {"question": "another"}
    assert not (got1 / "checkpoints").exists() and (got3 / "checkpoints").is_dir() and not (got3 / "adopted.json").exists()
    assert a.adopted == {str(got1): str(ran1)}
    plan = {j["num"]: j for j in read_json(tmp_path / "b" / "plan.json")["jobs"]}
    assert plan[0]["action"] == "skip" and plan[0]["why"].startswith("adopted from ") and plan[1]["action"] == "run"
    # the copy is a run of this sweep: run again, nothing trains and nothing is copied twice
    again = Adopter(tmp_path / "a")
    sweep([*base, "seed=1,3", "trainer.enable_progress_bar=false", "+study.question=another",
           f"hydra.sweep.dir={tmp_path / 'b'}"], again)
    assert again.adopted == {} and (got1 / "metrics.json").read_bytes() == (ran1 / "metrics.json").read_bytes()


def test_a_run_that_predates_a_key_is_adopted_only_where_the_job_leaves_it_at_its_default(tmp_path, monkeypatch):
    """Compared both ways: a key the ended run never recorded (added to modforge after it ran) stands for today's
    default, and only that; a job that is to pause (pause_at) adopts nothing."""
    import shutil

    import yaml
    from omegaconf import OmegaConf

    from modforge.run.dirs import keys_it_predates
    from modforge.sweeps.adopt import Adopter
    from modforge.sweeps.launch import sweep
    from modforge.sweeps.plan import Job

    monkeypatch.chdir(tmp_path)
    sweep([*TINY, "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path / 'a'}"])
    (run,) = [p.parent for p in (tmp_path / "a").glob("0_*/metrics.json")]
    job_config = yaml.safe_load((run / "config.yaml").read_text())
    old = tmp_path / "old" / "0_x"
    shutil.copytree(run, old)
    recorded = yaml.safe_load((old / "config.yaml").read_text())
    del recorded["task"]["z_loss"]  # as if z_loss had been added after this run
    (old / "config.yaml").write_text(yaml.safe_dump(recorded))
    a = Adopter(tmp_path / "old", default=lambda: job_config)
    assert a.match(job_config) == old  # the job's z_loss is the default: the run trained with it
    assert a.match({**job_config, "task": {**job_config["task"], "z_loss": 1e-4}}) is None
    assert [k for k, *_ in keys_it_predates({"task": {"name": "x"}}, {"task": {"name": "x", "k": 1}},
                                            {"task": {"name": "y", "k": 1}})] == ["task.k"]  # no option x: no default
    rms = {"name": "rms", "eps": 1e-6, "eps_placement": "outside"}  # another option than the default's: its own
    assert [k for k, *_ in keys_it_predates({"norm": {"name": "rms", "eps": 1e-6}}, {"norm": rms},
                                            {"norm": {"name": "layer", "eps": 1e-5}})] == ["norm.eps_placement"]
    assert keys_it_predates({"norm": {"name": "rms", "eps": 1e-6}}, {"norm": {**rms, "eps_placement": "inside"}},
                            {"norm": {"name": "layer", "eps": 1e-5}}) == []
    paused = Job(0, [], tmp_path / "new", "run", cfg=OmegaConf.create({**job_config, "pause_at": 1}))
    assert not a.adopt(paused) and paused.action == "run" and not (tmp_path / "new").exists()


def test_a_sweep_refuses_a_job_whose_directory_holds_a_run_that_predates_a_key_the_job_sets(tmp_path, monkeypatch):
    """A sweep compares each job with the run its directory holds both ways, as a single run does: a key the run
    never recorded must be at today's default, or the job is a conflict (not a skip) and nothing starts."""
    import yaml

    from modforge.errors import ConfigError
    from modforge.sweeps.launch import sweep

    monkeypatch.chdir(tmp_path)
    base = [*TINY, "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path / 's'}",
            "hydra.sweep.subdir=${hydra.job.num}"]  # one directory per job, whatever its overrides
    sweep([*base, "seed=1,2"])
    for cfg in (tmp_path / "s").glob("*/config.yaml"):
        recorded = yaml.safe_load(cfg.read_text())
        del recorded["task"]["z_loss"]  # as if z_loss had been added after these runs
        cfg.write_text(yaml.safe_dump(recorded))
    out = sweep([*base, "seed=1,2"])  # at the default: the runs are the jobs' and are skipped
    assert [j["action"] for j in out["jobs"]] == ["skip", "skip"]
    with pytest.raises(ConfigError, match="2 job directories cannot be used") as e:
        sweep([*base, "seed=1,2", "task.z_loss=1e-4"])
    assert "task.z_loss: 0.0001 now; the run predates the key, so it trained at its default 0.0" in str(e.value)

def test_resume_refuses_a_component_key_the_run_predates_unless_at_its_option_s_default(tmp_path, monkeypatch,
                                                                                           capsys):
    """resume=<run>: a key the checkpoint's config never recorded (added to modforge after the run started) may be
    named only at the default the run trained with, that of its own option (norm=rms here, not the default's)."""
    import torch

    from modforge.train import main

    monkeypatch.chdir(tmp_path)
    base = [*TINY, "norm=rms", "trainer.max_steps=2"]
    main([*base, f"hydra.run.dir={tmp_path / 'a'}"])
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    del state["hyper_parameters"]["run_cfg"]["norm"]["eps_placement"]  # as if it had been added after this run
    torch.save(state, ckpt)
    more = [*TINY, "norm=rms", "trainer.max_steps=4", f"resume={ckpt}"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*more, "norm.eps_placement=outside", f"hydra.run.dir={tmp_path / 'b'}"])
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: norm.eps_placement=outside: the run being resumed predates "
                                              "norm.eps_placement, so it trained at its default 'inside'")
    main([*more, "norm.eps_placement=inside", f"hydra.run.dir={tmp_path / 'c'}"])
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["steps"] == 4


def test_a_study_report_counts_and_names_what_it_adopted(tmp_path, monkeypatch):
    from modforge.studies import stages
    from modforge.studies.writeup import adopted_record

    assert adopted_record({}) == {}
    rec = adopted_record({"s/tune/round-0/0_x": "/old/ln/tune/round-0/0_x", "s/tune/round-0/1_y": "/old/ln/tune/round-0/1_y",
                          "s/tune/carry/3_z": "/old/ln/tune/carry-extend-1/3_z"})
    assert rec == {"runs": 3, "stages": {"tune/carry": 1, "tune/round-0": 2}, "sources": ["/old/ln"]}
    # the probe measures this machine: its stage never adopts
    seen = []
    monkeypatch.setattr(stages, "sweep", lambda overrides, adopter=None: seen.append(adopter) or
                        {"exit": 0, "summary": ""})
    monkeypatch.setattr(stages, "read_stage", lambda d, stage, cells: [{"status": "unfinished", "pause": None}]
                        if not seen else [{"status": "finished", "pause": None}])
    monkeypatch.setattr(stages, "check_cells", lambda *a: None)
    marker = object()
    clock = stages.StageClock(tmp_path, {}, adopter=marker)
    d = type("D", (), {"overrides": [], "experiment": "x"})()
    cell = stages.Cell("a", "", "", 1, {"seed": 1})
    stages.run_stage(d, tmp_path / "probe", [cell], 1, clock)
    seen_probe = seen.pop()
    stages.run_stage(d, tmp_path / "tune" / "round-0", [cell], 1, clock)
    assert seen_probe is None and seen == [marker]
