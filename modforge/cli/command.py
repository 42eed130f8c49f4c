"""What every command-line entry point shares: a mistake ends in one line on stderr and exit code 2; a signal
(Ctrl-C, SIGTERM) ends it with 128 + the signal's number."""
import contextlib
import signal
import sys
from typing import Callable, Iterator, NoReturn, Optional

from modforge.registry import ModforgeError

EXIT_USAGE = 2


def fail(error: BaseException) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with code 2: no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Inside this block a :class:`~modforge.registry.ModforgeError` ends the program through :func:`fail`."""
    try:
        yield
    except ModforgeError as e:
        fail(e)
    except OSError as e:  # a fault on disk (no space, no permission): the path and the reason, in one line
        if e.filename is None:
            raise
        fail(f"{e.filename}: {e.strerror or e}")


def wants_help(argv: list) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def command(doc: str, body: Callable[[list], None], argv: Optional[list] = None, options=None) -> None:
    """Run ``body(argv)`` as a command: ``-h``/``--help`` prints ``doc`` and the block of ``options`` (a
    :class:`~modforge.cli.options.Options`) generated from their declarations; a ModforgeError is one line, exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(doc.rstrip() + ("\n\n" + options.help() if options is not None else ""))
        return
    try:
        with one_line_errors():
            body(argv)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


@contextlib.contextmanager
def signals_noted(received: list):
    """Note SIGINT and SIGTERM (the exit code is 128 + the signal). A signal while Lightning trains is Lightning's
    to handle (it stops at the end of the step; the run records 'interrupted'); at any other time it stops the
    command as Ctrl-C would."""
    def noted(signum, frame):
        received.append(signum)
        if signum == signal.SIGINT or signal.getsignal(signum) is noted:  # not inside Lightning's own handler
            raise KeyboardInterrupt

    try:
        previous = {s: signal.signal(s, noted) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread (a notebook's worker): nothing to install
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def signal_name(received: list) -> str:
    return signal.Signals(received[0]).name if received else "an interruption"
