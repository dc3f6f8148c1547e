"""A training step's memory and communication split by what they hold and what they move.

A training-step dump (``trace-stage --mode train``, or any program whose sidecar has a
``training`` section, see ``tracing/training.py``) lists its persistent buffers in the sidecar:
each program argument and each output with a class (``param``, ``grad``, ``optimizer_state``,
``input``, ``output``), its global and local shape and its dtype.

**Memory per device** (the notes' P / G / OS / Act):

* ``param``: bytes of the arguments that are parameters, ``optimizer_state`` of those that are
  master weights and moments. An argument is matched to its sidecar entry by (global shape
  (its local shape times the tiles of its ``mhlo.sharding``), local shape, element type): two
  entries alike in all three have the same bytes, so a tie cannot change a total;
* ``grad``: bytes of the outputs that are gradients (outputs keep their order: the sidecar's
  ``outputs`` list is the entry function's results, checked by type and by shape: the local
  shape, or for an output left to GSPMD's layout a shape that tiles the global one);
* ``activation``: what the forward keeps for the backward: the values defined by a forward op,
  and the stage inputs that a forward op reads (not the gradients of the stage's outputs that
  arrive as inputs: no forward keeps them), that a backward op reads, each counted once, except
  values computed
  from the parameters and optimizer states alone (a gathered weight is a parameter, not an
  activation) and from constants.

**Phases.** An op is *forward* when its location (torch-xla's ``op_name``, which GSPMD copies to
the collectives it inserts for the op) carries the sidecar's forward scope, *optimizer* with
the optimizer scope, *backward* otherwise; a sidecar may name a backward marker too
(``scopes.backward``: JAX names the backward of a scope ``transpose(jvp(scope))``), which wins.

**Traffic.** A collective moves *parameters or gradients* (``param_grad``) when

* its operand is computed from parameters and optimizer states (and constants) alone, with at
  least one of them (a ZeRO-3 gather of a weight, in the forward or again in the backward; a
  rotation of constant zeros is activation traffic), or
* its result reaches a ``param``, ``grad`` or ``optimizer_state`` output through element-wise
  and layout ops only: no contraction (dot, convolution) and no reduction on the way (the sum of
  a weight gradient, the gather of the updated parameters);

else it moves *activations* (or their gradients: a Megatron all-reduce in the backward, a
Ulysses all-to-all, the caption K/V gradient that data parallelism sums). Each collective is
counted by (phase, traffic, kind) with the CommVisitor's per-device ring volume.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
from jaxlib.mlir import ir

from hlo_analyzer.comm import CommVisitor
from hlo_analyzer.dataflow import dependency_order
from hlo_analyzer.memory import argument_shardings, global_shape
from hlo_analyzer.sidecar import SIDECAR_DTYPES, Sidecar, as_sidecar
from hlo_analyzer.tensors import TypeTable, format_location
from hlo_analyzer.visitor import symbol_name
from hlo_trace.errors import InputFileError

PARAM, GRAD, OPTIMIZER_STATE, INPUT, OUTPUT = "param", "grad", "optimizer_state", "input", "output"
STATE_CLASSES = (PARAM, GRAD, OPTIMIZER_STATE)
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
PARAM_GRAD, ACTIVATION = "param_grad", "activation"

#: Ops through which a collective's result still *is* a parameter, gradient or state: not a
#: contraction and not a reduction (see the module docstring).
_STOPPING_OPS = (".dot", ".dot_general", ".convolution", ".reduce", ".reduce_window",
                 ".select_and_scatter", ".scatter", ".gather")


@dataclass(frozen=True)
class TrainingBuffer:
    name: str
    klass: str
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    dtype: str  # MLIR element type spelling


@dataclass(frozen=True)
class TrainingLayout:
    """The sidecar's ``training`` section: buffers and scope names."""

    arguments: tuple[TrainingBuffer, ...]
    outputs: tuple[TrainingBuffer, ...]
    forward_scope: str
    optimizer_scope: str
    backward_marker: str | None = None  # e.g. JAX's "transpose(": backward even in the scope

    def phase(self, location: str) -> str:
        if self.backward_marker and self.backward_marker in location:
            return BACKWARD
        if self.forward_scope in location:
            return FORWARD
        return OPTIMIZER if self.optimizer_scope in location else BACKWARD


#: The phases in the order a step runs them (:func:`node_phases`).
_PHASE_ORDER = {FORWARD: 0, BACKWARD: 1, OPTIMIZER: 2}


def node_phases(graph: nx.DiGraph, locations: dict[int, str], layout: TrainingLayout) -> dict[int, str]:
    """The phase of each node of a training step's dataflow graph (``hlo_analyzer.dataflow``):
    its location's (``locations``: node -> location, :meth:`TrainingLayout.phase`) where it has
    one. A node without (a cast, a copy or a view that torch-xla's lowering or GSPMD adds with
    no ``op_name``) runs for the first phase that reads it: the earliest phase of its readers;
    one that nothing with a phase reads (the step's outputs), in the latest phase of what it
    reads. (By the location alone the forward's unnamed casts and copies, and a fused kernel
    that ends in one, were the backward's; by what it reads alone, the backward's casts of
    the values the forward saved were the forward's.)"""
    phase = {node: layout.phase(location) for node, location in locations.items() if location and node in graph}
    order = dependency_order(graph)
    producers = graph.graph["producers"]
    upstream: dict[int, str] = {}
    for node in order:
        if node not in phase:
            read = [phase.get(p, upstream.get(p)) for p in producers[node]]
            upstream[node] = max((r for r in read if r is not None), key=_PHASE_ORDER.__getitem__, default=BACKWARD)
    for node in reversed(order):
        if node not in upstream:
            continue
        readers = [phase[r] for r in graph.successors(node) if r in phase]
        phase[node] = min(readers, key=_PHASE_ORDER.__getitem__) if readers else upstream[node]
    return phase


@dataclass(frozen=True)
class TrainingSplit:
    """Memory per device by class and communication by (phase, traffic, kind)."""

    memory: dict[str, int]  # param, grad, optimizer_state, activation, input
    comm: dict[tuple[str, str, str], tuple[int, float]] = field(default_factory=dict)
    #: Each collective's (phase, traffic) by its walk position (the report's rows' positions).
    collective_classes: dict[int, tuple[str, str]] = field(default_factory=dict)

    def comm_bytes(self, phase: str | None = None, traffic: str | None = None,
                   kind: str | None = None) -> float:
        return sum(volume for (p, t, k), (_, volume) in self.comm.items()
                   if (phase is None or p == phase) and (traffic is None or t == traffic)
                   and (kind is None or k == kind))

    def comm_count(self, phase: str | None = None, traffic: str | None = None,
                   kind: str | None = None) -> int:
        return sum(count for (p, t, k), (count, _) in self.comm.items()
                   if (phase is None or p == phase) and (traffic is None or t == traffic)
                   and (kind is None or k == kind))

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": dict(self.memory),
                "comm": [{"phase": p, "traffic": t, "kind": k, "count": count,
                          "bytes_per_device": volume}
                         for (p, t, k), (count, volume) in sorted(self.comm.items())]}

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> TrainingSplit:
        """The split :meth:`to_dict` wrote (a report's ``training``), read back where a report
        crosses a process (``origin`` names it in errors). The collectives' positions are not
        written: ``collective_classes`` comes back empty."""
        try:
            return cls(memory=dict(document["memory_bytes"]),
                       comm={(row["phase"], row["traffic"], row["kind"]):
                             (row["count"], row["bytes_per_device"]) for row in document["comm"]})
        except (KeyError, TypeError, ValueError) as error:
            raise InputFileError(f"{origin}: not a training section ({error!r})") from None


def read_training_layout(sidecar: Sidecar | str | Path) -> TrainingLayout | None:
    """The ``training`` section of a sidecar (or of the sidecar at that path), or None when it
    has none."""
    sidecar = as_sidecar(sidecar)
    assert sidecar is not None
    path = sidecar.path
    section = sidecar.section("training")
    if not isinstance(section, dict):
        return None

    def buffers(key: str) -> tuple[TrainingBuffer, ...]:
        entries = section.get(key)
        if not isinstance(entries, list):
            raise InputFileError(f"{path}: training.{key}: expected a list of buffers")
        result = []
        for index, entry in enumerate(entries):
            try:
                result.append(TrainingBuffer(
                    name=str(entry["name"]), klass=str(entry["class"]),
                    shape=tuple(int(d) for d in entry["shape"]),
                    local_shape=tuple(int(d) for d in entry["local_shape"]),
                    dtype=SIDECAR_DTYPES[entry["dtype"]]))
            except (KeyError, TypeError, ValueError):
                raise InputFileError(
                    f"{path}: training.{key}[{index}]: expected name, class, shape, local_shape "
                    f"and dtype (one of {', '.join(SIDECAR_DTYPES)})") from None
        return tuple(result)

    scopes = section.get("scopes") or {}
    return TrainingLayout(arguments=buffers("arguments"), outputs=buffers("outputs"),
                          forward_scope=str(scopes.get("forward", "hlo_trace_forward")),
                          optimizer_scope=str(scopes.get("optimizer", "hlo_trace_optimizer")),
                          backward_marker=scopes.get("backward"))


def entry_function(module: ir.Module) -> Any:
    """``main``, else the first public function of the module."""
    functions = [op for op in module.body.operations if op.operation.name == "func.func"]
    for function in functions:
        if symbol_name(function) == "main":
            return function
    for function in functions:
        attributes = function.operation.attributes
        if "sym_visibility" not in attributes or \
                ir.StringAttr(attributes["sym_visibility"]).value == "public":
            return function
    raise InputFileError("the module has no entry function")


class _CommOps(CommVisitor):
    """The CommVisitor, remembering the op of each row."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ops: list[Any] = []

    def _record(self, op: Any, *args: Any, **kwargs: Any) -> None:
        super()._record(op, *args, **kwargs)
        self.ops.append(op)


def measure_training(module: ir.Module, layout: TrainingLayout, origin: str = "dump",
                     num_devices: int | None = None) -> TrainingSplit:
    """Memory by class and collectives by (phase, traffic, kind); see the module docstring."""
    types = TypeTable()
    entry = entry_function(module)
    block = entry.operation.regions[0].blocks[0]
    memory = {PARAM: 0, GRAD: 0, OPTIMIZER_STATE: 0, "activation": 0, INPUT: 0}

    # Arguments: classes by (global shape, local shape, element type).
    shardings = argument_shardings(entry)
    remaining = list(layout.arguments)
    argument_class: dict[int, str] = {}
    for index, argument in enumerate(block.arguments):
        local = types.shape(argument, entry)
        dtype = types.dtype(argument)
        key = (global_shape(local, shardings[index]), local, dtype)
        match = next((b for b in remaining if (b.shape, b.local_shape, b.dtype) == key), None)
        if match is None:
            argument_class[hash(argument)] = "scalar" if not local else INPUT
            if local:
                raise InputFileError(
                    f"{origin}: argument {index} ({'x'.join(map(str, local))}x{dtype}, global "
                    f"{key[0]}) matches no entry of the sidecar's training.arguments")
            continue
        remaining.remove(match)
        argument_class[hash(argument)] = match.klass
        if match.klass in memory:
            memory[match.klass] += types.nbytes(argument, entry)

    # Outputs: in order.
    ops = list(block.operations)
    terminator = ops[-1]
    results = list(terminator.operation.operands)
    if len(results) != len(layout.outputs):
        raise InputFileError(f"{origin}: the entry function returns {len(results)} values, the "
                             f"sidecar's training.outputs lists {len(layout.outputs)}")
    output_classes: list[str] = []
    for index, (value, buffer) in enumerate(zip(results, layout.outputs)):
        local = types.shape(value, terminator)
        # An output its tracer left unmarked has the layout GSPMD gave it: its local shape need
        # only tile the global one.
        tiles = len(local) == len(buffer.shape) and all(
            size and whole % size == 0 for size, whole in zip(local, buffer.shape))
        if types.dtype(value) != buffer.dtype or not (local == buffer.local_shape or tiles):
            raise InputFileError(
                f"{origin}: output {index} is {local}x{types.dtype(value)}, the sidecar's "
                f"training.outputs[{index}] ({buffer.name}) {buffer.local_shape}x{buffer.dtype}")
        output_classes.append(buffer.klass)
        if buffer.klass == GRAD:
            memory[GRAD] += types.nbytes(value, terminator)

    # Forward pass over the ops: phases, values computed from the weights alone, saved values.
    phase_of_value: dict[int, str] = {}
    # Values computed from the parameters and states (and constants), with at least one of
    # them; and values computed from constants and scalars alone.
    from_weights: set[int] = {key for key, klass in argument_class.items()
                              if klass in (PARAM, OPTIMIZER_STATE)}
    static: set[int] = {key for key, klass in argument_class.items() if klass == "scalar"}
    value_bytes: dict[int, int] = {}
    inputs = {key for key, klass in argument_class.items() if klass == INPUT}
    for argument in block.arguments:
        if hash(argument) in inputs:
            value_bytes[hash(argument)] = types.nbytes(argument, entry)
    saved: set[int] = set()
    read_by_forward: set[int] = set()  # stage inputs; the others (grad_x ...) are no activations
    op_phase: dict[int, str] = {}
    for op in ops[:-1]:
        phase = layout.phase(format_location(op.operation.location))
        op_phase[hash(op.operation)] = phase
        operand_keys = [hash(v) for v in op.operation.operands]
        if phase == FORWARD:
            read_by_forward.update(key for key in operand_keys if key in inputs)
        if phase == BACKWARD:
            for key in operand_keys:
                if (key not in from_weights and key not in static and key not in saved
                        and (phase_of_value.get(key) == FORWARD or key in inputs)):
                    saved.add(key)
        is_static = all(key in static for key in operand_keys)
        is_weight = not is_static and all(key in from_weights or key in static
                                          for key in operand_keys)
        for value in op.operation.results:
            key = hash(value)
            phase_of_value[key] = phase
            if is_static:
                static.add(key)
            elif is_weight:
                from_weights.add(key)
            elif phase == FORWARD:
                value_bytes[key] = types.nbytes(value, op)
    memory["activation"] = sum(value_bytes.get(key, 0) for key in saved
                               if key not in inputs or key in read_by_forward)

    # Backward pass: values that reach a param / grad / optimizer-state output unreduced.
    reaches: set[int] = {hash(value) for value, klass in zip(results, output_classes)
                         if klass in STATE_CLASSES}
    for op in reversed(ops[:-1]):
        name = op.operation.name
        if name.endswith(_STOPPING_OPS):
            continue
        if any(hash(value) in reaches for value in op.operation.results):
            reaches.update(hash(value) for value in op.operation.operands)

    comm_visitor = _CommOps(num_devices=num_devices, types=types)
    comm_visitor.visit(module)
    comm: dict[tuple[str, str, str], list] = defaultdict(lambda: [0, 0.0])
    classes: dict[int, tuple[str, str]] = {}
    for row, op in zip(comm_visitor.rows, comm_visitor.ops):
        phase = op_phase.get(hash(op.operation))
        if phase is None:  # a collective inside a called function or loop body
            phase = layout.phase(row.location)
        operands = [hash(v) for v in op.operation.operands]
        moves_weights = bool(operands) and all(key in from_weights for key in operands)
        reaches_state = any(hash(v) in reaches for v in op.operation.results)
        traffic = PARAM_GRAD if moves_weights or reaches_state else ACTIVATION
        classes[row.position] = (phase, traffic)
        entry_row = comm[(phase, traffic, row.comm_kind)]
        entry_row[0] += row.count
        entry_row[1] += row.comm_bytes_per_device * row.count
    return TrainingSplit(memory=memory,
                         comm={key: (count, volume) for key, (count, volume) in comm.items()},
                         collective_classes=classes)


