"""A warm interpreter for tests whose subject is a process (SIGKILL at a step, SIGTERM, exit codes, two runs at
once, a fresh plugin registry): one server process imports the heavy libraries once (torch, Lightning, Hydra,
OmegaConf, NumPy: 5-8 s a start on 2 cores) and forks a child per call, which then runs exactly what
``python -m <module> args`` or ``python -c <code> args`` would, in its own working directory and environment.

modforge itself is not imported by the server (a child imports it afresh, so its registry and plugins are the
child's own). The server computes nothing, so no OpenMP pool exists when it forks; the child sets its thread
count from ``OMP_NUM_THREADS`` as a fresh interpreter would read it.

Where the launch itself is the subject (DDP's relaunch of ``sys.argv``, the joblib/submitit/Ray/gpus launchers,
the front door without torch) the tests start ``sys.executable`` for real.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

STARTS = [0]  # children forked in this process's life (the interpreter guard of conftest.py counts them)
PRELOAD = ("torch", "lightning", "lightning.pytorch", "hydra", "omegaconf", "numpy", "yaml", "scipy.stats")


def _send(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket) -> Optional[dict]:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack("!I", head)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


# ------------------------------------------------------------------------------------------------ the server

def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        req = _recv(conn)
        if req is None:
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:  # the child: what `python <argv>` would do, then exit with its code
            server.close()
            conn.close()
            _child(req)
        _send(conn, {"pid": pid})
        threading.Thread(target=_reap, args=(conn, pid), daemon=True).start()


def _reap(conn: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
    finally:
        conn.close()


def _child(req: dict) -> None:
    import runpy

    code = 0
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        fd_in = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd_in, 0)
        for fd, where in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if "OMP_NUM_THREADS" in os.environ:
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        argv = req["argv"]
        if argv[0] == "-m":
            sys.path[:] = [os.getcwd(), *extra, *[p for p in sys.path[1:] if p not in extra]]
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.path[:] = ["", *extra, *[p for p in sys.path[1:] if p not in extra]]
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            raise ValueError(f"the fork server runs -m or -c, not {argv[:1]}")
    except BaseException as e:  # noqa: BLE001 - as the interpreter ends
        code = exit_code(e)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def exit_code(e: BaseException) -> int:
    """The exit code the interpreter gives for ``e`` ending the program (an exception: its traceback, 1)."""
    import traceback

    if isinstance(e, SystemExit):
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if isinstance(e, KeyboardInterrupt):
        return 130
    traceback.print_exception(e)
    return 1


# ------------------------------------------------------------------------------------------------ the client

class Forked:
    """A child of the fork server, used like ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``,
    ``kill``, ``communicate``); its output goes to files, read when it has ended."""

    def __init__(self, server: "ForkServer", argv: list, cwd: Path, env: dict):
        self.args = [sys.executable, *argv]
        self._dir = tempfile.mkdtemp(prefix="forked-")
        self._out, self._err = os.path.join(self._dir, "out"), os.path.join(self._dir, "err")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(server.path)
        _send(self._sock, {"argv": argv, "cwd": str(cwd), "env": env, "stdout": self._out, "stderr": self._err})
        self.pid = _recv(self._sock)["pid"]
        STARTS[0] += 1
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._sock.setblocking(False)
            try:
                msg = _recv(self._sock)
            except BlockingIOError:
                msg = None
            finally:
                self._sock.setblocking(True)
            if msg is not None:
                self.returncode = msg["returncode"]
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self._sock.settimeout(timeout)
            try:
                msg = _recv(self._sock)
            except socket.timeout:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            finally:
                self._sock.settimeout(None)
            self.returncode = msg["returncode"] if msg else -9
            self._sock.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple:
        read = lambda p: Path(p).read_text(errors="replace") if os.path.exists(p) else ""  # noqa: E731
        return read(self._out), read(self._err)

    def communicate(self, timeout: Optional[float] = None) -> tuple:
        self.wait(timeout)
        return self.output()


class ForkServer:
    """The server process (started on first use, stopped at the session's end)."""

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="forkserver-")
        self.path = os.path.join(self._dir, "sock")
        self._proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                                       f"import forkserver; forkserver.serve({self.path!r})"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the fork server did not start: {line}{self._proc.stderr.read()[-2000:]}")

    def popen(self, argv: list, cwd: Path, env: Optional[dict] = None) -> Forked:
        return Forked(self, argv, cwd, dict(os.environ if env is None else env))

    def run(self, argv: list, cwd: Path, env: Optional[dict] = None, timeout: Optional[float] = None):
        child = self.popen(argv, cwd, env)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        out, err = child.output()
        return subprocess.CompletedProcess(child.args, child.returncode, out, err)

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()
