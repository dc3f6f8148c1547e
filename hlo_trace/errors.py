"""Errors that reach the user as one line and exit code 2 (never a traceback)."""


class UsageError(Exception):
    """Bad input from the user: a file, an op, an option. The message is one line that names it."""


class InputFileError(UsageError):
    """A dump or data file that is missing, empty or not what was expected."""


class UnsupportedIRError(UsageError):
    """IR that the analyzer cannot measure faithfully (dynamic shapes, unknown group forms, ...)."""
