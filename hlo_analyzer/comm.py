"""CommVisitor: collective communication per device, with ring formulas.

For each collective, ``M`` is the size in bytes of the tensor the formula is stated on and ``n``
the group size read from ``replica_groups``, in any form XLA and JAX write it: a dense list of
device ids (``dense<[[0, 1], [2, 3]]>``; empty means all devices), or mesh axes
(``#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [...]>`` over an ``sdy.mesh @m``, or
with the ``#stablehlo.mesh<...>`` written inline; MHLO's ``#mhlo.replica_group_mesh_axes``
alike): the groups are the devices that differ only
along the named axes (sub-axes included), the mesh's device ids in order (iota unless given).
Shardy's own collectives (``sdy.all_gather`` ...) are pre-partition annotations, not
communication, and are not measured. Per-device volume, ring algorithms:

=====================  ==================  =====================================================
op                     M                   bytes each device sends
=====================  ==================  =====================================================
all_reduce             operand             ``2 * M * (n-1) / n`` (reduce-scatter + all-gather)
all_gather             result (gathered)   ``M * (n-1) / n``
reduce_scatter         operand (full)      ``M * (n-1) / n``
all_to_all             operand             ``M * (n-1) / n``; Bruck: ``M * log2(n) / 2``
collective_permute     operand             ``M`` (each sender sends its buffer once)
collective_broadcast   operand             ``M``
=====================  ==================  =====================================================

An ``all_reduce`` whose every user is a ``dynamic_slice`` keeping 1/n of it (directly or through
transposes, reshapes and copies) is a reduce-scatter that XLA's CPU backend never forms as one op
(GSPMD writes it that way): it is counted as ``reduce_scatter`` (``M * (n-1) / n``), since a real
backend sends only that.

The brief writes Bruck's all-to-all as ``M' * n * log2(n) / 2`` with ``M'`` the block sent to each
peer; with ``M = n * M'`` the device's whole buffer that is ``M * log2(n) / 2``.

Latency needs a link model: pass ``collective_time(kind, group_size, comm_bytes) -> seconds``
(the hardware package's system model), or a ``RingLink`` for the plain ring estimate
``volume / bandwidth + steps * hop_latency``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from hardware.collectives import per_device_bytes, ring_steps
from hlo_analyzer.mlir import mhlo_replica_groups_to_stablehlo
from hlo_analyzer.rows import COMM, OpRow
from hlo_analyzer.tensors import TypeTable, format_location, num_elements
from hlo_analyzer.visitor import IRVisitor
from hlo_trace.errors import UnsupportedIRError

CollectiveTime = Callable[[str, int, int], float]

#: Ops that move elements without changing them, between an all-reduce and the dynamic_slice
#: that makes it a reduce-scatter.
_LAYOUT_OPS = (".transpose", ".reshape", ".copy", ".bitcast")


@dataclass(frozen=True)
class RingLink:
    """The simplest link model: every step crosses one link of this bandwidth and latency."""

    bandwidth_bytes_per_s: float
    hop_latency_s: float
    bruck: bool = False

    def __call__(self, kind: str, group_size: int, comm_bytes: int) -> float:
        volume = per_device_bytes(kind, group_size, comm_bytes, bruck=self.bruck)
        steps = ring_steps(kind, group_size, bruck=self.bruck)
        return volume / self.bandwidth_bytes_per_s + steps * self.hop_latency_s


class CommVisitor(IRVisitor):
    """Measures every collective; see the module docstring for the formulas."""

    skip_scalar_bodies = True

    def __init__(self, collective_time: CollectiveTime | None = None, bruck: bool = False,
                 num_devices: int | None = None, types: TypeTable | None = None) -> None:
        super().__init__()
        self.collective_time = collective_time
        self.bruck = bruck
        self.num_devices = num_devices
        self.rows: list[OpRow] = []
        self.types = types if types is not None else TypeTable()
        self._meshes: dict[str, Any] = {}
        self._groups: dict[ir.Attribute, tuple[int, int, tuple[int, ...]]] = {}

    @property
    def bytes_per_device(self) -> float:
        return sum(row.comm_bytes_per_device for row in self.rows)

    def begin_module(self, module: ir.Module) -> None:
        if self.num_devices is None:
            self.num_devices = _module_num_partitions(module)
        self._meshes = {
            ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation.attributes["mesh"]
            for op in module.body.operations if op.operation.name == "sdy.mesh"}

    def visit_all_reduce(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        comm_bytes = self._operand_bytes(op)
        groups = self._group_size(op)
        kind = "reduce_scatter" if self._is_sliced_apart(op, groups[0]) else "all_reduce"
        self._record(op, kind, comm_bytes, groups=groups)

    def _is_sliced_apart(self, op: Any, group_size: int) -> bool:
        """True when every user keeps exactly 1/group_size of the result with a dynamic_slice,
        directly or after layout ops that keep every element (transpose, reshape, copy: GSPMD
        puts the sum before the transpose of a weight gradient)."""
        results = self.types.row_shapes(op, self.op_name).results
        if len(results) != 1 or group_size <= 1:
            return False
        whole = num_elements(results[0])
        pending = [op.operation.result]
        slices = 0
        while pending:
            value = pending.pop()
            for use in value.uses:
                user = use.owner
                if user.name.endswith(".dynamic_slice"):
                    if num_elements(self.types.shape(user.results[0], user)) * group_size != whole:
                        return False
                    slices += 1
                elif user.name.endswith(_LAYOUT_OPS) and len(user.results) == 1:
                    pending.append(user.results[0])
                else:
                    return False
        return slices > 0

    def visit_all_gather(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        results = op.operation.results
        self._record(op, "all_gather", sum(self.types.nbytes(v, op) for v in results))

    def visit_reduce_scatter(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        self._record(op, "reduce_scatter", self.types.nbytes(op.operation.operands[0], op))

    def visit_all_to_all(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        self._record(op, "all_to_all", self._operand_bytes(op))

    def visit_collective_permute(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        # A pair whose source is its target moves nothing (GSPMD emits them for edge shards).
        pairs = [tuple(int(d) for d in pair) for pair in _dense_groups(op, "source_target_pairs")
                 if pair[0] != pair[1]]
        groups = (2, len(pairs), pairs[0]) if pairs else (1, 0, ())
        self._record(op, "collective_permute", self.types.nbytes(op.operation.operands[0], op),
                     groups=groups)

    def visit_collective_broadcast(self, op: Any) -> None:
        if _is_annotation(self.op_name):
            return
        self._record(op, "collective_broadcast", self.types.nbytes(op.operation.operands[0], op))

    def _operand_bytes(self, op: Any) -> int:
        """Bytes of all of ``op``'s operands (their types read once with the results')."""
        types = self.types
        return sum([types.type_nbytes(value_type, op) for value_type in types.value_types(op)[0]])

    def _record(self, op: Any, kind: str, comm_bytes: int,
                groups: tuple[int, int, tuple[int, ...]] | None = None) -> None:
        group_size, num_groups, first_group = groups or self._group_size(op)
        volume = per_device_bytes(kind, group_size, comm_bytes, bruck=self.bruck)
        latency = (self.collective_time(kind, group_size, comm_bytes)
                   if self.collective_time is not None else None)
        self.rows.append(self.types.op_row(
            op, self.position, COMM, comm_kind=kind, comm_bytes=comm_bytes,
            comm_bytes_per_device=volume, group_size=group_size, num_groups=num_groups,
            replica_group=first_group, comm_latency_s=latency, scope=self.scope))

    def _group_size(self, op: Any) -> tuple[int, int, tuple[int, ...]]:
        """(group size, number of groups, first group) of the op's ``replica_groups``, worked
        out once per distinct attribute (MLIR uniques them: a dump repeats a few)."""
        attributes = op.operation.attributes
        attribute = attributes["replica_groups"] if "replica_groups" in attributes else None
        groups = self._groups.get(attribute) if attribute is not None else None
        if groups is None:
            groups = self._read_group_size(op)
            if attribute is not None:
                self._groups[attribute] = groups
        return groups

    def _read_group_size(self, op: Any) -> tuple[int, int, tuple[int, ...]]:
        mesh_axes = _mesh_axes_groups(op)
        if mesh_axes is not None:
            groups = self._mesh_groups(op, mesh_axes)
            return groups.shape[1], groups.shape[0], tuple(int(d) for d in groups[0])
        groups = _dense_groups(op, "replica_groups")
        if groups.size == 0:
            # An empty group list means "all devices in one group".
            if self.num_devices is None:
                raise UnsupportedIRError(
                    f"{_describe(op)}: empty replica_groups and no mhlo.num_partitions on the "
                    "module, so the group size is unknown"
                )
            return self.num_devices, 1, tuple(range(self.num_devices))
        sizes = {int(np.count_nonzero(row >= 0)) for row in groups}  # -1 pads uneven groups
        if len(sizes) != 1:
            raise UnsupportedIRError(
                f"{_describe(op)}: replica groups of different sizes {sorted(sizes)}"
            )
        first_group = tuple(int(d) for d in groups[0] if d >= 0)
        return sizes.pop(), len(groups), first_group


    def _mesh_groups(self, op: Any, attribute: ir.Attribute) -> np.ndarray:
        """Device groups (one row each) of a ``replica_group_mesh_axes`` attribute."""
        groups = stablehlo.ReplicaGroupMeshAxesAttr(attribute)
        mesh_ref = groups.mesh
        if isinstance(mesh_ref, ir.FlatSymbolRefAttr):
            if mesh_ref.value not in self._meshes:
                raise UnsupportedIRError(f"{_describe(op)}: replica groups refer to mesh "
                                         f"@{mesh_ref.value}, but the module has no such sdy.mesh")
            mesh, axis_class = sdy.MeshAttr(self._meshes[mesh_ref.value]), sdy.MeshAxisAttr
        else:
            mesh, axis_class = stablehlo.MeshAttr(mesh_ref), stablehlo.MeshAxisAttr
        axes = [axis_class(axis) for axis in mesh.axes]
        axis_refs = []
        for axis in groups.axes:
            ref = stablehlo.AxisRefAttr(axis)
            sub = ref.sub_axis_info
            sub_info = None
            if sub is not None:
                info = stablehlo.SubAxisInfoAttr(sub)
                sub_info = (info.pre_size, info.size)
            axis_refs.append((ref.name, sub_info))
        try:
            return mesh_device_groups([(a.name, a.size) for a in axes],
                                      _device_ids(mesh.device_ids), axis_refs)
        except ValueError as exc:
            raise UnsupportedIRError(f"{_describe(op)}: {exc}") from None


def _mesh_axes_groups(op: Any) -> ir.Attribute | None:
    """The op's ``replica_groups`` as a ``#stablehlo.replica_group_mesh_axes`` attribute, or None
    when they are not mesh axes. MHLO's spelling (``#mhlo.replica_group_mesh_axes``, which the
    bindings cannot read) is converted to it by MHLO's own legalization
    (``hlo_analyzer.mlir.mhlo_replica_groups_to_stablehlo``): the two say the same."""
    attributes = op.operation.attributes
    if "replica_groups" not in attributes:
        return None
    attribute = attributes["replica_groups"]
    if stablehlo.ReplicaGroupMeshAxesAttr.isinstance(attribute):
        return attribute
    if isinstance(attribute, ir.DenseIntElementsAttr) or not op.operation.name.startswith("mhlo."):
        return None
    converted = mhlo_replica_groups_to_stablehlo(attribute)
    if converted is not None and stablehlo.ReplicaGroupMeshAxesAttr.isinstance(converted):
        return converted
    return None


def mesh_device_groups(axes: list[tuple[str, int]], device_ids: list[int],
                       group_axes: list[tuple[str, tuple[int, int] | None]]) -> np.ndarray:
    """Replica groups (rows of device ids) of the mesh ``axes`` (name, size), device order
    ``device_ids`` (iota when empty), grouping over ``group_axes`` (name, optional sub-axis
    ``(pre_size, size)``): two devices share a group when their mesh coordinates differ only
    along the group axes. A sub-axis ``(pre_size, size)`` of an axis of size ``n`` is the middle
    factor of the axis split as ``[pre_size, size, n / (pre_size * size)]``."""
    sizes = {name: size for name, size in axes}
    total = int(np.prod([size for _, size in axes])) if axes else 1
    ids = np.array(device_ids if device_ids else range(total), dtype=np.int64)
    if ids.size != total:
        raise ValueError(f"mesh has {total} positions but {ids.size} device ids")
    # Split every axis into factors so that sub-axes are whole dimensions.
    factors: list[tuple[str, int, int]] = []  # (axis, pre_size, size) of each dimension
    for name, size in axes:
        cuts = sorted({(pre, sub) for ref, info in group_axes if ref == name and info
                       for pre, sub in [info]})
        start = 1
        for pre, sub in cuts:
            if pre % start or size % (pre * sub):
                raise ValueError(f"sub-axis {name}:({pre}){sub} does not divide axis of size {size}")
            if pre > start:
                factors.append((name, start, pre // start))
            factors.append((name, pre, sub))
            start = pre * sub
        if size // start > 1 or not cuts:
            factors.append((name, start, size // start))
    grid = ids.reshape([size for _, _, size in factors])
    chosen = []
    for name, info in group_axes:
        if name not in sizes:
            raise ValueError(f"replica groups name axis {name!r}, not in the mesh")
        for index, (axis, pre, size) in enumerate(factors):
            if axis == name and (info is None or (pre, size) == info):
                chosen.append(index)
    rest = [i for i in range(len(factors)) if i not in chosen]
    group_size = int(np.prod([factors[i][2] for i in chosen])) if chosen else 1
    return grid.transpose(rest + chosen).reshape(-1, group_size)


def _device_ids(attribute: Any) -> list[int]:
    """A mesh's explicit device ids (a list, or dense elements inline); [] for iota."""
    if attribute is None:
        return []
    if isinstance(attribute, ir.DenseIntElementsAttr):
        return [int(d) for d in np.array(attribute).reshape(-1)]
    return [int(d) for d in attribute]


def _is_annotation(name: str) -> bool:
    """Shardy's collectives (``sdy.all_gather`` ...) describe a sharding, they send nothing."""
    return name.startswith("sdy.")


def _dense_groups(op: Any, attribute_name: str) -> np.ndarray:
    attributes = op.operation.attributes
    if attribute_name not in attributes:
        raise UnsupportedIRError(f"{_describe(op)}: has no {attribute_name} attribute")
    attribute = attributes[attribute_name]
    if not isinstance(attribute, ir.DenseIntElementsAttr):
        raise UnsupportedIRError(
            f"{_describe(op)}: {attribute_name} in the form {str(attribute)[:60]} is not "
            "supported; expected a dense list of device ids, e.g. dense<[[0, 1], [2, 3]]>"
        )
    groups = np.array(attribute)
    return groups.reshape(groups.shape[0], -1) if groups.ndim >= 1 and groups.size else groups


def _module_num_partitions(module: ir.Module) -> int | None:
    attributes = module.operation.attributes
    for name in ("mhlo.num_partitions", "stablehlo.num_partitions"):
        if name in attributes:
            return ir.IntegerAttr(attributes[name]).value
    return None


def _describe(op: Any) -> str:
    location = format_location(op.operation.location)
    return f"{op.operation.name} at {location}" if location else op.operation.name
