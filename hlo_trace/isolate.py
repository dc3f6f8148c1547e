"""``call_in_child``: run a function in a forked child so that a crash inside native code (a jaxlib
parser CHECK failure, a stack overflow, a division by zero in a verifier) becomes one ``Error:``
line naming the input instead of killing the command with a signal. ``start_in_child`` starts one
that runs beside the caller (a second core), collected later.

The child inherits the parent's memory (``os.fork``, copy-on-write), runs the function, and sends
its result or its exception back through a pipe (pickled); the parent re-raises a
:class:`~hlo_trace.errors.UsageError` as is. A child that dies of a signal becomes a
``UsageError`` that names the input and the signal. The cost on the happy path is one fork
(~20 ms on a process that has jaxlib loaded) plus pickling the result: callers should return
something small or already rendered (text), not live MLIR objects (they cannot cross processes).

A child never outlives its parent: on Linux it asks the kernel for SIGKILL when its parent ends
(``prctl(PR_SET_PDEATHSIG)``, so a ``kill -9`` of the command takes its children with it, and a
child of a child likewise), and a parent ended by SIGTERM kills its live children first. So a
child never writes the output of a command that was stopped.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from hlo_trace.errors import UsageError

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK = 1 << 20

#: What a child keeps until it ends (``keep_until_exit``); None outside a child.
_kept: list[Any] | None = None
#: Children of this process that have not been collected: killed if SIGTERM ends it.
_live_children: set[int] = set()
#: prctl option: the signal a process gets when its parent ends (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


class ChildFailed(Exception):
    """The child raised an exception that is not a usage error (a bug): its type, message and
    traceback text, re-raised in the parent so that ``run_click`` reports an internal error."""


class InputCrashed(UsageError):
    """Native code crashed on the input (the child died of a signal)."""


def call_in_child(function: Callable[..., T], *args: Any, origin: str,
                  what: str = "reading it") -> T:
    """``function(*args)`` run in a forked child; its return value, or its exception re-raised.

    ``origin`` (usually the input file) and ``what`` word the error when the child dies of a
    signal: ``"<origin>: jaxlib crashed (SIGABRT: Check failed: ...) while reading it"``.
    Whatever the child writes to its standard error (logging, native warnings) is held back and
    replayed here after it ends, unless it failed or crashed: then only the one line is said.
    """
    return start_in_child(function, *args, origin=origin, what=what).result()


def start_in_child(function: Callable[..., T], *args: Any, origin: str,
                   what: str = "reading it") -> ChildTask[T]:
    """``function(*args)`` started in a forked child that runs while this process goes on; its
    ``ChildTask.result()`` waits for it (see ``call_in_child`` for the errors). The child sees
    this process's memory as it is now (copy-on-write): e.g. a parsed module, walked by the
    child and by this process at once, on two cores."""
    return ChildTask(function, args, origin, what)


def keep_until_exit(*objects: Any) -> None:
    """In a child (``start_in_child``), hold ``objects`` until the child ends: it ends with
    ``os._exit``, which gives all its memory back at once, so freeing them one by one first is
    wasted time (a parsed 100k-op module takes ~26 ms to free). Outside a child, nothing."""
    if _kept is not None:
        _kept.extend(objects)


class ChildTask(Generic[T]):
    """A forked child running one function (``start_in_child``). ``result()`` collects it once;
    ``cancel()`` stops it if it still runs (so a caller that fails first leaves nothing behind)."""

    def __init__(self, function: Callable[..., T], args: tuple, origin: str, what: str) -> None:
        self._origin, self._what = origin, what
        self._pid = 0
        if not hasattr(os, "fork"):  # pragma: no cover - Windows: no isolation, run in process
            self._value = function(*args)
            return
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by result()/cancel()
        prctl = _prctl()  # resolved before the fork: no dynamic loading in the child
        _kill_children_on_sigterm()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns, whatever happens
            try:
                _die_with(parent, prctl)
                os.close(read_end)
                global _kept
                _kept = []
                _redirect_stderr(self._stderr.fileno())
                if not os.environ.get("HLO_TRACE_DEBUG"):
                    faulthandler.disable()  # a crash is reported by the parent, in one line
                _child(function, args, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        _live_children.add(pid)
        self._pid, self._read_end = pid, read_end

    def result(self) -> T:
        """Wait for the child: its return value, or its exception (or crash) raised here."""
        if not self._pid:
            return self._value
        try:
            payload = _read_all(self._read_end)
            _, status = os.waitpid(self._pid, 0)
            _live_children.discard(self._pid)
            self._pid = 0
        finally:
            self.cancel()  # interrupted while the child runs: stop it, never leave it behind
        self._stderr.seek(0)
        held_back = self._stderr.read().decode("utf-8", errors="replace")
        self._stderr.close()
        origin, what = self._origin, self._what
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if number == signal.SIGKILL:  # the kernel's out-of-memory killer, or a kill -9
                raise InputCrashed(f"{origin}: the analysis process was killed (SIGKILL, out of "
                                   f"memory?) while {what}")
            raise InputCrashed(_crash_message(origin, what, number, _native_reason(held_back)))
        if not payload:
            raise InputCrashed(f"{origin}: the analysis process ended (exit status "
                               f"{os.waitstatus_to_exitcode(status)}) without a result while "
                               f"{what}")
        kind, value = pickle.loads(payload)
        if kind == "ok":
            if held_back:
                sys.stderr.write(held_back)
            return value
        raise value  # an error is its one line: the parser's own log lines are not replayed

    def cancel(self) -> None:
        """Stop the child if it still runs (a no-op after ``result()``)."""
        if self._pid:
            _stop(self._pid)
            self._pid = 0
            self._stderr.close()
        if getattr(self, "_read_end", -1) >= 0:
            os.close(self._read_end)
            self._read_end = -1


def _redirect_stderr(fd: int) -> None:
    """Send the child's standard error, native (fd 2) and Python's, to ``fd``."""
    try:
        os.dup2(fd, 2)
    except OSError:
        return
    for name in ("stderr", "__stderr__"):
        stream = getattr(sys, name, None)
        try:
            is_fd2 = stream is not None and stream.fileno() == 2
        except (AttributeError, OSError, ValueError):  # a capture object without a file
            is_fd2 = False
        if not is_fd2 and name == "stderr":
            # Python-level writes (pytest's capture, logging handlers) still land in a stream
            # the parent never sees: point them at fd 2 too.
            replacement = open(2, "w", closefd=False, errors="replace")  # noqa: SIM115
            _retarget_logging(stream, replacement)
            sys.stderr = replacement


def _retarget_logging(old: Any, new: Any) -> None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is old:
            handler.setStream(new)


def _native_reason(text: str) -> str:
    """The message of a native crash report: absl's ``F... file:line] message`` line, a C++
    ``what(): message`` line, or nothing."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("F") and "] " in line and line[1:5].isdigit():
            return line.split("] ", 1)[1][:_REASON_CHARS]
        if line.startswith("what():"):
            return line.removeprefix("what():").strip()[:_REASON_CHARS]
    return ""


#: A native message is cut to this length: it is a hint, the one line must stay readable.
_REASON_CHARS = 200


def _child(function: Callable[..., Any], args: tuple, write_end: int) -> None:
    """Run ``function`` and write ``(kind, value)`` to the pipe, then leave without cleanup
    (``os._exit``: the parent's atexit handlers and buffers are not the child's to run)."""
    code = 0
    try:
        try:
            message: tuple[str, Any] = ("ok", function(*args))
        except UsageError as error:
            message = ("raise", error)
        except KeyboardInterrupt:
            code = 130
            message = ("raise", KeyboardInterrupt())
        except BaseException as error:  # a bug: carry its traceback text to the parent
            message = ("raise", ChildFailed(
                f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        try:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # a result or an exception that does not pickle
            data = pickle.dumps(("raise", _plain(message[1]) or ChildFailed(f"unpicklable result: {error}")))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(data)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # even a broken pipe must not run the parent's code in the child
        code = code or 1
    os._exit(code)


def _plain(value: Any) -> UsageError | None:
    """A usage error as its class and one line alone, without what else it holds (an attribute
    or argument that does not pickle, e.g. the MLIR diagnostics of the failure behind it); None
    for anything else."""
    if not isinstance(value, UsageError):
        return None
    try:
        plain = type(value)(str(value))
        pickle.dumps(plain)
        return plain
    except Exception:  # noqa: BLE001 - a subclass whose constructor wants more: the base class
        return UsageError(str(value))


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    _live_children.discard(pid)


_prctl_function: Any = None


def _prctl() -> Any:
    """libc's ``prctl`` (Linux), or None where there is none."""
    global _prctl_function
    if _prctl_function is None and sys.platform.startswith("linux"):
        try:
            _prctl_function = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            _prctl_function = False
    return _prctl_function or None


def _die_with(parent: int, prctl: Any) -> None:
    """In a new child: be killed when ``parent`` ends (PR_SET_PDEATHSIG), or end now if it
    already has (it ended between the fork and the request: the child was re-parented); a
    SIGTERM handler inherited from the parent is the parent's, not the child's."""
    global _live_children
    _live_children = set()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _kill_children_on_sigterm() -> None:
    """Install (once, from the main thread, where SIGTERM is not already handled) a handler that
    kills the live children and then ends this process by SIGTERM as it would have."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(number: int, frame: Any) -> None:
    for pid in list(_live_children):
        _stop(pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _crash_message(origin: str, what: str, number: int, reason: str) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    detail = f"{name}: {reason}" if reason else name
    return (f"{origin}: jaxlib crashed ({detail}) while {what}; the input is malformed in a way "
            "its parser or verifier does not check")
