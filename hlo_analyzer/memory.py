"""MemoryVisitor: memory one device needs to run its partitioned program.

Two parts, per device (a partitioned dump is one device's program, its shapes are local):

* **Resident arguments.** The entry function's (public ``main``) arguments are split into
  - *stage inputs*: with a tracer sidecar (``<dump>.json``, its ``inputs`` section: name, global
    shape and dtype of each stage input), an argument whose *global* shape (its local shape times
    the tiles of its ``mhlo.sharding`` attribute, read by XLA's own ``HloSharding`` parser) and
    element type equal a sidecar input's is that input (one argument per input; two inputs of one
    shape and dtype have the same bytes, so which argument is taken does not matter);
  - *stale K/V*: sidecar inputs named ``stale_*`` (a stage traced on one PipeFusion patch keeps
    the previous step's full-sequence K and V of each spatial attention), resident;
  - *scalars*: rank-0 arguments (torch-xla lifts Python scalars to graph parameters);
  - *weights*: every other argument, counted with its local (sharded) size: the parameters as
    sharded on that device.
  Without a sidecar (dumps of other models, JAX exports) stage inputs cannot be told apart, so
  every non-scalar argument counts as a weight: an upper bound, marked ``weights_source =
  "all-arguments"`` in the result.
* **Peak live activations**, by a liveness walk of the entry function in program order (the
  order of the dump's top-level ops, which a one-stream device executes in turn). A value is
  live from the op that defines it to its last use; stage inputs from the start to their last
  use; values the function returns to the end. At each op the live set includes its operands
  and its results (both exist while it runs). An op with regions (``while``, ``case``, a called
  function) adds the peak of its body's own temporaries at its position; values of an outer
  scope used inside a body count as used by the enclosing op. Reducer bodies (scalar combiners)
  hold no tensors and are skipped. No buffer is shared or reused in place (no aliasing of
  ``reshape``/``bitcast`` results, no fusion): the figure is the unfused program's peak, an upper
  bound of what XLA's buffer assignment would allocate.

``total_bytes = weight_bytes + scalar_bytes + stale_kv_bytes + peak_live_bytes``. With a chip capacity (the
hardware description's ``dram_capacity``) ``exceeds_capacity`` flags a device that does not fit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxlib.mlir import ir

from hlo_analyzer.tensors import TypeTable
from hlo_analyzer.visitor import SCALAR_BODY_OPS, IRVisitor, short_op_name
from hlo_trace.errors import InputFileError

log = logging.getLogger(__name__)

#: torch dtype names used by the tracer's sidecar -> MLIR element type spelling.
SIDECAR_DTYPES = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "ui8", "bool": "i1",
}

#: Sidecar inputs named so are PipeFusion's stale K/V buffers (``tracing.pipefusion``): resident
#: for the whole step, reported apart as ``stale_kv_bytes``, neither weights nor activations.
STALE_KV_PREFIX = "stale_"

#: ``weights_source`` values.
FROM_SIDECAR = "sidecar"
ALL_ARGUMENTS = "all-arguments"


@dataclass(frozen=True)
class InputSignature:
    """One stage input as the sidecar records it: global shape and MLIR element type."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class MemoryUsage:
    """Memory of one device; see the module docstring for what each figure counts."""

    weight_bytes: int
    weight_arguments: int
    input_bytes: int
    input_arguments: int
    scalar_bytes: int
    weights_source: str
    peak_live_bytes: int
    peak_position: int
    peak_op: str
    stale_kv_bytes: int = 0
    capacity_bytes: float | None = None

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.scalar_bytes + self.stale_kv_bytes + self.peak_live_bytes

    @property
    def exceeds_capacity(self) -> bool | None:
        if self.capacity_bytes is None:
            return None
        return self.total_bytes > self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_bytes": self.weight_bytes, "weight_arguments": self.weight_arguments,
            "input_bytes": self.input_bytes, "input_arguments": self.input_arguments,
            "scalar_bytes": self.scalar_bytes, "weights_source": self.weights_source,
            "peak_live_bytes": self.peak_live_bytes, "peak_position": self.peak_position,
            "peak_op": self.peak_op, "stale_kv_bytes": self.stale_kv_bytes,
            "total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes,
            "exceeds_capacity": self.exceeds_capacity,
        }


def read_sidecar_inputs(path: str | Path) -> list[InputSignature] | None:
    """The ``inputs`` of a tracer sidecar, or None if the file has no such section."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{path}: not a readable JSON sidecar ({exc})") from None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, dict):
        return None
    signatures = []
    for name, entry in sorted(inputs.items()):
        try:
            dtype = SIDECAR_DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
        except (KeyError, TypeError, ValueError):
            raise InputFileError(
                f"{path}: inputs.{name}: expected {{'dtype': one of "
                f"{', '.join(SIDECAR_DTYPES)}, 'shape': [ints]}}") from None
        signatures.append(InputSignature(name, shape, dtype))
    return signatures


def sidecar_for(dump: str | Path) -> Path | None:
    """``dumps/x.mlir`` -> ``dumps/x.json`` when that file exists."""
    candidate = Path(dump).with_suffix(".json")
    return candidate if candidate.is_file() else None


def global_shape(local: tuple[int, ...], sharding: str | None) -> tuple[int, ...]:
    """Local shape times the tile counts of an ``mhlo.sharding`` string (XLA's parser)."""
    if not sharding:
        return local
    from jaxlib import xla_client

    try:
        parsed = xla_client.HloSharding.from_string(sharding)
    except Exception:  # noqa: BLE001 - XLA raises its own error type for a bad sharding string
        log.warning("unreadable mhlo.sharding %r: taken as replicated", sharding)
        return local
    if not parsed.is_tiled():
        return local
    tiles = parsed.tile_assignment_dimensions()
    return tuple(size * tiles[axis] for axis, size in enumerate(local))


class _Scope:
    """Liveness bookkeeping of one block: value -> (bytes, first position, last position)."""

    def __init__(self) -> None:
        self.index = 0
        self.values: dict[ir.Value, list[int]] = {}
        self.transient: dict[int, int] = {}
        self.names: list[str] = []

    def define(self, value: ir.Value, nbytes: int, position: int) -> None:
        self.values[value] = [nbytes, position, position]

    def use(self, value: ir.Value, position: int) -> None:
        record = self.values[value]
        record[2] = max(record[2], position)

    def peak(self) -> tuple[int, int]:
        """(peak bytes, position of the peak) over this block's positions."""
        count = max(self.index, 1)
        delta = [0] * (count + 1)
        for nbytes, first, last in self.values.values():
            delta[max(first, 0)] += nbytes
            delta[min(last, count - 1) + 1] -= nbytes
        best, best_position, live = 0, 0, 0
        for position in range(count):
            live += delta[position]
            total = live + self.transient.get(position, 0)
            if total > best:
                best, best_position = total, position
        return best, best_position


class MemoryVisitor(IRVisitor):
    """Weights, stage inputs and the peak of live activations of the entry function."""

    skip_scalar_bodies = True

    def __init__(self, inputs: Sequence[InputSignature] | None = None) -> None:
        super().__init__()
        self.inputs = list(inputs) if inputs is not None else None
        self.types = TypeTable()
        self._type_bytes: dict[ir.Type, int] = {}
        self._scopes: list[_Scope] = []
        self._call_stack: list[str] = []  # callees being measured (a call cycle is not re-entered)
        self._callee_peaks: dict[str, int] = {}  # a callee's own peak, measured once
        self._entry_seen = False
        self.weight_bytes = self.weight_arguments = 0
        self.input_bytes = self.input_arguments = self.scalar_bytes = self.stale_kv_bytes = 0
        self.peak_live_bytes = self.peak_position = 0
        self.peak_op = ""

    def result(self, capacity_bytes: float | None = None) -> MemoryUsage:
        return MemoryUsage(
            weight_bytes=self.weight_bytes, weight_arguments=self.weight_arguments,
            input_bytes=self.input_bytes, input_arguments=self.input_arguments,
            scalar_bytes=self.scalar_bytes,
            weights_source=FROM_SIDECAR if self.inputs is not None else ALL_ARGUMENTS,
            peak_live_bytes=self.peak_live_bytes, peak_position=self.peak_position,
            peak_op=self.peak_op, stale_kv_bytes=self.stale_kv_bytes,
            capacity_bytes=capacity_bytes)

    # -- the entry function ---------------------------------------------------------------------
    def visit_func(self, op: Any) -> None:
        """The first function reached is the entry (``visit_module`` starts at public ones)."""
        if self._entry_seen:
            return
        self._entry_seen = True
        block = op.operation.regions[0].blocks[0]
        scope = _Scope()
        self._scopes.append(scope)
        self._classify_arguments(op, block, scope)
        for inner in block.operations:
            self.visit(inner)
        self._scopes.pop()
        self.peak_live_bytes, self.peak_position = scope.peak()
        if scope.names:
            self.peak_op = scope.names[min(self.peak_position, len(scope.names) - 1)]

    def visit_return(self, op: Any) -> None:
        """Returned values stay live to the end of their block."""
        self._record(op, live_to_end=True)

    def visit_call(self, op: Any) -> None:
        """A call holds the callee's temporaries while it runs."""
        callee = ir.FlatSymbolRefAttr(op.operation.attributes["callee"]).value
        function = self._symbols.get(callee)
        extra = 0
        if callee in self._callee_peaks:
            extra = self._callee_peaks[callee]
        elif function is not None and callee not in self._call_stack:
            self._call_stack.append(callee)
            try:
                extra = self._body_peak(function.operation.regions[0].blocks[0])
            finally:
                self._call_stack.pop()
            self._callee_peaks[callee] = extra
        self._record(op, extra_bytes=extra)

    def generic_visit(self, node: Any) -> None:
        if isinstance(node, (ir.Region, ir.Block)):
            super().generic_visit(node)
            return
        if not self._scopes:  # module-level ops outside functions (e.g. sdy.mesh)
            return
        operation = node.operation
        extra = 0
        if len(operation.regions) and short_op_name(operation.name) not in SCALAR_BODY_OPS:
            for region in operation.regions:
                for block in region.blocks:
                    extra = max(extra, self._body_peak(block))
        self._record(node, extra_bytes=extra)

    # -- helpers --------------------------------------------------------------------------------
    def _record(self, node: Any, *, extra_bytes: int = 0, live_to_end: bool = False) -> None:
        scope = self._scopes[-1]
        operation = node.operation
        position = scope.index
        used = _used_values(operation) if len(operation.regions) else operation.operands
        if len(self._scopes) == 1 and not live_to_end:  # the hot path: a top-level op
            values = scope.values
            for value in used:
                record = values.get(value)
                if record is not None and record[2] < position:
                    record[2] = position
        else:
            for value in used:
                self._use(value, position, live_to_end)
        values = scope.values
        for value in operation.results:
            values[value] = [self._bytes(value, node), position, position]
        if extra_bytes:
            scope.transient[position] = extra_bytes
        scope.names.append(operation.name)
        scope.index += 1

    def _use(self, value: ir.Value, position: int, live_to_end: bool) -> None:
        """Mark ``value`` used by the op now running in the innermost scope that defines it."""
        for depth in range(len(self._scopes) - 1, -1, -1):
            scope = self._scopes[depth]
            if value in scope.values:
                at = scope.index if depth < len(self._scopes) - 1 else position
                scope.use(value, 1 << 62 if live_to_end and depth == len(self._scopes) - 1 else at)
                return

    def _body_peak(self, block: ir.Block) -> int:
        """Peak of a nested body's own temporaries (its arguments alias the op's operands)."""
        scope = _Scope()
        self._scopes.append(scope)
        try:
            for inner in block.operations:
                self.visit(inner)
        finally:
            self._scopes.pop()
        return scope.peak()[0]

    def _classify_arguments(self, function: Any, block: ir.Block, scope: _Scope) -> None:
        remaining = ([(s.shape, s.dtype, s.name.startswith(STALE_KV_PREFIX)) for s in self.inputs]
                     if self.inputs is not None else None)
        shardings = _argument_shardings(function)
        for index, argument in enumerate(block.arguments):
            nbytes = self._bytes(argument, function)
            shape = self.types.shape(argument, function) if nbytes else ()
            if not shape:
                self.scalar_bytes += nbytes
                continue
            if remaining is not None:
                key = (global_shape(shape, shardings[index]), self.types.dtype(argument))
                match = next((entry for entry in remaining if entry[:2] == key), None)
                if match is not None and match[2]:  # a PipeFusion stale K/V buffer: resident
                    remaining.remove(match)
                    self.stale_kv_bytes += nbytes
                    continue
                if match is not None:
                    remaining.remove(match)
                    self.input_bytes += nbytes
                    self.input_arguments += 1
                    scope.define(argument, nbytes, 0)
                    continue
            self.weight_bytes += nbytes
            self.weight_arguments += 1
        if remaining:
            # XLA drops parameters a program never reads (t passes through a middle stage).
            log.info("sidecar inputs that the program does not take: %s", remaining)

    def _bytes(self, value: ir.Value, op: Any) -> int:
        value_type = value.type
        nbytes = self._type_bytes.get(value_type)
        if nbytes is None:
            # tokens and tuples of nothing hold no bytes
            nbytes = (self.types.nbytes(value, op)
                      if isinstance(value_type, ir.RankedTensorType) else 0)
            self._type_bytes[value_type] = nbytes
        return nbytes


def _used_values(operation: Any) -> list[ir.Value]:
    """Operands of ``operation`` and of every op nested in its regions (free values included)."""
    values = list(operation.operands)
    if short_op_name(operation.name) in SCALAR_BODY_OPS:
        return values
    for region in operation.regions:
        for block in region.blocks:
            for inner in block.operations:
                values.extend(_used_values(inner.operation))
    return values


def _argument_shardings(function: Any) -> list[str | None]:
    attributes = function.operation.attributes
    count = len(function.operation.regions[0].blocks[0].arguments)
    if "arg_attrs" not in attributes:
        return [None] * count
    shardings: list[str | None] = []
    for entry in ir.ArrayAttr(attributes["arg_attrs"]):
        dictionary = ir.DictAttr(entry)
        shardings.append(ir.StringAttr(dictionary["mhlo.sharding"]).value
                         if "mhlo.sharding" in dictionary else None)
    return shardings + [None] * (count - len(shardings))


def measure_memory(module: ir.Module, inputs: Sequence[InputSignature] | None = None, *,
                   capacity_bytes: float | None = None) -> MemoryUsage:
    visitor = MemoryVisitor(inputs)
    visitor.visit(module)
    return visitor.result(capacity_bytes)


def add_memory_section(report: Any, module: ir.Module, dump: str, *, sidecar: str | None = None,
                       hardware: str | None = None) -> MemoryUsage:
    """Measure ``module`` and add the ``memory`` section to ``report``; the capacity is the DRAM
    of ``hardware``'s chip when the description gives one."""
    sidecar_path = Path(sidecar) if sidecar else sidecar_for(dump)
    inputs = read_sidecar_inputs(sidecar_path) if sidecar_path else None
    capacity = None
    if hardware is not None:
        from hardware import as_system, load_hardware

        capacity = as_system(load_hardware(hardware)).chip.dram_capacity_bytes
    usage = measure_memory(module, inputs, capacity_bytes=capacity)
    report.extra["memory"] = usage.to_dict() | {
        "sidecar": str(sidecar_path) if sidecar_path else None}
    return usage
