"""Errors that reach the user as one line and exit code 2 (never a traceback)."""


class UsageError(Exception):
    """Bad input from the user: a file, an op, an option. The message is one line that names it."""


class InputFileError(UsageError):
    """A dump or data file that is missing, empty or not what was expected."""


class OutOfMemory(UsageError):
    """The process (or its child) could not get the memory the work needs: one line that says
    so and what to do, not an internal error or a death by SIGABRT."""


class UnsupportedIRError(UsageError):
    """IR that the analyzer cannot measure faithfully (dynamic shapes, unknown group forms, ...)."""


def shown(path: object) -> str:
    """A file name as a message shows it: as is, unless it holds a control character (a
    newline, a tab, an escape), which is written as its escape (``\\n``) so that the message stays
    one line and keeps what follows the name (the reason)."""
    text = str(path)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: What a run that ran out of memory says, by the library that says it: C++'s
#: ``std::bad_alloc``, LLVM's and glibc's ``out of memory`` / ``Cannot allocate memory``
#: (ENOMEM), XLA's ``RESOURCE_EXHAUSTED``, a thread that could not be made under an
#: address-space limit (EAGAIN, ``Resource temporarily unavailable``), Python's MemoryError.
OUT_OF_MEMORY_SIGNS = ("bad_alloc", "RESOURCE_EXHAUSTED", "Resource temporarily unavailable",
                       "Cannot allocate memory", "out of memory", "Out of memory", "MemoryError")
#: What to do about it (the one line says it after the sign).
OUT_OF_MEMORY_ADVICE = ("free memory or raise the process's memory limit, or run a smaller case "
                        "(--shape, --batch, --config tiny) or fewer at once (plan-search --jobs)")


def out_of_memory_sign(text: str) -> str | None:
    """The sign of memory exhaustion in ``text`` (an error message, a crash report), or None."""
    return next((sign for sign in OUT_OF_MEMORY_SIGNS if sign in text), None)


def out_of_memory(where: str | None, sign: str) -> OutOfMemory:
    """The one-line error for running out of memory (``sign``), in ``where`` if given."""
    prefix = f"{where}: " if where else ""
    return OutOfMemory(f"{prefix}out of memory ({sign}); {OUT_OF_MEMORY_ADVICE}")
