"""Atomic output files: write to a temporary sibling, then rename over the target."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hlo_trace.errors import UsageError, shown


def check_target(path: str | os.PathLike, *, force: bool = False) -> Path:
    """The checks ``atomic_write`` makes before writing, alone: a command calls it first, so that
    a long computation is not lost to an output it may not write."""
    target = Path(path)
    name = shown(target)
    if target.is_symlink() and not target.exists() and not force:
        raise UsageError(f"{name}: is a dangling symbolic link; pass --force to replace the link")
    if target.exists() and not force:
        raise UsageError(f"{name}: already exists; pass --force to overwrite it")
    if target.exists() and not target.is_file():  # never replace a device, FIFO or directory
        raise UsageError(f"{name}: is not a regular file; refusing to replace it")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{shown(directory)}: output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{shown(directory)}: output directory is not writable")
    _probe(target, directory)
    return target


def _probe(target: Path, directory: Path) -> None:
    """Make (and remove) the temporary sibling that ``atomic_write`` will write: the only test
    that holds where permissions do not tell (root in /proc or /sys, a read-only mount, a full
    inode table)."""
    try:
        fd, name = tempfile.mkstemp(prefix=_temporary_prefix(target.name, directory),
                                    suffix=_TMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise UsageError(f"{shown(target)}: cannot write there: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(name)


_TMP_SUFFIX = ".tmp"
#: Characters ``mkstemp`` adds between the prefix and the suffix.
_TMP_RANDOM_CHARS = 8
#: The file name limit when the file system does not say (Linux's NAME_MAX, in bytes).
_DEFAULT_NAME_MAX = 255


def _temporary_prefix(name: str, directory: Path) -> str:
    """``.NAME.``, with NAME cut so that the temporary name (prefix, random part, suffix) fits
    the directory's file name limit: a target name near the limit must not make the write fail."""
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = _DEFAULT_NAME_MAX
    budget = name_max - len(_TMP_SUFFIX) - _TMP_RANDOM_CHARS - 2  # the two dots
    while len(os.fsencode(name)) > budget:  # bytes: a multi-byte character counts as several
        name = name[:-1]
    return f".{name}."


def _publish_new(tmp_name: str, target: Path) -> None:
    """Give the written temporary file the name ``target``, which must not exist (then the
    temporary name is removed); on a file system without hard links, a rename after a check."""
    try:
        os.link(tmp_name, target)
    except FileExistsError:
        raise UsageError(f"{shown(target)}: already exists (written meanwhile by another "
                         "process); pass --force to overwrite it") from None
    except OSError:  # no hard links here (EPERM, ENOTSUP): the check and the rename apart
        if os.path.lexists(target):
            raise UsageError(f"{shown(target)}: already exists; pass --force to overwrite "
                             "it") from None
        os.replace(tmp_name, target)
        return
    os.unlink(tmp_name)


def check_targets(targets: dict[str, str | os.PathLike | None], *, force: bool = False,
                  inputs: dict[str, str | os.PathLike | None] | None = None) -> None:
    """``check_target`` on each output a command was given (by option name, None when not
    given), no two naming the same file (one would silently replace the other), and none
    naming one of the command's ``inputs`` (by what they are: the report would replace the
    dump it was made from, even with ``--force``)."""
    seen: dict[str, str] = {}
    for option, path in targets.items():
        if path is None:
            continue
        for what, source in (inputs or {}).items():
            if source is not None and _same_file(path, source):
                raise UsageError(f"{shown(path)}: is the {what} this command reads; expected "
                                 f"another file for {option}")
        check_target(path, force=force)
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(f"{shown(path)}: given to both {seen[key]} and {option}; expected two "
                             "different files")
        seen[key] = option


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one does not exist (yet): by name
        return os.path.realpath(a) == os.path.realpath(b)


def atomic_write(path: str | os.PathLike, data: str | bytes | Iterable[str], *,
                 force: bool = False) -> Path:
    """Write ``data`` (text, bytes, or text in pieces, written as they come) to ``path`` so that
    readers never see a partial file.

    Refuses to replace an existing file unless ``force`` is true, so a dump is never silently lost:
    without ``force`` the file is made by a hard link, which fails if the name exists, so that
    of two processes writing one new file at once exactly one succeeds (a check, then a rename,
    would let both "succeed", the second silently replacing the first).
    """
    target = check_target(path, force=force)
    directory = target.parent if str(target.parent) else Path(".")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=_temporary_prefix(target.name, directory),
                                        suffix=_TMP_SUFFIX, dir=directory)
    except OSError as exc:  # the directory changed since check_target
        raise UsageError(f"{shown(target)}: cannot write there: {exc.strerror or exc}") from None
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
        if force:
            os.replace(tmp_name, target)
        else:
            _publish_new(tmp_name, target)
    except BaseException as exc:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):  # a full disk, a quota, an I/O error: one line
            raise UsageError(f"{shown(target)}: cannot write: {exc.strerror or exc}") from None
        raise
    return target


def write_png(figure, path: str | os.PathLike, *, force: bool = False, dpi: int = 110) -> Path:  # noqa: ANN001
    """A matplotlib ``figure`` as a PNG at ``path``, written as :func:`atomic_write` writes (the
    caller lays the figure out and closes it)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return atomic_write(path, buffer.getvalue(), force=force)
