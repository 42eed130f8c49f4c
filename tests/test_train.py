"""The training entry point: in-process for the plumbing, in a subprocess (slow) for the real command."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from conftest import python, run_in_process, run_module, tiny_overrides
from modforge.config import compose
from modforge.checkpoints import load_checkpoint
from modforge.run.story import run
from modforge.plugins import load_all

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.process  # an interpreter that has not loaded the registry
def test_run_writes_metrics_config_and_a_rebuildable_checkpoint(tmp_path):
    cfg = compose(tiny_overrides(steps=7) + ["data.max_chars=50000", "norm=rms", "pos=rope", "task.sample_chars=20"])
    m = run(cfg, tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["steps"] == 7 and saved["tokens_seen"] == 7 * 12 * 64
    # passes over the ~45,000 training characters, not loader epochs over every window start (64x fewer)
    assert saved["epochs"] == pytest.approx(7 * 12 * 64 / 45_000, rel=0.02)
    assert saved["tokens_per_sec_steady"] > 0  # over steps 6 and 7, after the first 5
    assert math.isfinite(saved["val"]["val/loss"]) and saved["params"] > 0 and saved["tokens_per_sec"] > 0
    assert isinstance(saved["sample"], str) and len(saved["sample"]) > 0
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written["norm"]["name"] == "rms" and written["pos"]["name"] == "rope"
    # the checkpoint alone rebuilds model and tokenizer
    task = load_checkpoint(m["checkpoint"])
    assert task.run_cfg["norm"]["name"] == "rms"
    x = torch.randint(5, task.tokenizer.vocab_size, (2, 16))
    ckpt = torch.load(m["checkpoint"], weights_only=False)
    assert ckpt["global_step"] == 7
    with torch.no_grad():
        assert torch.isfinite(task.model(x)).all()
    assert task.tokenizer.decode(task.tokenizer.encode("def f():")) == "def f():"
    # ... also in a fresh interpreter that has not loaded the registry
    code = f"from modforge.checkpoints import load_checkpoint; print(load_checkpoint({m['checkpoint']!r}).run_cfg['pos']['name'])"
    p = python("-c", code, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "rope", p.stderr[-2000:]


def test_the_final_metrics_reuse_a_validation_of_the_last_step_and_equal_a_fresh_one(tmp_path, monkeypatch):
    # validated at step 4 inside fit: no second pass, and the same numbers as the pass a run validated at
    # step 3 makes after fit (same seed, same weights at step 4)
    import lightning as L

    calls = []
    validate = L.Trainer.validate
    monkeypatch.setattr(L.Trainer, "validate", lambda self, *a, **k: calls.append(1) or validate(self, *a, **k))
    ov = tiny_overrides(steps=4) + ["data.max_chars=50000", "sample=false", "eval_at_start=false"]
    reused = run(compose(ov), tmp_path / "a")
    assert calls == []
    fresh = run(compose(ov + ["trainer.val_check_interval=3"]), tmp_path / "b")
    assert calls == [1]
    assert reused["val"] == fresh["val"] and reused["steps"] == fresh["steps"] == 4
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert 0 < m["seconds_to_first_step"] < m["session_seconds"]["before_run"] + m["wall_seconds"]
    assert m["tokens_per_sec_steady"] is None  # 4 steps: none after the first 5


def test_weights_changed_after_the_last_validation_are_validated_again(tmp_path, monkeypatch):
    # a callback that changes the weights when training ends (as SWA or pruning do): the last validation
    # saw other weights, so the final metrics come from a fresh pass
    import lightning as L

    class Shrink(L.Callback):
        def on_train_end(self, trainer, pl_module):
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.mul_(0.5)

    monkeypatch.setattr("modforge.run.monitoring.configured_callbacks", lambda node: [Shrink()])
    ov = tiny_overrides(steps=2) + ["data.max_chars=50000", "sample=false", "eval_at_start=false"]
    shrunk = run(compose(ov), tmp_path / "a")
    monkeypatch.undo()
    plain = run(compose(ov), tmp_path / "b")
    assert shrunk["val"]["val/loss"] != plain["val"]["val/loss"]


def test_a_reloaded_checkpoint_reports_the_metrics_of_the_run_that_trained_it(tmp_path):
    """val/bpc needs the data's tokens per character; it travels in the checkpoint with the other data facts.
    With BPE (about 0.4 tokens per character) bits per token would be a different, wrong number."""
    import lightning as L

    from modforge import registry

    cfg = compose(tiny_overrides(steps=2) + ["data.max_chars=40000", "data.tokenizer=bpe", "data.vocab_size=300",
                                              "sample=false"])
    m = run(cfg, tmp_path)
    task = load_checkpoint(m["checkpoint"])
    assert task.facts.tokens_per_char == pytest.approx(m["val"]["val/bpc"] / (m["val"]["val/loss"] / math.log(2)))
    assert task.facts.tokens_per_char < 0.9
    dm = registry.build("data", cfg.data)
    dm.prepare(task.tokenizer)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=cfg.trainer.limit_val_batches)
    again = trainer.validate(task, datamodule=dm, verbose=False)[0]
    assert again["val/loss"] == pytest.approx(m["val"]["val/loss"], rel=1e-6)
    assert again["val/bpc"] == pytest.approx(m["val"]["val/bpc"], rel=1e-6)


def test_a_checkpoint_from_before_the_data_facts_still_loads(tmp_path):
    """Checkpoints written before the data facts carried only the tokenizer state (labels in its meta)."""
    cfg = compose(tiny_overrides(steps=1) + ["data.max_chars=20000", "sample=false", "eval_at_start=false"])
    m = run(cfg, tmp_path)
    ckpt = torch.load(m["checkpoint"], weights_only=False)
    facts = ckpt["hyper_parameters"].pop("data_facts")
    ckpt["hyper_parameters"]["tokenizer_state"] = {**facts["tokenizer"], "meta": {"labels": ["a", "b"]}}
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    task = load_checkpoint(str(old))
    assert task.facts.labels == ["a", "b"] and task.facts.tokens_per_char is None  # unknown: no val/bpc, never a wrong one
    assert task.facts.positions == 64 and task.context_len == 64
    assert task.tokenizer.encode("def") == load_checkpoint(m["checkpoint"]).tokenizer.encode("def")


def count_training_steps(monkeypatch) -> list:
    """Record every training_step call of the causal_lm task (a resumed run must only take the remaining ones)."""
    from modforge import registry

    load_all()
    cls = registry.get("task", "causal_lm").cls
    calls, real = [], cls.training_step
    monkeypatch.setattr(cls, "training_step", lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    return calls


def test_run_resumes_from_last_checkpoint(tmp_path, monkeypatch):
    steps = count_training_steps(monkeypatch)
    first = run(compose(tiny_overrides(steps=3) + ["data.max_chars=50000", "sample=false"]), tmp_path / "a")
    assert len(steps) == 3
    cfg = compose(tiny_overrides(steps=6) + ["data.max_chars=50000", "sample=false", f"resume={first['checkpoint']}"])
    second = run(cfg, tmp_path / "b")
    assert len(steps) == 3 + 3  # only the remaining three steps were trained
    assert second["steps"] == 6
    assert second["tokens_seen"] == 6 * 12 * 64  # the counter is restored, not restarted
    assert second["val_loss_at_start"] == first["val_loss_at_start"]  # the run's step-0 loss, from its checkpoint
    assert second["resumed_at_steps"] == [3]


def test_resume_takes_a_run_directory_and_checkpoints_go_through_the_atomic_writer(tmp_path, monkeypatch):
    from modforge.run.callbacks import AtomicCheckpointIO

    saved = []
    real = AtomicCheckpointIO.save_checkpoint
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint",
                        lambda self, ckpt, path, **kw: (saved.append(Path(path).name), real(self, ckpt, path, **kw)))
    run(compose(tiny_overrides(steps=3) + ["data.max_chars=50000", "sample=false"]), tmp_path / "a")
    assert "last.ckpt" in saved and "best.ckpt" in saved
    steps = count_training_steps(monkeypatch)
    second = run(compose(tiny_overrides(steps=5) + ["data.max_chars=50000", "sample=false", f"resume={tmp_path / 'a'}"]),
                 tmp_path / "b")
    assert len(steps) == 2 and second["steps"] == 5 and second["tokens_seen"] == 5 * 12 * 64


@pytest.mark.parametrize("layout", ["missing", "empty run directory", "checkpoints/ without last.ckpt"])
def test_resume_from_a_missing_checkpoint_fails_before_any_work(tmp_path, layout):
    from modforge.registry import ConfigError

    target = tmp_path / "nope"
    if layout != "missing":
        (target / "checkpoints" if "checkpoints" in layout else target).mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"resume=.*nope: no checkpoint at .*nope.*; give a \.ckpt file or a run directory"):
        run(compose(tiny_overrides(steps=1) + [f"resume={target}"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_save_killed_midway_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    from modforge.run.callbacks import AtomicCheckpointIO

    io, target = AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, target)

    def killed(obj, fh, *a, **k):
        fh.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2}, target)
    monkeypatch.undo()
    assert torch.load(target)["global_step"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no temporary file left behind
    # a process killed outright (SIGKILL, OOM) leaves its temporary file: the next save removes it
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = target.parent / f".last.ckpt.{dead.pid}-0badf00d.tmp"
    stale.write_bytes(b"half a checkpoint")
    io.save_checkpoint({"global_step": 3}, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"] and torch.load(target)["global_step"] == 3


def test_bad_trainer_key_is_a_clear_error(tmp_path):
    from modforge.registry import ConfigError

    with pytest.raises(ConfigError, match="trainer.max_stepz.*Did you mean 'max_steps'"):
        compose(tiny_overrides(steps=1) + ["+trainer.max_stepz=3"])  # caught on the command line


def train_cli(tmp_path, *args, steps=120):
    args = [*args, "model.d_model=32", "model.n_heads=2", "model.n_layers=1", f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=8", "scheduler.warmup_steps=10",
            f"hydra.run.dir={tmp_path}"]
    p = run_in_process("modforge.train", tmp_path.parent, *args, threads=None)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text()), p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["model=decoder_only", "norm=rms", "data.max_chars=300000"],
    ["model=encoder_only", "norm=batch", "residual=post", "ffn=geglu", "pos=sinusoidal", "data.max_chars=300000"],
    ["model=encoder_decoder", "pos=rope", "ffn=swiglu"],
])
def test_cli_trains_and_learns(tmp_path, args):
    m, out = train_cli(tmp_path / "run", *args)
    start, end = m["val_loss_at_start"], m["val"]["val/loss"]
    assert end < 0.85 * start, (start, end)
    assert "== modforge run" in out


def test_sweep_job_directory_names_are_flat_and_bounded():
    from modforge.config.resolvers import run_dirname

    assert run_dirname("data.path=../shared/a.txt,norm=rms") == "data.path=.._shared_a.txt,norm=rms"
    long_a, long_b = "norm=rms," + "x" * 300, "norm=rms," + "x" * 299 + "y"
    assert len(run_dirname(long_a)) <= 120 and run_dirname(long_a) != run_dirname(long_b)
    # cut between key=value pairs, never inside a value (trainer.max_steps=10 must not read as =1...)
    pairs = ",".join(f"model.key{i}=value{i}" for i in range(8)) + ",trainer.max_steps=10"
    name = run_dirname(pairs)
    assert len(name.encode()) <= 120 and name.rsplit("-", 1)[0].split(",") == pairs.split(",")[:len(name.split(","))]
    assert "trainer.max_steps=1" not in name
    assert run_dirname("") == "defaults"
    assert len(run_dirname("data.path=" + "語" * 300).encode()) <= 120  # the limit is in bytes


@pytest.mark.slow
def test_cli_sweep_runs_every_job_into_its_own_flat_directory(tmp_path):
    corpus = tmp_path / "corpus" / "text.txt"
    corpus.parent.mkdir()
    corpus.write_text("".join(f"line {i}: to be, or not to be\n" for i in range(3000)))
    sweep = tmp_path / "sweep"
    p = run_module("modforge.train", tmp_path, "-m", "norm=layer,rms", "data=text", f"data.path={corpus}",
                   "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "trainer.max_steps=4",
                   "trainer.val_check_interval=4", "trainer.limit_val_batches=2", "sample=false",
                   f"hydra.sweep.dir={sweep}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert [d.name.split("_", 1)[0] for d in jobs] == ["0", "1"]
    assert {json.loads((d / "metrics.json").read_text())["config"]["norm"] for d in jobs} == {"layer", "rms"}


@pytest.mark.process  # joblib's worker processes
@pytest.mark.slow
def test_cli_sweep_with_the_joblib_launcher_runs_jobs_in_parallel_processes_and_a_failure_stays_in_its_job(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "modforge.train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           "norm=layer,rms,batch", "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "trainer.max_steps=4",
           "trainer.val_check_interval=4", "trainer.limit_val_batches=2", "data.max_chars=50000", "sample=false",
           f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1", MODFORGE_FAULT="raise@step=2@job=1"))
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]  # one job failed: the others ran
    assert "Joblib.Parallel" in p.stdout + p.stderr  # really the joblib launcher, not the basic one
    assert "3 jobs: 2 finished, 1 failed, 0 diverged, 0 interrupted" in p.stderr
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert {json.loads((d / "metrics.json").read_text())["config"]["norm"] for d in jobs
            if (d / "metrics.json").exists()} == {"layer", "batch"}
    assert json.loads((jobs[1] / "status.json").read_text())["status"] == "failed"


def test_cli_unknown_option_is_one_clear_line(tmp_path):
    p = run_module("modforge.train", tmp_path, "norm=rmss")
    assert p.returncode == 2
    assert "Did you mean 'rms'" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_generate_cli_from_checkpoint_with_each_strategy(tmp_path, capsys):
    from modforge import generate

    m = run(compose(tiny_overrides(steps=2) + ["data.max_chars=50000", "sample=false"]), tmp_path)
    capsys.readouterr()
    for extra in (["strategy=greedy"], ["strategy=beam", "beam_size=3"],
                  ["strategy=sample", "temperature=0.9", "top_k=5", "top_p=0.9", "seed=1", "num_samples=2"]):
        generate.main([f"ckpt={m['checkpoint']}", "prompt=def ", "max_new=12", *extra])
        out = capsys.readouterr().out
        assert out.startswith("def ") or out.startswith("--- sample 1\ndef "), out
    generate.main([f"ckpt={m['checkpoint']}", "prompt=x", "max_new=8", "strategy=sample", "seed=3"])
    a = capsys.readouterr().out
    generate.main([f"ckpt={m['checkpoint']}", "prompt=x", "max_new=8", "strategy=sample", "seed=3"])
    assert capsys.readouterr().out == a  # seeded sampling is reproducible
    generate.main([f"ckpt={tmp_path}", "prompt=x", "max_new=8", "strategy=sample", "seed=3"])
    assert capsys.readouterr().out == a  # a run directory names its checkpoints/last.ckpt


@pytest.mark.parametrize("argv,msg", [(["prompt=hi"], "ckpt=<run dir or .ckpt> is required"), (["ckpt=/nonexistent.ckpt"], "no checkpoint at /nonexistent.ckpt"),
                                      (["ckpt=x", "strategy=nucleus"], None), (["ckpt=x", "beam=3"], "beam_size")])
def test_generate_cli_errors_are_one_line(argv, msg, capsys, tmp_path):
    from modforge import generate

    if argv[0] == "ckpt=x":  # a real file so the error comes from the strategy / key check
        (tmp_path / "x").write_bytes(b"")
        argv = [f"ckpt={tmp_path / 'x'}"] + argv[1:]
    with pytest.raises(SystemExit) as e:
        generate.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    if msg:
        assert msg in err


def test_data_longer_than_model_positions_fails_before_training(tmp_path):
    from modforge.registry import ConfigError

    cfg = compose(tiny_overrides(steps=1) + ["data.block_size=100"])  # tiny model: max_len=64
    with pytest.raises(ConfigError, match=r"model.max_len=64 .*data=stdlib \(100 positions"):
        run(cfg, tmp_path)


@pytest.mark.process  # Lightning starts rank 1 from sys.argv
@pytest.mark.xdist_group("ddp")  # one DDP rendezvous at a time
@pytest.mark.slow
@pytest.mark.parametrize("param", [["param=mup", "param.base.d_model=16"]], ids=["mup"])  # one run holds both:
def test_ddp_on_cpu_with_two_processes(tmp_path, param):  # DDP itself, and µP's groups under it
    """trainer=ddp with the gloo backend: two processes, one run directory, global token count; and its
    validation is one process's: the same items once each (3 batches of 12 split 18/18, each rank's last
    batch partial), means reduced by sums, so its checkpoint re-evaluated on one process gives its val loss."""
    import lightning as L

    from modforge import registry

    run_dir = tmp_path / "run"
    # through the verb table (python -m modforge train): Lightning starts rank 1 as `python -m <__main__'s module>`,
    # which must be modforge.train, not modforge.__main__ with the verb gone
    cmd = [sys.executable, "-m", "modforge", "train", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
           "trainer.precision=32-true", "trainer.max_steps=4", "trainer.val_check_interval=4",
           "trainer.limit_val_batches=3", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
           "data.max_chars=50000", "sample=false", f"hydra.run.dir={run_dir}",
           *param]  # (and under param=mup: µP's per-group rates and multipliers under DDP, and reloaded)
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["steps"] == 4 and m["tokens_seen"] == 2 * 4 * 12 * 64
    assert m["devices"]["world_size"] == 2 and m["devices"]["accelerator"] == "cpu"

    load_all()
    task = load_checkpoint(str(run_dir / "checkpoints" / "last.ckpt"))
    dm = registry.build("data", task.run_cfg["data"])
    dm.prepare(task.tokenizer)
    one = L.Trainer(accelerator="cpu", devices=1, limit_val_batches=3, logger=False, enable_progress_bar=False,
                    enable_model_summary=False).validate(task, datamodule=dm, verbose=False)[0]
    for key in ("val/loss", "val/bpc"):
        assert abs(m["val"][key] - one[key]) < 1e-6, (key, m["val"][key], one[key])


def test_a_sweep_jobs_command_line_for_its_ddp_ranks():
    from omegaconf import OmegaConf

    from modforge.config.overrides import job_argv

    hc = OmegaConf.create({"overrides": {
        "hydra": ["hydra.sweep.dir=/tmp/s", "hydra.mode=MULTIRUN", "hydra.job.chdir=false", "hydra.verbose=true"],
        "task": ["norm=rms", "trainer=ddp"]}})
    argv = ["train.py", "-m", "--config-dir", "/my/conf", "-cn=mine", "norm=layer,rms", "trainer=ddp",
            "hydra.sweep.dir=/tmp/s", "hydra.job.chdir=false", "hydra.verbose=true"]
    assert job_argv(argv, hc) == ["train.py", "--config-dir", "/my/conf", "-cn=mine", "hydra.job.chdir=false",
                                  "hydra.verbose=true", "norm=rms", "trainer=ddp"]


@pytest.mark.process  # Lightning relaunches each job's ranks from sys.argv
@pytest.mark.xdist_group("ddp")  # one DDP rendezvous at a time
@pytest.mark.slow
def test_ddp_inside_a_sweep_runs_each_job_once_in_its_own_directory(tmp_path):
    """Lightning relaunches DDP ranks from sys.argv (#11300): inside -m they must run their job, not the sweep."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "modforge.train", "-m", "norm=layer,rms", "trainer=ddp", "trainer.accelerator=cpu",
           "trainer.devices=2", "trainer.precision=32-true", "trainer.max_steps=2", "trainer.val_check_interval=2",
           "trainer.limit_val_batches=2", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
           "data.max_chars=50000", "sample=false", "eval_at_start=false", f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert len(jobs) == 2, [d.name for d in jobs]
    for job, norm in zip(jobs, ("layer", "rms")):
        m = json.loads((job / "metrics.json").read_text())
        assert m["config"]["norm"] == norm and m["tokens_seen"] == 2 * 2 * 12 * 64  # both ranks counted
        assert (job / "train_ddp_process_1.log").exists()  # rank 1 ran in this job's directory
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_train_help_lists_the_config_groups_and_no_nested_kind(tmp_path):
    p = run_module("modforge.train", tmp_path, "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    groups = p.stdout.split("== Configuration groups ==")[1].split("== Keys of the run ==")[0]
    assert "norm: batch" in groups and "experiment:" in groups and "logger: csv" in groups
    assert "activation:" not in groups and "tokenizer:" not in groups  # chosen through ffn.activation, data.tokenizer


def test_a_diverged_run_is_recorded_as_such_in_strict_json(tmp_path, monkeypatch):
    from modforge import registry

    load_all()
    cls = registry.get("task", "causal_lm").cls
    monkeypatch.setattr(cls, "validation_step", lambda self, b, i: self.log("val/loss", float("nan")))
    run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false"]), tmp_path)

    def no_nan(token):
        raise ValueError(f"{token} is not JSON")

    m = json.loads((tmp_path / "metrics.json").read_text(), parse_constant=no_nan)
    assert m["status"] == "diverged" and m["val"]["val/loss"] is None
    assert 0 < m["params_non_embedding"] < m["params"]


def test_a_failing_run_leaves_its_status_and_error(tmp_path):
    from modforge.registry import ConfigError
    from modforge.run.dirs import failure_recorded

    with pytest.raises(ConfigError), failure_recorded(tmp_path):
        raise ConfigError("model.max_len=8 is shorter than the data\nsecond line")
    assert json.loads((tmp_path / "status.json").read_text()) == {
        "status": "failed", "error": "ConfigError: model.max_len=8 is shorter than the data"}


@pytest.mark.slow
def test_a_study_with_its_own_grid_runs_in_one_command_and_reports(tmp_path):
    """experiment=norm_quick carries hydra.sweeper.params: -m alone runs its grid (one seed here, tiny)."""
    p = run_module("modforge.train", tmp_path, "-m", "experiment=norm_quick", "hydra.sweeper.params.seed=1",
                   "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "trainer.max_steps=3",
                   "trainer.val_check_interval=3", "trainer.limit_val_batches=2", "data.max_chars=20000",
                   "trainer.enable_progress_bar=false", f"hydra.sweep.dir={tmp_path / 'study'}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = run_module("modforge.report", tmp_path, str(tmp_path / "study"), "format=json")
    rows = json.loads(r.stdout)["rows"]
    assert sorted(row["norm"] for row in rows) == ["batch", "layer", "rms"]
    assert all(row["ended_runs"] == 1 for row in rows)  # finished (or, 3 steps being no training, collapsed)


def test_a_log_file_gets_plain_progress_lines_and_callbacks_come_from_the_config(tmp_path, monkeypatch):
    """callbacks.progress=log (what auto picks when stdout is a file): one line every N steps and after each
    validation, no carriage returns; callbacks=[default,early_stopping] adds Lightning's EarlyStopping."""
    import modforge.run.monitoring

    said = []
    monkeypatch.setattr(modforge.run.monitoring, "say", said.append)  # what would go to the log
    m = run(compose(tiny_overrides(steps=20) + ["trainer.val_check_interval=2", "data.max_chars=20000", "sample=false",
                                                "callbacks=[default,early_stopping]", "callbacks.progress=log",
                                                "callbacks.progress_every=2", "callbacks.early_stopping.patience=1",
                                                "callbacks.early_stopping.min_delta=10"]), tmp_path)
    out = "\n".join(said)
    assert "step 2/20  train/loss " in out and "step 2  validation  val/bpc " in out and "\r" not in out
    assert m["status"] == "finished" and m["steps"] == 4  # no improvement by 10 nats: stopped after 2 validations


def test_auto_progress_is_a_bar_in_a_terminal_and_lines_in_a_file():
    from modforge.run.monitoring import LogProgress, progress_callbacks

    assert progress_callbacks("auto", 50, stdout_is_terminal=True) == []  # Lightning's own tqdm bar
    assert isinstance(progress_callbacks("auto", 50, stdout_is_terminal=False)[0], LogProgress)
    assert isinstance(progress_callbacks("log", 7, stdout_is_terminal=True)[0], LogProgress)


def test_a_logger_that_cannot_be_created_is_named_in_one_line(tmp_path):
    from modforge.run.monitoring import configured_loggers
    from modforge.registry import ConfigError

    node = {"mine": {"_target_": "lightning.pytorch.loggers.CSVLogger", "name": None, "no_such_argument": 1}}
    with pytest.raises(ConfigError, match=r"^logger\.mine could not be created: TypeError"):
        configured_loggers(node, tmp_path, "run", "group")


def test_tensorboard_and_mlflow_loggers_write_the_runs_metrics_offline(tmp_path):
    pytest.importorskip("tensorboardX", reason="the loggers extra (tensorboardX) is part of the test extra")
    pytest.importorskip("mlflow", reason="the loggers extra (mlflow-skinny) is part of the test extra")
    m = run(compose(tiny_overrides(steps=4) + ["trainer.val_check_interval=2", "data.max_chars=20000", "sample=false",
                                               "logger=[csv,tensorboard,mlflow]"]), tmp_path)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and any(b"val/loss" in e.read_bytes() for e in events)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run_info,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    logged = [h.value for h in client.get_metric_history(run_info.info.run_id, "val/loss")]
    assert logged and logged[-1] == pytest.approx(m["val"]["val/loss"], rel=1e-6)  # the final validation
    assert (tmp_path / "logs" / "metrics.csv").exists()  # the run's own record, whatever the loggers


def test_wandb_logs_offline_and_finishes_its_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is in the 'loggers' extra, not in the test extra (a large "
                                                "download for every CI run); this test runs where it is installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false", "logger=wandb",
                                           "logger.wandb.offline=true"]), tmp_path)
    assert list((tmp_path / "wandb").glob("offline-run-*")) and wandb.run is None  # finished, not left open


@pytest.mark.parametrize("extra", [[], ["tokenizer=bpe", "data.vocab_size=300"]], ids=["char", "bpe"])
def test_an_exported_model_gives_the_checkpoints_logits_exactly(tmp_path, extra):
    from modforge.checkpoints import load_checkpoint
    from modforge.export import export, load_exported, main as export_main

    extra = [e.replace("tokenizer=", "data.tokenizer=") for e in extra]
    m = run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false", *extra]), tmp_path / "run")
    export_main([f"ckpt={tmp_path / 'run'}", f"out={tmp_path / 'exported'}"])
    files = sorted(p.name for p in (tmp_path / "exported").iterdir())
    assert files == ["config.json", "model.safetensors"]
    raw = (tmp_path / "exported" / "model.safetensors").read_bytes()
    header = int.from_bytes(raw[:8], "little")
    assert raw[8:9] == b"{" and json.loads(raw[8:8 + header])["__metadata__"]["format"] == "modforge-export-1"
    a, b = load_checkpoint(m["checkpoint"]), load_exported(tmp_path / "exported")
    x = torch.tensor([a.tokenizer.encode("def f(x):\n    return x")])
    assert torch.equal(a.model(x), b.model(x))
    assert b.tokenizer.encode("def g()") == a.tokenizer.encode("def g()")
    assert export(m["checkpoint"], tmp_path / "again") == tmp_path / "again"  # a .ckpt file works too


def test_the_throughput_callback_logs_tokens_and_counted_flops(tmp_path):
    import csv

    m = run(compose(tiny_overrides(steps=6) + ["data.max_chars=20000", "sample=false", "trainer.log_every_n_steps=1",
                                               "callbacks=[default,throughput]", "callbacks.throughput.window_size=2"]),
            tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "logs" / "metrics.csv")))
    tokens = [float(r["train/device/items_per_sec"]) for r in rows if r.get("train/device/items_per_sec")]
    flops = [float(r["train/device/flops_per_sec"]) for r in rows if r.get("train/device/flops_per_sec")]
    assert tokens and flops and all(t > 0 for t in tokens)
    # counted FLOPs per step: at least the 6·N·D estimate's matrix work on the non-embedding parameters
    per_step = flops[-1] / tokens[-1] * (12 * 64)
    assert per_step > 6 * m["params_non_embedding"] * 12 * 64 * 0.9


FRONT_DOOR = """
import contextlib, io, runpy, sys
sys.argv = sys.argv[1:]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        assert not e.code, e.code
print(repr(out.getvalue()))
print("torch" in sys.modules, "lightning" in sys.modules)
"""


@pytest.mark.process  # an interpreter where torch cannot be imported
@pytest.mark.slow
def test_help_list_and_tab_completion_answer_without_torch(tmp_path):
    """After one full load has cached the registry's manifest, --help, modforge.catalog and a completion query
    import neither torch nor Lightning; completion understands the README's `python -m modforge.train`."""
    env = dict(os.environ, MODFORGE_CACHE=str(tmp_path), COMP_LINE="python -m modforge.train norm=r",
               COMP_POINT=str(len("python -m modforge.train norm=r")))
    first = subprocess.run([sys.executable, "-m", "modforge.train", "--help"], env=env, capture_output=True,
                           text=True, timeout=120)  # no manifest yet: the full registry, then the manifest written
    assert first.returncode == 0 and (tmp_path / "manifest.json").exists()
    outs = {}
    for argv in (["modforge.train", "--help"], ["modforge.train", "-sc", "query=bash"], ["modforge.catalog"]):
        p = subprocess.run([sys.executable, "-c", FRONT_DOOR, *argv], env=env, capture_output=True, text=True,
                           timeout=120)
        out, imported = p.stdout.strip().splitlines()[-2:]
        assert imported == "False False", (argv, p.stdout[-2000:], p.stderr[-2000:])
        outs[argv[-1]] = eval(out)  # the repr printed above
    assert outs["query=bash"].split() == ["norm=rms"]
    assert outs["--help"] == first.stdout  # from the manifest, word for word what the full registry gives
    cold = subprocess.run([sys.executable, "-m", "modforge.catalog"], env=dict(env, MODFORGE_CACHE=str(tmp_path / "x")),
                          capture_output=True, text=True, timeout=120)
    assert outs["modforge.catalog"] == cold.stdout and "norm: " in cold.stdout
    install = subprocess.run([sys.executable, "-m", "modforge.train", "-sc", "install=bash"], env=env,
                             capture_output=True, text=True, timeout=120).stdout
    assert "complete -o nospace -o default -F _modforge_train_complete python python3 modforge-train" in install


@pytest.mark.parametrize("module", ["modforge.generate", "modforge.catalog", "modforge.report", "modforge.export"])
def test_every_command_explains_itself(module, capsys):
    import importlib

    importlib.import_module(module).main(["--help"])
    out = capsys.readouterr().out
    command = {"modforge.catalog": "python -m modforge list"}.get(module, f"python -m {module}")
    assert command in out and ("Example" in out or "  python -m" in out), out[:500]


def test_a_run_ending_between_validations_saves_its_last_step_and_resumes_from_it_exactly(tmp_path):
    """max_steps=7 with validations every 5: last.ckpt holds step 7 (Lightning alone left it at step 5, so the
    run's last two steps were lost and generate/eval read older weights than metrics.json reported)."""
    base = ["data.max_chars=50000", "sample=false"]
    last = ["trainer.val_check_interval=5"]  # (after tiny_overrides' own)
    first = run(compose(tiny_overrides(steps=7) + base + last), tmp_path / "a")
    assert torch.load(first["checkpoint"], weights_only=False)["global_step"] == 7
    task = load_checkpoint(first["checkpoint"])
    x = torch.randint(5, task.tokenizer.vocab_size, (1, 16))
    resumed = run(compose(tiny_overrides(steps=10) + base + last + [f"resume={first['checkpoint']}"]), tmp_path / "b")
    whole = run(compose(tiny_overrides(steps=10) + base + last), tmp_path / "c")
    assert resumed["resumed_at_steps"] == [7] and resumed["data_checksum"] == whole["data_checksum"]
    assert resumed["val"]["val/loss"] == pytest.approx(whole["val"]["val/loss"], abs=1e-6)
    assert torch.isfinite(task.model(x)).all()


def test_last_ckpt_follows_every_validation_even_one_that_did_not_improve(tmp_path, monkeypatch):
    """val/loss made worse at every validation (it is the step): Lightning alone rewrote last.ckpt only when the
    best improved, so a run stopped at step 5 kept step 2's weights and would train steps 3-4 again."""
    from modforge.tasks.lm import CausalLM

    def worse_every_time(self, batch, batch_idx):
        loss = torch.tensor(float(self.global_step))
        self.log_mean("val/loss", loss, 1)
        return loss

    monkeypatch.setattr(CausalLM, "validation_step", worse_every_time)
    monkeypatch.setenv("MODFORGE_FAULT", "raise@step=5")
    with pytest.raises(BaseException):
        run(compose(tiny_overrides(steps=8) + ["data.max_chars=50000", "sample=false", "trainer.val_check_interval=2"]),
            tmp_path / "a")
    ckpts = tmp_path / "a" / "checkpoints"
    assert torch.load(ckpts / "best.ckpt", weights_only=False)["global_step"] == 2
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == 4
