"""The tracer's JSON sidecar (``<dump>.json``), read once and its fields checked.

A sidecar is input like the dump beside it: it may be any file (``--sidecar /dev/zero``), any
JSON, and any value in any field. :func:`read_sidecar` reads it through
:func:`hlo_trace.documents.load_json` (a regular file, bounded size and nesting, finite numbers)
and checks the fields the analyzer computes with, where present: ``inputs`` and ``outputs``
(name -> global ``shape``, a list of non-negative integers, and ``dtype``, a torch dtype name of
``SIDECAR_DTYPES``), ``mesh.global_device_ids`` (rows of device ids), ``blocks`` (``[first,
last]``), ``stage``, ``pipefusion.patches``, ``strategy.name`` and the trace statistics
(``seconds_total`` and the fields that come with it: :class:`TraceStatistics`). A field of the
wrong form is one ``InputFileError`` naming the file and the field, never a ``KeyError`` deep in
the analysis.

The result is a :class:`Sidecar`: the checked fields typed, the rest of the document kept for
the sections that other modules read (``training``, ``library_calls``, ``redundancy``). It is the
one reader: every command reads a dump's sidecar once and passes the ``Sidecar`` on.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hlo_analyzer.tensors import ELEMENT_BYTES
from hlo_trace.documents import load_json
from hlo_trace.errors import InputFileError, shown

#: torch dtype names used by the tracer's sidecar -> MLIR element type spelling.
SIDECAR_DTYPES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "ui8", "bool": "i1",
}

#: Largest dimension of a recorded shape: MLIR's (int64) bound.
MAX_DIMENSION = 2**63 - 1
#: Largest device id of a mesh (``hlo_analyzer.mlir.MAX_DEVICES``'s bound, 2**20 devices).
MAX_DEVICE_ID = (1 << 20) - 1
#: Largest count (block pair, stage, patch count) a sidecar may give.
MAX_INDEX = 10**6

#: What the error says a sidecar is.
WHAT = "a tracer sidecar (JSON)"
#: File descriptor of standard output (a sidecar is never the file the report goes to).
STDOUT_FD = 1


@dataclass(frozen=True)
class SidecarTensor:
    """One tensor a sidecar records: its global shape and MLIR element type."""

    name: str
    shape: tuple[int, ...]
    element_type: str  # MLIR spelling: bf16, f32, ...

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ELEMENT_BYTES[self.element_type]


#: The trace statistics every traced program's sidecar records (``seconds_total`` marks them).
STATISTICS = ("seconds", "seconds_total", "peak_rss_bytes")


@dataclass(frozen=True)
class TraceStatistics:
    """What tracing the dump cost, as the tracer records it: the seconds of each step and in all,
    the process's peak RSS (and the peak reached by the end of each step, where recorded) and the
    dump's size (None: not recorded)."""

    seconds: Mapping[str, float]
    seconds_total: float
    peak_rss_bytes: int
    peak_rss_bytes_after: Mapping[str, int] = field(default_factory=dict)
    mlir_bytes: int | None = None


@dataclass(frozen=True)
class Sidecar:
    """A tracer sidecar, read once and checked (:func:`read_sidecar`). ``inputs`` is None when
    the file has no ``inputs`` section, ``statistics`` when it records no trace statistics;
    ``document`` is the whole JSON object (read-only), for the sections typed by the modules
    that read them."""

    path: Path
    document: Mapping[str, Any]
    inputs: tuple[SidecarTensor, ...] | None
    outputs: tuple[SidecarTensor, ...]
    device_ids: tuple[tuple[int, ...], ...] | None
    blocks: tuple[int, int] | None
    stage: int | None
    patches: int
    strategy: str
    statistics: TraceStatistics | None = None

    def section(self, name: str) -> Any:
        """The top-level ``name`` section of the document (None when absent)."""
        return self.document.get(name)

    def input(self, name: str) -> SidecarTensor | None:
        return next((t for t in self.inputs or () if t.name == name), None)

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device id of the mesh, row by row (empty when not recorded)."""
        return tuple(d for row in self.device_ids or () for d in row)

    @property
    def caption_tokens(self) -> int | None:
        """Caption tokens of one sample (the model's ``model_max_length``) from
        ``pipeline.model``, or None if it has none."""
        try:
            tokens = self.document["pipeline"]["model"]["model_max_length"]
        except (KeyError, TypeError):
            return None
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def sidecar_for(dump: str | Path) -> Path | None:
    """``dumps/x.mlir`` -> ``dumps/x.json`` when that file exists and is a sidecar: not empty,
    and not the file this process's standard output writes (``analyze-hlo x.mlir --format json
    > x.json``: the shell made ``x.json``, empty or with an earlier report under ``>>``, before
    the command started)."""
    candidate = Path(dump).with_suffix(".json")
    try:
        found = candidate.stat()
    except (OSError, ValueError):  # absent, unreadable, or a name the OS refuses
        return None
    if not stat.S_ISREG(found.st_mode) or found.st_size == 0 or _is_standard_output(found):
        return None
    return candidate


def _is_standard_output(found: os.stat_result) -> bool:
    """Whether ``found`` is the file behind file descriptor 1 (this process's stdout, whatever
    ``sys.stdout`` is replaced by)."""
    try:
        out = os.fstat(STDOUT_FD)
    except OSError:  # stdout closed
        return False
    return (out.st_dev, out.st_ino) == (found.st_dev, found.st_ino)


def stage_sidecar(dump: str | Path, command: str) -> Sidecar:
    """The sidecar beside a traced stage ``dump``, which ``command`` needs (with its mesh)."""
    path = sidecar_for(dump)
    if path is None:
        raise InputFileError(f"{dump}: no sidecar {Path(dump).with_suffix('.json')}; "
                             f"{command} needs the tracer's sidecar of every stage")
    sidecar = read_sidecar(path, required=("mesh.global_device_ids",))
    assert sidecar is not None
    return sidecar


def as_sidecar(sidecar: Sidecar | str | Path | None) -> Sidecar | None:
    """``sidecar`` as is, or the sidecar read from that path."""
    return sidecar if sidecar is None or isinstance(sidecar, Sidecar) else read_sidecar(sidecar)


def read_sidecar(path: str | Path | None, *, required: tuple[str, ...] = ()) -> Sidecar | None:
    """The sidecar at ``path``, its fields checked (None: no path). The fields named in
    ``required`` (dotted: ``mesh.global_device_ids``) must be present."""
    if path is None:
        return None
    origin = shown(path)
    document = load_json(path, WHAT)
    if not isinstance(document, dict):
        raise InputFileError(f"{origin}: a JSON {type(document).__name__}; expected {WHAT}, "
                             "an object")
    for dotted in required:
        value: Any = document
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            raise InputFileError(f"{origin}: field {dotted} is missing; expected {WHAT} that "
                                 "has it")
    check_sidecar(document, origin)
    return _typed(Path(path), document)


def _tensors(section: Any) -> tuple[SidecarTensor, ...]:
    return tuple(SidecarTensor(name, tuple(entry["shape"]), SIDECAR_DTYPES[entry["dtype"]])
                 for name, entry in sorted(section.items()))


def _typed(path: Path, document: dict[str, Any]) -> Sidecar:
    """The checked ``document`` as a :class:`Sidecar`."""
    mesh = document.get("mesh") or {}
    rows = mesh.get("global_device_ids")
    blocks = document.get("blocks")
    return Sidecar(
        path=path, document=MappingProxyType(document),
        inputs=_tensors(document["inputs"]) if "inputs" in document else None,
        outputs=_tensors(document.get("outputs", {})),
        device_ids=None if rows is None else tuple(tuple(row) for row in rows),
        blocks=None if blocks is None else (blocks[0], blocks[1]),
        stage=document.get("stage"),
        patches=int(document.get("pipefusion", {}).get("patches", 1)),
        strategy=str(document.get("strategy", {}).get("name", "?")),
        statistics=_statistics(document) if "seconds_total" in document else None)


def _statistics(document: dict[str, Any]) -> TraceStatistics:
    mlir_bytes = document.get("mlir_bytes")
    return TraceStatistics(
        seconds=MappingProxyType(dict(document["seconds"])),
        seconds_total=float(document["seconds_total"]),
        peak_rss_bytes=document["peak_rss_bytes"],
        peak_rss_bytes_after=MappingProxyType(dict(document.get("peak_rss_bytes_after", {}))),
        mlir_bytes=mlir_bytes)


def check_sidecar(document: dict[str, Any], origin: str) -> None:
    """Check the fields the analyzer reads (see the module docstring)."""
    for section in ("inputs", "outputs"):
        if section in document:
            _check_tensors(document[section], f"{section}", origin)
    if "mesh" in document:
        mesh = _expect(document["mesh"], isinstance(document["mesh"], dict), "mesh", origin,
                       "an object with global_device_ids")
        if "global_device_ids" in mesh:
            rows = mesh["global_device_ids"]
            good = (isinstance(rows, list) and rows
                    and all(isinstance(row, list) and row
                            and all(_is_int(d, 0, MAX_DEVICE_ID) for d in row) for row in rows))
            _expect(rows, good, "mesh.global_device_ids", origin,
                    f"rows of device ids from 0 to {MAX_DEVICE_ID}, e.g. [[0, 1], [2, 3]]")
    if "blocks" in document:
        blocks = document["blocks"]
        good = (isinstance(blocks, list) and len(blocks) == 2
                and all(_is_int(b, 0, MAX_INDEX) for b in blocks) and blocks[0] <= blocks[1])
        _expect(blocks, good, "blocks", origin, "[first, last] block pairs, 0 <= first <= last")
    if "stage" in document:
        _expect(document["stage"], _is_int(document["stage"], 0, MAX_INDEX), "stage", origin,
                "a stage index >= 0")
    if "pipefusion" in document:
        pipefusion = _expect(document["pipefusion"], isinstance(document["pipefusion"], dict),
                             "pipefusion", origin, "an object with patches")
        if "patches" in pipefusion:
            _expect(pipefusion["patches"], _is_int(pipefusion["patches"], 1, MAX_INDEX),
                    "pipefusion.patches", origin, f"a patch count from 1 to {MAX_INDEX}")
    if "strategy" in document:
        strategy = document["strategy"]
        good = isinstance(strategy, dict) and isinstance(strategy.get("name", ""), str)
        _expect(strategy, good, "strategy", origin, 'an object with a name, e.g. {"name": "megatron"}')
    if any(key in document for key in STATISTICS):
        _check_statistics(document, origin)


def _check_statistics(document: dict[str, Any], origin: str) -> None:
    """The trace statistics: all of ``STATISTICS`` once any is there, each of its form."""
    for key in STATISTICS:
        if key not in document:
            raise InputFileError(f"{origin}: field {key} is missing; expected {WHAT} with every "
                                 f"trace statistic ({', '.join(STATISTICS)}) or none")
    seconds = document["seconds_total"]
    _expect(seconds, _is_number(seconds), "seconds_total", origin, "seconds, a number >= 0")
    for key, check, expected in (("seconds", _is_number, "seconds >= 0"),
                                 ("peak_rss_bytes_after", _is_bytes, "bytes, an integer >= 0")):
        steps = document.get(key, {})
        good = isinstance(steps, dict) and all(check(value) for value in steps.values())
        _expect(steps, good, key, origin, f"an object of step -> {expected}")
    for key in ("peak_rss_bytes", "mlir_bytes"):
        if key in document:
            _expect(document[key], _is_bytes(document[key]), key, origin, "bytes, an integer >= 0")


def _check_tensors(section: Any, where: str, origin: str) -> None:
    _expect(section, isinstance(section, dict), where, origin,
            'an object of name -> {"shape": [...], "dtype": "bfloat16"}')
    for name, entry in section.items():
        place = f"{where}.{name}"
        _expect(entry, isinstance(entry, dict), place, origin,
                '{"shape": [...], "dtype": "bfloat16"}')
        shape = entry.get("shape")
        good = isinstance(shape, list) and all(_is_int(d, 0, MAX_DIMENSION) for d in shape)
        _expect(shape, good, f"{place}.shape", origin,
                "a list of integer sizes from 0 to 2**63-1")
        dtype = entry.get("dtype")
        _expect(dtype, isinstance(dtype, str) and dtype in SIDECAR_DTYPES, f"{place}.dtype", origin,
                f"one of {', '.join(SIDECAR_DTYPES)}")


def _is_int(value: Any, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _is_bytes(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _expect(value: Any, good: Any, field: str, origin: str, expected: str) -> Any:
    if not good:
        text = repr(value)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise InputFileError(f"{origin}: field {field} = {text}: expected {expected}")
    return value
