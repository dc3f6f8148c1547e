"""hlo_trace: the lowest layer of the project, shared by every package above it.

It holds only what every package needs and imports nothing but the standard library (and
click for the command-line runner):

* ``hlo_trace.errors``: the typed exceptions that reach the user as one ``Error:`` line, exit 2;
* ``hlo_trace.atomic``: atomic output files that are never silently overwritten;
* ``hlo_trace.numbers``: ``parse_int``, integers typed as text (ASCII digits, bounded first);
* ``hlo_trace.documents``: ``load_json`` / ``load_toml``, every JSON and TOML input read with its
  size, nesting and numbers bounded;
* ``hlo_trace.cli``: ``run_click``, the one way the project's commands turn errors into lines;
* ``hlo_trace.isolate``: ``call_in_child`` and ``start_in_child``, a forked child whose crash becomes a usage error.
* ``hlo_trace.examples``: ``example_dump``, the bundled example dump (package data), from any directory.

Dependency direction (docs/design.md): ``hlo_trace`` <- ``hardware`` <- ``hlo_analyzer``;
``hlo_trace`` <- ``models`` <- ``tracing``.
"""

import os as _os
import sys as _sys

#: The project's console commands (pyproject.toml's ``[project.scripts]``).
COMMANDS = ("analyze-hlo", "analyze-pipeline", "hlo-report", "plan-search", "trace-module",
            "trace-stage", "trace-vae-decode")


def quiet_interrupts() -> None:
    """Make an interrupt that reaches the top of the process (Ctrl-C while a command still
    imports its modules, before ``run_click`` catches it) the one line ``Interrupted.`` and exit
    code 130, as everywhere else in a command, instead of a traceback and death by SIGINT. Any
    other exception is reported as before. Installed by ``hlo_trace.cli`` (the commands'
    runner) and, earlier, here when the process was started as one of the commands."""
    if getattr(_sys.excepthook, "_hlo_trace_quiet", False):
        return
    previous = _sys.excepthook

    def hook(kind, value, traceback) -> None:
        if _interrupted(value):
            try:
                _sys.stderr.write("Interrupted.\n")
                _sys.stderr.flush()
            finally:
                _os._exit(130)  # no cleanup: a half-initialised native library may crash in it
        previous(kind, value, traceback)

    hook._hlo_trace_quiet = True  # type: ignore[attr-defined]
    _sys.excepthook = hook
    _sys.unraisablehook = _unraisable_hook(_sys.unraisablehook)


#: How long the re-sent interrupt waits: long enough for the hook and the callback that lost the
#: interrupt to return (microseconds), short against a person's reaction to Ctrl-C.
_RESEND_DELAY_S = 0.02


def _unraisable_hook(previous):
    """An interrupt that lands in code Python cannot raise from (a weakref callback, such as the
    import system's module-lock ``cb``, or a ``__del__``) is printed as "Exception ignored" and
    lost. Send SIGINT again to the main thread instead, a moment later from a thread of its own
    (sent from here it would be raised inside this hook and lost once more), where it is the
    usual KeyboardInterrupt: ``run_click`` or the hook above turns it into ``Interrupted.``, and
    outputs being written are cleaned up as on any interrupt."""
    def hook(unraisable) -> None:
        if _interrupted(unraisable.exc_value):
            import signal
            import threading

            def resend() -> None:
                threading.Event().wait(_RESEND_DELAY_S)
                if callable(signal.getsignal(signal.SIGINT)):
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                else:  # SIGINT ignored (inherited SIG_IGN): a re-sent one would be lost too
                    _sys.stderr.write("Interrupted.\n")
                    _sys.stderr.flush()
                    _os._exit(130)

            threading.Thread(target=resend, name="hlo-trace-interrupt", daemon=True).start()
            return
        previous(unraisable)

    return hook


def _interrupted(error: BaseException | None) -> bool:
    """Whether ``error`` is a KeyboardInterrupt or was caused by one (Python wraps an exception
    raised in ``__set_name__`` as a class is made, e.g. while ``platform`` imports, in a
    RuntimeError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


if _sys.argv and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) in COMMANDS):
    quiet_interrupts()  # ``python -m tracing.cli`` (while the package imports) or a console script
