"""Reading static shapes, element sizes and locations off MLIR values and ops."""

from __future__ import annotations

import logging
import math
import os
from operator import attrgetter
from typing import Any, NamedTuple

from jaxlib.mlir import ir

from hlo_analyzer.rows import OpRow, Shape
from hlo_trace.errors import UnsupportedIRError

log = logging.getLogger(__name__)

#: Bytes per element of the common element types (kept for callers that want a whole-byte size
#: by name; the analyzer itself sizes every builtin type through ``element_bits``).
ELEMENT_BYTES = {
    "f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2,
    "f8E4M3FN": 1, "f8E5M2": 1, "f8E4M3FNUZ": 1, "f8E5M2FNUZ": 1, "f8E4M3B11FNUZ": 1,
    "i64": 8, "ui64": 8, "i32": 4, "ui32": 4, "i16": 2, "ui16": 2, "i8": 1, "ui8": 1, "i1": 1,
    "i4": 1, "ui4": 1, "complex<f32>": 8, "complex<f64>": 16,
}

#: Storage bits of an i1 (pred) element: XLA stores booleans in one byte.
PRED_BITS = 8
#: Storage bits of ``index`` (a 64-bit integer on every XLA target).
INDEX_BITS = 64
#: A ``!stablehlo.token`` carries no data.
TOKEN_BITS = 0


def element_bits(element_type: ir.Type) -> int:
    """Storage bits of one element of any builtin MLIR type.

    Floats and integers use their declared width (``FloatType.width``/``IntegerType.width``), so
    sub-byte types are exact in bits: f4E2M1FN is 4, i2 is 2, f8* is 8. i1 is stored in a byte
    (``PRED_BITS``), complex types are two of their element, ``index`` is 64 bits. A tensor's
    size in bytes is ``ceil(elements * bits / 8)`` (sub-byte elements packed, as XLA stores them).
    """
    if isinstance(element_type, ir.IntegerType):
        return PRED_BITS if element_type.width == 1 else element_type.width
    if isinstance(element_type, ir.FloatType):
        return element_type.width
    if isinstance(element_type, ir.ComplexType):
        return 2 * element_bits(element_type.element_type)
    if isinstance(element_type, ir.IndexType):
        return INDEX_BITS
    if "token" in str(element_type):
        return TOKEN_BITS
    raise UnsupportedIRError(f"element type {element_type}: not a builtin numeric type")


#: The attribute that carries XLA's sharding of an op's result or of an argument (HLO text's
#: ``sharding={...}``), a string in HLO's sharding syntax.
SHARDING_ATTRIBUTE = "mhlo.sharding"


def parse_sharding(text: str) -> Any:
    """``jaxlib.xla_client.HloSharding`` of an ``mhlo.sharding`` string (XLA's own parser), or
    None when XLA cannot read it (logged; the caller takes it as replicated)."""
    from jaxlib import xla_client

    try:
        return xla_client.HloSharding.from_string(text)
    except Exception:  # noqa: BLE001 - XLA raises its own error type for a bad sharding string
        log.warning("unreadable mhlo.sharding %r: taken as replicated", text)
        return None


def sharding_tiles(text: str | None) -> tuple[int, ...] | None:
    """Tiles per dimension of a tensor sharded by ``text`` (a trailing replication dimension
    included, as XLA lists them), or None when it is not split into tiles: replicated, on one
    device, manual, a tuple (whose tiles ``tile_assignment_dimensions`` cannot be asked for:
    XLA aborts the process), unreadable or absent."""
    parsed = parse_sharding(text) if text else None
    if parsed is None or parsed.tuple_elements() or not parsed.is_tiled():
        return None
    return tuple(parsed.tile_assignment_dimensions())


def splits_tensor(text: str) -> bool:
    """Whether a sharding string splits its tensor (or, for a tuple, one of its elements) into
    more than one tile: a tensor so annotated belongs to a program not yet partitioned."""
    parsed = parse_sharding(text)
    if parsed is None:
        return False
    return any(_data_tiles(part) > 1 for part in parsed.tuple_elements() or [parsed])


def _data_tiles(sharding: Any) -> int:
    """Tiles a tiled (non-tuple) sharding cuts the data into: the product of its tile counts
    without the trailing subgroup dimensions (replicated or manual copies of a tile)."""
    if sharding.tuple_elements() or not sharding.is_tiled():
        return 1
    dims = list(sharding.tile_assignment_dimensions())
    subgroups = len(sharding.subgroup_types()) + int(sharding.replicate_on_last_tile_dim())
    return math.prod(dims[:len(dims) - subgroups])


def packed_bytes(elements: int, bits: int) -> int:
    """Bytes of ``elements`` values of ``bits`` each, packed (sub-byte types) and rounded up."""
    return (elements * bits + 7) // 8


def shape_of(value: ir.Value, op: Any = None) -> tuple[int, ...]:
    """Static shape of a tensor value; scalars and tokens are ``()``.

    Raises UnsupportedIRError for a dynamic dimension: FLOPs and bytes of such a program depend on
    run-time sizes, and guessing them would give a wrong number that looks right.
    """
    return type_shape(value.type, op)


def type_shape(value_type: ir.Type, op: Any = None) -> tuple[int, ...]:
    """Static shape of a value of type ``value_type`` (see ``shape_of``)."""
    if not isinstance(value_type, ir.RankedTensorType):
        if isinstance(value_type, ir.ShapedType):  # unranked tensor
            raise UnsupportedIRError(f"{_where(op)}: unranked tensor {value_type}; static shapes only")
        return ()
    if not value_type.has_static_shape:
        raise UnsupportedIRError(
            f"{_where(op)}: dynamic shape {value_type}; the analyzer needs static shapes"
        )
    return tuple(value_type.shape)


def element_type_name(value: ir.Value) -> str:
    return type_element_name(value.type)


def type_element_name(value_type: ir.Type) -> str:
    if isinstance(value_type, ir.ShapedType):
        return str(value_type.element_type)
    return str(value_type)


def value_bits(value: ir.Value, op: Any = None) -> int:
    """Bits of one element of ``value`` (see ``element_bits``)."""
    return type_bits(value.type, op)


def type_bits(value_type: ir.Type, op: Any = None) -> int:
    """Bits of one element of a value of type ``value_type`` (see ``element_bits``)."""
    element_type = value_type.element_type if isinstance(value_type, ir.ShapedType) else value_type
    try:
        return element_bits(element_type)
    except UnsupportedIRError as exc:
        raise UnsupportedIRError(f"{_where(op)}: {exc}") from None


#: Elements of a tensor of this shape (``math.prod`` itself: called for every row).
num_elements = math.prod


def tensor_bytes(value: ir.Value, op: Any = None) -> int:
    return packed_bytes(num_elements(shape_of(value, op)), value_bits(value, op))


#: Element-wise ops whose operands all have the result's shape, by their verifier: StableHLO's
#: (and MHLO's) ``UnaryElementwiseOp`` and ``BinaryElementwiseOp`` classes and ``compare`` carry
#: the ``SameOperandsAndResultShape`` trait (stablehlo/dialect/StablehloOps.td). ``select`` and
#: ``clamp`` are not among them (a scalar predicate or bound), nor are chlo's ops.
SAME_SHAPE_OPS = frozenset(f"{dialect}.{name}" for dialect in ("stablehlo", "mhlo") for name in (
    "add", "subtract", "multiply", "divide", "remainder", "power", "atan2", "maximum", "minimum",
    "and", "or", "xor", "compare", "negate", "abs", "sign", "not", "exponential",
    "exponential_minus_one", "log", "log_plus_one", "logistic", "rsqrt", "sqrt", "cbrt", "tanh",
    "sine", "cosine", "tan", "floor", "ceil", "round_nearest_even", "round_nearest_afz",
    "is_finite"))


_TYPE = attrgetter("type")  # a value's type (map(_TYPE, values): no Python frame per value)
_new_tuple = tuple.__new__  # a NamedTuple built without its Python-level __new__ (~0.3 us less)


class OpFacts(NamedTuple):
    """An op's operands and results, and the results' MLIR types, as read from the bindings."""

    operands: tuple[ir.Value, ...]
    results: tuple[ir.Value, ...]
    result_types: tuple[ir.Type, ...]


class RowShapes(NamedTuple):
    """An op's operand and result shapes and its (first result's) element type, as in a row."""

    operands: tuple[Shape, ...]
    results: tuple[Shape, ...]
    dtype: str


class TypeTable:
    """Shape, element type and size per MLIR type, each worked out once; an op's operands and
    results read once however many visitors ask.

    MLIR uniques types in their context, so a transformer dump has a few hundred distinct types
    for 100k values; reading shape and dtype through the bindings costs ~4 us, a lookup 0.2 us.
    Locations are likewise uniqued and formatted once. Visitors that walk together
    (``IRVisitor.walk_with``) share one table, so that each op's values cross the bindings once:
    ``facts(op)`` (the values, for liveness) and ``value_types(op)`` (the types, for shapes) keep
    the last op's. A visitor that needs the values sets ``reads_values``: the types are then
    read through them, not apart.
    """

    def __init__(self) -> None:
        self._types: dict[ir.Type, tuple[tuple[int, ...], str]] = {}
        self._bytes: dict[ir.Type, int] = {}
        self._locations: dict[ir.Attribute, str] = {}
        self._last: tuple[Any, OpFacts | None] = (None, None)
        self._last_types: tuple[Any, tuple[tuple[ir.Type, ...], tuple[ir.Type, ...]] | None] = (
            None, None)
        self._last_shapes: tuple[Any, RowShapes | None] = (None, None)
        self.reads_values = False

    def facts(self, op: Any) -> OpFacts:
        """``op``'s operands, results and result types (read once for consecutive asks)."""
        last_op, facts = self._last
        if op is last_op and facts is not None:
            return facts
        operation = op.operation
        results = operation.results
        if len(results) == 1:  # most ops: one result, read directly (~0.2 us less)
            result = operation.result
            facts = _new_tuple(OpFacts, (tuple(operation.operands), (result,), (result.type,)))
        else:
            values = tuple(results)
            facts = _new_tuple(OpFacts, (tuple(operation.operands), values,
                                         tuple(map(_TYPE, values))))
        self._last = (op, facts)
        return facts

    def value_types(self, op: Any) -> tuple[tuple[ir.Type, ...], tuple[ir.Type, ...]]:
        """(operand types, result types) of ``op``: what shapes need (read without the result
        values unless ``reads_values``: a one-result op's type directly, ~1 us less)."""
        last_op, types = self._last_types
        if op is last_op and types is not None:
            return types
        operands = self.facts(op).operands if self.reads_values else op.operation.operands
        types = (tuple(map(_TYPE, operands)), self.result_types(op))
        self._last_types = (op, types)
        return types

    def shape(self, value: ir.Value, op: Any = None) -> tuple[int, ...]:
        return self.info(value.type, op)[0]

    def shapes(self, values: Any, op: Any = None) -> tuple[tuple[int, ...], ...]:
        """Shapes of all ``values`` (e.g. an op's operands or results)."""
        return self.type_shapes([value.type for value in values], op)

    def type_shapes(self, types: Any, op: Any = None) -> tuple[tuple[int, ...], ...]:
        """Shapes of values of these ``types``: the hot path of every row."""
        known = self._types
        shapes = []
        for value_type in types:
            info = known.get(value_type)
            if info is None:
                info = self.info(value_type, op)
            shapes.append(info[0])
        return tuple(shapes)

    def dtype(self, value: ir.Value) -> str:
        return self.info(value.type, None)[1]

    def nbytes(self, value: ir.Value, op: Any = None) -> int:
        return self.type_nbytes(value.type, op)

    def type_nbytes(self, value_type: ir.Type, op: Any = None) -> int:
        """Bytes of a value of type ``value_type`` (sub-byte elements packed)."""
        nbytes = self._bytes.get(value_type)
        if nbytes is None:
            shape = self.info(value_type, op)[0]
            nbytes = self._bytes[value_type] = packed_bytes(num_elements(shape),
                                                            type_bits(value_type, op))
        return nbytes

    def result_types(self, op: Any) -> tuple[ir.Type, ...]:
        """The types of ``op``'s results alone (``value_types`` without the operands)."""
        last_op, types = self._last_types
        if op is last_op and types is not None:
            return types[1]
        if self.reads_values:
            return self.facts(op).result_types
        operation = op.operation
        if len(operation.results) == 1:  # most ops: one result, read directly (~0.2 us less)
            return (operation.result.type,)
        return tuple(map(_TYPE, operation.results))

    def row_shapes(self, op: Any, name: str) -> RowShapes:
        """``op``'s operand and result shapes and its first result's dtype (for ``op_row``; kept
        for consecutive asks). The operands of ``SAME_SHAPE_OPS`` (named ``name``) are only
        counted: their shapes are the result's (~2 us less)."""
        last_op, shapes = self._last_shapes
        if op is last_op and shapes is not None:
            return shapes
        if name in SAME_SHAPE_OPS:
            result_types = self.result_types(op)
            results = self.type_shapes(result_types, op)
            operands = (results[0],) * len(op.operation.operands)
        else:
            operand_types, result_types = self.value_types(op)
            results = self.type_shapes(result_types, op)
            operands = self.type_shapes(operand_types, op)
        dtype = self._types[result_types[0]][1] if result_types else ""  # read by type_shapes
        shapes = _new_tuple(RowShapes, (operands, results, dtype))
        self._last_shapes = (op, shapes)
        return shapes

    def op_row(self, op: Any, position: int, category: str, *, name: str | None = None,
               **measures: Any) -> OpRow:
        """An ``OpRow`` for ``op`` (named ``name``, if the caller has read it) with its shapes
        (``row_shapes``), dtype and location filled in."""
        name = name or op.operation.name
        shapes = self.row_shapes(op, name)
        return OpRow(position, name, self.location(op), category, *shapes, **measures)

    def location(self, op: Any) -> str:
        location = op.operation.location
        key = location.attr
        text = self._locations.get(key)
        if text is None:
            text = self._locations[key] = format_location(location)
        return text

    def info(self, value_type: ir.Type, op: Any = None) -> tuple[tuple[int, ...], str]:
        """(shape, element type name) of a value of type ``value_type``."""
        info = self._types.get(value_type)
        if info is None:
            info = self._types[value_type] = (type_shape(value_type, op),
                                              type_element_name(value_type))
        return info


def format_location(location: ir.Location) -> str:
    """A short readable location: ``aten__mm @ model.py:40`` for torch-xla's fused name + file
    locations, ``dot.3`` for a name, ``model.py:12:3`` for a file position, ``""`` if unknown."""
    if isinstance(location, ir.FusedLoc):
        parts = [format_location(child) for child in location.locations]
        names = [p for p in parts if p and ":" not in p]
        files = [p for p in parts if ":" in p]
        return " @ ".join(filter(None, ("/".join(names), files[0] if files else "")))
    if isinstance(location, ir.NameLoc):
        return location.name_str
    if isinstance(location, ir.FileLineColLoc):
        return f"{os.path.basename(location.filename)}:{location.start_line}"
    if isinstance(location, ir.CallSiteLoc):
        return format_location(location.callee)
    text = str(location)
    return "" if text == "loc(unknown)" else text.removeprefix("loc(").removesuffix(")")


def _where(op: Any) -> str:
    if op is None:
        return "value"
    operation = op.operation
    location = format_location(operation.location)
    return f"{operation.name} at {location}" if location else operation.name
