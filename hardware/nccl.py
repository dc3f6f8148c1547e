"""Collectives as NCCL runs them inside one NVSwitch node: measured nccl-tests bus bandwidth by
message size, instead of a flat link rate.

A table (``hardware/data/nccl/*.toml``, ``kind = "nccl_table"``) holds, for all-reduce,
all-gather, reduce-scatter and all-to-all, rows of an nccl-tests run on ``group_size`` GPUs:
message size ``S`` (nccl-tests' size: the all-reduce buffer, the gathered all-gather output, the
reduce-scatter input, one rank's all-to-all send buffer; the same ``M`` as
:func:`hardware.collectives.collective_time_s` takes), time and bus bandwidth. nccl-tests reports
``busbw = algbw * factor`` with ``algbw = S / time`` and the factor of
:func:`bus_bandwidth_factor` (nccl-tests ``doc/PERFORMANCE.md``): ``2(n-1)/n`` for all-reduce,
``(n-1)/n`` for all-gather, reduce-scatter and all-to-all. So a collective of ``M`` bytes over
``n`` GPUs takes (:func:`nccl_time_s`)::

    time = max(floor, M * factor(n) / busbw(M))

* ``busbw(M)``: the table's bus bandwidth, interpolated linearly in log(size) and log(busbw)
  between its rows (the time, ``M * factor / busbw``, is then log-log interpolated too), the
  last row's above the table. Small messages are latency-bound as measured: their busbw is low.
* ``floor``: the time of the table's first row, ``S_0 * factor(group_size) / busbw_0``; a
  smaller message takes that long (the left-out rows below it are flat in the logs).
* Another group size ``n`` inside the node (a documented rule, not a measurement): the bus
  bandwidth per GPU at a message size does not depend on how many GPUs take part (each GPU drives
  its own NVLink ports into the non-blocking NVSwitch), so only ``factor(n)`` changes; the floor
  stays the table's (NCCL's launch and synchronisation cost does not shrink with the group).
  Groups that run at the same time use disjoint ports and do not slow each other.
* One GPU, or nothing to move (``M = 0``: XLA emits no such collective), takes no time.
* ``busbw_scale``: a system measured with another system's table (``nccl_busbw_scale`` of its
  file, e.g. 8x H100 from the 8x A100 table times the NVLink ratio 450/300) multiplies every
  bus bandwidth, so the floor shrinks by the same factor.

Every problem with a table file raises :class:`hlo_trace.errors.InputFileError` naming the file
and the field.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_trace.documents import load_toml
from hlo_trace.errors import InputFileError

__all__ = [
    "NCCL_KINDS",
    "NCCL_TABLE_COLUMNS",
    "NcclCurve",
    "NcclMeasurement",
    "NcclTable",
    "bus_bandwidth",
    "bus_bandwidth_factor",
    "load_nccl_measurement",
    "load_nccl_table",
    "nccl_floor_s",
    "nccl_time_s",
]

#: The collectives a table holds (one TOML table each), in the names of
#: :data:`hardware.collectives.COLLECTIVE_KINDS`.
NCCL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: The columns of every row, as nccl-tests prints them (out-of-place).
NCCL_TABLE_COLUMNS = ("size (B)", "time (us)", "busbw (GB/s)")
#: nccl-tests prints time in microseconds and bandwidth in GB/s (1e9 bytes per second).
_US = 1e-6
_GB_PER_S = 1e9
#: A row's time and its busbw are two printed numbers of one measurement: ``size * factor /
#: busbw`` must give the time to within this fraction (busbw is printed with three or more
#: significant digits, so rounding alone stays under 0.4%); a larger gap is a transcription error.
ROW_CONSISTENCY = 0.02


def bus_bandwidth_factor(kind: str, group_size: int) -> float:
    """nccl-tests' ``busbw / algbw`` for ``kind`` over ``group_size`` ranks (doc/PERFORMANCE.md)."""
    if kind not in NCCL_KINDS:
        raise ValueError(f"no NCCL table model for {kind!r} (known: {', '.join(NCCL_KINDS)})")
    if group_size < 1:
        raise ValueError(f"group size must be at least 1, got {group_size}")
    n = group_size
    return 2.0 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class NcclCurve:
    """One collective's rows: sizes (bytes, increasing), times (s) and bus bandwidths (B/s)."""

    kind: str
    log: str
    sizes_bytes: tuple[float, ...]
    times_s: tuple[float, ...]
    busbw_bytes_per_s: tuple[float, ...]


@dataclass(frozen=True)
class NcclTable:
    """An nccl-tests run on ``group_size`` GPUs of one node; ``curves`` in :data:`NCCL_KINDS` order."""

    name: str
    description: str
    source: str
    path: str
    group_size: int
    curves: tuple[NcclCurve, ...]

    def curve(self, kind: str) -> NcclCurve:
        for curve in self.curves:
            if curve.kind == kind:
                return curve
        raise ValueError(f"NCCL table {self.name} has no {kind!r} rows")


def bus_bandwidth(curve: NcclCurve, message_bytes: float) -> float:
    """Bus bandwidth (B/s) at ``message_bytes``: log-log between rows, the end rows beyond them."""
    sizes, busbw = curve.sizes_bytes, curve.busbw_bytes_per_s
    if message_bytes <= sizes[0]:
        return busbw[0]
    if message_bytes >= sizes[-1]:
        return busbw[-1]
    upper = bisect.bisect_left(sizes, message_bytes)
    if sizes[upper] == message_bytes:
        return busbw[upper]
    lower = upper - 1
    fraction = math.log(message_bytes / sizes[lower]) / math.log(sizes[upper] / sizes[lower])
    return math.exp(math.log(busbw[lower]) + fraction * math.log(busbw[upper] / busbw[lower]))


def nccl_floor_s(table: NcclTable, kind: str, *, busbw_scale: float = 1.0) -> float:
    """The table's small-message floor of ``kind``: the time of its first row (scaled)."""
    curve = table.curve(kind)
    return curve.sizes_bytes[0] * bus_bandwidth_factor(kind, table.group_size) / (curve.busbw_bytes_per_s[0] * busbw_scale)


def nccl_time_s(table: NcclTable, kind: str, group_size: int, message_bytes: float, *,
                busbw_scale: float = 1.0) -> float:
    """Seconds of one ``kind`` of ``message_bytes`` over ``group_size`` GPUs (module docstring)."""
    if message_bytes < 0:
        raise ValueError(f"message size must not be negative, got {message_bytes}")
    if busbw_scale <= 0:
        raise ValueError(f"bus bandwidth scale must be positive, got {busbw_scale}")
    if group_size == 1 or message_bytes == 0:
        return 0.0
    curve = table.curve(kind)
    floor = nccl_floor_s(table, kind, busbw_scale=busbw_scale)
    moving = message_bytes * bus_bandwidth_factor(kind, group_size) / (bus_bandwidth(curve, message_bytes) * busbw_scale)
    return max(floor, moving)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_TOP_KEYS = {"kind", "name", "description", "source", "group_size", "columns", *NCCL_KINDS}
_CURVE_KEYS = {"log", "rows"}


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a positive number, got {value!r}")
    return float(value)


def _curve(path: Path, kind: str, table: Any, group_size: int) -> NcclCurve:
    where = f"{path}: field '{kind}"
    if not isinstance(table, dict):
        raise InputFileError(f"{where}': expected a table with 'log' and 'rows', got {table!r}")
    unknown = sorted(set(table) - _CURVE_KEYS)
    if unknown:
        raise InputFileError(f"{where}.{unknown[0]}': unknown field (known: log, rows)")
    log = table.get("log", "")
    if not isinstance(log, str):
        raise InputFileError(f"{where}.log': expected a string, got {log!r}")
    rows = table.get("rows")
    if not isinstance(rows, list) or not rows:
        raise InputFileError(f"{where}.rows': expected a non-empty list of [size, time, busbw] rows")
    sizes, times, busbw = [], [], []
    for index, row in enumerate(rows):
        field = f"{where}.rows[{index}]'"
        if not isinstance(row, list) or len(row) != len(NCCL_TABLE_COLUMNS):
            raise InputFileError(f"{field}: expected [{', '.join(NCCL_TABLE_COLUMNS)}], got {row!r}")
        try:
            size, time_us, busbw_gb = (_number(v) for v in row)
        except ValueError as error:
            raise InputFileError(f"{field}: {error}") from None
        if sizes and size <= sizes[-1]:
            raise InputFileError(f"{field}: sizes must increase, {size:g} follows {sizes[-1]:g}")
        implied_us = size * bus_bandwidth_factor(kind, group_size) / (busbw_gb * _GB_PER_S) / _US
        if abs(implied_us - time_us) > ROW_CONSISTENCY * time_us:
            raise InputFileError(
                f"{field}: time {time_us:g} us and busbw {busbw_gb:g} GB/s disagree (size x bus factor / "
                f"busbw = {implied_us:.4g} us on {group_size} GPUs): a mistyped number?")
        sizes.append(size)
        times.append(time_us * _US)
        busbw.append(busbw_gb * _GB_PER_S)
    return NcclCurve(kind=kind, log=log, sizes_bytes=tuple(sizes), times_s=tuple(times),
                     busbw_bytes_per_s=tuple(busbw))


def _text(path: Path, data: dict[str, Any], key: str, *, required: bool) -> str:
    value = data.get(key, "")
    if key not in data and required:
        raise InputFileError(f"{path}: field '{key}': missing")
    if not isinstance(value, str):
        raise InputFileError(f"{path}: field '{key}': expected a string, got {value!r}")
    return value


def _document(path: Path, what: str, kind: str, known: set[str]) -> dict:
    """The TOML document at ``path`` whose ``kind`` is ``kind`` and whose fields are ``known``."""
    data = load_toml(path, what)
    if data.get("kind") != kind:
        raise InputFileError(f"{path}: field 'kind': expected {kind!r}, got {data.get('kind')!r}")
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputFileError(f"{path}: field '{unknown[0]}': unknown field (known: {', '.join(sorted(known))})")
    return data


def load_nccl_table(path: str | Path) -> NcclTable:
    """Read an nccl-tests table file (module docstring); InputFileError names the bad field."""
    path = Path(path)
    data = _document(path, "an NCCL bus-bandwidth table (TOML)", "nccl_table", _TOP_KEYS)
    group_size = data.get("group_size")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise InputFileError(f"{path}: field 'group_size': expected an integer of at least 2, got {group_size!r}")
    if data.get("columns") != list(NCCL_TABLE_COLUMNS):
        raise InputFileError(f"{path}: field 'columns': expected {list(NCCL_TABLE_COLUMNS)}, got {data.get('columns')!r}")
    missing = [kind for kind in NCCL_KINDS if kind not in data]
    if missing:
        raise InputFileError(f"{path}: field '{missing[0]}': missing (a table holds {', '.join(NCCL_KINDS)})")
    return NcclTable(
        name=_text(path, data, "name", required=True),
        description=_text(path, data, "description", required=False),
        source=_text(path, data, "source", required=True),
        path=str(path),
        group_size=group_size,
        curves=tuple(_curve(path, kind, data[kind], group_size) for kind in NCCL_KINDS),
    )


# --------------------------------------------------------------------------------------------
# Multi-node measurements (validation of hardware.collectives' hierarchical model)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NcclMeasurement:
    """An nccl-tests run over ``nodes`` nodes of ``ranks_per_node`` GPUs (``kind =
    "nccl_measurement"``): one or more collectives' rows, for validation only (nothing is
    timed from them)."""

    name: str
    description: str
    source: str
    path: str
    nodes: int
    ranks_per_node: int
    curves: tuple[NcclCurve, ...]

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


_MEASUREMENT_KEYS = {"kind", "name", "description", "source", "nodes", "ranks_per_node", "columns",
                     *NCCL_KINDS}


def load_nccl_measurement(path: str | Path) -> NcclMeasurement:
    """Read a multi-node nccl-tests measurement file (rows as :func:`load_nccl_table` reads
    them, over ``nodes * ranks_per_node`` ranks); InputFileError names the bad field."""
    path = Path(path)
    data = _document(path, "a multi-node nccl-tests measurement (TOML)", "nccl_measurement",
                     _MEASUREMENT_KEYS)
    counts = []
    for key in ("nodes", "ranks_per_node"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputFileError(f"{path}: field '{key}': expected a positive integer, got {value!r}")
        counts.append(value)
    if data.get("columns") != list(NCCL_TABLE_COLUMNS):
        raise InputFileError(f"{path}: field 'columns': expected {list(NCCL_TABLE_COLUMNS)}, got {data.get('columns')!r}")
    kinds = [kind for kind in NCCL_KINDS if kind in data]
    if not kinds:
        raise InputFileError(f"{path}: no collective's rows (expected one of {', '.join(NCCL_KINDS)})")
    ranks = counts[0] * counts[1]
    return NcclMeasurement(
        name=_text(path, data, "name", required=True),
        description=_text(path, data, "description", required=False),
        source=_text(path, data, "source", required=True),
        path=str(path), nodes=counts[0], ranks_per_node=counts[1],
        curves=tuple(_curve(path, kind, data[kind], ranks) for kind in kinds))
