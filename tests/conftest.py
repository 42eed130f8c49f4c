import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

import forkserver
from modforge.plugins import load_all

load_all()  # built-ins and installed plugins: tests that enumerate the registry cover plugins too

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of pytest-xdist's workers: one thread each, so two share 2 cores
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _modforge_cache(tmp_path_factory):
    """Token and tokenizer caches of every test (and its subprocesses) go to a temporary directory."""
    os.environ["MODFORGE_CACHE"] = str(tmp_path_factory.mktemp("modforge-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config):
    config.addinivalue_line("markers", "process: the test starts Python interpreters because the process is its "
                                       "subject (a kill, a signal, a launcher, a fresh registry); every other test "
                                       "runs commands in process (run_module, run_in_process)")


def pytest_collection_modifyitems(config, items):
    """The full product of every option (``exhaustive``: tens of thousands of models once issue 52's options
    multiply it) runs only when a ``-m`` expression names it (``-m exhaustive``); the default run trains the
    covering array of every pair of options instead."""
    if "exhaustive" in (config.option.markexpr or ""):
        return
    kept = [i for i in items if i.get_closest_marker("exhaustive") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("exhaustive") is not None])
        items[:] = kept


def interpreter(args) -> bool:
    """Whether a Popen's ``args`` start a Python interpreter."""
    first = args if isinstance(args, (str, bytes)) else (list(args)[:1] or [""])[0]
    name = os.path.basename(os.fsdecode(first).split()[0] if first else "")
    return first == sys.executable or name.startswith("python")


@pytest.fixture(autouse=True)
def _interpreters_only_where_marked(request, monkeypatch):
    """A test that starts a Python interpreter (directly, through a command it runs, a launcher ...) must say
    so with ``@pytest.mark.process``: each start costs 5-8 s of imports here, so the suite stays in process."""
    started = []
    real = subprocess.Popen._execute_child

    def spy(self, args, *a, **k):
        if interpreter(args) and "forkserver.serve(" not in str(args):  # the warm server: once a session
            started.append(args)
        return real(self, args, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", spy)
    forked = forkserver.STARTS[0]
    yield
    started += [["<forked>"]] * (forkserver.STARTS[0] - forked)
    _COUNTS["interpreters"] += sum(a != ["<forked>"] for a in started)
    _COUNTS["forked"] += sum(a == ["<forked>"] for a in started)
    if started and request.node.get_closest_marker("process") is None:
        pytest.fail(f"{request.node.name} started {len(started)} Python interpreter(s) ({started[0]!r:.120}) "
                    "without @pytest.mark.process: run the command in process (conftest.run_module / "
                    "run_in_process), or mark the test and say why the process is its subject", pytrace=False)


def tiny_overrides(tmp_path=None, steps: int = 1) -> list[str]:
    """Overrides that make any default run tiny."""
    ov = [
        "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.max_len=64",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2",
    ]
    if tmp_path is not None:
        ov.append(f"hydra.run.dir={tmp_path}")
    return ov


_SERVER: list = []


def fork_server() -> forkserver.ForkServer:
    """The session's warm interpreter (started on first use): ``python -m``/``-c`` without the imports."""
    if not _SERVER:
        _SERVER.append(forkserver.ForkServer())
    return _SERVER[0]


_COUNTS = {"interpreters": 0, "forked": 0}  # this worker's starts (MODFORGE_TEST_STARTS=<file> appends them)


def pytest_sessionfinish(session, exitstatus):
    for server in _SERVER:
        server.close()
    if os.environ.get("MODFORGE_TEST_STARTS"):
        with open(os.environ["MODFORGE_TEST_STARTS"], "a", encoding="utf-8") as fh:
            fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {_COUNTS['interpreters']} "
                     f"{_COUNTS['forked']}\n")


def python(*argv: str, cwd: Path, env: Optional[dict] = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python <argv>`` (``-m module ...`` or ``-c code ...``) as a child of the warm fork server: a process of
    its own, without the 5-8 s of imports (tests/forkserver.py)."""
    return fork_server().run(list(argv), cwd, env, timeout)


def python_popen(*argv: str, cwd: Path, env: Optional[dict] = None) -> "forkserver.Forked":
    """As :func:`python`, started and handed back like ``subprocess.Popen`` (to signal it, to run two at once)."""
    return fork_server().popen(list(argv), cwd, env)


PROCESS_FAULTS = ("kill", "preempt")  # faults that kill or signal the process: the process is the subject


def run_module(module: str, cwd: Path, *args: str, fault: str = "", threads: Optional[int] = 1,
               timeout: int = 300, process: Optional[bool] = None) -> subprocess.CompletedProcess:
    """``python -m <module> args`` in ``cwd``, its output captured; ``fault``: a ``MODFORGE_FAULT`` for it (and
    only it); ``threads``: its thread count (None: the machine's). It runs in this process (the module's
    ``main(argv)``: see :func:`run_in_process`) unless the process is the subject: ``process=True``, or a fault
    that kills or signals it (``kill@...``, ``preempt@...``), which run as a child of the warm fork server."""
    if process is None:
        process = fault.split("@", 1)[0] in PROCESS_FAULTS
    if not process:
        return run_in_process(module, cwd, *args, fault=fault, threads=threads)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MODFORGE_FAULT", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if fault:
        env["MODFORGE_FAULT"] = fault
    return python("-m", module, *args, cwd=cwd, env=env, timeout=timeout)


def run_in_process(module: str, cwd: Path, *args: str, fault: str = "", threads: Optional[int] = 1,
                   env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``python -m <module> args`` as its ``main(argv)`` in this process: the working directory, environment
    (``env`` on top, ``MODFORGE_FAULT`` only if ``fault``), thread count, ``sys.argv``, signal handlers and
    logging are set for the call and restored after it; stdout and stderr captured; the exit code is the
    ``SystemExit``'s (an exception: 1, its traceback in stderr). No interpreter start: about 6 s saved a call."""
    import contextlib
    import importlib
    import io
    import logging
    import signal

    from hydra.core.global_hydra import GlobalHydra

    name = "modforge.__main__" if module == "modforge" else module
    main = importlib.import_module(name).main
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), list(sys.argv)
    saved_threads = torch.get_num_threads()
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2) if s is not None]
    saved_sigs = {s: signal.getsignal(s) for s in sigs}
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    saved_logs = {id(lg): (lg, list(lg.handlers), lg.level, lg.disabled, lg.propagate) for lg in loggers}
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.environ.pop("MODFORGE_FAULT", None)
        os.environ.update(env or {})
        if fault:
            os.environ["MODFORGE_FAULT"] = fault
        if threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except (SystemExit, KeyboardInterrupt, Exception) as e:  # noqa: BLE001 - as the interpreter ends
                code = forkserver.exit_code(e)
    finally:
        from modforge.config import resolvers

        resolvers.forget_claimed()  # the command's claimed directories, if left empty, removed as at its exit
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        torch.set_num_threads(saved_threads)
        for s, h in saved_sigs.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        for lg in [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                           if isinstance(lg, logging.Logger)]:
            if id(lg) in saved_logs:
                _, handlers, level, disabled, propagate = saved_logs[id(lg)]
                lg.handlers[:] = handlers
                lg.setLevel(level)
                lg.disabled, lg.propagate = disabled, propagate
            else:  # made by the call (Hydra's, Lightning's): left quiet, as a fresh process would not have it
                lg.handlers.clear()
        GlobalHydra.instance().clear()
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out.getvalue(), err.getvalue())
