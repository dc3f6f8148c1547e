"""The JSON and CSV a page is made from, read with one-line errors naming the file and the field.

A page builder asks a :class:`Document` for the fields it shows (``doc.number("totals.
gemm_flops")``); a field that is missing or of the wrong type is an
:class:`~hlo_trace.errors.InputFileError` naming the file, the field and the command that writes
such a file, never a traceback or a page with a hole in it.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hlo_trace.documents import load_json, read_document
from hlo_trace.errors import InputFileError, shown

_MISSING = object()


@dataclass(frozen=True)
class Document:
    """A JSON object read from ``origin`` (a file), at ``where`` inside it; ``what`` says what
    the file should be (e.g. "analyze-hlo --format json output")."""

    data: dict[str, Any]
    origin: str
    what: str
    where: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike, what: str) -> Document:
        data = load_json(path, what)
        if not isinstance(data, dict):
            raise InputFileError(f"{shown(path)}: a JSON {type(data).__name__}, not an object; "
                                 f"expected {what}")
        document = cls(data, shown(path), what)
        document._check_values()
        return document

    def _check_values(self) -> None:
        """Refuse a number no page can compute with (beyond :data:`MAX_MAGNITUDE`: a
        401-digit integer, 1.8e308) and a string that is no Unicode text (a lone surrogate, which
        JSON's ``\\ud800`` escape can spell), naming the field; walked with a stack."""
        stack: list[tuple[str, Any]] = [("", self.data)]
        while stack:
            where, value = stack.pop()
            if isinstance(value, dict):
                stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
                stack.extend((f"{where} key", k) for k in value)
            elif isinstance(value, list):
                stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
            elif _is_number(value) and not abs(value) <= MAX_MAGNITUDE:
                raise InputFileError(f"{self.origin}: field {where}: a number beyond "
                                     f"{MAX_MAGNITUDE:g}; expected {self.what}")
            elif isinstance(value, str) and not _is_unicode(value):
                raise InputFileError(f"{self.origin}: field {where}: a string with a lone "
                                     f"surrogate (not Unicode text); expected {self.what}")

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _error(self, key: str, expected: str) -> InputFileError:
        return InputFileError(f"{self.origin}: field {self._path(key)}: expected {expected}; "
                              f"expected {self.what}")

    def _get(self, key: str, optional: bool) -> Any:
        value: Any = self.data
        for part in key.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
            if value is _MISSING:
                if optional:
                    return None
                raise self._error(key, "it to be there")
        return value

    def has(self, key: str) -> bool:
        return self._get(key, optional=True) is not None

    def _typed(self, key: str, optional: bool, accepts: Callable[[Any], bool], expected: str) -> Any:
        """The field, checked by ``accepts``; None for a missing or null optional field."""
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if not accepts(value):
            raise self._error(key, expected)
        return value

    def number(self, key: str, *, optional: bool = False, signed: bool = False) -> int | float | None:
        """A number, non-negative unless ``signed`` (a correlation)."""
        return self._typed(key, optional, lambda v: _is_number(v) and (signed or v >= 0),
                           "a number" if signed else "a non-negative number")

    def text(self, key: str, *, optional: bool = False) -> str | None:
        return self._typed(key, optional, lambda v: isinstance(v, str), "a string")

    def flag(self, key: str, *, optional: bool = False) -> bool | None:
        return self._typed(key, optional, lambda v: isinstance(v, bool), "true or false")

    def child(self, key: str, *, optional: bool = False) -> Document | None:
        value = self._typed(key, optional, lambda v: isinstance(v, dict), "an object")
        return None if value is None else Document(value, self.origin, self.what, self._path(key))

    def numbers(self, key: str, *, optional: bool = False) -> dict[str, int | float]:
        """An object of numbers (e.g. seconds by kind)."""
        inner = self.child(key, optional=optional)
        return {} if inner is None else {name: inner.number(name) for name in inner.data}

    def values(self, key: str, *, optional: bool = False) -> list[Any]:
        return self._typed(key, optional, lambda v: isinstance(v, list), "a list") or []

    def typed_list(self, key: str, accepts: Callable[[Any], bool], expected: str, *,
                   optional: bool = False) -> list[Any]:
        """A list whose every item ``accepts`` (e.g. :func:`is_count`, ``str``)."""
        values = self.values(key, optional=optional)
        for index, value in enumerate(values):
            if not accepts(value):
                raise self._error(f"{key}[{index}]", expected)
        return values

    def texts(self, key: str, *, optional: bool = False) -> list[str]:
        return self.typed_list(key, lambda v: isinstance(v, str), "a string", optional=optional)

    def counts(self, key: str, *, optional: bool = False) -> list[int]:
        """A list of non-negative integers (op positions)."""
        return self.typed_list(key, is_count, "a non-negative integer", optional=optional)

    def shapes(self, key: str, *, optional: bool = False) -> list[list[int]]:
        """A list of tensor shapes, each a list of non-negative integers."""
        return self.typed_list(key, lambda v: isinstance(v, list) and all(map(is_count, v)),
                               "a shape (a list of non-negative integers)", optional=optional)

    def children(self, key: str, *, optional: bool = False) -> Iterator[Document]:
        """The objects of a list, each as a Document (``key[i]``)."""
        for index, value in enumerate(self.values(key, optional=optional)):
            if not isinstance(value, dict):
                raise self._error(f"{key}[{index}]", "an object")
            yield Document(value, self.origin, self.what, self._path(f"{key}[{index}]"))


#: A CSV cell that is a number (Python's int() and float() also take "204_640_360", " 5", "nan").
#: Longer number cells are refused (Python's int() refuses 4,300 digits).
_MAX_NUMBER_CHARS = 400
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


#: Largest magnitude of a number a page reads: far beyond any count, byte or second the
#: commands write (the FLOPs of a whole training run are ~1e25), far below a double's 1.8e308,
#: so that sums and unit scalings of such numbers stay finite.
MAX_MAGNITUDE = 1e100


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def csv_value(text: str) -> int | float | str | None:
    """A CSV cell as a number where it is one (plain decimal digits); empty and ``n/a`` are
    None; anything else (``204_640_360``, ``1x16``) is text."""
    if text in ("", "n/a"):
        return None
    match = _NUMBER.fullmatch(text)
    if match is None:
        return text
    if len(text) > _MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text):,} characters")
    number = float(text) if match.group(1) is not None or match.group(2) is not None else int(text)
    if not abs(number) <= MAX_MAGNITUDE:
        raise ValueError(f"a number beyond {MAX_MAGNITUDE:g}")
    return number


def load_csv(path: str | os.PathLike, what: str) -> list[dict[str, Any]]:
    """The rows of a CSV file with a header, values as :func:`csv_value` reads them."""
    text = read_document(path, what)
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or not rows[0]:
        raise InputFileError(f"{shown(path)}: no header row; expected {what}")
    header = rows[0]
    table = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise InputFileError(f"{shown(path)}: line {number} has {len(row)} cells, the header "
                                 f"{len(header)}; expected {what}")
        try:
            table.append({name: csv_value(cell) for name, cell in zip(header, row)})
        except ValueError as error:
            raise InputFileError(f"{shown(path)}: line {number}: {error}; expected {what}") from None
    return table


def require_columns(rows: list[dict[str, Any]], names: tuple[str, ...], origin: str,
                    what: str) -> None:
    """Refuse a CSV that lacks one of the columns a page shows."""
    if rows:
        missing = [name for name in names if name not in rows[0]]
        if missing:
            raise InputFileError(f"{origin}: no column {missing[0]!r}; expected {what}")
