"""Reading the project's small input documents (JSON sidecars and caches, TOML configurations)
so that no input can hang, exhaust memory or overflow the stack of the command reading it.

Every TOML and JSON file a command is given goes through :func:`load_json` or
:func:`load_toml`: the hardware descriptions (``--hw FILE``), model and pipeline TOMLs
(``--config``, ``--pipeline``, analyze-pipeline's PIPELINE), the tracer's sidecars
(``--sidecar``, analyze-pipeline's stages) and the shape cache (``--shape-cache``). Each

* is a regular file (``stat`` first: a FIFO, ``/dev/zero`` or a directory is refused without
  opening it) of at most ``MAX_DOCUMENT_BYTES`` (read no further, whatever ``stat`` said);
* is UTF-8 text that parses, with numbers a command can compute with: no JSON ``NaN`` or
  ``Infinity``, no float beyond the double range (``1e400``), no integer of more digits than
  Python converts (its 4,300-digit limit);
* nests arrays and tables at most ``MAX_NESTING`` deep (the parsers and the code that walks
  the document recurse: a 2,000-deep ``[[[...]]]`` would end in ``RecursionError``).

Anything else is one :class:`~hlo_trace.errors.InputFileError` naming the file and what it was
expected to be. :func:`check_input_file` is the first check alone, for a file read otherwise
(a dump).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import sys
import tomllib
from collections.abc import Callable
from typing import Any, TypeVar

from hlo_trace.errors import InputFileError, shown

#: Largest JSON or TOML document read: far above any the project writes (a full-size training
#: sidecar is ~100 kB, a hardware file 2 kB), far below a size that would strain memory.
MAX_DOCUMENT_BYTES = 64 * 2**20
#: Deepest nesting of arrays and tables accepted (the project's documents nest 6 deep at most).
MAX_NESTING = 64


def check_input_file(path: str | os.PathLike, what: str, *, max_bytes: int | None = None) -> int:
    """The size of ``path`` when it is a regular file (of at most ``max_bytes``); else one
    ``InputFileError``: missing, a directory, a FIFO, socket or device, unreadable, too big."""
    name = shown(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{name}: no such file") from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, EACCES on a parent, NUL byte
        raise InputFileError(f"{name}: cannot read: {_reason(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputFileError(f"{name}: is a directory, expected {what}")
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{name}: is not a regular file (a FIFO, socket or device); "
                             f"expected {what}")
    if max_bytes is not None and info.st_size > max_bytes:
        raise InputFileError(f"{name}: {info.st_size} bytes, more than the {_size(max_bytes)} "
                             f"{what} may hold")
    return info.st_size


def read_document(path: str | os.PathLike, what: str, *, max_bytes: int | None = None) -> str:
    """The text of a small document: a regular UTF-8 file of at most ``max_bytes`` (None:
    ``MAX_DOCUMENT_BYTES``)."""
    max_bytes = MAX_DOCUMENT_BYTES if max_bytes is None else max_bytes
    check_input_file(path, what, max_bytes=max_bytes)
    name = shown(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)  # the file may have grown since stat
    except OSError as exc:
        raise InputFileError(f"{name}: cannot read: {_reason(exc)}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{name}: more than the {_size(max_bytes)} {what} may hold")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{name}: not UTF-8 text (byte {exc.start}); expected {what}") from None


def load_json(path: str | os.PathLike, what: str = "a JSON file", *,
              max_bytes: int | None = None) -> Any:
    """The JSON document in ``path`` (see the module docstring for what is refused; a document
    that may be larger than ``MAX_DOCUMENT_BYTES`` names its own bound)."""
    return loads_json(read_document(path, what, max_bytes=max_bytes), shown(path), what)


def loads_json(text: str, origin: str, what: str = "JSON") -> Any:
    """``text`` parsed as JSON with the checks of :func:`load_json`; errors name ``origin``."""
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{origin}: not valid JSON ({exc}); expected {what}") from None
    except RecursionError:
        raise InputFileError(f"{origin}: nested more than {MAX_NESTING} deep; expected "
                             f"{what}") from None
    except ValueError as exc:  # a non-finite number, an integer beyond the digit limit
        raise InputFileError(f"{origin}: {_first_line(exc)}; expected {what}") from None
    check_nesting(document, origin, what)
    return document


Record = TypeVar("Record")


def dataclass_from_dict(cls: type[Record], document: Any, origin: str, what: str,
                        **convert: Callable[[Any], Any]) -> Record:
    """The frozen dataclass ``cls`` from the fields of ``document`` of the same names (a field
    with a default may be absent), each through its function in ``convert`` where one is given:
    a JSON result read back where it crosses a process. A missing field or a value of the wrong
    type is one ``InputFileError``: ``ORIGIN: not WHAT (...)``."""
    try:
        values = {f.name: document[f.name] for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                  if f.name in document or f.default is dataclasses.MISSING}
        return cls(**{name: convert[name](value) if name in convert else value
                      for name, value in values.items()})
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InputFileError(f"{origin}: not {what} ({error!r})") from None


def load_toml(path: str | os.PathLike, what: str = "a TOML file") -> dict[str, Any]:
    """The TOML document in ``path`` (see the module docstring for what is refused)."""
    text = read_document(path, what)
    origin = shown(path)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"{origin}: not valid TOML ({exc}); expected {what}") from None
    except RecursionError:
        raise InputFileError(f"{origin}: nested more than {MAX_NESTING} deep; expected "
                             f"{what}") from None
    except ValueError as exc:  # an integer beyond the digit limit
        raise InputFileError(f"{origin}: {_first_line(exc)}; expected {what}") from None
    check_nesting(document, origin, what)
    return document


def check_nesting(document: Any, origin: str, what: str) -> None:
    """Refuse a document whose arrays and tables nest more than ``MAX_NESTING`` deep (walked
    with a stack of its own: no recursion)."""
    stack = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth >= MAX_NESTING:
            raise InputFileError(f"{origin}: nested more than {MAX_NESTING} deep; expected {what}")
        stack.extend((child, depth + 1) for child in children)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"number {name} is not finite")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]} is beyond the range of a double")
    return number


def _first_line(exc: BaseException) -> str:
    if "integer string conversion" in str(exc):  # Python's int() digit limit
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


