"""The per-op row that every measuring visitor produces."""

from __future__ import annotations

from typing import NamedTuple

Shape = tuple[int, ...]

GEMM = "gemm"
VECTOR = "vector"
COMM = "comm"
OTHER = "other"
CATEGORIES = (GEMM, VECTOR, COMM, OTHER)


class OpRow(NamedTuple):
    """One measured op. ``position`` is its index in the walk, so rows from several visitors
    of the same module merge back into program order. ``flops`` and the comm figures are for one
execution; totals multiply them by ``count``. (A NamedTuple: immutable, and built
    several times faster than a frozen dataclass, which matters at 100k rows.)"""

    position: int
    op: str
    location: str
    category: str
    operand_shapes: tuple[Shape, ...]
    result_shapes: tuple[Shape, ...]
    dtype: str
    flops: int = 0
    comm_kind: str = ""
    comm_bytes: int = 0  # M: bytes of the tensor the collective's formula is stated on
    comm_bytes_per_device: float = 0.0
    group_size: int = 0
    num_groups: int = 0
    replica_group: tuple[int, ...] = ()  # the first group's device ids (for hop counts)
    comm_latency_s: float | None = None
    scope: int = 0  # the region the op sits in (IRVisitor.scopes), for loops/branches/calls
    count: int = 1  # times the op runs: loop trip counts x calls; 0 in a branch not taken


# The fields between ``flops`` and ``scope`` say what an op communicates: for any other op, their
# defaults, written out in compute_row.
assert OpRow._fields[7] == "flops" and OpRow._fields[-2:] == ("scope", "count")
assert tuple(OpRow._field_defaults[name] for name in OpRow._fields[8:-2]) == (
    "", 0, 0.0, 0, 0, (), None)
_new_tuple = tuple.__new__


def compute_row(position: int, op: str, location: str, category: str,
                operand_shapes: tuple[Shape, ...], result_shapes: tuple[Shape, ...], dtype: str,
                flops: int, scope: int) -> OpRow:
    """The row of an op that does not communicate (run once, ``count`` 1): the same as
    ``OpRow(..., flops=flops, scope=scope)``, built as a tuple, without the keywords and
    OpRow's Python-level ``__new__`` (~0.3 us less a row, the commonest rows of a 100k-op dump)."""
    return _new_tuple(OpRow, (position, op, location, category, operand_shapes, result_shapes,
                              dtype, flops, "", 0, 0.0, 0, 0, (), None, scope, 1))
