"""Sweeps on GPUs and clusters: the slot allocator on simulated devices, the device decisions made on CPU,
and each launcher run for real on CPU (hydra/launcher=gpus with simulated slots, submitit's local executor
with a preempted and requeued job, a local Ray, and DDP ranks started the way srun starts them)."""
import json
import os
import random
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import run_in_process

from modforge.utils.devices import accelerator_of, fused_optimizer, matmul_precision
from modforge.sweeps.clusters import check_launcher_installed, job_gpus, job_tasks
from modforge.sweeps.gpus import job_env
from modforge.config.grid import labels
from modforge.sweeps.ray_jobs import ray_gpus
from modforge.registry import ConfigError
from modforge.sweeps.slots import SlotError, SlotPool, cpu_threads, devices_needed, pool_devices, schedule

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "data.max_chars=50000", "sample=false",
        "eval_at_start=false", "trainer.limit_val_batches=2"]


# --------------------------------------------------------------------------- the slot allocator, simulated


def simulate(needs, durations, devices):
    """Run ``schedule`` on a simulated clock; returns (placements with start/end times, decision snapshots)."""
    clock = {"now": 0.0}
    timeline, snapshots = [], []

    def start(i, got):
        timeline.append({"job": i, "devices": got, "start": clock["now"], "end": clock["now"] + durations[i]})
        return timeline[-1]

    def wait(running):
        # after every round of starts: what was idle, and which jobs were still waiting
        busy = {d for p in running for d in p.devices}
        started = {p.job for p in running} | {t["job"] for t in timeline}
        snapshots.append((len(devices) - len(busy), [needs[j] for j in range(len(needs)) if j not in started]))
        clock["now"] = min(p.handle["end"] for p in running)
        return [p for p in running if p.handle["end"] <= clock["now"]]

    ended = schedule(needs, devices, start, wait)
    return timeline, snapshots, ended


@pytest.mark.parametrize("seed", range(5))
def test_slots_never_shared_every_job_once_no_device_idle_while_a_waiting_job_fits(seed):
    rng = random.Random(seed)
    devices = ["0", "1", "2", "3"]
    needs = [rng.choice([1, 2]) for _ in range(10)]
    durations = [rng.uniform(1, 10) for _ in range(10)]
    timeline, snapshots, ended = simulate(needs, durations, devices)
    assert sorted(t["job"] for t in timeline) == list(range(10)) and len(ended) == 10
    for t in timeline:
        assert len(t["devices"]) == needs[t["job"]] and len(set(t["devices"])) == needs[t["job"]]
    for a in timeline:  # no two jobs on one device at the same time
        for b in timeline:
            if a is not b and set(a["devices"]) & set(b["devices"]):
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    for idle, waiting in snapshots:  # work-conserving: nothing waiting could have used the idle devices
        assert all(need > idle for need in waiting), (idle, waiting)
    assert max(t["end"] for t in timeline) < sum(durations)  # jobs did run side by side


def test_a_two_device_job_waits_while_one_device_jobs_fill_the_gaps():
    timeline, _, _ = simulate([1, 2, 1, 1], [5, 1, 1, 1], ["0", "1"])
    first = {t["job"]: t for t in timeline}
    assert first[0]["devices"] == ["0"] and first[2]["devices"] == ["1"]  # #1 (2 GPUs) cannot start yet: #2 can
    assert first[1]["start"] == 5 and first[1]["devices"] == ["0", "1"]


def test_pool_hands_out_the_lowest_free_devices_and_takes_them_back():
    pool = SlotPool(["4", "5", "6"])
    assert pool.take(2) == ["4", "5"] and pool.take(2) is None and pool.take(1) == ["6"]
    pool.give(["4"])
    assert pool.take(1) == ["4"]
    with pytest.raises(SlotError):
        pool.give(["9"])


def test_a_job_too_big_for_the_pool_is_refused_before_anything_starts():
    started = []
    with pytest.raises(SlotError, match=r"job #1 needs 3 devices \(trainer.devices\) and the launcher has 2"):
        schedule([1, 3], ["0", "1"], lambda i, d: started.append(i), lambda r: r)
    assert started == []


def test_devices_of_the_pool_and_of_a_job():
    assert pool_devices([2, 3]) == ["2", "3"] and pool_devices(3) == ["0", "1", "2"]
    assert pool_devices(None, visible="1, 3") == ["1", "3"]
    assert pool_devices(None, visible="", count=lambda: 2) == ["0", "1"]
    with pytest.raises(SlotError, match=r"no GPU is visible here; give hydra.launcher.devices=N"):
        pool_devices(None, visible="", count=lambda: 0)
    with pytest.raises(SlotError, match="listed twice"):
        SlotPool(["0", "0"])
    assert devices_needed(2, 4) == 2 and devices_needed("auto", 4) == 4 and devices_needed(-1, 3) == 3
    with pytest.raises(SlotError, match=r"trainer.devices=\[0, 1\]: under hydra/launcher=gpus give a number"):
        devices_needed([0, 1], 4)
    assert pool_devices(2, visible="5,6,7") == ["5", "6"]  # the first N of the GPUs this process sees
    assert cpu_threads(2, cores=16) == 8 and cpu_threads(4, cores=2) == 1
    env = job_env({"PATH": "/bin", "MASTER_PORT": "1", "SLURM_PROCID": "0", "LOCAL_RANK": "0"}, ["3", "4"], "cpu", 4)
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "3,4", "PYTHONUNBUFFERED": "1",
                   "OMP_NUM_THREADS": str(cpu_threads(4))}
    # an MPI launcher's rank and world are not inherited; MPI's settings are (on the GPU machines, mpi4py's
    # singleton start, which Lightning's MPI detection does, aborted without OMPI_MCA_plm=isolated & co.)
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_UNIVERSE_SIZE": "2", "PMIX_RANK": "1",
           "PMI_SIZE": "2", "OMPI_MCA_plm": "isolated", "PMIX_MCA_gds": "hash", "OMPI_ALLOW_RUN_AS_ROOT": "1"}
    kept = set(job_env(mpi, ["0"], "cuda", 1)) - {"CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"}
    assert kept == {"OMPI_MCA_plm", "PMIX_MCA_gds", "OMPI_ALLOW_RUN_AS_ROOT"}


def test_a_job_that_dies_before_recording_why_is_failed_with_its_exception(tmp_path, capsys):
    """A job's process that dies before its run records anything: the launcher writes its status.json (the
    directory marked as the job's, so the sweep's summary counts it failed, not a stranger's directory it
    crashed on) and names the exception, not what a library printed after it."""
    from modforge.run.dirs import read_state
    from modforge.sweeps.gpus import _Job
    from modforge.sweeps.launch import outcome
    from modforge.sweeps.plan import Job, Plan

    d = tmp_path / "sweep" / "0_seed=1"
    d.mkdir(parents=True)
    (d / "console.log").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                   "RuntimeError: the real cause\n\n[vm:01304] Local abort before MPI_INIT completed\n")
    job = _Job(0, ["seed=1"], d, 1, "cuda", None)
    job.devices, job.returncode = ["0"], 1
    job.finish()
    assert "failed: RuntimeError: the real cause" in capsys.readouterr().out
    state = read_state(d)
    assert state.status == "failed" and state.error == "RuntimeError: the real cause"
    summary = outcome(Plan(True, [Job(0, ["seed=1"], d, "run")]))
    assert "0 finished, 1 failed" in str(summary)


def test_cluster_resources_from_the_trainer_settings():
    assert ray_gpus("gpu", 1) == 1 and ray_gpus("cpu", 2) == 0 and ray_gpus("auto", 1) == 0
    with pytest.raises(ConfigError, match="a Ray job trains on one device"):
        ray_gpus("gpu", 2)
    assert job_tasks(4) == 4 and job_gpus("gpu", 2) == 2 and job_gpus("cpu", 2) == 0
    for bad in ([0], "auto", -1, 0):  # the job runs elsewhere: 'auto' cannot be resolved where it is submitted
        with pytest.raises(ConfigError, match=r"under hydra/launcher=slurm give a number of devices per job"):
            job_tasks(bad)
    assert labels([["a=1", "b=2"], ["a=1", "b=3"]]) == ["b=2", "b=3"] and labels([["a=1"]]) == ["a=1"]


def test_a_missing_extra_is_named_in_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("hydra_plugins.hydra_") else real(name, *a))
    for option, extra in (("slurm", "slurm"), ("ray", "ray"), ("joblib", "sweep")):
        with pytest.raises(ConfigError, match=re.escape(f"pip install 'modforge[{extra}]'")):
            check_launcher_installed(["-m", f"hydra/launcher={option}", "norm=rms"])
    check_launcher_installed(["hydra/launcher=gpus"])  # modforge's own: nothing to install


# --------------------------------------------------------------------------- device decisions, on CPU


def test_fused_adam_only_when_every_parameter_is_on_cuda():
    cuda = SimpleNamespace(device=SimpleNamespace(type="cuda"), is_floating_point=lambda: True)
    cpu = SimpleNamespace(device=SimpleNamespace(type="cpu"), is_floating_point=lambda: True)
    assert fused_optimizer(None, [cuda, cuda]) and not fused_optimizer(None, [cuda, cpu])
    assert not fused_optimizer(None, []) and fused_optimizer(True, [cpu]) and not fused_optimizer(False, [cuda])
    import torch

    from modforge.registry import build

    opt = build("optim", {"name": "adamw"}, [torch.nn.Parameter(torch.zeros(2, 2))])
    assert not opt.defaults["fused"]  # CPU: the unfused loop, the committed numbers unchanged


def test_tf32_on_cuda_only_unless_asked():
    assert matmul_precision(None, "cuda") == "high" and matmul_precision(None, "cpu") == "highest"
    assert matmul_precision("medium", "cpu") == "medium"
    assert accelerator_of({"accelerator": "gpu"}) == "cuda" and accelerator_of({"accelerator": "cpu"}) == "cpu"


def test_loaders_pin_memory_for_a_cuda_trainer_only():
    from modforge.data.base import on_cuda

    CUDAAccelerator = type("CUDAAccelerator", (), {})
    assert on_cuda(SimpleNamespace(accelerator=CUDAAccelerator())) and not on_cuda(None)
    assert not on_cuda(SimpleNamespace(accelerator=object()))


def test_launched_rank_of_srun_and_torchrun_tasks():
    from modforge.run.ranks import launched_rank

    assert launched_rank({}) == (0, None)
    assert launched_rank({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) == (0, None)  # one task: Lightning's ranks
    assert launched_rank({"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_JOB_ID": "7",
                          "SLURM_RESTART_COUNT": "2"}) == (1, "slurm-7.0-2")
    assert launched_rank({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "1"}) == (1, "torchrun-x-0")


# --------------------------------------------------------------------------- the launchers, for real on CPU


def train(args, cwd, env=None, timeout=300, in_process=False):
    """The command as a real process (the launcher's own processes are the subject), or with ``in_process`` the
    command in this process (its jobs still the launcher's processes)."""
    if in_process:
        p = run_in_process("modforge.train", cwd, *args, threads=None)
    else:
        p = subprocess.run([sys.executable, "-m", "modforge.train", *args], cwd=cwd, capture_output=True,
                           text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def metrics_of(sweep):
    return {d.name.split("_")[0]: json.loads((d / "metrics.json").read_text())
            for d in sorted(sweep.iterdir()) if (d / "metrics.json").exists()}


@pytest.mark.process  # the launcher starts each job as a process
@pytest.mark.slow
def test_gpus_launcher_runs_jobs_side_by_side_one_device_each(tmp_path):
    sweep = tmp_path / "sweep"
    p = train(["-m", "hydra/launcher=gpus", "hydra.launcher.devices=[a,b]", "seed=1,2,3", "trainer.max_steps=10",
               "trainer.val_check_interval=10", *TINY, f"hydra.sweep.dir={sweep}"], tmp_path, in_process=True)
    free, order = {"a", "b"}, []
    for line in p.stdout.splitlines():  # the launcher's own record: no device is ever given twice
        if m := re.match(r"\[modforge\] #(\d) (started|ended).* on device (\w+)", line):
            job, what, dev = m.groups()
            order.append((job, what))
            if what == "started":
                assert dev in free, line
                free.discard(dev)
            else:
                free.add(dev)
    assert order[:2] == [("0", "started"), ("1", "started")] and ("2", "started") in order[2:]
    m = metrics_of(sweep)
    assert sorted(m) == ["0", "1", "2"] and all(r["status"] == "finished" and r["steps"] == 10 for r in m.values())
    assert {m["0"]["devices"]["cuda_visible_devices"], m["1"]["devices"]["cuda_visible_devices"]} == {"a", "b"}
    assert "3 finished" in p.stdout
    p = train(["-m", "resume=" + str(sweep)], tmp_path, in_process=True)  # re-run: every job skipped (planned from its directory)
    assert "started" not in p.stdout and "3 finished" in p.stdout


@pytest.mark.process  # submitit's local processes, a requeue
@pytest.mark.slow
def test_slurm_preset_on_submitit_local_requeues_a_preempted_job_which_resumes(tmp_path):
    """hydra/launcher=slurm_local: a 2-job sweep; job #1 gets SIGUSR2 (a preemption) at step 15: it writes its
    checkpoint at the end of that step, submitit requeues it, and it resumes there to finish its 20 steps."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    env = dict(os.environ, MODFORGE_FAULT="preempt@step=15@job=1")
    p = train(["-m", "hydra/launcher=slurm_local", "callbacks.progress_every=50,51", "trainer.max_steps=20", "trainer.val_check_interval=10",
               *TINY, f"hydra.sweep.dir={sweep}"], tmp_path, env=env)  # the same run twice (two progress settings), #1 preempted
    assert "2 jobs: 2 finished" in p.stdout
    m = metrics_of(sweep)
    assert m["0"]["resumed_at_steps"] == [] and m["0"]["steps"] == 20
    assert m["1"]["val"] == m["0"]["val"]  # the requeued run resumed exactly: the same numbers
    assert m["1"]["resumed_at_steps"] == [15] and m["1"]["steps"] == 20 and m["1"]["status"] == "finished"
    logs = "".join(f.read_text() for f in (sweep / ".submitit").rglob("*_log.err"))
    assert "Caught signal SIGUSR2" in logs and "preempted" in logs


@pytest.mark.process  # Ray's workers
@pytest.mark.slow
def test_ray_launcher_runs_a_two_job_sweep_on_a_local_ray(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "sweep"
    p = train(["-m", "hydra/launcher=ray", "seed=1,2", "trainer.max_steps=5", "trainer.val_check_interval=5",
               *TINY, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=600)
    assert "#0 to Ray (0 GPUs): seed=1" in p.stdout and "2 jobs: 2 finished" in p.stdout
    assert sorted(metrics_of(sweep)) == ["0", "1"]


@pytest.mark.process  # two ranks as srun starts them
@pytest.mark.xdist_group("ddp")  # one DDP rendezvous at a time
@pytest.mark.slow
def test_ddp_ranks_started_as_srun_starts_them_train_one_run(tmp_path):
    """Two processes with SLURM's task variables (what srun gives each task when tasks_per_node =
    trainer.devices): Lightning's SLURM environment joins them; rank 1 follows rank 0's resume decision. As
    submitit jobs, rank 0 alone is signalled a preemption at step 2: both ranks write the checkpoint (its
    barrier would hang if rank 1 were not told) and, with no submitit to requeue, train on to step 4."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "modforge.train", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
            "trainer.precision=32-true", "trainer.max_steps=4", "trainer.val_check_interval=4", *TINY,
            f"hydra.run.dir={run_dir}"]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_PROCID=str(rank),
                   SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_NNODES="1", SLURM_NODELIST="localhost",
                   SLURM_JOB_ID="4242", SLURM_JOB_NAME="train", MASTER_PORT=str(20000 + os.getpid() % 20000),
                   SUBMITIT_EXECUTOR="slurm", MODFORGE_FAULT="preempt@step=2")
        procs.append(subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["devices"]["world_size"] == 2 and m["steps"] == 4 and m["tokens_seen"] == 2 * 4 * 12 * 64
    assert json.loads((run_dir / ".rank0.json").read_text())["launch"] == "slurm-4242.0-0"
    assert (run_dir / ".preempted-at-2").exists() and m["status"] == "finished"


@pytest.mark.parametrize("value", ["/tmp/back\\slash", "it's", "end\\", "q\\'x", "a b,c=d", "/plain/path"])
def test_a_directory_given_to_a_job_reads_back_as_itself(value):
    """hydra_value quotes a path for a job's command line (hydra.run.dir=...): Hydra's parser gives it back."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from modforge.config.overrides import hydra_value

    assert OverridesParser.create().parse_override("hydra.run.dir=" + hydra_value(value)).value() == value


# --------------------------------------------------------------------------- several jobs per device

@pytest.mark.parametrize("seed", range(3))
def test_packed_slots_hold_at_most_k_jobs_a_device_and_spread_them(seed):
    rng = random.Random(seed)
    devices, k = ["0", "1"], 3
    needs = [rng.choice([1, 1, 2]) for _ in range(12)]
    durations = [rng.uniform(1, 10) for _ in range(12)]
    timeline = []
    clock = {"now": 0.0}

    def start(i, got):
        timeline.append({"job": i, "devices": got, "start": clock["now"], "end": clock["now"] + durations[i]})
        return timeline[-1]

    def wait(running):
        on = {d: sum(d in p.devices for p in running) for d in devices}
        assert max(on.values()) <= k and max(on.values()) - min(on.values()) <= k  # never past k a device
        waiting_fits = [i for i in range(12) if i not in {t["job"] for t in timeline}
                        and needs[i] <= sum(on[d] < k for d in devices)]
        assert not waiting_fits  # work-conserving: a job that fits the room left was started
        clock["now"] = min(p.handle["end"] for p in running)
        return [p for p in running if p.handle["end"] <= clock["now"]]

    schedule(needs, devices, start, wait, per_device=k)
    assert sorted(t["job"] for t in timeline) == list(range(12))
    assert all(len(set(t["devices"])) == needs[t["job"]] for t in timeline)  # a job's devices are distinct
    first = timeline[:2]
    if needs[0] == needs[1] == 1:
        assert first[0]["devices"] != first[1]["devices"]  # the least loaded device first: spread, then pack


def test_a_pool_with_room_for_two_jobs_a_device():
    pool = SlotPool(["0", "1"], per_device=2)
    assert pool.take(1) == ["0"] and pool.take(1) == ["1"] and pool.take(2) == ["0", "1"]
    assert pool.take(1) is None and pool.free == []
    pool.give(["0"])
    assert pool.take(2) is None and pool.take(1) == ["0"]
    with pytest.raises(SlotError, match=r"jobs_per_device=0: a whole number"):
        SlotPool(["0"], per_device=0)
    assert cpu_threads(1, cores=16, per_device=4) == 4 and cpu_threads(2, cores=2, per_device=2) == 1
    env = job_env({"PATH": "/bin"}, ["0"], "cpu", 1, 2)
    assert env["OMP_NUM_THREADS"] == str(cpu_threads(1, per_device=2)) and env["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.process  # the launcher starts each job as a process
@pytest.mark.slow
def test_the_fault_hook_reaches_the_gpus_launchers_jobs_by_their_number(tmp_path):
    """MODFORGE_FAULT's @job=N must fire in job N when each job is its own single run (the study default with
    jobs=2): job #1 raises, job #0 finishes. Without the job number in the child, nothing is injected."""
    from modforge.run.callbacks import JOB_NUM_ENV
    from modforge.sweeps.gpus import job_env

    assert job_env({}, ["a"], "cpu", 2, num=3)[JOB_NUM_ENV] == "3"
    sweep = tmp_path / "sweep"
    p = run_in_process("modforge.train", tmp_path, "-m", "hydra/launcher=gpus", "hydra.launcher.devices=[a,b]",
                       "seed=1,2", "trainer.max_steps=2", "trainer.val_check_interval=2", *TINY,
                       f"hydra.sweep.dir={sweep}", threads=None, fault="raise@step=1@job=1")
    assert p.returncode == 1 and "2 jobs: 1 finished, 1 failed" in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr
    assert sorted(metrics_of(sweep)) == ["0"]


@pytest.mark.process  # SIGTERM to the sweep's command, its jobs each a process of the gpus launcher
@pytest.mark.slow
def test_sigterm_to_a_gpus_sweep_stops_its_jobs_prints_its_summary_and_exits_143(tmp_path):
    """A scheduler's SIGTERM to ``train -m hydra/launcher=gpus``: every running job stops at a step and records
    'interrupted'; the command prints the sweep's summary with the resume hint and exits 128 + 15."""
    import signal
    import time

    from conftest import python_popen

    sweep = tmp_path / "sweep"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MODFORGE_FAULT="hold@step=1")
    p = python_popen("-m", "modforge.train", "-m", "hydra/launcher=gpus", "hydra.launcher.devices=2", "seed=1,2",
                     "trainer.max_steps=20", *TINY, f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(sweep.glob("*/.lock"))) < 2 and p.poll() is None:
        time.sleep(0.2)
    time.sleep(3.0)  # both jobs past their start, holding at step 1
    assert p.poll() is None, "the sweep ended before its jobs trained"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 143, err[-3000:]
    assert "2 jobs: 0 finished, 0 failed, 0 diverged, 2 interrupted; resume with: python -m modforge.train -m " \
           f"resume={sweep}" in err, err[-3000:]
    assert all(json.loads((d / "status.json").read_text())["status"] == "interrupted"
               for d in sweep.iterdir() if d.is_dir())
