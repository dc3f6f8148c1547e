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

**Fused attention** (``held_in_tiles``; ``hlo_analyzer.attention_memory``): the ops whose results
a fused kernel keeps in on-chip tiles (a flash attention's scores and softmax) take no memory, so
a program traced with attention written out is charged what flash-attention's tiling holds: its
q, k, v and output, no (heads x S_Q x S_KV) score buffer.

``total_bytes = weight_bytes + scalar_bytes + stale_kv_bytes + peak_live_bytes``. With a chip capacity (the
hardware description's ``dram_capacity``) ``exceeds_capacity`` flags a device that does not fit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from jaxlib.mlir import ir

from hlo_analyzer.sidecar import Sidecar, as_sidecar
from hlo_analyzer.tensors import SHARDING_ATTRIBUTE, TypeTable, sharding_tiles
from hlo_analyzer.visitor import IRVisitor, symbol_name
from hlo_trace.documents import dataclass_from_dict
from hlo_trace.errors import InputFileError

log = logging.getLogger(__name__)

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

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> MemoryUsage:
        """The usage :meth:`to_dict` wrote, read back where a report crosses a process
        (``origin`` names it in errors; the totals and the verdict are computed again)."""
        return dataclass_from_dict(cls, document, origin, "a memory section")


@dataclass(frozen=True)
class MemorySection:
    """A report's memory section: the ``usage`` of one device, measured with the inputs of the
    ``sidecar`` at that path (None: without one, every argument counted as a weight), with the
    attentions ``written`` as the program holds them or ``fused`` (held in tiles:
    ``hlo_analyzer.attention_memory``; only then does the section name it)."""

    usage: MemoryUsage
    sidecar: str | None
    attention: str = "written"

    def to_dict(self) -> dict[str, Any]:
        fused = {"attention": "fused"} if self.attention == "fused" else {}
        return self.usage.to_dict() | {"sidecar": self.sidecar} | fused

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> MemorySection:
        """The section :meth:`to_dict` wrote (a report's ``memory``), read back."""
        usage = MemoryUsage.from_dict(document, origin)
        attention = document.get("attention", "written")
        if attention not in ("written", "fused"):
            raise InputFileError(f"{origin}: memory.attention is {attention!r}: expected 'written' or 'fused'")
        return cls(usage, document.get("sidecar"), attention)


def read_sidecar_inputs(sidecar: Sidecar | str | Path | None) -> list[InputSignature] | None:
    """The ``inputs`` of a tracer sidecar (or of the sidecar at that path), or None if it has
    no such section."""
    sidecar = as_sidecar(sidecar)
    if sidecar is None or sidecar.inputs is None:
        return None
    return [InputSignature(t.name, t.shape, t.element_type) for t in sidecar.inputs]


def global_shape(local: tuple[int, ...], sharding: str | None) -> tuple[int, ...]:
    """Local shape times the tile counts of an ``mhlo.sharding`` string (XLA's parser)."""
    tiles = sharding_tiles(sharding)
    if tiles is None:
        return local
    return tuple(size * tiles[axis] for axis, size in enumerate(local))


#: Last use of a value that a ``return`` hands back: it stays live to the end of its region.
LIVE_TO_END = 1 << 62


class _Liveness:
    """Liveness bookkeeping of one region: value -> [bytes, first index, last index], indices
    counting the region's ops in order. ``outer`` holds the enclosing regions' tables, innermost
    first, each with the index of the op (in it) that holds this region.

    Values are keyed by ``hash(value)``: the bindings hash a value by its MLIR pointer, unique
    among the values of the (live) module, and an int key does not keep the value's Python
    object, nor the op object it holds, alive: a 1M-op program would keep 1M of each."""

    def __init__(self, outer: tuple[tuple[_Liveness, int], ...]) -> None:
        self.index = 0
        self.last_position = -1  # walk position of the op recorded last
        self.values: dict[int, list[int]] = {}
        self.transient: dict[int, int] = {}
        self.names: list[str] = []
        self.outer = outer

    def define(self, value: ir.Value, nbytes: int, position: int) -> None:
        self.values[hash(value)] = [nbytes, position, position]

    def peak(self) -> tuple[int, int]:
        """(peak bytes, position of the peak) over this region's positions."""
        count = max(self.index, 1)
        delta = [0] * (count + 1)
        end = count - 1
        for nbytes, first, last in self.values.values():
            delta[first if first > 0 else 0] += nbytes
            delta[(last if last < end else end) + 1] -= nbytes
        live = list(accumulate(delta[:count]))  # bytes live at each position
        for position, extra in self.transient.items():
            if 0 <= position < count:
                live[position] += extra
        best = max(live)
        return (best, live.index(best)) if best > 0 else (0, 0)  # the first position of the peak


class MemoryVisitor(IRVisitor):
    """Weights, stage inputs and the peak of live activations of the entry function.

    Each op is recorded in the liveness table of the region it sits in (one per walked scope);
    the peaks of nested regions and called functions are added to the ops that hold them after
    the walk, innermost first (``result``). So the visitor walks like the others and can follow
    them (``IRVisitor.walk_with``) in one walk of the module.
    """

    skip_scalar_bodies = True

    def __init__(self, inputs: Sequence[InputSignature] | None = None,
                 types: TypeTable | None = None, *,
                 held_in_tiles: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.inputs = list(inputs) if inputs is not None else None
        #: walk positions of ops whose results a fused kernel keeps on chip: no memory
        self.held_in_tiles = held_in_tiles
        self.types = types if types is not None else TypeTable()
        self.types.reads_values = True  # liveness reads every op's values
        self._type_bytes: dict[ir.Type, int] = {}
        self._tables: dict[int, _Liveness] = {}  # scope -> its table
        self._table_scope = -1
        self._table: _Liveness | None = None
        self._bodies: dict[str, _Liveness] = {}  # function -> table of its body
        self._calls: list[tuple[_Liveness, int, str]] = []  # (table, index of the call, callee)
        self._entry: Any = None  # the entry function's func.func op
        self._entry_table: _Liveness | None = None
        self.weight_bytes = self.weight_arguments = 0
        self.input_bytes = self.input_arguments = self.scalar_bytes = self.stale_kv_bytes = 0

    def result(self, capacity_bytes: float | None = None) -> MemoryUsage:
        peak_live_bytes = peak_position = 0
        peak_op = ""
        entry = self._entry_table
        if entry is not None:
            peaks = self._peaks(entry)
            peak_live_bytes, peak_position = peaks[id(entry)]
            if entry.names:
                peak_op = entry.names[min(peak_position, len(entry.names) - 1)]
        return MemoryUsage(
            weight_bytes=self.weight_bytes, weight_arguments=self.weight_arguments,
            input_bytes=self.input_bytes, input_arguments=self.input_arguments,
            scalar_bytes=self.scalar_bytes,
            weights_source=FROM_SIDECAR if self.inputs is not None else ALL_ARGUMENTS,
            peak_live_bytes=peak_live_bytes, peak_position=peak_position,
            peak_op=peak_op, stale_kv_bytes=self.stale_kv_bytes,
            capacity_bytes=capacity_bytes)

    # -- ops ------------------------------------------------------------------------------------
    def visit_func(self, op: Any) -> None:
        """The first function reached is the entry (``visit_module`` starts at public ones)."""
        if self._entry is None:
            self._entry = op
        super().generic_visit(op)  # walks the body (unless following: the leader walks)

    def visit_return(self, op: Any) -> None:
        """Returned values stay live to the end of their block."""
        self._record(op, live_to_end=True)

    def visit_call(self, op: Any) -> None:
        """A call holds the callee's temporaries while it runs."""
        self._record_calling(op, ir.FlatSymbolRefAttr(op.operation.attributes["callee"]).value)
        super().visit_call(op)

    def generic_visit(self, node: Any) -> None:
        if isinstance(node, (ir.Region, ir.Block)):
            super().generic_visit(node)
        else:
            self._record(node)  # an op with regions holds their temporaries: see result()
            self.walk_regions(node)

    # -- liveness -------------------------------------------------------------------------------
    def _record(self, node: Any, *, live_to_end: bool = False) -> None:
        """Record the op in its region's table: its operands used now, its results defined."""
        if self.scope != self._table_scope:
            self._table, self._table_scope = self._table_for(self.scope), self.scope
        table = self._table
        if table is None:  # module-level ops outside functions (e.g. sdy.mesh)
            return
        facts = self.types.facts(node)
        index = table.index
        values = table.values
        for key in map(hash, facts.operands):
            record = values.get(key)
            if record is None:
                if table.outer:
                    _use_outer(key, table.outer)
            elif live_to_end:
                record[2] = LIVE_TO_END
            elif record[2] < index:
                record[2] = index
        type_bytes = self._type_bytes
        tiled = self.position in self.held_in_tiles
        for value, value_type in zip(facts.results, facts.result_types):
            nbytes = type_bytes.get(value_type)
            if nbytes is None:
                nbytes = self._bytes(value_type, node)
            values[hash(value)] = [0 if tiled else nbytes, index, index]
        table.names.append(self.op_name)
        table.index = index + 1
        table.last_position = self.position

    def _record_calling(self, op: Any, callee: str) -> None:
        self._record(op)
        if self._table is not None:
            self._calls.append((self._table, self._table.index - 1, callee))

    def _table_for(self, scope: int) -> _Liveness | None:
        """The table of ``scope``, made on its first op; None outside functions."""
        table = self._tables.get(scope)
        if table is not None:
            return table
        info = self.scopes[scope]
        if info.parent < 0:  # a root scope holds only its func.func (or module-level ops)
            return None
        parent = self._tables.get(info.parent)
        if parent is None:  # a function's body
            table = _Liveness(())
            if info.owner_name == "func":
                self._bodies.setdefault(info.function, table)
                if (self._entry_table is None and self._entry is not None
                        and self.scopes[info.parent].function == info.function
                        and info.function == symbol_name(self._entry)):
                    self._entry_table = table
                    self._classify_arguments(self._entry, table)
        else:  # a nested region, walked right after the op that holds it
            assert parent.last_position == info.owner, (scope, info)
            table = _Liveness(((parent, parent.index - 1),) + parent.outer)
        self._tables[scope] = table
        return table

    def _peaks(self, entry: _Liveness) -> dict[int, tuple[int, int]]:
        """(peak bytes, its index) of ``entry`` and of every table it holds, nested regions and
        callees first (iteratively: nesting of any depth); a region's peak is charged to the op
        holding it as a transient, the largest of its regions, as is a callee's peak."""
        held: dict[int, list[tuple[int, _Liveness]]] = {}
        for table in self._tables.values():
            if table.outer:
                outer, index = table.outer[0]
                held.setdefault(id(outer), []).append((index, table))
        for table, index, callee in self._calls:
            body = self._bodies.get(callee)
            if body is not None:
                held.setdefault(id(table), []).append((index, body))
        peaks: dict[int, tuple[int, int]] = {}
        started: set[int] = set()
        stack = [entry]
        while stack:
            table = stack[-1]
            inner = held.get(id(table), ())
            if id(table) not in started:
                started.add(id(table))
                stack.extend(child for _, child in inner if id(child) not in started)
                continue
            stack.pop()
            if id(table) in peaks:
                continue
            for index, child in inner:  # a child still in progress is a call cycle: nothing
                extra = peaks.get(id(child), (0, 0))[0]
                if extra > table.transient.get(index, 0):
                    table.transient[index] = extra
            peaks[id(table)] = table.peak()
        return peaks

    def _classify_arguments(self, function: Any, table: _Liveness) -> None:
        block = function.operation.regions[0].blocks[0]
        remaining = ([(s.shape, s.dtype, s.name.startswith(STALE_KV_PREFIX)) for s in self.inputs]
                     if self.inputs is not None else None)
        shardings = argument_shardings(function)
        for index, argument in enumerate(block.arguments):
            nbytes = self._bytes(argument.type, function)
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
                    table.define(argument, nbytes, 0)
                    continue
            self.weight_bytes += nbytes
            self.weight_arguments += 1
        if remaining:
            # XLA drops parameters a program never reads (t passes through a middle stage).
            log.info("sidecar inputs that the program does not take: %s", remaining)

    def _bytes(self, value_type: ir.Type, op: Any) -> int:
        nbytes = self._type_bytes.get(value_type)
        if nbytes is None:
            # tokens and tuples of nothing hold no bytes
            nbytes = (self.types.type_nbytes(value_type, op)
                      if isinstance(value_type, ir.RankedTensorType) else 0)
            self._type_bytes[value_type] = nbytes
        return nbytes


def _use_outer(key: int, outer: tuple[tuple[_Liveness, int], ...]) -> None:
    """Mark the value ``key`` used by the op holding the current region, in the innermost
    enclosing region that defines it (a body reads it while that op runs)."""
    for table, index in outer:
        record = table.values.get(key)
        if record is not None:
            if record[2] < index:
                record[2] = index
            return


def argument_shardings(function: Any) -> list[str | None]:
    attributes = function.operation.attributes
    count = len(function.operation.regions[0].blocks[0].arguments)
    if "arg_attrs" not in attributes:
        return [None] * count
    shardings: list[str | None] = []
    for entry in ir.ArrayAttr(attributes["arg_attrs"]):
        dictionary = ir.DictAttr(entry)
        shardings.append(ir.StringAttr(dictionary[SHARDING_ATTRIBUTE]).value
                         if SHARDING_ATTRIBUTE in dictionary else None)
    return shardings + [None] * (count - len(shardings))


def measure_memory(module: ir.Module, inputs: Sequence[InputSignature] | None = None, *,
                   capacity_bytes: float | None = None,
                   held_in_tiles: frozenset[int] = frozenset()) -> MemoryUsage:
    """The memory of ``module``; ``held_in_tiles``: walk positions (``OpRow.position``) of ops
    whose results take no memory (a fused kernel keeps them on chip)."""
    visitor = MemoryVisitor(inputs, held_in_tiles=held_in_tiles)
    visitor.visit(module)
    return visitor.result(capacity_bytes)


