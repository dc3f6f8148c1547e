"""The tracer's JSON sidecar (``<dump>.json``), read once and its fields checked.

A sidecar is input like the dump beside it: it may be any file (``--sidecar /dev/zero``), any
JSON, and any value in any field. :func:`read_sidecar` reads it through
:func:`hlo_trace.documents.load_json` (a regular file, bounded size and nesting, finite numbers)
and checks the fields the analyzer computes with, where present: ``inputs`` and ``outputs``
(name -> global ``shape``, a list of non-negative integers, and ``dtype``, a torch dtype name of
``SIDECAR_DTYPES``), ``mesh.global_device_ids`` (rows of device ids), ``blocks`` (``[first,
last]``), ``stage``, ``pipefusion.patches`` and ``strategy.name``. A field of the wrong form is
one ``InputFileError`` naming the file and the field, never a ``KeyError`` deep in the analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def read_sidecar(path: str | Path | None, *, required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The sidecar at ``path`` as a JSON object with its fields checked (None: no path). The
    fields named in ``required`` (dotted: ``mesh.global_device_ids``) must be present."""
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
    return document


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


def _check_tensors(section: Any, where: str, origin: str) -> None:
    _expect(section, isinstance(section, dict), where, origin,
            'an object of name -> {"shape": [...], "dtype": "bfloat16"}')
    for name, entry in section.items():
        field = f"{where}.{name}"
        _expect(entry, isinstance(entry, dict), field, origin,
                '{"shape": [...], "dtype": "bfloat16"}')
        shape = entry.get("shape")
        good = isinstance(shape, list) and all(_is_int(d, 0, MAX_DIMENSION) for d in shape)
        _expect(shape, good, f"{field}.shape", origin,
                "a list of integer sizes from 0 to 2**63-1")
        dtype = entry.get("dtype")
        _expect(dtype, isinstance(dtype, str) and dtype in SIDECAR_DTYPES, f"{field}.dtype", origin,
                f"one of {', '.join(SIDECAR_DTYPES)}")


def _is_int(value: Any, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _expect(value: Any, good: Any, field: str, origin: str, expected: str) -> Any:
    if not good:
        text = repr(value)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise InputFileError(f"{origin}: field {field} = {text}: expected {expected}")
    return value
