"""CommVisitor: collective communication per device, with ring formulas.

For each collective, ``M`` is the size in bytes of the tensor the formula is stated on and ``n``
the group size read from ``replica_groups`` (dense form). Per-device volume, ring algorithms:

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

An ``all_reduce`` whose every user is a ``dynamic_slice`` keeping 1/n of it is a reduce-scatter
that XLA's CPU backend never forms as one op (GSPMD writes it that way): it is counted as
``reduce_scatter`` (``M * (n-1) / n``), since a real backend sends only that.

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

from hardware.collectives import per_device_bytes, ring_steps
from hlo_analyzer.rows import COMM, OpRow
from hlo_analyzer.tensors import TypeTable, format_location, num_elements
from hlo_analyzer.visitor import IRVisitor
from hlo_trace.errors import UnsupportedIRError

CollectiveTime = Callable[[str, int, int], float]


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
                 num_devices: int | None = None) -> None:
        super().__init__()
        self.collective_time = collective_time
        self.bruck = bruck
        self.num_devices = num_devices
        self.rows: list[OpRow] = []
        self.types = TypeTable()

    @property
    def bytes_per_device(self) -> float:
        return sum(row.comm_bytes_per_device for row in self.rows)

    def visit_module(self, module: ir.Module) -> None:
        if self.num_devices is None:
            self.num_devices = _module_num_partitions(module)
        super().visit_module(module)

    def visit_all_reduce(self, op: Any) -> None:
        operands = op.operation.operands
        comm_bytes = sum(self.types.nbytes(v, op) for v in operands)
        groups = self._group_size(op)
        kind = "reduce_scatter" if self._is_sliced_apart(op, groups[0]) else "all_reduce"
        self._record(op, kind, comm_bytes, groups=groups)

    def _is_sliced_apart(self, op: Any, group_size: int) -> bool:
        """True when every user keeps exactly 1/group_size of the result with a dynamic_slice."""
        results = op.operation.results
        if len(results) != 1 or group_size <= 1:
            return False
        whole = num_elements(self.types.shape(results[0], op))
        users = [use.owner for use in results[0].uses]
        return bool(users) and all(
            user.name.endswith(".dynamic_slice")
            and num_elements(self.types.shape(user.results[0], user)) * group_size == whole
            for user in users)

    def visit_all_gather(self, op: Any) -> None:
        results = op.operation.results
        self._record(op, "all_gather", sum(self.types.nbytes(v, op) for v in results))

    def visit_reduce_scatter(self, op: Any) -> None:
        self._record(op, "reduce_scatter", self.types.nbytes(op.operation.operands[0], op))

    def visit_all_to_all(self, op: Any) -> None:
        operands = op.operation.operands
        self._record(op, "all_to_all", sum(self.types.nbytes(v, op) for v in operands))

    def visit_collective_permute(self, op: Any) -> None:
        # A pair whose source is its target moves nothing (GSPMD emits them for edge shards).
        pairs = [tuple(int(d) for d in pair) for pair in _dense_groups(op, "source_target_pairs")
                 if pair[0] != pair[1]]
        groups = (2, len(pairs), pairs[0]) if pairs else (1, 0, ())
        self._record(op, "collective_permute", self.types.nbytes(op.operation.operands[0], op),
                     groups=groups)

    def visit_collective_broadcast(self, op: Any) -> None:
        self._record(op, "collective_broadcast", self.types.nbytes(op.operation.operands[0], op))

    def _record(self, op: Any, kind: str, comm_bytes: int,
                groups: tuple[int, int, tuple[int, ...]] | None = None) -> None:
        group_size, num_groups, first_group = groups or self._group_size(op)
        volume = per_device_bytes(kind, group_size, comm_bytes, bruck=self.bruck)
        latency = (self.collective_time(kind, group_size, comm_bytes)
                   if self.collective_time is not None else None)
        self.rows.append(self.types.op_row(
            op, self.position, COMM, comm_kind=kind, comm_bytes=comm_bytes,
            comm_bytes_per_device=volume, group_size=group_size, num_groups=num_groups,
            replica_group=first_group, comm_latency_s=latency))

    def _group_size(self, op: Any) -> tuple[int, int, tuple[int, ...]]:
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
