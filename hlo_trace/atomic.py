"""Atomic output files: write to a temporary sibling, then rename over the target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hlo_trace.errors import UsageError


def check_target(path: str | os.PathLike, *, force: bool = False) -> Path:
    """The checks ``atomic_write`` makes before writing, alone: a command calls it first, so that
    a long computation is not lost to an output it may not write."""
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{target}: already exists; pass --force to overwrite it")
    if target.exists() and not target.is_file():  # never replace a device, FIFO or directory
        raise UsageError(f"{target}: is not a regular file; refusing to replace it")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{directory}: output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{directory}: output directory is not writable")
    return target


def atomic_write(path: str | os.PathLike, data: str | bytes | Iterable[str], *,
                 force: bool = False) -> Path:
    """Write ``data`` (text, bytes, or text in pieces, written as they come) to ``path`` so that
    readers never see a partial file.

    Refuses to replace an existing file unless ``force`` is true, so a dump is never silently lost.
    """
    target = check_target(path, force=force)
    directory = target.parent if str(target.parent) else Path(".")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as handle:
            if isinstance(data, (str, bytes)):
                handle.write(data)
            else:
                handle.writelines(data)
        # mkstemp creates the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, target)
    except BaseException as exc:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):  # a full disk, a quota, an I/O error: one line
            raise UsageError(f"{target}: cannot write: {exc.strerror or exc}") from None
        raise
    return target
