"""The unit of a mapping: one *work* per kernel (an Op for the chip, or a collective for the
network), and how one HLO op becomes one.

* **GEMM**: every ``dot``, ``dot_general`` and ``convolution`` as ``(M, K) x (K, N)``; batch
  dimensions make it one batched GEMM (``Op.batch`` instances): one kernel, one launch, whose
  tiling spreads the instances over the tiles (``hardware.gemm_mapper``) or CTAs
  (``hardware.kernel_model``) with M, N and K; a convolution as its im2col GEMM
  (``hlo_analyzer.dataflow.conv_dims``).
* **vector**, one kernel per op (``eager``): an element-wise op's rows are its result's leading
  dims, a reduction's rows its result elements (each reads one row). Reads are charged at their
  real size (:func:`real_elements`: a broadcast operand is read at its size before the
  broadcast).
* **collective**: timed on the system's chip-to-chip network (:func:`hardware.collective_time_s`).

Works of the same signature are mapped once (:class:`Signatures`, ``hlo_analyzer.mapping.program``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from hardware import Op, OpType
from hlo_analyzer.dataflow import CONSTANT_OPS, FREE_MOVEMENT_OPS
from hlo_analyzer.mapping.results import GEMM_KIND, NETWORK_KIND, VECTOR_KIND, PendingEpilogue
from hlo_analyzer.rows import OpRow
from hlo_analyzer.tensors import ELEMENT_BYTES

#: Reductions: a kernel's rows are their windows, one output each. ``select_and_scatter`` is a
#: windowed reduction too (each element of its source selects one element of its window of the
#: operand and adds itself there): its windows are its source's elements (``WINDOWS_OF_OPERAND``),
#: not its result's, which has the operand's shape.
REDUCTION_OPS = frozenset({"reduce", "reduce_window", "select_and_scatter"})
#: Reductions whose windows are the elements of one of their operands (by index), not of the result.
WINDOWS_OF_OPERAND = {"select_and_scatter": 1}


class Work(NamedTuple):
    """One thing to map: an Op for the chip, or a collective for the network (internal: a
    NamedTuple, built once per kernel several times faster than a frozen dataclass)."""

    position: int
    positions: tuple[int, ...]
    name: str
    kind: str
    shapes: str
    op: Op | None = None
    epilogue: Op | None = None
    collective: tuple[str, int, int, tuple[int, ...] | None] | None = None
    per_sample: bool = False      # a cross-attention charged per sample
    pending: PendingEpilogue | None = None  # ``MappingOptions.defer_epilogues``


# -- shapes ------------------------------------------------------------------------------------------
def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape) or (1,)


def _shapes_text(operands: Iterable[Sequence[int]], results: Iterable[Sequence[int]]) -> str:
    def one(shapes: Iterable[Sequence[int]]) -> str:
        return ",".join("x".join(map(str, s)) or "()" for s in shapes)

    return f"{one(operands)}->{one(results)}"


def dtype_bytes(dtype: str) -> int:
    return ELEMENT_BYTES.get(dtype, 2)


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


# -- GEMMs and attention --------------------------------------------------------------------------------
def _gemm_op(dims: tuple[int, int, int, int], row: OpRow) -> tuple[Op, str] | None:
    """The (batched) GEMM Op and the shapes text, or None for an empty GEMM."""
    m, k, n, batch = dims
    if min(m, k, n, batch) <= 0:
        return None
    op = Op(row.op, OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * batch * m * k * n, dtype_bytes(row.dtype),
            batch=batch)
    return op, _shapes_text(row.operand_shapes, row.result_shapes)


# -- real sizes ---------------------------------------------------------------------------------------------
def real_elements(attributes_of: dict[int, dict[str, Any]], order: Iterable[int] | None = None) -> dict[int, int]:
    """Elements a kernel reads from memory for each node's result: its result's, except that free
    data movement holds no more data than its operand (a broadcast of a 2x6x1152 modulation
    vector to a whole activation is still 2x6x1152 values, which the reading kernel broadcasts
    on the fly) and constants hold none (they are folded into the kernels that use them).
    ``order``: the nodes in dependency order (``dataflow.dependency_order``; default: sorted)."""
    real: dict[int, int] = {}
    for node in sorted(attributes_of) if order is None else order:
        attributes = attributes_of[node]
        name = attributes["name"]
        if name in CONSTANT_OPS:
            real[node] = 0
            continue
        size = sum(map(element_count, attributes["result_shapes"]))
        if name in FREE_MOVEMENT_OPS and attributes["operands"]:
            producer = attributes["operands"][0]
            source = real[producer] if producer is not None else element_count(attributes["operand_shapes"][0])
            size = min(size, source)
        real[node] = size
    return real


def read_shape(producer: int | None, shape: Sequence[int], real: dict[int, int]) -> tuple[int, ...] | None:
    """What a kernel reads for one operand: its shape (a scalar as ``(1,)``), or its real element
    count where the producer holds less (:func:`real_elements`); None for a constant."""
    if producer is None:
        return _dims(shape)
    size = real[producer]
    if size == 0:
        return None
    return _dims(shape) if size == element_count(shape) else (size,)


def stored_dtype(attributes_of: dict[int, dict[str, Any]], producer: int | None, dtype: str) -> str:
    """The element type in memory of an operand of type ``dtype`` made by ``producer``: free
    movement (a ``convert`` included) is no kernel, so a reader reads the tensor behind it, in
    that tensor's type (an i64 scalar converted to f32 is read as 8 bytes)."""
    while producer is not None and attributes_of[producer]["name"] in FREE_MOVEMENT_OPS \
            and attributes_of[producer]["operands"]:
        dtype = attributes_of[producer]["operand_dtypes"][0]
        producer = attributes_of[producer]["operands"][0]
    return dtype


# -- vector ops -------------------------------------------------------------------------------------------
def vector_flops(row: OpRow, exp_ops: int) -> int:
    scale = exp_ops if row.op.endswith("exponential") else 1
    return row.flops * scale


def _vector_op(name: str, inputs: Sequence[Sequence[int]], rows: int, out_elements: int, flops: int,
               bytes_per_element: int) -> Op:
    width = max(1, math.ceil(out_elements / rows))
    shapes = tuple(_dims(s) for s in inputs if element_count(s) > 0) or ((1,),)
    return Op(name, OpType.VECTOR, shapes, None, (rows, width), max(1, flops), bytes_per_element)


def rows_of(row: OpRow, result: Sequence[int]) -> int:
    """Rows of a vector kernel whose largest op is ``row``, of result ``result``: a reduction's
    windows, else its result's leading dims."""
    name = row.op.split(".", 1)[-1]
    if name in REDUCTION_OPS:
        source = WINDOWS_OF_OPERAND.get(name)
        if source is not None and source < len(row.operand_shapes):
            return max(1, element_count(row.operand_shapes[source]))
        return max(1, element_count(result))
    return max(1, element_count(result[:-1]))


def _eager_vector_op(row: OpRow, reads: tuple[tuple[tuple[int, ...] | None, str], ...],
                     exp_ops: int) -> tuple[Op, str, str] | None:
    """(Op, kernel name, shapes text) of one element-wise op or reduction run alone, or None
    for an empty result. ``reads``: what it reads of each operand (:func:`read_shape`) and the
    operand's element type; the Op counts bytes, each tensor in its own element type (a compare
    of f32 reads 4 bytes an element and writes 1)."""
    result = row.result_shapes[0] if row.result_shapes else ()
    if element_count(result) == 0:
        return None
    short = row.op.split(".", 1)[-1]
    inputs = [(element_count(s) * dtype_bytes(dtype),) for s, dtype in reads if s is not None]  # a constant is folded in
    op = _vector_op(short, inputs, rows_of(row, result), element_count(result) * dtype_bytes(row.dtype),
                    vector_flops(row, exp_ops), 1)
    return op, short, _shapes_text(row.operand_shapes, row.result_shapes)


_MISSING = object()


class Signatures:
    """Ops and shapes texts by op signature, each made once per program: a transformer repeats
    a few dozen distinct kernels thousands of times. A GEMM's signature is its op name, shapes,
    dtype and (M, K, N, batch); an element-wise op's its op name, shapes, dtype and FLOPs; a
    fused kernel's the arguments of its Op. The options enter through ``exp_ops`` (fixed here)
    and the chip (the ``_Mapper``'s, which caches the mappings by the Ops' signatures)."""

    def __init__(self, exp_ops: int) -> None:
        self.exp_ops = exp_ops
        self._gemms: dict[tuple[Any, ...], tuple[Op, str] | None] = {}
        self._vectors: dict[tuple[Any, ...], tuple[Op, str, str] | None] = {}
        self._vector_ops: dict[tuple[Any, ...], Op] = {}
        self._texts: dict[tuple[Any, ...], str] = {}
        self._names: dict[tuple[str, ...], str] = {}

    def gemm(self, node: int, dims: tuple[int, int, int, int], row: OpRow) -> Work | None:
        key = (dims, row.op, row.dtype, row.operand_shapes, row.result_shapes)
        made = self._gemms.get(key, _MISSING)
        if made is _MISSING:
            made = self._gemms[key] = _gemm_op(dims, row)
        if made is None:
            return None
        op, shapes = made  # type: ignore[misc]
        return Work(node, (node,), row.op, GEMM_KIND, shapes, op=op)

    def eager_vector(self, node: int, row: OpRow, reads: tuple[tuple[tuple[int, ...] | None, str], ...]) -> Work | None:
        key = (row.op, reads, row.result_shapes, row.dtype, row.flops)
        made = self._vectors.get(key, _MISSING)
        if made is _MISSING:
            made = self._vectors[key] = _eager_vector_op(row, reads, self.exp_ops)
        if made is None:
            return None
        op, name, shapes = made  # type: ignore[misc]
        return Work(node, (node,), name, VECTOR_KIND, shapes, op=op)

    def vector_op(self, name: str, inputs: tuple[tuple[int, ...], ...], rows: int, out_elements: int,
                  flops: int, bytes_per_element: int, row_length: int = 0) -> Op:
        key = (name, inputs, rows, out_elements, flops, bytes_per_element, row_length)
        op = self._vector_ops.get(key)
        if op is None:
            op = _vector_op(name, inputs, rows, out_elements, flops, bytes_per_element)
            if row_length:
                op = replace(op, row_length=row_length)
            self._vector_ops[key] = op
        return op

    def shapes_text(self, operands: tuple[tuple[int, ...], ...], results: tuple[tuple[int, ...], ...]) -> str:
        key = (operands, results)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = _shapes_text(operands, results)
        return text

    def fusion_name(self, ops: tuple[str, ...]) -> str:
        """``fusion(a,b,...)`` of the distinct short names of the vector ops ``ops``."""
        name = self._names.get(ops)
        if name is None:
            name = self._names[ops] = "fusion(" + ",".join(dict.fromkeys(op.split(".", 1)[-1] for op in ops)) + ")"
        return name


def behind_views(attributes_of: Any, node: int | None) -> int | None:
    """The op whose result ``node`` holds, followed back through views (a cast is no view: it
    is a kernel in PyTorch); an argument as it is given (None, or ``("argument", i)``)."""
    while isinstance(node, int) and attributes_of[node]["name"] in FREE_MOVEMENT_OPS \
            and attributes_of[node]["name"] != "convert" and attributes_of[node]["operands"]:
        node = attributes_of[node]["operands"][0]
    return node


# -- collectives -----------------------------------------------------------------------------------------
def collective_work(row: OpRow) -> Work | None:
    if row.group_size <= 1:
        return None
    devices = row.replica_group if len(row.replica_group) == row.group_size else None
    return Work(row.position, (row.position,), row.comm_kind, NETWORK_KIND,
                 _shapes_text(row.operand_shapes, row.result_shapes),
                 collective=(row.comm_kind, row.group_size, row.comm_bytes, devices))
