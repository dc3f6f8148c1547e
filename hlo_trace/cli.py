"""``run_click``: the one way the project's commands turn errors into one line and an exit code;
and the option types they share."""

from __future__ import annotations

import errno
import fcntl
import io
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import click

from hlo_trace import quiet_interrupts
from hlo_trace.errors import UsageError, out_of_memory, out_of_memory_sign, shown
from hlo_trace.isolate import die_with_parent, in_child, memory_limit_reached
from hlo_trace.numbers import brief, parse_int

quiet_interrupts()

#: Upper bound of physical quantities given as options (a bandwidth in GB/s, a latency in us):
#: far above any machine (1e9 GB/s is an exabyte per second), and small enough that the
#: products a report takes of them (bytes, seconds, FLOP/s) stay finite in a float.
MAX_QUANTITY = 1e9
#: Upper bound of count options (``--steps``, ``--blocks``): far above any real use (30 sampling
#: steps, 28 block pairs) yet small enough that products of counts stay exact in a float.
MAX_COUNT = 10**6


class PositiveFinite(click.ParamType):
    """A finite float greater than zero (or at least zero with ``allow_zero``): a physical
    quantity such as a bandwidth or a latency, never NaN or infinite. The one home of the
    project's float options."""

    name = "number"

    def __init__(self, *, allow_zero: bool = False, maximum: float = math.inf) -> None:
        self.allow_zero = allow_zero
        self.maximum = maximum

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)  # a default
        else:
            text = str(value).strip()
            if not _ASCII_NUMBER.fullmatch(text):  # '٣', '1_000', '0x10': not typed as a number
                self.fail(f"{brief(value)} is not a number (e.g. 0.5, 100, 1e-3)", param, ctx)
            number = float(text)
        if not math.isfinite(number):
            self.fail(f"{brief(value)} is not a finite number", param, ctx)
        if number < 0 or (number == 0 and not self.allow_zero):
            bound = "at least 0" if self.allow_zero else "greater than 0"
            self.fail(f"{brief(value)} must be {bound}", param, ctx)
        if number > self.maximum:
            self.fail(f"{brief(value)} must be at most {self.maximum:g}", param, ctx)
        return number


#: A decimal number in ASCII (float() alone also takes Unicode digits and underscores);
#: nan and inf are words float() reads too: refused as not finite.
_ASCII_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)",
                           re.IGNORECASE)


class Count(click.ParamType):
    """An integer from ``minimum`` to ``maximum`` (default ``MAX_COUNT``) in ASCII digits: a
    count, an index or a degree. The one home of the project's integer options: a Unicode
    digit, a 5,000-digit number or a value out of range is one line that says what is
    expected."""

    name = "integer"

    def __init__(self, minimum: int = 1, maximum: int = MAX_COUNT) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)  # a default, checked like a typed value
        else:
            text = str(value).strip()
        try:
            return parse_int(text, minimum=self.minimum, maximum=self.maximum)
        except ValueError as error:
            self.fail(f"{brief(value)}: {error}", param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        return "INTEGER"


class OneLineCommand(click.Command):
    """A click command whose standalone run (console script, ``CliRunner``) goes through
    :func:`run_click`: click's own usage errors are one line too, not usage + hint + error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        code = run_click(self, args if args is not None else sys.argv[1:])
        if args is None:  # the process's own command line: a console script, python -m
            end_process(code)
        sys.exit(code)


def run_click(command: click.Command, argv: Sequence[str] | None = None) -> int:
    """Run a click command so that every usage error is one line on stderr and exit code 2.

    Shared by the project's CLIs: click's own usage errors, the project's UsageError, a file
    system error (full disk, permissions) and an interrupted run all end without a traceback.
    """
    _guard_closed_streams()
    die_with_parent()
    try:
        result = command.main(args=list(argv) if argv is not None else None,
                              standalone_mode=False)
    except click.exceptions.UsageError as exc:
        click.echo(f"Error: {_one_line(exc.format_message())}", err=True)
        return 2
    except UsageError as exc:
        click.echo(f"Error: {_one_line(str(exc))}", err=True)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("Interrupted.", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (analyze-hlo ... | head): nothing to say
        _silence_stdout()
        return 1
    except OSError as exc:  # the system refused: disk full, permission, too many files, ...
        where = f"{shown(exc.filename)}: " if exc.filename else ""
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        click.echo(f"Error: {where}{reason}", err=True)
        return 2
    except Exception as exc:  # a bug, not bad input: say what, keep the traceback for debugging
        sign = memory_limit_reached() or out_of_memory_sign(f"{type(exc).__name__}: {exc}")
        if sign is not None:  # MemoryError, XLA's RESOURCE_EXHAUSTED, ...: the machine's limit
            click.echo(f"Error: {out_of_memory(None, sign)}", err=True)
            return 2
        if os.environ.get("HLO_TRACE_DEBUG"):
            raise
        click.echo(f"Error: internal error ({type(exc).__name__}: {_one_line(str(exc))}); "
                   "set HLO_TRACE_DEBUG=1 for the traceback", err=True)
        return 1
    return result if isinstance(result, int) else 0


def end_process(code: int) -> None:
    """End a command's process with exit code ``code`` (its ``main``). An interrupted one (130)
    ends at once, without the interpreter's cleanup (a native library interrupted while it
    initialised may crash in its destructors); any other ignores Ctrl-C from here on: the
    interpreter's cleanup restores SIGINT's default action, so an interrupt in its last
    milliseconds would end a finished command by the signal."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == 130:
        os._exit(130)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # left as is by the cleanup, unlike a handler
    sys.exit(code)


@contextmanager
def native_imports() -> Iterator[None]:
    """Within: Ctrl-C ends the process at once (``Interrupted.``, exit code 130) instead of
    raising KeyboardInterrupt. For the first import of native libraries (jaxlib's MLIR bindings,
    torch): an exception raised while one initialises leaves it half-made, and the process
    crashes (SIGSEGV) when it unwinds or exits. Outside the main thread, or where SIGINT is
    ignored (a command started in the background keeps ignoring Ctrl-C), nothing."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield
        return
    previous = signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_interrupted(number: int, frame: object) -> None:
    try:
        if not in_child():  # a forked child's parent says it
            sys.stderr.write("Interrupted.\n")
            sys.stderr.flush()
    finally:
        os._exit(130)


def emit(text: str | Iterable[str], output: str | None, *, force: bool = False) -> None:
    """A command's report (text, or text in pieces): to ``output`` atomically (refusing to
    overwrite without ``force``), or to standard output."""
    if output:
        from hlo_trace.atomic import atomic_write

        atomic_write(output, text, force=force)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text if isinstance(text, str) else "".join(text), nl=False)


class _ClosedStdout(io.TextIOBase):
    """Standard output when the command was started with it closed (``cmd >&-``): a report
    written there is a usage error; flushing it is nothing."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise UsageError("standard output is closed: nowhere to write the report; "
                         "pass -o FILE or open standard output")

    def flush(self) -> None:
        pass


def _open_for_writing(fd: int) -> bool:
    """Whether descriptor ``fd`` is open and writable (a closed standard stream may have been
    taken by a file opened read-only before Python started, e.g. by a launcher script)."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return False
    return flags & os.O_ACCMODE != os.O_RDONLY


def _guard_closed_streams() -> None:
    """A command started with standard output or error closed (``cmd >&-``) has a descriptor 1
    (2) that is free, so the next file opened would take it, or already held by a read-only
    file; and a Python stream that is None or fails. Hold the descriptor with /dev/null and
    give Python a stream: for stdout, one that refuses the report with a usage error; for
    stderr, /dev/null."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if _open_for_writing(fd) and getattr(sys, name) is not None:
            continue
        if not _open_for_writing(fd):
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        stream = _ClosedStdout() if fd == 1 else open(fd, "w", closefd=False)  # noqa: SIM115
        setattr(sys, name, stream)


def _one_line(message: str) -> str:
    """The first non-empty line of a message (a usage error is one line, always)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else message.strip()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
