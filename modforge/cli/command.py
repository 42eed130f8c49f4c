"""What every command-line entry point shares: a mistake ends in one line on stderr and exit code 2; a signal
(Ctrl-C, SIGTERM) ends it with 128 + the signal's number."""
import contextlib
import signal
import sys
from typing import Callable, Iterator, NoReturn, Optional, Sequence

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


def key_values(argv: list, allowed: Sequence[str], expected: str) -> dict:
    """A command's ``key=value`` arguments as {key: value}. An argument without ``=`` or with a key not in
    ``allowed`` is one ConfigError (``expected`` says what is; the nearest key suggested), and so is a key given
    twice: which one was meant cannot be told, and the last one winning without a word hides the slip."""
    from modforge.registry import ConfigError, suggest

    given: dict = {}
    for a in argv:
        key, eq, value = a.partition("=")
        key = key.lstrip("+")
        if not eq or key not in allowed:
            raise ConfigError(f"{a!r}: expected {expected}.{suggest(key, list(allowed))}")
        if key in given:
            raise given_twice(key, given[key], a)
        given[key] = value
    return given


def given_twice(key: str, first: str, again: str) -> Exception:
    """The refusal of a command's option given twice (every command says it alike)."""
    from modforge.registry import ConfigError

    return ConfigError(f"{key}= given twice ({key}={first}, then {again}): give it once")


def wants_help(argv: list) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def command(doc: str, body: Callable[[list], None], argv: Optional[list] = None) -> None:
    """Run ``body(argv)`` as a command: ``-h``/``--help`` prints ``doc``; a ModforgeError is one line, exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(doc)
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
