"""Sweeps that survive faults and resume exactly: fault isolation, pre-flight, divergence, exact resume after
SIGKILL (at a step and while a checkpoint is written), sweep resume, and run directories never shared.

Faults are injected with ``MODFORGE_FAULT`` (modforge.run.callbacks.injected_fault): ``kill@step=N`` sends the run
SIGKILL after step N, ``kill@save=N`` during its N-th checkpoint write, ``raise@step=N@job=J`` raises in job #J.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import python_popen, run_module, tiny_overrides
from modforge.config import compose
from modforge.run.story import run

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "trainer.limit_val_batches=2",
        "data.max_chars=20000", "data.block_size=32", "trainer.enable_progress_bar=false", "sample=false"]


def train(cwd: Path, *args: str, fault: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    return run_module("modforge.train", cwd, *args, fault=fault, timeout=timeout)


def strict_json(path: Path) -> dict:
    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def job_dirs(sweep: Path) -> list:
    return sorted((d for d in sweep.iterdir() if d.is_dir()), key=lambda d: int(d.name.split("_")[0]))


def final_params(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


# --------------------------------------------------------------------------- resumable data order

def test_the_training_loader_resumes_at_the_batch_where_it_stopped():
    from modforge.data.loading import train_loader

    data = list(range(100))
    torch.manual_seed(3)
    whole = [b.tolist() for b in train_loader(data, batch_size=8, drop_last=True)]
    torch.manual_seed(3)
    first = train_loader(data, batch_size=8, drop_last=True)
    it = iter(first)
    head = [next(it).tolist() for _ in range(5)]
    state = first.state_dict()
    assert state["batches"] == 5 and isinstance(state["epoch_seed"], int)
    torch.manual_seed(999)  # the resumed process draws differently: the saved seed wins
    again = train_loader(data, batch_size=8, drop_last=True)
    again.load_state_dict(state)
    tail = [b.tolist() for b in again]
    assert head + tail == whole and len(again) == len(whole)  # len: the epoch's, as Lightning counts
    assert [b.tolist() for b in again] != whole[5:]  # the next epoch is whole again (and a new order)
    # a whole epoch trained: nothing to skip, and the next epoch draws its own seed (after the RNG restore)
    done = train_loader(data, batch_size=8, drop_last=True, consumed=lambda: 0)
    list(done)
    assert done.state_dict() == {"batches": 0, "epoch_seed": None}


# --------------------------------------------------------------------------- divergence

def test_a_diverging_run_stops_within_its_patience_and_records_the_last_finite_values(tmp_path):
    cfg = compose(tiny_overrides(steps=200) + ["trainer.val_check_interval=5", "optim.lr=1e4",
                                               "divergence_patience=2", "data.max_chars=20000"])
    m = run(cfg, tmp_path)
    rec = strict_json(tmp_path / "metrics.json")
    assert rec["status"] == "diverged" and m["steps"] < 200
    last = rec["last_finite_train"]
    assert last is not None and rec["diverged_at_step"] <= last["step"] + 2 + 1  # within the patience
    assert rec["val"] and all(isinstance(v, float) for v in rec["val"].values())  # the last finite validation
    assert "sample" not in rec
    ckpt = tmp_path / "checkpoints" / "last.ckpt"  # if any: a finite state from before the divergence
    assert not ckpt.exists() or all(torch.isfinite(t).all() for t in final_params(tmp_path).values())


def test_a_directory_holding_another_configuration_is_refused_and_left_alone(tmp_path):
    from modforge.errors import RunDirTaken

    run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false"]), tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RunDirTaken, match="holds a run of another configuration.*norm: 'layer' there, 'rms' now"):
        run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false", "norm=rms"]), tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before
    again = run(compose(tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false"]), tmp_path)
    assert again["status"] == "finished"  # the same run, finished: nothing is retrained
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_run_that_predates_a_key_is_this_configuration_only_where_the_key_is_at_its_default(tmp_path):
    """Compared both ways: a key the saved run never recorded (added to modforge after it ran) stands for today's
    default, so the run is taken as this configuration only where the command leaves the key there; set off it,
    the directory is refused and left alone, not skipped as if the run had trained with it."""
    import yaml

    from modforge.errors import RunDirTaken

    base = tiny_overrides(steps=2) + ["data.max_chars=20000", "sample=false"]
    run(compose(base), tmp_path)
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del recorded["task"]["z_loss"]  # as if z_loss had been added after this run
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded))
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RunDirTaken, match=r"another configuration \(task.z_loss: 0.0001 now; the run predates the key, so it trained "
                                         r"at its default 0.0\)"):
        run(compose([*base, "task.z_loss=1e-4"]), tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before
    assert run(compose(base), tmp_path)["status"] == "finished"  # at the default: the same run, nothing retrained
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


# --------------------------------------------------------------------------- exact resume

@pytest.mark.process  # SIGKILL at a step and mid-save
@pytest.mark.slow
def test_a_run_killed_at_a_step_or_while_writing_a_checkpoint_resumes_bit_for_bit(tmp_path):
    # epochs of 15 batches, checkpoints every 10 steps: at step 10 and 20 inside an epoch, at 30 at its end
    args = [*TINY, "model.dropout=0.1", "trainer.max_steps=40", "trainer.val_check_interval=10",
            "trainer.limit_train_batches=15"]
    p = train(tmp_path, *args, "hydra.run.dir=whole")
    assert p.returncode == 0, p.stderr[-3000:]
    # killed at step 35 (its last checkpoint: step 30, the end of an epoch), resumed with resume=<its directory>
    p = train(tmp_path, *args, "hydra.run.dir=killed", fault="kill@step=35")
    assert p.returncode == -9 and not (tmp_path / "killed" / "metrics.json").exists()
    p = train(tmp_path, "resume=killed")
    assert p.returncode == 0, p.stderr[-3000:]
    # killed while writing its 3rd checkpoint file (step 20's best.ckpt): re-running the command continues it
    # from step 10, inside the first epoch
    p = train(tmp_path, *args, "hydra.run.dir=torn", fault="kill@save=3")
    assert p.returncode == -9 and list((tmp_path / "torn" / "checkpoints").glob(".*.tmp"))
    p = train(tmp_path, *args, "hydra.run.dir=torn")
    assert p.returncode == 0, p.stderr[-3000:]

    whole = strict_json(tmp_path / "whole" / "metrics.json")
    for name, resumed_at in (("killed", [30]), ("torn", [10])):
        m = strict_json(tmp_path / name / "metrics.json")
        assert m["resumed_at_steps"] == resumed_at and m["steps"] == whole["steps"] == 40
        assert m["val"]["val/loss"] == pytest.approx(whole["val"]["val/loss"], abs=1e-6)
        assert m["tokens_seen"] == whole["tokens_seen"] and m["val_loss_at_start"] == whole["val_loss_at_start"]
        assert m["data_checksum"] == whole["data_checksum"]  # the same batches, in the same order
        a, b = final_params(tmp_path / "whole"), final_params(tmp_path / name)
        assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
        # the log reads as the uninterrupted run's: the rows a killed session wrote after its checkpoint are gone
        assert (tmp_path / name / "logs" / "metrics.csv").read_text() == \
            (tmp_path / "whole" / "logs" / "metrics.csv").read_text()
        # tokens/s over the whole run: its tokens over its training time, not the last session's
        assert m["tokens_per_sec"] == pytest.approx(m["tokens_seen"] / m["train_seconds"], rel=0.05)
    assert (tmp_path / "killed" / ".hydra" / "resume-1" / "overrides.yaml").exists()  # the first command kept


# --------------------------------------------------------------------------- sweeps

@pytest.mark.slow
def test_a_failing_job_fails_alone_and_a_rerun_retries_only_it(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "norm=layer,rms,batch", *TINY, "trainer.max_steps=6", "trainer.val_check_interval=3",
            f"hydra.sweep.dir={sweep}"]
    p = train(tmp_path, *args, fault="raise@step=4@job=1")
    assert p.returncode == 1, p.stderr[-3000:]
    assert "3 jobs: 2 finished, 1 failed, 0 diverged, 0 interrupted" in p.stderr
    assert "job #1 failed: RuntimeError: fault injected at step 4" in p.stderr
    jobs = job_dirs(sweep)
    assert [strict_json(d / "metrics.json")["status"] for d in (jobs[0], jobs[2])] == ["finished", "finished"]
    failed = strict_json(jobs[1] / "status.json")
    assert failed["status"] == "failed" and failed["error"].startswith("RuntimeError: fault injected at step 4")
    assert "Traceback" in failed["traceback"]
    kept = {p: p.stat().st_mtime_ns for d in (jobs[0], jobs[2]) for p in d.rglob("*") if p.is_file()}

    p = train(tmp_path, "-m", f"resume={sweep}")  # without retry_failed the failed job is skipped
    assert p.returncode == 1 and "skip (failed; retry_failed=true runs it again)" in p.stdout
    p = train(tmp_path, "-m", f"resume={sweep}", "retry_failed=true")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 jobs: 3 finished, 0 failed" in p.stdout
    assert strict_json(jobs[1] / "metrics.json")["resumed_at_steps"] == [3]  # from its checkpoint, in place
    assert {p: p.stat().st_mtime_ns for d in (jobs[0], jobs[2]) for p in d.rglob("*") if p.is_file()} == kept


@pytest.mark.slow
def test_invalid_jobs_stop_the_sweep_unless_skipped_and_a_dry_run_trains_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "model.n_heads=2,3,4", *(a for a in TINY if "n_heads" not in a), "trainer.max_steps=2",
            "trainer.val_check_interval=2"]
    p = train(tmp_path, *args, f"hydra.sweep.dir={sweep}")
    assert p.returncode == 2 and "1 of 3 jobs are invalid, so the sweep does not start: #1 (model.n_heads=3)" in p.stderr
    assert not sweep.exists()
    p = train(tmp_path, *args, "skip_invalid=true", "dry_run=true")  # the default, time-stamped sweep directory
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 jobs (dry run, nothing is trained)" in p.stdout and p.stdout.count(" run\n") == 2
    assert "invalid: skipped" in p.stdout and not (tmp_path / "multirun").exists()  # claimed, empty, removed
    p = train(tmp_path, *args, "skip_invalid=true", f"hydra.sweep.dir={sweep}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 jobs: 2 finished, 0 failed, 0 diverged, 0 interrupted, 1 invalid (skipped)" in p.stdout
    assert [d.name.split("_")[0] for d in job_dirs(sweep)] == ["0", "2"]  # each job keeps its number


@pytest.mark.process  # SIGKILL during a job
@pytest.mark.slow
def test_a_sweep_killed_during_a_job_resumes_where_it_stopped(tmp_path, capsys):
    from modforge import report

    sweep = tmp_path / "sweep"
    args = ["-m", "norm=layer,rms,batch", *TINY, "trainer.max_steps=8", "trainer.val_check_interval=4",
            f"hydra.sweep.dir={sweep}"]
    p = train(tmp_path, *args, fault="kill@step=6@job=1")
    assert p.returncode == -9
    jobs = job_dirs(sweep)
    assert len(jobs) == 2 and (jobs[0] / "metrics.json").exists() and not (jobs[1] / "metrics.json").exists()
    kept = {p: p.stat().st_mtime_ns for p in jobs[0].rglob("*") if p.is_file()}
    p = train(tmp_path, "-m", f"resume={sweep}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resume (from step 4)" in p.stdout and "skip (finished)" in p.stdout
    assert "3 jobs: 3 finished, 0 failed, 0 diverged, 0 interrupted" in p.stdout
    jobs = job_dirs(sweep)
    assert len(jobs) == 3 and {p: p.stat().st_mtime_ns for p in jobs[0].rglob("*") if p.is_file()} == kept
    resumed = strict_json(jobs[1] / "metrics.json")
    assert resumed["resumed_at_steps"] == [4] and resumed["steps"] == 8
    capsys.readouterr()
    report.main([str(sweep), "format=json"])
    rows = json.loads(capsys.readouterr().out)
    ended = rows["jobs"].get("finished", 0) + rows["jobs"].get("collapsed", 0)  # a few steps: maybe no better than
    assert ended == 3 and sorted(r["norm"] for r in rows["rows"]) == ["batch", "layer", "rms"]  # the unigram model


@pytest.mark.process  # two processes at once
@pytest.mark.slow
def test_two_runs_started_at_the_same_moment_get_their_own_directories(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MODFORGE_FAULT", None)
    cmd = ["-m", "modforge.train", *TINY, "trainer.max_steps=2", "trainer.val_check_interval=2",
           "hydra.run.dir=${modforge_new_dir:runs/same-name}"]  # one name for both: the second must not take it
    procs = [python_popen(*cmd, cwd=tmp_path, env=env) for _ in range(2)]  # two processes, forked warm
    for pr in procs:
        out, err = pr.communicate(timeout=300)
        assert pr.returncode == 0, err[-3000:]
    dirs = sorted(d.name for d in (tmp_path / "runs").iterdir())
    assert dirs == ["same-name", "same-name-2"]
    assert all(strict_json(tmp_path / "runs" / d / "metrics.json")["steps"] == 2 for d in dirs)


def test_a_new_directory_is_claimed_once_per_process_and_never_shared(tmp_path, monkeypatch):
    from modforge.config import resolvers as runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "_CLAIMED", {})
    first = runs.new_dir("out/%Y")
    assert runs.new_dir("out/%Y") == first and Path(first).is_dir()  # the same for the life of the process
    monkeypatch.setattr(runs, "_CLAIMED", {})  # another process, same second
    assert runs.new_dir("out/%Y") == first + "-2"


def test_one_process_trains_a_run_at_a_time(tmp_path):
    from modforge.run.dirs import RunDirTaken, is_locked, run_lock

    with run_lock(tmp_path):
        assert is_locked(tmp_path)
        with pytest.raises(RunDirTaken, match="another process is training this run right now"):
            with run_lock(tmp_path):
                pass
        with pytest.raises(RunDirTaken, match="another process is training"):  # and run() says so, writing nothing
            run(compose(tiny_overrides(steps=1) + ["data.max_chars=20000"]), tmp_path)
        assert not (tmp_path / "status.json").exists() and not (tmp_path / "config.yaml").exists()
    assert not is_locked(tmp_path)


def test_the_keys_left_out_of_job_directory_names_are_the_command_switches():
    from modforge.config.composition import compose_job
    from modforge.run.dirs import CONTROL_KEYS

    cfg = compose_job([], hydra=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == list(CONTROL_KEYS)


# --------------------------------------------------------------------------- cells: a union of configurations

def test_cells_are_a_union_each_crossed_with_the_grid_in_hydras_order():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from modforge.registry import ConfigError
    from modforge.config.grid import expand_jobs

    parse = OverridesParser.create().parse_overrides
    grid = ["seed=1,2", "norm=layer,rms"]

    def hydra(args):  # Hydra's basic sweeper on its own
        return [list(j) for batch in BasicSweeper.split_arguments(parse(args), None) for j in batch]

    assert expand_jobs(None, {}, grid, parse) == hydra(grid)
    cells = [{"ffn": "relu"}, {"ffn": "mlp", "ffn.activation": "silu"}, {"model.dropout": 0.1, "compile": False}]
    jobs = expand_jobs(cells, {"seed": "1,2"}, ["norm=layer,rms"], parse)
    assert jobs == (hydra(["ffn=relu", *grid]) + hydra(["ffn=mlp", "ffn.activation=silu", *grid])
                    + hydra(["model.dropout=0.1", "compile=false", *grid]))
    assert len(jobs) == 12 and jobs[4] == ["ffn=mlp", "ffn.activation=silu", "seed=1", "norm=layer"]
    with pytest.raises(ConfigError, match="ffn=gelu: that key is set by a cell of hydra.sweeper.cells"):
        expand_jobs(cells, {}, ["ffn=gelu"], parse)
    with pytest.raises(ConfigError, match="must be a non-empty list of mappings"):
        expand_jobs(["ffn=relu"], {}, [], parse)


def test_a_study_with_cells_plans_each_cell_with_its_own_task(tmp_path):
    """Three architectures as cells, each with its task and width, five seeds: the pre-flight composes and checks
    all 15 jobs (the model/task fit included) and the sweeper numbers them in that order."""
    cells = ("hydra.sweeper.cells=[{model:encoder_decoder},"
             "{model:decoder_only,task:seq2seq_lm,model.n_layers:4,model.d_ff:325},"
             "{model:encoder_only,task:transduce,model.n_layers:4,model.d_ff:325}]")
    p = train(tmp_path, "-m", "experiment=architectures", cells, "seed=1,2,3,4,5", "dry_run=true", "hydra.sweep.dir=sw")
    assert p.returncode == 0, p.stderr
    lines = [line.split(None, 1)[1] for line in p.stdout.splitlines() if line.lstrip().startswith("#")]
    assert len(lines) == 15 and not (tmp_path / "sw").exists()
    assert lines[0].startswith("model=encoder_decoder seed=1")
    assert lines[5].startswith("model=decoder_only task=seq2seq_lm model.n_layers=4 model.d_ff=325 seed=1")
    assert lines[14].startswith("model=encoder_only task=transduce model.n_layers=4 model.d_ff=325 seed=5")


@pytest.mark.process  # SIGTERM and the exit code
@pytest.mark.slow
def test_sigterm_to_a_sweep_exits_143_with_the_summary_and_the_resume_hint(tmp_path):
    import signal
    import time

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("MODFORGE_FAULT", None)
    sweep = tmp_path / "sweep"
    p = python_popen("-m", "modforge.train", "-m", *TINY, "trainer.max_steps=100000", "trainer.val_check_interval=50",
                     "seed=1,2", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(sweep.glob("0_*/logs/metrics.csv")):
        time.sleep(0.5)
    time.sleep(1)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 143, err[-3000:]
    assert "2 jobs: 0 finished, 0 failed, 0 diverged, 2 interrupted; resume with: python -m modforge.train -m " \
           f"resume={sweep}" in err
    assert "#1 interrupted: not started" in err
    (job0,) = sweep.glob("0_*")
    assert strict_json(job0 / "status.json") == {"status": "interrupted", "error": "stopped by SIGTERM"}
    assert strict_json(sweep / "sweep.json")["exit"] == 1
