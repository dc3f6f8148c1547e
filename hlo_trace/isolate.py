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

A child may be given limits (``time_s``, ``memory_bytes``): it is killed once it has run for
``time_s`` seconds, and it may map at most ``memory_bytes`` more than the parent had when it
forked (``RLIMIT_AS``); either way the parent raises :class:`ChildLimitExceeded`, a usage
error that says which limit, so that an input whose parse loops or grows without bound (a
malformed count in MLIR bytecode) is one line, not a hang.

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
import resource
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from hlo_trace.errors import OutOfMemory, UsageError, out_of_memory, out_of_memory_sign

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK = 1 << 20

#: What a child keeps until it ends (``keep_until_exit``); None outside a child.
_kept: list[Any] | None = None
#: Children of this process that have not been collected: killed if SIGTERM ends it.
_live_children: set[int] = set()
#: Signals held back while a child is forked.
_DEFERRED = {signal.SIGINT, signal.SIGTERM}
#: prctl option: the signal a process gets when its parent ends (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


class ChildFailed(Exception):
    """The child raised an exception that is not a usage error (a bug): its type, message and
    traceback text, re-raised in the parent so that ``run_click`` reports an internal error."""


class InputCrashed(UsageError):
    """Native code crashed on the input (the child died of a signal)."""


class ChildLimitExceeded(UsageError):
    """The child ran past its time limit or its memory limit; ``reason`` is what happened
    (e.g. ``"still running after 30 s"``), the message adds the origin and the work."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def call_in_child(function: Callable[..., T], *args: Any, origin: str,
                  what: str = "reading it", time_s: float | None = None,
                  memory_bytes: int | None = None, live_stderr: bool = False) -> T:
    """``function(*args)`` run in a forked child; its return value, or its exception re-raised.

    ``origin`` (usually the input file) and ``what`` word the error when the child dies of a
    signal: ``"<origin>: jaxlib crashed (SIGABRT: Check failed: ...) while reading it"``.
    Whatever the child writes to its standard error (logging, native warnings) is held back and
    replayed here after it ends, unless it failed or crashed: then only the one line is said.
    ``time_s`` and ``memory_bytes`` limit the child (module docstring). With ``live_stderr``
    its standard error is shown as it comes (a trace's progress), all but a native crash
    report, which becomes the one line. A child that ran out of memory (``std::bad_alloc``
    and kin, ``hlo_trace.errors.out_of_memory_sign``) is an ``OutOfMemory`` error.
    """
    return start_in_child(function, *args, origin=origin, what=what, time_s=time_s,
                          memory_bytes=memory_bytes, live_stderr=live_stderr).result()


def start_in_child(function: Callable[..., T], *args: Any, origin: str,
                   what: str = "reading it", time_s: float | None = None,
                   memory_bytes: int | None = None, live_stderr: bool = False) -> ChildTask[T]:
    """``function(*args)`` started in a forked child that runs while this process goes on; its
    ``ChildTask.result()`` waits for it (see ``call_in_child`` for the errors). The child sees
    this process's memory as it is now (copy-on-write): e.g. a parsed module, walked by the
    child and by this process at once, on two cores."""
    return ChildTask(function, args, origin, what, time_s=time_s, memory_bytes=memory_bytes,
                     live_stderr=live_stderr)


def other_threads_run() -> bool:
    """Whether this process runs threads besides this one (Python's or native: a JAX runtime, an
    MLIR thread pool), after which a fork is not safe: a child may wait forever on a lock that
    one of them held."""
    try:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("Threads:")) > 1
    except (OSError, StopIteration, ValueError, IndexError):  # not Linux: Python's threads only
        return threading.active_count() > 1


def in_child() -> bool:
    """Whether this process is a child started by ``call_in_child`` / ``start_in_child``."""
    return _kept is not None


def keep_until_exit(*objects: Any) -> None:
    """In a child (``start_in_child``), hold ``objects`` until the child ends: it ends with
    ``os._exit``, which gives all its memory back at once, so freeing them one by one first is
    wasted time (a parsed 100k-op module takes ~26 ms to free). Outside a child, nothing."""
    if _kept is not None:
        _kept.extend(objects)


class ChildTask(Generic[T]):
    """A forked child running one function (``start_in_child``). ``result()`` collects it once;
    ``cancel()`` stops it if it still runs (so a caller that fails first leaves nothing behind)."""

    def __init__(self, function: Callable[..., T], args: tuple, origin: str, what: str, *,
                 time_s: float | None = None, memory_bytes: int | None = None,
                 live_stderr: bool = False) -> None:
        self._origin, self._what = origin, what
        self._time_s, self._memory_bytes = time_s, memory_bytes
        self._deadline = None if time_s is None else time.monotonic() + time_s
        self._pid = 0
        if not hasattr(os, "fork"):  # pragma: no cover - Windows: no isolation, run in process
            self._value = function(*args)
            return
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self._stderr = _ChildStderr(live_stderr)
        prctl = _prctl()  # resolved before the fork: no dynamic loading in the child
        _kill_children_on_sigterm()
        parent = os.getpid()
        # No interrupt while the interpreter's fork handlers run (an exception there is
        # printed as "Exception ignored"), nor before the child is known here to be stopped.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
        pid = os.fork()
        if pid == 0:  # the child: never returns, whatever happens
            try:
                _die_with(parent, prctl)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read_end)
                global _kept
                _kept = []
                _redirect_stderr(self._stderr.child_end())
                if memory_bytes is not None:
                    _limit_memory(memory_bytes)
                if not os.environ.get("HLO_TRACE_DEBUG"):
                    faulthandler.disable()  # a crash is reported by the parent, in one line
                _child(function, args, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        self._stderr.started()
        _live_children.add(pid)
        self._pid, self._read_end = pid, read_end
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending interrupt is raised here

    def result(self) -> T:
        """Wait for the child: its return value, or its exception (or crash) raised here."""
        if not self._pid:
            return self._value
        try:
            payload = _read_all(self._read_end, self._deadline)
            if payload is None:  # past its time limit: stopped by cancel() below
                raise ChildLimitExceeded(
                    f"{self._origin}: still {self._what} after {self._time_s:.0f} s; gave up",
                    f"still running after {self._time_s:.0f} s")
            _, status = os.waitpid(self._pid, 0)
            _live_children.discard(self._pid)
            self._pid = 0
        finally:
            self.cancel()  # interrupted while the child runs: stop it, never leave it behind
        held_back = self._stderr.close()
        origin, what = self._origin, self._what
        if self._memory_bytes is not None and _out_of_memory(status, payload, held_back):
            limit = (f"{self._memory_bytes / 2**30:.3g} GiB" if self._memory_bytes >= 2**30
                     else f"{self._memory_bytes / 2**20:.3g} MiB")
            raise ChildLimitExceeded(f"{origin}: needed more than {limit} of memory while {what}",
                                     f"needs more than {limit} of memory")
        sign = out_of_memory_sign(held_back) if os.WIFSIGNALED(status) else None
        if sign is not None:  # std::bad_alloc and kin: SIGABRT
            raise out_of_memory(origin, sign)
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
            if held_back and not self._stderr.live:
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


class _ChildStderr:
    """Where a child's standard error goes: a file read once it ended (held back), or, ``live``,
    a pipe whose lines this process shows as they come, all but those of a native crash
    report (``_is_crash_line``), which are kept for the one-line error."""

    def __init__(self, live: bool) -> None:
        self.live = live
        self._closed = False
        if live:
            self._read_end, self._write_end = os.pipe()
            self._kept: list[str] = []
            self._thread: threading.Thread | None = None
        else:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()

    def child_end(self) -> int:
        return self._write_end if self.live else self._file.fileno()

    def started(self) -> None:
        """In this process, once the child is forked: start showing its lines."""
        if self.live:
            os.close(self._write_end)
            self._thread = threading.Thread(target=self._forward, daemon=True)
            self._thread.start()

    def _forward(self) -> None:
        with os.fdopen(self._read_end, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", errors="replace")
                if _is_crash_line(line) or self._kept and self._kept[-1].startswith("terminate"):
                    self._kept.append(line)
                    continue
                try:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass

    def close(self) -> str:
        """Stop and return what was held back (once; later calls return nothing)."""
        if self._closed:
            return ""
        self._closed = True
        if not self.live:
            self._file.seek(0)
            text = self._file.read().decode("utf-8", errors="replace")
            self._file.close()
            return text
        if self._thread is not None:
            self._thread.join(timeout=5)
        return "".join(self._kept)


def _is_crash_line(line: str) -> bool:
    """A line of a native crash report: C++'s ``terminate called ...`` and ``what(): ...``,
    absl's fatal ``F0123 12:34:56 ... Check failed``, a fatal Python error."""
    text = line.strip()
    return (text.startswith(("terminate called", "what():", "Fatal Python error", "*** "))
            or (text[:1] == "F" and text[1:5].isdigit() and "] " in text))


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
        except (UsageError, OSError) as error:  # an OSError is the system's refusal: one line
            message = ("raise", error)
        except KeyboardInterrupt:
            code = 130
            message = ("raise", KeyboardInterrupt())
        except BaseException as error:  # a bug: carry its traceback text to the parent
            sign = memory_limit_reached() or out_of_memory_sign(f"{type(error).__name__}: {error}")
            message = ("raise", out_of_memory(None, sign) if sign else ChildFailed(
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


def _read_all(fd: int, deadline: float | None = None) -> bytes | None:
    """Everything the child sends until it closes the pipe; None if ``deadline`` (a
    ``time.monotonic()`` value) passes first."""
    chunks = []
    while True:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _limit_memory(extra_bytes: int) -> None:
    """In a new child: allow ``extra_bytes`` of address space beyond what it maps now (its
    parent's mappings, shared copy-on-write, are not new memory)."""
    try:
        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or limit < soft:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _out_of_memory(status: int, payload: bytes, held_back: str) -> bool:
    """Whether a child under a memory limit ended because an allocation failed."""
    if os.WIFSIGNALED(status):
        return out_of_memory_sign(held_back) is not None
    if not payload:
        return False
    try:
        kind, value = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a result that does not unpickle is reported below
        return False
    return kind == "raise" and isinstance(value, OutOfMemory)


def memory_limit_reached() -> str | None:
    """When this process has come within 10% (or 256 MiB) of the address space it may use
    (``RLIMIT_AS``), what it used of what (an error then is most likely the limit's: a library
    that fails to allocate may say anything); else None."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as handle:
            peak = next(int(line.split()[1]) * 1024 for line in handle
                        if line.startswith("VmPeak:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    if peak < soft - max(0.1 * soft, 256 << 20):
        return None
    return f"{peak / 1e9:.3g} GB of the {soft / 1e9:.3g} GB address space it may use"


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


#: The environment variable by which a command started by another of the project's commands
#: (a plan search's trace and analysis steps, ``--all-stages``' stage processes) learns the
#: process id of the command that started it (``child_environment``, ``die_with_parent``).
PARENT_ENV = "HLO_TRACE_PARENT_PID"


def child_environment(environment: dict[str, str] | None = None) -> dict[str, str]:
    """``environment`` (default: this process's) for a command this process starts and waits
    for: the command ends when this process ends (``die_with_parent``, called by every
    command's ``run_click``), so that a stopped plan search leaves no trace running and no
    output written after it."""
    return {**(os.environ if environment is None else environment), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In a command started with ``child_environment``: ask the kernel for SIGTERM when the
    process that started it ends (``PR_SET_PDEATHSIG``), or end now if it already has. Elsewhere
    nothing. The variable is removed: this process's own children get it from it."""
    parent = os.environ.pop(PARENT_ENV, None)
    if not parent or not parent.isdigit():
        return
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # it ended before the request: re-parented already
        os._exit(128 + signal.SIGTERM)


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
