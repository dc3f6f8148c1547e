"""Chip-to-chip collective model: turns a collective's bytes into seconds on a :class:`SystemSpec`.

The communication visitor of the analyzer measures *what* moves (kind, group size, message
bytes); this module says *how long* it takes. ``M`` is the full tensor size in bytes and ``n``
the group size. The ring volumes (the project's one home for them):

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

Timing (:func:`collective_time_s`) follows the system's ``collective_algorithm``. Each algorithm
is a list of *phases*; a phase is a set of transfers ``(source, destination, bytes)`` that run at
the same time, routed over the topology (:func:`route`: dimension-order on a 2-D mesh or torus,
the shorter way round a ring, chip -> switch -> chip on a switch). Per phase::

    link time = max over directed links of (bytes crossing it) / link_bandwidth
    DRAM time = max over chips of (bytes sent + bytes received) / chip DRAM bandwidth
                (only when the system's ``transfers_through_dram``, e.g. TX8)
    phase     = max(link time, DRAM time) + steps * (longest transfer in hops) * hop_latency

* ``ring``: every member sends the ring volume to its successor (a group filling an even
  rectangle of a mesh is ordered along its 1-hop Hamiltonian cycle).
* ``bidirectional_ring``: half to the successor and half to the predecessor (each link is used
  both ways, so a ring over free links takes half the time).
* ``per_dimension``: a group filling an ``r x c`` rectangle of a 2-D grid runs its collective
  row by row, then column by column (all-reduce: reduce-scatter along rows, all-reduce of ``M/c``
  along columns, all-gather along rows); each line is a bidirectional ring. Other groups fall
  back to the bidirectional ring.
* ``switch``: every chip has one port of ``link_bandwidth`` each way into a non-blocking switch
  (NVSwitch); the ring volume crosses each chip's port, one hop per step.
* ``all_to_all`` under every algorithm: direct exchange (each member sends ``M/n`` to each other
  member, routed), and never faster than the bisection bound
  (:func:`all_to_all_bisection_bound_s`).

*Measured NCCL* (NVSwitch systems with an ``nccl_table``, e.g. 8xa100, 8xh100): all-reduce,
all-gather, reduce-scatter and all-to-all take their time from the measured nccl-tests bus
bandwidth at the message size (:func:`hardware.nccl.nccl_time_s`: latency-bound small messages,
the protocol switch and the measured peak as NCCL runs them, all-to-all with its own curve)
instead of the phases above; groups that run at the same time use disjoint switch ports.
Collective-permute and broadcast keep the phase model.

*Multi-node systems* (a system with ``inter_node``, e.g. ``4x8xh100``, ``tx8-64``): a group
inside one node runs on that node's network as above (local chip ids). A group spanning ``k``
nodes with ``g`` members on each runs hierarchically, as NCCL does:

=====================  ==================================  =================================
kind                   inside each node (``g`` members)    between the nodes (``k`` nodes)
=====================  ==================================  =================================
``all_reduce``         reduce-scatter of M, all-gather     all-reduce of ``M/g`` by each of
                       of M                                the ``g`` members with its peers
``all_gather``         all-gather of M                     all-gather of ``M/g`` per member
``reduce_scatter``     reduce-scatter of M                 reduce-scatter of ``M/g``
``all_to_all``         all-to-all of the ``g*M/n`` bound   every member sends ``M*(n-g)/n``
                       for its own node (+ PXN: the        off its node
                       share bound for other rails)
``collective_permute`` --                                  ``M`` per member crossing nodes
=====================  ==================================  =================================

A node's inter-node bytes (every concurrent group's members on that node together; a ring
member sends the ring volume of its level) cross its NICs at
:meth:`hardware.spec.InterNodeNetwork.nic_bytes_per_s` of the chips taking part; each
inter-node step pays ``inter_node.latency``. NCCL pipelines the levels chunk by chunk, so a
hierarchical collective takes the slower level plus the latency of the faster one::

    time = max(intra, inter) + latency(the other level)

(:func:`hierarchical_cost` returns the bytes of each level, which the tests count by hand.)

*Link sharing*: ``concurrent_groups`` lists every group of the collective that runs at the same
time (an SPMD collective's replica groups); their transfers load the same links, e.g. the pairs
``{i, i+8}`` of a 4x4 mesh all cross the middle vertical links. Communication is not overlapped
with compute.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hardware.nccl import NCCL_KINDS, nccl_floor_s, nccl_time_s
from hardware.spec import SystemSpec

__all__ = [
    "COLLECTIVE_KINDS",
    "SWITCH_NODE",
    "HierarchicalCost",
    "Phase",
    "Transfer",
    "all_to_all_bisection_bound_s",
    "bisection_links",
    "collective_phases",
    "collective_time_s",
    "hierarchical_cost",
    "hop_distance",
    "node_system",
    "phase_time_s",
    "route",
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


#: The switch of a ``switch`` system, as a node of :func:`route` (chips are 0 .. chip_count-1).
SWITCH_NODE = -1

Link = tuple[int, int]


@dataclass(frozen=True)
class Transfer:
    """``bytes`` sent from chip ``source`` to chip ``destination`` within one phase."""

    source: int
    destination: int
    bytes: float


@dataclass(frozen=True)
class Phase:
    """Transfers that run at the same time, and how many sequential steps (latencies) they take."""

    transfers: tuple[Transfer, ...]
    steps: int


def _line_route(start: int, stop: int, size: int, wrap: bool) -> list[int]:
    """Coordinates visited going from ``start`` to ``stop`` on a line (or a ring if ``wrap``)."""
    if start == stop:
        return [start]
    forward = (stop - start) % size if wrap else None
    if wrap and forward is not None and forward <= size - forward:
        return [(start + i) % size for i in range(forward + 1)]
    if wrap:
        return [(start - i) % size for i in range(size - (forward or 0) + 1)]
    step = 1 if stop > start else -1
    return list(range(start, stop + step, step))


def route(source: int, destination: int, system: SystemSpec) -> list[Link]:
    """Directed links a transfer crosses: X then Y on a 2-D grid (shorter way round on a torus),
    the shorter way round a ring (forward on a tie), chip -> switch -> chip on a switch."""
    if source == destination:
        return []
    if system.topology == "switch":
        return [(source, SWITCH_NODE), (SWITCH_NODE, destination)]
    if system.topology == "ring":
        nodes = _line_route(source, destination, system.chip_count, wrap=True)
        return list(zip(nodes, nodes[1:]))
    wrap = system.topology == "torus2d"
    (row_a, col_a), (row_b, col_b) = _position(source, system), _position(destination, system)
    cols = _line_route(col_a, col_b, system.topology_cols, wrap)
    rows = _line_route(row_a, row_b, system.topology_rows, wrap)
    nodes = [row_a * system.topology_cols + c for c in cols] + [r * system.topology_cols + col_b for r in rows[1:]]
    return list(zip(nodes, nodes[1:]))


def phase_time_s(phase: Phase, system: SystemSpec) -> float:
    """Seconds of one phase (module docstring): link or DRAM time, plus step latencies."""
    if not phase.transfers:
        return 0.0
    load: dict[Link, float] = defaultdict(float)
    moved: dict[int, float] = defaultdict(float)
    for transfer in phase.transfers:
        for link in route(transfer.source, transfer.destination, system):
            load[link] += transfer.bytes
        moved[transfer.source] += transfer.bytes
        moved[transfer.destination] += transfer.bytes
    link_s = 0.0 if math.isinf(system.link_bandwidth_bytes_per_s) else max(load.values(), default=0.0) / system.link_bandwidth_bytes_per_s
    dram_s = 0.0
    if system.transfers_through_dram:
        dram_s = max(moved.values()) / system.chip.dram_bandwidth_bytes_per_s
    hops = max(hop_distance(t.source, t.destination, system) for t in phase.transfers)
    return max(link_s, dram_s) + phase.steps * hops * system.hop_latency_s


def _snake_cycle(rows: int, cols: int) -> list[tuple[int, int]]:
    """A 1-hop Hamiltonian cycle of an ``rows x cols`` grid with ``rows`` even: down column 0,
    then back up through columns 1.. row by row, alternating direction, ending next to (0, 0)."""
    down = [(r, 0) for r in range(rows)]
    back = []
    for step, r in enumerate(range(rows - 1, -1, -1)):
        columns = range(1, cols) if step % 2 == 0 else range(cols - 1, 0, -1)
        back += [(r, c) for c in columns]
    return down + back


def _ring_order(members: list[int], system: SystemSpec) -> list[int]:
    """The members in ring order: a 1-hop cycle when they fill an even rectangle of a 2-D grid."""
    if system.topology not in ("mesh2d", "torus2d") or not _is_even_rectangle(members, system):
        return members
    positions = [_position(d, system) for d in members]
    top, left = min(r for r, _ in positions), min(c for _, c in positions)
    rows = max(r for r, _ in positions) - top + 1
    cols = max(c for _, c in positions) - left + 1
    if rows % 2 == 0:
        cells = _snake_cycle(rows, cols)
    else:
        cells = [(r, c) for c, r in _snake_cycle(cols, rows)]
    return [(top + r) * system.topology_cols + (left + c) for r, c in cells]


def _ring_phase(kind: str, groups: Sequence[Sequence[int]], message_bytes: float, system: SystemSpec,
                *, both_ways: bool) -> Phase:
    transfers: list[Transfer] = []
    steps = 0
    for group in groups:
        order = _ring_order(list(group), system)
        n = len(order)
        if n < 2:
            continue
        sent = per_device_bytes(kind, n, message_bytes)
        steps = max(steps, ring_steps(kind, n))
        for i, member in enumerate(order):
            successor, predecessor = order[(i + 1) % n], order[i - 1]
            if both_ways and n > 2:
                transfers += [Transfer(member, successor, sent / 2), Transfer(member, predecessor, sent / 2)]
            else:
                transfers.append(Transfer(member, successor, sent))
    return Phase(tuple(transfers), steps)


def _all_to_all_phase(groups: Sequence[Sequence[int]], message_bytes: float) -> Phase:
    transfers = []
    steps = 0
    for group in groups:
        n = len(group)
        steps = max(steps, n - 1)
        transfers += [Transfer(a, b, message_bytes / n) for a in group for b in group if a != b]
    return Phase(tuple(transfers), steps)


def _lines(group: Sequence[int], system: SystemSpec, axis: int) -> list[list[int]]:
    """The rows (``axis`` 0) or columns (1) of a rectangular group, each in grid order."""
    by_line: dict[int, list[int]] = defaultdict(list)
    for device in sorted(group, key=lambda d: _position(d, system)[1 - axis]):
        by_line[_position(device, system)[axis]].append(device)
    return [by_line[key] for key in sorted(by_line)]


def _fills_rectangle(group: Sequence[int], system: SystemSpec) -> tuple[int, int] | None:
    positions = {_position(d, system) for d in group}
    rows = {r for r, _ in positions}
    cols = {c for _, c in positions}
    r, c = max(rows) - min(rows) + 1, max(cols) - min(cols) + 1
    if len(positions) == r * c == len(group) and r >= 2 and c >= 2:
        return r, c
    return None


def _per_dimension_phases(kind: str, groups: Sequence[Sequence[int]], message_bytes: float,
                          system: SystemSpec) -> list[Phase] | None:
    shapes = {_fills_rectangle(g, system) for g in groups}
    if len(shapes) != 1 or None in shapes or kind not in ("all_reduce", "all_gather", "reduce_scatter"):
        return None
    rows, cols = next(iter(shapes))  # type: ignore[misc]
    row_lines = [line for g in groups for line in _lines(g, system, 0)]
    col_lines = [line for g in groups for line in _lines(g, system, 1)]

    def along(lines: list[list[int]], sub_kind: str, size: float) -> Phase:
        return _ring_phase(sub_kind, lines, size, system, both_ways=True)

    m = message_bytes
    if kind == "all_reduce":
        return [along(row_lines, "reduce_scatter", m), along(col_lines, "all_reduce", m / cols),
                along(row_lines, "all_gather", m)]
    if kind == "all_gather":
        return [along(row_lines, "all_gather", m / rows), along(col_lines, "all_gather", m)]
    return [along(col_lines, "reduce_scatter", m), along(row_lines, "reduce_scatter", m / rows)]


def collective_phases(kind: str, groups: Sequence[Sequence[int]], message_bytes: float,
                      system: SystemSpec) -> list[Phase]:
    """The phases of ``kind`` over concurrent ``groups`` under the system's algorithm."""
    algorithm = system.collective_algorithm
    if kind == "all_to_all":
        return [_all_to_all_phase(groups, message_bytes)]
    if algorithm == "per_dimension":
        phases = _per_dimension_phases(kind, groups, message_bytes, system)
        if phases is not None:
            return phases
    both_ways = algorithm in ("bidirectional_ring", "per_dimension")
    return [_ring_phase(kind, groups, message_bytes, system, both_ways=both_ways)]


def bisection_links(system: SystemSpec) -> int:
    """Directed links crossing the system's narrowest cut into two halves, per direction
    (a switch: half the chips' ports)."""
    if system.topology == "switch":
        return system.chip_count // 2
    if system.topology == "ring":
        return 2 if system.chip_count > 2 else 1
    rows, cols = system.topology_rows, system.topology_cols
    wrap = 2 if system.topology == "torus2d" else 1
    cuts = []
    if cols >= 2:
        cuts.append(rows * (wrap if cols > 2 else 1))
    if rows >= 2:
        cuts.append(cols * (wrap if rows > 2 else 1))
    return min(cuts) if cuts else 1


def all_to_all_bisection_bound_s(group_size: int, message_bytes: float, system: SystemSpec) -> float:
    """Lower bound of an all-to-all of ``group_size`` chips: ``(n/2)^2`` pairs each send ``M/n``
    across the bisection in each direction, ``n*M/4`` bytes over the system's bisection links."""
    if group_size < 2 or math.isinf(system.link_bandwidth_bytes_per_s):
        return 0.0
    crossing = (group_size // 2) * (group_size - group_size // 2) * message_bytes / group_size
    return crossing / (bisection_links(system) * system.link_bandwidth_bytes_per_s)


def collective_time_s(
    kind: str,
    group_size: int,
    message_bytes: float,
    system: SystemSpec,
    *,
    devices: Sequence[int] | None = None,
    concurrent_groups: Sequence[Sequence[int]] | None = None,
) -> float:
    """Seconds for one collective of ``kind`` over ``group_size`` chips moving a ``message_bytes`` tensor.

    ``message_bytes`` is the full tensor (for all-gather the gathered result, for reduce-scatter
    its input, for collective-permute the message each device sends). ``devices`` are the chip
    ids of one group (e.g. a replica group ``[0, 8]``); by default ``0 .. group_size-1``.
    ``concurrent_groups``: every group that runs at the same time (they share links); by default
    only ``devices``. The algorithm is the system's ``collective_algorithm``, or its measured NCCL
    table for the kinds it holds (module docstring).
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
    groups = [list(g) for g in concurrent_groups] if concurrent_groups is not None else [members]
    for group in groups:
        if len(group) != group_size:
            raise ValueError(f"concurrent group {group} does not have {group_size} members")
        if len(set(group)) != len(group) or any(d < 0 or d >= system.chip_count for d in group):
            raise ValueError(f"device ids {group} repeat or do not fit a system of {system.chip_count} chips")
    if system.inter_node is not None:
        return hierarchical_cost(kind, groups, message_bytes, system).seconds
    return _one_node_time_s(kind, groups, message_bytes, system)


def _one_node_time_s(kind: str, groups: Sequence[Sequence[int]], message_bytes: float,
                     system: SystemSpec) -> float:
    """Seconds of ``kind`` over the concurrent ``groups`` of one node's network."""
    group_size = len(groups[0])
    if group_size < 2:
        return 0.0
    if system.nccl_table is not None and kind in NCCL_KINDS:
        return nccl_time_s(system.nccl_table, kind, group_size, message_bytes, busbw_scale=system.nccl_busbw_scale)
    seconds = sum(phase_time_s(p, system) for p in collective_phases(kind, groups, message_bytes, system))
    if kind == "all_to_all":
        seconds = max(seconds, all_to_all_bisection_bound_s(group_size, message_bytes, system))
    return seconds


# --------------------------------------------------------------------------------------------
# Multi-node systems: hierarchical collectives (module docstring)
# --------------------------------------------------------------------------------------------


def node_system(system: SystemSpec) -> SystemSpec:
    """The network inside one node of a multi-node system (the system itself for one node):
    its chips, topology, links and NCCL table, as the system (with any overrides) has them."""
    if system.inter_node is None:
        return system
    return replace(system, name=f"{system.name} node", chip_count=system.chips_per_node, inter_node=None)


@dataclass(frozen=True)
class HierarchicalCost:
    """A collective over concurrent groups of a multi-node system, level by level.

    ``nodes``/``members_per_node``: how one group spreads (k nodes, g members on each);
    ``intra_phases``: ``(kind, message bytes)`` run inside every node, one after the other;
    ``inter_kind``/``inter_message_bytes``: the collective each member runs with its peers on
    the other nodes; ``nic_bytes_per_node``: bytes one node sends over its NICs (all groups);
    ``intra_s``/``inter_s``: each level's time; ``seconds``: the total (module docstring)."""

    nodes: int
    members_per_node: int
    intra_phases: tuple[tuple[str, float], ...]
    inter_kind: str | None
    inter_message_bytes: float
    nic_bytes_per_node: float
    intra_s: float
    inter_s: float
    intra_latency_s: float
    inter_latency_s: float
    seconds: float


def _intra_latency_s(kind: str, group_size: int, node: SystemSpec) -> float:
    """The latency part of one collective inside a node: the measured NCCL floor, or one hop
    latency per ring step."""
    if group_size < 2:
        return 0.0
    if node.nccl_table is not None and kind in NCCL_KINDS:
        return nccl_floor_s(node.nccl_table, kind, busbw_scale=node.nccl_busbw_scale)
    return ring_steps(kind, group_size) * node.hop_latency_s


def _by_node(group: Sequence[int], system: SystemSpec) -> dict[int, list[int]]:
    network = system.inter_node
    assert network is not None
    members: dict[int, list[int]] = defaultdict(list)
    for device in group:
        members[network.node_of(device)].append(network.local_id(device))
    return members


def hierarchical_cost(kind: str, groups: Sequence[Sequence[int]], message_bytes: float,
                      system: SystemSpec) -> HierarchicalCost:
    """The hierarchical collective of the module docstring on a multi-node ``system``."""
    network = system.inter_node
    if network is None:
        raise ValueError(f"{system.name} has one node: no hierarchical collective")
    node = node_system(system)
    spread = [_by_node(g, system) for g in groups]
    k = len(spread[0])
    g = max(len(members) for members in spread[0].values())
    n = len(groups[0])
    # The groups of one node run at the same time: those members, in local ids, on the busiest node.
    per_node: dict[int, list[list[int]]] = defaultdict(list)
    for members in spread:
        for node_id, local in members.items():
            per_node[node_id].append(sorted(local))
    busiest = max(per_node, key=lambda node_id: (sum(map(len, per_node[node_id])), -node_id))
    local_groups = [grp for grp in per_node[busiest] if len(grp) == g] or per_node[busiest]
    active = sum(map(len, per_node[busiest]))
    m = message_bytes
    if k == 1:
        seconds = _one_node_time_s(kind, local_groups, m, node) if g > 1 else 0.0
        return HierarchicalCost(1, g, ((kind, m),), None, 0.0, 0.0, seconds, 0.0,
                                _intra_latency_s(kind, g, node), 0.0, seconds)
    groups_on_node = len(per_node[busiest])
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):
        intra = {"all_reduce": (("reduce_scatter", m), ("all_gather", m)),
                 "all_gather": (("all_gather", m),),
                 "reduce_scatter": (("reduce_scatter", m),)}[kind] if g > 1 else ()
        inter_kind, inter_message = kind, m / g
        # each member sends its ring volume over k nodes; every member on the node does
        nic_bytes = groups_on_node * g * per_device_bytes(kind, k, inter_message)
        steps = ring_steps(kind, k)
    elif kind == "all_to_all":
        local_share = m * g / n  # what a member sends to its own node (itself included)
        remote = m * (n - g) / n
        if network.switch == "rail_optimized" and g > 1:
            # PXN: the part bound for other rails first moves to the chip on the destination's rail
            local_share += remote * (g - 1) / g
        intra = (("all_to_all", local_share),) if g > 1 else ()
        inter_kind, inter_message = "all_to_all", remote  # what each member sends off its node
        nic_bytes = groups_on_node * g * remote
        steps = k - 1
    else:  # collective_permute, collective_broadcast: each member's message crosses its node
        intra = ()
        inter_kind, inter_message = kind, m
        nic_bytes = groups_on_node * g * m
        steps = 1
    intra_s = sum(_one_node_time_s(sub, local_groups, size, node) for sub, size in intra)
    intra_latency = sum(_intra_latency_s(sub, g, node) for sub, _ in intra)
    inter_latency = steps * network.latency_s
    inter_s = nic_bytes / network.nic_bytes_per_s(active) + inter_latency
    seconds = max(intra_s, inter_s) + (inter_latency if intra_s >= inter_s else intra_latency)
    if not intra:
        seconds = inter_s
    return HierarchicalCost(k, g, tuple(intra), inter_kind, inter_message, nic_bytes, intra_s,
                            inter_s, intra_latency, inter_latency, seconds)
