"""Errors that reach the user as one line and exit code 2 (never a traceback)."""


class UsageError(Exception):
    """Bad input from the user: a file, an op, an option. The message is one line that names it."""


class InputFileError(UsageError):
    """A dump or data file that is missing, empty or not what was expected."""


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
