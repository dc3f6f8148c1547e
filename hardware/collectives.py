"""Chip-to-chip collective model: turns a collective's bytes into seconds on a :class:`SystemSpec`.

The communication visitor of the analyzer measures *what* moves (kind, group size, message
bytes); this module says *how long* it takes. Ring algorithms throughout (NCCL's default for
large messages), with ``M`` the full tensor size in bytes and ``n`` the group size:

=====================  ============================  =====================
kind                   bytes each device sends       ring steps
=====================  ============================  =====================
``all_reduce``         ``2 * M * (n-1) / n``         ``2 * (n-1)``
``all_gather``         ``M * (n-1) / n``             ``n - 1``
``reduce_scatter``     ``M * (n-1) / n``             ``n - 1``
``all_to_all``         ``M * (n-1) / n``             ``n - 1``
``collective_permute`` ``M``                         ``1``
``collective_broadcast`` ``M``                       ``1``
=====================  ============================  =====================

With ``bruck=True`` an all-to-all sends ``M * log2(n) / 2`` in ``ceil(log2(n))`` steps.

``time = bytes_sent / link_bandwidth + steps * hops_per_step * hop_latency``: each step every
member sends to its ring successor at the same time, so a step lasts as long as its longest
edge, measured in links crossed on the system's topology (:func:`ring_hops_per_step`). The model
ignores link sharing between concurrent groups and does not overlap communication with compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hardware.spec import SystemSpec

__all__ = [
    "COLLECTIVE_KINDS",
    "collective_time_s",
    "hop_distance",
    "per_device_bytes",
    "ring_hops_per_step",
    "ring_steps",
]

#: Every collective the analyzer measures, in the order reports list them.
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                    "collective_broadcast")


def _check(kind: str, group_size: int) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r} (known: {', '.join(COLLECTIVE_KINDS)})")
    if group_size < 1:
        raise ValueError(f"group size must be at least 1, got {group_size}")


def per_device_bytes(kind: str, group_size: int, message_bytes: float, *,
                     bruck: bool = False) -> float:
    """Bytes each member sends under the ring algorithm (table in the module docstring).

    ``bruck``: all-to-all by Bruck's algorithm, ``M * log2(n) / 2`` per device. The brief writes it
    ``M' * n * log2(n) / 2`` with ``M'`` the block sent to each peer; with ``M = n * M'`` (the
    device's whole buffer) that is the same figure.
    """
    _check(kind, group_size)
    n = group_size
    if n == 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * message_bytes * (n - 1) / n
    if kind in ("collective_permute", "collective_broadcast"):
        return float(message_bytes)
    if kind == "all_to_all" and bruck:
        return message_bytes * math.log2(n) / 2.0
    return message_bytes * (n - 1) / n


def ring_steps(kind: str, group_size: int, *, bruck: bool = False) -> int:
    """Number of sequential ring (or Bruck) steps, each paying one message latency."""
    _check(kind, group_size)
    if group_size == 1:
        return 0
    if kind == "all_reduce":
        return 2 * (group_size - 1)
    if kind in ("collective_permute", "collective_broadcast"):
        return 1
    if kind == "all_to_all" and bruck:
        return math.ceil(math.log2(group_size))
    return group_size - 1


def _position(device: int, system: SystemSpec) -> tuple[int, int]:
    return divmod(device, system.topology_cols)


def hop_distance(first: int, second: int, system: SystemSpec) -> int:
    """Links crossed between two chips (device ids placed row-major on the system grid)."""
    if first == second:
        return 0
    if system.topology == "switch":
        return 1
    if system.topology == "ring":
        gap = abs(first - second) % system.chip_count
        return min(gap, system.chip_count - gap)
    (row_a, col_a), (row_b, col_b) = _position(first, system), _position(second, system)
    row_gap, col_gap = abs(row_a - row_b), abs(col_a - col_b)
    if system.topology == "torus2d":
        row_gap = min(row_gap, system.topology_rows - row_gap)
        col_gap = min(col_gap, system.topology_cols - col_gap)
    return row_gap + col_gap


def _is_even_rectangle(devices: Sequence[int], system: SystemSpec) -> bool:
    """True when the devices fill an r x c sub-grid with r, c >= 2 and r*c even.

    Such a sub-grid has a Hamiltonian cycle of 1-hop edges (snake down the columns, come back up
    the first one), so a ring over it never crosses more than one link per step.
    """
    positions = {_position(d, system) for d in devices}
    rows = {r for r, _ in positions}
    cols = {c for _, c in positions}
    r, c = max(rows) - min(rows) + 1, max(cols) - min(cols) + 1
    return len(positions) == r * c == len(devices) and r >= 2 and c >= 2 and (r * c) % 2 == 0


def ring_hops_per_step(devices: Sequence[int], system: SystemSpec) -> int:
    """Longest edge, in links, of the ring through ``devices`` (in the given order, closed).

    On a 2-D mesh a group that fills an even-sized rectangle is routed along its 1-hop
    Hamiltonian cycle instead of the given order.
    """
    members = list(devices)
    if len(members) < 2:
        return 0
    if len(members) != len(set(members)):
        raise ValueError(f"device ids repeat in the group {members}")
    if any(d < 0 or d >= system.chip_count for d in members):
        raise ValueError(f"device ids {members} do not fit a system of {system.chip_count} chips")
    if system.topology in ("mesh2d", "torus2d") and _is_even_rectangle(members, system):
        return 1
    return max(hop_distance(a, b, system) for a, b in zip(members, members[1:] + members[:1]))


def collective_time_s(
    kind: str,
    group_size: int,
    message_bytes: float,
    system: SystemSpec,
    *,
    devices: Sequence[int] | None = None,
) -> float:
    """Seconds for one collective of ``kind`` over ``group_size`` chips moving a ``message_bytes`` tensor.

    ``message_bytes`` is the full tensor (for all-gather the gathered result, for reduce-scatter
    its input, for collective-permute the message each device sends). ``devices`` are the chip
    ids of one group (e.g. a replica group ``[0, 8]``); by default ``0 .. group_size-1``.
    """
    _check(kind, group_size)
    if message_bytes < 0:
        raise ValueError(f"message size must not be negative, got {message_bytes}")
    if group_size > system.chip_count:
        raise ValueError(f"a group of {group_size} does not fit the {system.chip_count} chips of {system.name}")
    if group_size == 1:
        return 0.0
    members = list(devices) if devices is not None else list(range(group_size))
    if len(members) != group_size:
        raise ValueError(f"{len(members)} device ids given for a group of {group_size}")
    bandwidth_s = per_device_bytes(kind, group_size, message_bytes) / system.link_bandwidth_bytes_per_s
    latency_s = ring_steps(kind, group_size) * ring_hops_per_step(members, system) * system.hop_latency_s
    if math.isinf(system.link_bandwidth_bytes_per_s):
        bandwidth_s = 0.0
    return bandwidth_s + latency_s
