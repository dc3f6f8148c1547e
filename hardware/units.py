"""Parse quantities with explicit units, as written in the hardware TOML files.

Convention (one for the whole package): the SI prefixes k, M, G, T, P are decimal
(``1 GB = 1e9 bytes``, ``1 GB/s = 1e9 bytes/s``, ``1 TFLOPS = 1e12 FLOP/s``); binary sizes
must be spelled with the IEC prefixes ``KiB``, ``MiB``, ``GiB``, ``TiB`` (``1 MiB = 2**20 bytes``).
Datasheets quote bandwidths and throughputs in decimal units and on-chip memories in binary
ones, so both are accepted but never guessed: ``"3 MB"`` is 3_000_000 bytes, ``"3 MiB"`` is
3_145_728 bytes.

Every parser returns a plain ``float`` in base units (bytes, bytes per second, seconds,
operations per second) and raises ``ValueError`` with a one-line reason; the loader turns
that into an ``InputFileError`` naming the file and the field.
"""

from __future__ import annotations

import re
from enum import Enum

__all__ = ["Dimension", "parse_quantity"]

_DECIMAL_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY_PREFIX = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12}


class Dimension(Enum):
    """The physical dimension a field must have; selects the accepted unit spellings."""

    BYTES = "bytes"
    BANDWIDTH = "bytes/s"
    TIME = "s"
    THROUGHPUT = "operations/s"


_QUANTITY = re.compile(r"^\s*([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([^\s].*?)?\s*$")


def _byte_scale(unit: str) -> float | None:
    """Scale of a byte unit such as ``B``, ``kB``, ``GB``, ``MiB``; None if not one."""
    if not unit.endswith("B"):
        return None
    prefix = unit[:-1]
    if prefix in _BINARY_PREFIX:
        return _BINARY_PREFIX[prefix]
    if prefix in _DECIMAL_PREFIX:
        return _DECIMAL_PREFIX[prefix]
    return None


def _throughput_scale(unit: str) -> float | None:
    """Scale of ``FLOPS``, ``TFLOPS``, ``TOPS``, ``GFLOP/s``, ``TOP/s`` ...; None if not one."""
    for suffix in ("FLOPS", "FLOP/s", "OPS", "OP/s"):
        if unit.endswith(suffix):
            prefix = unit[: -len(suffix)]
            return _DECIMAL_PREFIX.get(prefix)
    return None


def parse_quantity(text: str | float, dimension: Dimension) -> float:
    """Parse ``"128 GB/s"``, ``"3 MiB"``, ``"0.01 us"``, ``"8 TFLOPS"`` into base units.

    A bare number is rejected: every quantity in a hardware file must say its unit, so that
    ``100`` can never silently mean MB/s in one file and GB/s in another. The sign is kept
    (range checks such as "bandwidth must be positive" belong to the caller, who knows the field).
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"expected a string with a unit (e.g. '{_example(dimension)}'), got {text!r}")  # noqa: TRY004 - the loader reports ValueError as a field error
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"cannot read {text!r} as '<number> <unit>' (e.g. '{_example(dimension)}')")
    value = float(match.group(1))
    unit = (match.group(2) or "").strip()
    if not unit:
        raise ValueError(f"{text!r} has no unit (e.g. '{_example(dimension)}')")
    scale: float | None
    if dimension is Dimension.BYTES:
        scale = _byte_scale(unit)
    elif dimension is Dimension.BANDWIDTH:
        scale = _byte_scale(unit[:-2]) if unit.endswith("/s") else None
    elif dimension is Dimension.TIME:
        scale = _TIME_UNITS.get(unit)
    else:
        scale = _throughput_scale(unit)
    if scale is None:
        raise ValueError(f"unknown unit {unit!r} for a quantity in {dimension.value} (e.g. '{_example(dimension)}')")
    return value * scale


def _example(dimension: Dimension) -> str:
    return {
        Dimension.BYTES: "3 MiB",
        Dimension.BANDWIDTH: "128 GB/s",
        Dimension.TIME: "0.01 us",
        Dimension.THROUGHPUT: "8 TFLOPS",
    }[dimension]
