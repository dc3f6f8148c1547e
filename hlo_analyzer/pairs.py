"""Which block pair each op of an STDiT3 stage belongs to, whatever XLA hoisted or merged.

A pair's work is everything that computes from the pair's input on the residual stream up to
its output, plus the per-pair side work that only it reads (its adaLN modulation ``t_mlp +
scale_shift_table``, its shift/scale/gate slices, its cross-attention's k/v of the caption).
XLA may list that side work anywhere (the modulation of all 28 pairs comes first in a dump, as it
depends only on ``t_mlp``), so order means nothing here: only the dataflow graph does.

1. **The pair's input** ``X_k`` is the residual operand of the residual add after the spatial
   self-attention's output projection: the first op after the projection (forward through
   non-GEMM ops) with an operand that does not come from the projection and does lead to the
   block's qkv projection (the gate does not: its slice feeds only the gated residual). That
   operand is followed back through free data movement to the op that made it (or to the
   function argument, in a stage whose first pair reads ``x`` from the previous stage).
2. **The stage's output** ``Y`` is the last pair's final residual add, found the same way after
   the temporal block's fc2 (its other operand comes from the block's own attention).
3. **Level**: an op that depends on ``X_k`` (strictly: ``X_k`` itself is still the previous
   pair's output, or the embeddings') is in pair ``k`` for the largest such ``k``; an op that
   depends on ``Y`` is after the pairs (the final layer).
4. **Side work** (no level, not a labelled GEMM): in reverse program order, an op all of whose
   readers are in one pair ``k`` belongs to pair ``k``, whatever it reads: the pair's
   modulation, and also its own copy of work on shared data alone (LayerNorm's 1/N and epsilon
   scalars, the temporal RoPE tables, a rescale of ``t_mlp``), which every block of a traced
   stage computes for itself because the tracer keeps XLA's CSE pass off. An op read by two
   pairs, by the stage's ``return`` (``t_mlp`` and the caption embedding passed to the next
   stage) or by nothing is outside the pairs, as is every ``X_k`` that no level claims (the
   embeddings' output).

So the modulation of pair ``k`` belongs to pair ``k``, LayerNorm + modulate before a pair's qkv
belongs to that pair, every pair of a stage costs the same, and a stage of N pairs costs one
pair traced alone x N plus the embeddings and the final layer (tests/test_invariants.py,
tests/test_pair_invariant_traced.py). Work a program computes once and reads in several pairs
stays outside them, charged once, as it runs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import networkx as nx

from hlo_analyzer.blocks import Segmentation
from hlo_analyzer.dataflow import CONSTANT_OPS, FREE_MOVEMENT_OPS, GEMM_OPS, Marker, operand_markers

__all__ = ["RETURN_OP", "pair_owners", "residual_input", "residual_inputs", "unit_owners"]

RETURN_OP = "return"
#: Element types of masks, which are never the residual stream.
BOOLEAN_TYPES = frozenset({"i1", "pred"})
#: How far (in ops) the residual add may lie after the GEMM it follows: a gate, a bias, the
#: all-reduce or reduce-scatter of a tensor-parallel layout and their reshapes are a few dozen.
RESIDUAL_SEARCH_LIMIT = 512



def pair_owners(graph: nx.DiGraph, segmentation: Segmentation,
                inputs: list[Marker | None] | None = None) -> dict[int, int]:
    """Graph node -> block pair (module docstring). Work after the pairs (the final layer) has
    the number of pairs as its owner; work before them (the embeddings) is absent. ``inputs``:
    :func:`residual_inputs` when already found."""
    blocks = segmentation.blocks
    anchors = [(blocks[2 * pair].self_attention.out_proj, blocks[2 * pair].self_attention.q_proj)
               for pair in range(len(blocks) // 2)]
    labelled = {position: index // 2 for index, block in enumerate(blocks)
                for positions in block.labels().values() for position in positions if position is not None}
    last = blocks[-1]
    return unit_owners(graph, anchors, (last.fc2, last.self_attention.q_proj), labelled, inputs)


def unit_owners(graph: nx.DiGraph, anchors: list[tuple[int | None, int]],
                last: tuple[int, int], labelled: dict[int, int],
                inputs: list[Marker | None] | None = None) -> dict[int, int]:
    """Graph node -> unit (a block pair of STDiT3, a block of a generic transformer), by the
    steps of the module docstring. ``anchors``: each unit's first attention (its output
    projection and its q projection), whose residual add gives the unit's input (``inputs``:
    those inputs when already found); ``last``: the last unit's last GEMM and its first q
    projection, whose residual add gives the output; ``labelled``: the units' own GEMMs. Work
    after the units has ``len(anchors)`` as its owner."""
    units = len(anchors)
    if inputs is None:
        inputs = [residual_input(graph, proj, qkv) for proj, qkv in anchors]
    levels_of: dict[Marker, int] = {marker: unit for unit, marker in enumerate(inputs) if marker is not None}
    output = _residual_output(graph, *last)
    if output is not None:
        levels_of[output] = units  # after the units
    attributes_of = dict(graph.nodes(data=True))
    level = _levels(attributes_of, levels_of, graph.graph.get("buffers", {}))
    owner = dict(level)
    owner.update(labelled)
    side: dict[int, int] = {}
    owner_of, side_of, successors = owner.get, side.get, graph.successors
    returns = {node for node, attributes in attributes_of.items() if attributes["name"] == RETURN_OP}
    for node in sorted(attributes_of, reverse=True):
        if node in owner or node in levels_of:  # (every node with a level has an owner)
            continue
        readers = list(successors(node))
        if not readers:
            continue
        units_read = [owner_of(r, side_of(r)) for r in readers]
        first = units_read[0]
        if first is not None and units_read.count(first) == len(units_read) and \
                returns.isdisjoint(readers):
            side[node] = first
    owner.update(side)
    return owner


def residual_inputs(graph: nx.DiGraph, segmentation: Segmentation) -> list[Marker | None]:
    """Each pair's input ``X_k`` on the residual stream (step 1 of the module docstring): the op
    that made it, or ``("argument", i)`` in a stage that reads it from the previous one; None
    where it is not found."""
    blocks = segmentation.blocks
    return [residual_input(graph, blocks[2 * pair].self_attention.out_proj, blocks[2 * pair].self_attention.q_proj)
            for pair in range(len(blocks) // 2)]


def _levels(attributes_of: dict[int, dict], levels_of: dict[Marker, int],
            buffers: dict[int, Marker]) -> dict[int, int]:
    """Step 3: each node (``attributes_of``: the graph's nodes) -> the largest level of a marker
    it strictly depends on. An argument in ``buffers`` (an optimization barrier's result,
    ``dataflow.BUFFER_RESULT_OPS``) is the operand it hands on: a checkpoint's rerun of pair
    ``k`` depends on ``X_k`` through its barrier."""
    level: dict[int, int] = {}
    marker_level, node_level = levels_of.get, level.get
    for node in sorted(attributes_of):
        attributes = attributes_of[node]
        best = -1
        for producer, argument in zip(attributes["operands"], attributes["arguments"]):
            while producer is None and argument in buffers:
                best = max(best, marker_level(("argument", argument), -1))
                marker = buffers[argument]
                producer, argument = (marker, None) if isinstance(marker, int) else (None, marker[1])
            if producer is None:
                best = max(best, marker_level(("argument", argument), -1))
            else:
                best = max(best, marker_level(producer, -1), node_level(producer, -1))
        if best >= 0:
            level[node] = best
    return level


def _operand_markers(attributes: dict) -> Iterable[tuple[int | None, Marker]]:
    return zip(attributes["operands"], operand_markers(attributes))


def _after(graph: nx.DiGraph, start: int) -> Iterable[int]:
    """Nodes after ``start`` through non-GEMM ops, in program order (at most the search limit)."""
    heap = list(graph.successors(start))
    heapq.heapify(heap)
    seen = set(heap)
    for _ in range(RESIDUAL_SEARCH_LIMIT):
        if not heap:
            return
        node = heapq.heappop(heap)
        yield node
        if graph.nodes[node]["name"] in GEMM_OPS:
            continue
        for reader in graph.successors(node):
            if reader not in seen:
                seen.add(reader)
                heapq.heappush(heap, reader)


class _Behind:
    """The nodes and arguments that ``node`` reads through non-GEMM ops (its own operands
    included), found as far as a question needs. In a graph of walk positions
    (``graph.graph["walk_order"]``: each producer's node before its readers', as
    ``DataflowVisitor`` builds it) the walk goes back from ``node`` latest producer first, so
    once every producer left to visit precedes a node ``m``, none still to come can read ``m``
    and whether ``m`` is read is known: a question about a node near ``node`` does not walk the
    whole residual stream behind it (an STDiT3 stage's qkv projection reads, through residual
    adds, every earlier pair). An argument, or a node of another graph, is answered by the
    whole walk."""

    def __init__(self, graph: nx.DiGraph, node: int) -> None:
        self._nodes = graph.nodes
        self._bounded = bool(graph.graph.get("walk_order"))
        self._found: set[Marker] = set()
        self._heap: list[int] = [-node]  # latest first

    def __contains__(self, marker: Marker) -> bool:
        if marker not in self._found:
            self._walk(marker if self._bounded and isinstance(marker, int) else None)
        return marker in self._found

    def _walk(self, bound: int | None) -> None:
        """Visit the producers left, latest first, down to ``bound`` (exclusive; None: all)."""
        heap, found, nodes = self._heap, self._found, self._nodes
        while heap and (bound is None or -heap[0] > bound):
            current = -heapq.heappop(heap)
            for producer, marker in _operand_markers(nodes[current]):
                if marker in found:
                    continue
                found.add(marker)
                if producer is not None and nodes[producer]["name"] not in GEMM_OPS:
                    heapq.heappush(heap, -producer)


def _root(graph: nx.DiGraph, producer: int | None, marker: Marker) -> Marker:
    """Follow free data movement back from an operand to the op (or argument) that made it."""
    nodes = graph.nodes
    while producer is not None and nodes[producer]["name"] in FREE_MOVEMENT_OPS:
        operands = list(_operand_markers(nodes[producer]))
        if len(operands) != 1:
            break
        producer, marker = operands[0]
    return marker


def residual_input(graph: nx.DiGraph, proj: int | None, qkv: int) -> Marker | None:
    """Step 1: the block's input on the residual stream, or None if not found."""
    if proj is None:
        return None
    behind_qkv = _Behind(graph, qkv)
    from_proj = {proj}
    nodes = graph.nodes
    for node in _after(graph, proj):
        attributes = nodes[node]
        operands = list(_operand_markers(attributes))
        if any(p in from_proj for p, _ in operands):
            size = math.prod(attributes["result_shapes"][0]) if attributes["result_shapes"] else 0
            for (producer, marker), shape, dtype in zip(operands, attributes["operand_shapes"],
                                                        attributes["operand_dtypes"]):
                # the residual has the sum's shape (an index or a gate vector has not) and holds
                # numbers (not the official path's temporal mask, broadcast to it for a select)
                if producer not in from_proj and marker in behind_qkv and size > 1 and \
                        math.prod(shape) == size and dtype not in BOOLEAN_TYPES:
                    root = _root(graph, producer, marker)
                    if not (isinstance(root, int) and nodes[root]["name"] in CONSTANT_OPS):
                        return root
            from_proj.add(node)
    return None


def _residual_output(graph: nx.DiGraph, fc2: int, qkv: int) -> int | None:
    """Step 2: the block's final residual add (its output), or None if not found."""
    from_qkv = nx.descendants(graph, qkv)
    from_fc2 = {fc2}
    nodes = graph.nodes
    for node in _after(graph, fc2):
        operands = [p for p in nodes[node]["operands"]]
        if any(p in from_fc2 for p in operands):
            if any(p is not None and p not in from_fc2 and p in from_qkv for p in operands):
                return node
            from_fc2.add(node)
    return None
