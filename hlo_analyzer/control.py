"""How many times each op runs: loops, conditionals and calls, weighed after the walk.

The walk (``IRVisitor``) visits every function once and every region once, recording for each op
its *scope* (the region it sits in), every call site and every ``while``/``if``/``case``. This
module turns that record into an execution count per scope:

* ``while``: its regions run ``trip_count`` times when the trip count is static: a
  ``known_trip_count`` in the op's ``backend_config``, or the counter pattern of ``scan`` and
  ``fori_loop`` (the condition compares one loop variable against a constant, the body adds a
  constant to it, its initial value is a constant; copies, converts and single-op fusions on the
  way are seen through). The bound may also be another loop variable that the body hands back
  unchanged and whose initial value is a constant (torch-xla's ``max_pool2d_with_indices``). Otherwise once, and the loop is flagged ``unknown``. (The condition
  region runs once more than the body; it is weighed like the body, which for a counter compare
  is one op.)
* ``if``/``case``: one branch runs. ``branch="max"`` (default, as XLA's HloCostAnalysis) picks the
  branch with the most FLOPs (then the most bytes sent); ``"first"`` region 0; an integer ``N``
  region ``N`` of every conditional (for ``if``, 0 is the true branch; jax's ``lax.cond`` lowers to
  ``case`` whose region 0 is the *false* branch). Branches not taken get count 0.
* calls: a function's count is the sum over its call sites of the caller's count times the
  count of the call's scope. Totals per function are computed once, bottom-up over the call DAG
  (callees first), so a DAG of any depth costs one pass. Functions nothing calls are roots
  (count 1); a public function that ``main`` calls is counted per call, never also as a root.
  A call cycle has no static count: ``UnsupportedIRError``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import mhlo, stablehlo

from hlo_analyzer.tensors import format_location
from hlo_analyzer.visitor import CallSite, Scope, short_op_name
from hlo_trace.errors import UnsupportedIRError, UsageError
from hlo_trace.numbers import brief, parse_int

#: A scope's cost, the key that decides the most expensive branch: (FLOPs, bytes sent).
Cost = tuple[float, float]

#: Ops a loop counter or bound may pass through unchanged on its way (value-preserving).
_TRANSPARENT_OPS = frozenset({"copy", "convert", "reshape", "bitcast", "broadcast_in_dim"})
#: Ops that are the identity when their result has their operand's type.
_IDENTITY_WHEN_SAME_TYPE = frozenset({"convert", "reshape", "bitcast", "bitcast_convert"})

BRANCH_POLICIES = ("max", "first")
#: Largest region index ``--branch N`` takes (a case op with more regions is no real program).
MAX_BRANCH = 10**6


@dataclass(frozen=True)
class LoopInfo:
    position: int
    location: str
    trip_count: int | None  # None: not statically derivable, counted once
    source: str  # "known_trip_count", "counter" or "unknown"
    executions: int  # times the while op itself is reached


@dataclass(frozen=True)
class ConditionalInfo:
    position: int
    op: str
    location: str
    branch_flops: tuple[float, ...]
    branch_comm_bytes: tuple[float, ...]
    taken: int  # region index of the branch counted
    executions: int


@dataclass(frozen=True)
class ControlFlow:
    scope_counts: tuple[int, ...]
    loops: tuple[LoopInfo, ...]
    conditionals: tuple[ConditionalInfo, ...]
    function_counts: Mapping[str, int]


def parse_branch(text: str) -> str | int:
    """``--branch max|first|N`` -> the policy (``UsageError`` for anything else)."""
    if text in BRANCH_POLICIES:
        return text
    try:
        return parse_int(text, minimum=0, maximum=MAX_BRANCH)
    except ValueError:
        raise UsageError(f"--branch {brief(text)}: expected max, first or a region index N "
                         f"from 0 to {MAX_BRANCH} in ASCII digits") from None


def resolve(scopes: Sequence[Scope], call_sites: Sequence[CallSite],
            structure_ops: Mapping[int, tuple[Any, int]], walked_functions: Sequence[str],
            own_costs: Mapping[int, Cost], branch: str | int = "max") -> ControlFlow:
    """Execution count of every scope; see the module docstring."""
    trips = {position: trip_count(op) for position, (op, _) in structure_ops.items()
             if short_op_name(op.operation.name) == "while"}
    order = _function_order(scopes, call_sites, walked_functions)
    by_function: dict[str, list[int]] = defaultdict(list)
    for index, scope in enumerate(scopes):
        by_function[scope.function].append(index)
    calls_in: dict[int, list[CallSite]] = defaultdict(list)
    for site in call_sites:
        calls_in[site.scope].append(site)

    # Bottom-up: each scope's total cost, callees first; choose the branch of each conditional.
    taken: dict[int, int] = {}
    branch_costs: dict[int, list[tuple[int, Cost]]] = {}
    function_total: dict[str, Cost] = {}
    for function in reversed(order):
        acc: dict[int, Cost] = {}
        pending: dict[int, dict[int, list[tuple[int, Cost]]]] = defaultdict(lambda: defaultdict(list))
        for index in reversed(by_function[function]):
            total = _add(acc.get(index, (0.0, 0.0)), own_costs.get(index, (0.0, 0.0)))
            for site in calls_in.get(index, ()):
                total = _add(total, function_total.get(site.callee, (0.0, 0.0)))
            for owner, branches in pending.pop(index, {}).items():
                choice = _choose(branches, branch, structure_ops[owner][0])
                taken[owner] = choice
                branch_costs[owner] = sorted(branches)
                total = _add(total, dict(branches)[choice])
            scope = scopes[index]
            if scope.parent < 0:
                function_total[function] = total
            elif scope.owner_name in ("if", "case"):
                pending[scope.parent][scope.owner].append((scope.region, total))
            else:
                factor = _trip_factor(trips, scope.owner) if scope.owner_name == "while" else 1
                acc[scope.parent] = _add(acc.get(scope.parent, (0.0, 0.0)), _scale(total, factor))

    # Top-down: count within the function (product of factors along the scope chain), then
    # function counts from call sites, callers first.
    local = [1] * len(scopes)
    for index, scope in enumerate(scopes):
        if scope.parent < 0:
            continue
        factor = 1
        if scope.owner_name == "while":
            factor = _trip_factor(trips, scope.owner)
        elif scope.owner_name in ("if", "case"):
            factor = int(taken.get(scope.owner) == scope.region)
        local[index] = local[scope.parent] * factor
    called = {site.callee for site in call_sites}
    function_count: dict[str, int] = {name: (0 if name in called else 1) for name in order}
    function_count[""] = 1
    for function in order:
        for index in by_function[function]:
            for site in calls_in.get(index, ()):
                function_count[site.callee] += function_count[function] * local[index]
    counts = tuple(function_count.get(scope.function, 0) * local[index]
                   for index, scope in enumerate(scopes))

    loops, conditionals = [], []
    for position, (op, scope_index) in sorted(structure_ops.items()):
        executions = counts[scope_index]
        location = format_location(op.operation.location)
        if position in trips:
            trip, source = trips[position] if trips[position] else (None, "unknown")
            loops.append(LoopInfo(position, location, trip, source, executions))
        elif position in taken:
            costs = [cost for _, cost in branch_costs[position]]
            conditionals.append(ConditionalInfo(
                position, op.operation.name, location, tuple(c[0] for c in costs),
                tuple(c[1] for c in costs), taken[position], executions))
    return ControlFlow(counts, tuple(loops), tuple(conditionals), dict(function_count))


# -- trip counts ------------------------------------------------------------------------------
def trip_count(while_op: Any) -> tuple[int, str] | None:
    """(trip count, how it was found) of a ``while``, or None when not statically derivable."""
    known = _known_trip_count(while_op.operation)
    if known is not None:
        return known, "known_trip_count"
    counted = _counter_trip_count(while_op.operation)
    return (counted, "counter") if counted is not None else None


def _known_trip_count(operation: Any) -> int | None:
    attributes = operation.attributes
    if "backend_config" not in attributes:
        return None
    attribute = attributes["backend_config"]
    if not isinstance(attribute, ir.StringAttr):
        return None
    try:  # a JSON string attribute (XLA's backend_config), read with json, not by pattern
        config = json.loads(attribute.value)
        value = int(config["known_trip_count"]["n"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return value if value >= 0 else None


def _counter_trip_count(operation: Any) -> int | None:
    if len(operation.regions) != 2:
        return None
    cond_block = operation.regions[0].blocks[0]
    body_block = operation.regions[1].blocks[0]
    cond_ops = list(cond_block.operations)
    if not cond_ops:
        return None
    compare = _source_op(cond_ops[-1].operation.operands[0])
    if compare is None or short_op_name(compare.name) != "compare":
        return None
    direction = _direction(compare)
    lhs, rhs = (_trace(value) for value in compare.operands)
    for counter, bound, flip in ((lhs, rhs, False), (rhs, lhs, True)):
        index = _block_argument_index(counter, cond_block)
        limit = _constant(bound)
        if limit is None:
            limit = _invariant_constant(operation, bound, cond_block, body_block)
        if index is None or limit is None:
            continue
        init = _constant(operation.operands[index])
        step = _step(body_block, index)
        if init is None or step is None:
            return None
        return _iterations(init, limit, step, _flip(direction) if flip else direction)
    return None


def _invariant_constant(operation: Any, value: ir.Value, cond_block: Any, body_block: Any) -> int | None:
    """The constant a loop variable holds in every iteration, or None: ``value`` is loop
    variable ``j`` of the condition, the body hands its own ``j`` back unchanged (``_unchanged``),
    and the loop's initial ``j`` is a constant. (torch-xla's ``max_pool2d_with_indices`` loops
    from 0 to a bound carried this way.)"""
    index = _block_argument_index(value, cond_block)
    if index is None or index >= len(operation.operands):
        return None
    terminator = list(body_block.operations)[-1].operation
    if index >= len(terminator.operands) or not _unchanged(terminator.operands[index], body_block, index):
        return None
    return _constant(operation.operands[index])


def _unchanged(value: ir.Value, block: Any, index: int) -> bool:
    """True when ``value`` is argument ``index`` of ``block``, directly or through copies and
    ops that leave a value of one type as it is (a convert, reshape or bitcast to its own type):
    only those, so that no rounding, truncation or reordering can hide on the way."""
    for _ in range(64):  # bounded, as _trace
        if isinstance(value, ir.BlockArgument):
            return value.owner == block and value.arg_number == index
        producer = value.owner
        name = short_op_name(producer.name)
        if len(producer.operands) != 1 or not (
                name == "copy" or (name in _IDENTITY_WHEN_SAME_TYPE
                                   and producer.operands[0].type == value.type)):
            return False
        value = producer.operands[0]
    return False


def _iterations(init: int, limit: int, step: int, direction: str) -> int | None:
    """Iterations of ``for (i = init; i <direction> limit; i += step)``."""
    if step == 0:
        return None
    if direction in ("LT", "LE") and step > 0:
        end = limit if direction == "LT" else limit + 1
        return max(0, -(-(end - init) // step))
    if direction in ("GT", "GE") and step < 0:
        end = limit if direction == "GT" else limit - 1
        return max(0, -(-(init - end) // -step))
    if direction == "NE" and (limit - init) % step == 0 and (limit - init) // step >= 0:
        return (limit - init) // step
    return None


def _flip(direction: str) -> str:
    return {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)


def _direction(compare: Any) -> str:
    dialect = stablehlo if compare.name.startswith("stablehlo.") else mhlo
    return dialect.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value


def _step(body_block: Any, index: int) -> int | None:
    """The constant added to loop variable ``index`` by the body, or None."""
    terminator = list(body_block.operations)[-1].operation
    update = _source_op(terminator.operands[index])
    if update is None or short_op_name(update.name) not in ("add", "subtract"):
        return None
    lhs, rhs = (_trace(value) for value in update.operands)
    sign = -1 if short_op_name(update.name) == "subtract" else 1
    if _block_argument_index(lhs, body_block) == index and _constant(rhs) is not None:
        return sign * _constant(rhs)
    if sign == 1 and _block_argument_index(rhs, body_block) == index and _constant(lhs) is not None:
        return _constant(lhs)
    return None


def _trace(value: ir.Value) -> ir.Value:
    """Follow a value back through copies/converts and out of fusion bodies (to the fusion's
    operand); stops at anything else."""
    for _ in range(64):  # bounded: a chain longer than this is not a counter
        if isinstance(value, ir.BlockArgument):
            owner = value.owner.owner  # block -> the op owning its region
            if owner is not None and short_op_name(owner.name) == "fusion":
                value = owner.operands[value.arg_number]
                continue
            return value
        producer = value.owner
        name = short_op_name(producer.name)
        if name in _TRANSPARENT_OPS:
            value = producer.operands[0]
        elif name == "fusion":
            inner = list(producer.regions[0].blocks[0].operations)[-1].operation
            value = inner.operands[ir.OpResult(value).result_number]
        else:
            return value
    return value


def _source_op(value: ir.Value) -> Any:
    traced = _trace(value)
    return None if isinstance(traced, ir.BlockArgument) else traced.owner


def _block_argument_index(value: ir.Value, block: Any) -> int | None:
    if isinstance(value, ir.BlockArgument) and value.owner == block:
        return value.arg_number
    return None


def _constant(value: ir.Value) -> int | None:
    value = _trace(value)
    if isinstance(value, ir.BlockArgument) or short_op_name(value.owner.name) != "constant":
        return None
    attribute = value.owner.attributes["value"]
    if not isinstance(attribute, ir.DenseIntElementsAttr):
        return None
    array = np.array(attribute)
    return int(array.reshape(-1)[0]) if array.size else None


# -- helpers ----------------------------------------------------------------------------------
def _function_order(scopes: Sequence[Scope], call_sites: Sequence[CallSite],
                    walked: Sequence[str]) -> list[str]:
    """Walked functions, every caller before its callees; a call cycle is an error."""
    graph = nx.DiGraph()
    graph.add_nodes_from(walked)
    for site in call_sites:
        graph.add_edge(scopes[site.scope].function, site.callee)
    try:
        return list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:
        cycle = [edge[0] for edge in nx.find_cycle(graph)]
        raise UnsupportedIRError(
            "call cycle " + " -> ".join(f"@{name}" for name in cycle + cycle[:1])
            + ": recursion has no static cost") from None


def _choose(branches: list[tuple[int, Cost]], branch: str | int, op: Any) -> int:
    if branch == "max":  # the largest cost; the lowest region index among equals
        return max(branches, key=lambda item: (item[1], -item[0]))[0]
    if branch == "first":
        return min(index for index, _ in branches)
    regions = {index for index, _ in branches}
    if branch not in regions:
        raise UsageError(f"--branch {branch}: {op.operation.name} at "
                         f"{format_location(op.operation.location) or '?'} has only "
                         f"{len(regions)} branches (regions 0..{len(regions) - 1})")
    return int(branch)


def _trip_factor(trips: Mapping[int, tuple[int, str] | None], owner: int) -> int:
    """A while region's multiplier: its trip count, or 1 when unknown (flagged in the report)."""
    found = trips.get(owner)
    return found[0] if found else 1


def _add(a: Cost, b: Cost) -> Cost:
    return (a[0] + b[0], a[1] + b[1])


def _scale(a: Cost, factor: int) -> Cost:
    return (a[0] * factor, a[1] * factor)
