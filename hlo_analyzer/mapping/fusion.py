"""``--exec fused``: a compiled graph's kernels (XLA-style fusion).

Ops joined by data dependencies with no GEMM, collective or other unfusable op between them form
one kernel (one pass: reads the tensors entering the group once, writes the tensors leaving it
once; LayerNorm + modulate and residual + next LayerNorm are such groups). Free data movement
(broadcast, reshape, convert, transpose, slice, copy) and ``concatenate`` join groups and cost
nothing of their own; constants are free. Bytes are each tensor's own: in its element type, and a
tensor read only through slices is read as those slices. A group whose only large input is one GEMM's output (all of whose readers are in the
group), whose output has that GEMM's shape and whose other inputs are at most
``EPILOGUE_SIDE_INPUT_ROWS`` rows of N (bias, scale, gate vectors) is that GEMM's epilogue
(:func:`is_epilogue`). That rule reads sizes: RoPE's tables of frames x head_dim after the
temporal attention's q/k projection fit in 8 rows of N at a few frames and not at many, so the
same program makes one kernel at one size and two at another. A mapping for kernel documents
that are rescaled to another size (``MappingOptions.defer_epilogues``: the plan search's
calibrations) leaves that choice on the GEMM (``PendingEpilogue``) for :func:`resolve_epilogues`
to make at the rescaled sizes. A slice write (``select(pad(true), pad(update), buffer)``, XLA's
lowering of torch's ``slice_scatter``) reads and writes the update only: done in place, as
``dynamic_update_slice``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import networkx as nx

from hardware import Op, OpType
from hlo_analyzer.dataflow import CONSTANT_OPS, FREE_MOVEMENT_OPS, dependency_order
from hlo_analyzer.mapping.results import VECTOR_KIND, KernelSource, PendingEpilogue
from hlo_analyzer.mapping.works import (
    Signatures,
    Work,
    dtype_bytes,
    element_count,
    read_shape,
    real_elements,
    rows_of,
    vector_flops,
)
from hlo_analyzer.rows import OpRow

#: Data movement a fused kernel does as it reads or writes: the free movement, and
#: ``concatenate`` (each output element is read from one of the operands, as XLA's loop fusion
#: and torch-inductor's pointwise ``cat`` do it: RoPE's ``rotate_half`` is one kernel with the
#: products and the sum around it).
FUSED_MOVEMENT_OPS = FREE_MOVEMENT_OPS | {"concatenate"}
#: A fused epilogue may read side inputs of up to this many rows of the GEMM's N outputs (a bias,
#: the scale/shift/gate vectors of a few samples) without their reads being charged: at most a
#: few per cent of the GEMM's output bytes for M >= 256 rows.
EPILOGUE_SIDE_INPUT_ROWS = 8


class _Groups:
    """Union-find of fusable nodes (fused mode). A group's root is its least node, so a node's
    parent is never greater than the node."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def add(self, node: int, joining: Sequence[int] = ()) -> None:
        """A new node, in one group with the nodes ``joining`` (alone if none). Nodes come in
        dependency order: in walk order, each greater than those before, unless a call was
        inlined (``dataflow.dependency_order``)."""
        if len(joining) == 1:  # the common case
            root = self.find(joining[0])
            if root < node:
                self.parent[node] = root
                return
            roots = {root}
        else:
            roots = {self.find(other) for other in joining}
        root = min(roots | {node})
        self.parent[node] = root
        for other in roots:
            self.parent[other] = root

    def find(self, node: int) -> int:
        root = node
        while self.parent.setdefault(root, root) != root:
            root = self.parent[root]
        while self.parent[node] != root:
            self.parent[node], node = root, self.parent[node]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def members(self) -> list[list[int]]:
        """Every group, as its nodes in increasing order (one pass: in increasing order a
        node's parent has its root already)."""
        parent = self.parent
        root_of: dict[int, int] = {}
        groups: dict[int, list[int]] = {}
        for node in sorted(parent):
            up = parent[node]
            root = root_of[node] = node if up == node else root_of[up]
            groups.setdefault(root, []).append(node)
        return list(groups.values())


def _fusion_groups(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]],
                   vector_nodes: set[int], owners: dict[int, int]) -> tuple[list[list[int]], set[int]]:
    """Groups of fusable nodes (vector ops and free movement, no constants) with no unfusable op
    on any path between two members, and the constant nodes (constants and free movement of
    constants only).

    Members share an owner (``owners``: the block pair of each node, absent outside the pairs), so
    no kernel spans two pairs, and a "barrier depth" (the most unfusable ops on a path from the
    inputs), so a path that leaves the group through an unfusable op cannot come back. A tensor of
    another owner counts as an input: no path leaves a pair and comes back to it
    (:mod:`hlo_analyzer.pairs`), and so a pair is grouped alike wherever it lies in a stage. *Floating*
    nodes (fusable, fed only by inputs, constants and floating nodes: ``weight * constant``, a
    LayerNorm of an input) group among themselves; a floating group whose results are read by
    exactly one node outside it joins that reader's group, since every path from it passes
    through the reader.
    """
    constant: set[int] = set()
    fusable: set[int] = set()
    floating: set[int] = set()
    #: the most unfusable ops on a path from the inputs to a fusable node; for an unfusable
    #: node, one more (what it adds to the paths through it)
    depth: dict[int, int] = {}
    groups = _Groups()
    owner = owners.get
    for node in dependency_order(graph):
        attributes = attributes_of[node]
        operands = attributes["operands"]
        name = attributes["name"]
        movement = name in FUSED_MOVEMENT_OPS
        if name in CONSTANT_OPS or (movement and operands and constant.issuperset(operands)):
            constant.add(node)
            continue
        mine = owner(node)
        # neither a constant, nor an argument, nor another pair's (which counts as an input)
        inputs = [p for p in operands if p in depth and owner(p) == mine]
        node_depth = max(map(depth.__getitem__, inputs), default=0)
        if not movement and node not in vector_nodes:
            depth[node] = node_depth + 1
            continue
        depth[node] = node_depth
        fusable.add(node)
        is_floating = floating.issuperset(inputs)
        if is_floating:
            floating.add(node)
        groups.add(node, [p for p in inputs if p in fusable and (p in floating) == is_floating
                          and depth[p] == node_depth])
    floating_groups: dict[int, list[int]] = {}
    for node in floating:
        floating_groups.setdefault(groups.find(node), []).append(node)
    for nodes in floating_groups.values():
        readers = {r for node in nodes for r in graph.successors(node)} - set(nodes)
        if len(readers) == 1 and (reader := readers.pop()) in fusable and owner(reader) == owner(nodes[0]):
            groups.union(nodes[0], reader)
    return [nodes for nodes in groups.members() if not vector_nodes.isdisjoint(nodes)], constant


class GroupIO(NamedTuple):
    """What a kernel over a group of nodes reads and writes (:func:`group_io`)."""

    entering: list[tuple[Any, tuple[int, ...]]]  # (producer or ("argument", i), what is read of it)
    out_elements: int
    entering_bytes: list[int]  # of each entering tensor, in its element type
    out_bytes: int


#: Free movement whose result has its operand's elements (so reading a part of the result reads
#: as much of the operand): all but the broadcasts (which repeat elements) and ``slice``.
_WHOLE_VIEWS = FREE_MOVEMENT_OPS - {"broadcast", "broadcast_in_dim", "slice"}


def group_io(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], members: list[int],
              constant: set[int], real: dict[int, int], *, results_only: bool = False) -> GroupIO:
    """The tensors entering the group and the elements of the tensors leaving it, and both in
    bytes (each tensor in its own element type). Both at their real size
    (:func:`real_elements`): a broadcast entering the group is read as its operand; a tensor that
    the group reads only through slices is read as those slices (:func:`_parts_read`); a view
    leaving it is written once per tensor it views, and not at all when it views a tensor that
    entered the group (its readers read that). ``results_only``: what members read of each
    other (the kernel's temporaries) is not written even where ops outside read it too."""
    inside = set(members)
    #: key -> (shape read whole, element type, the parts read: None for all of it)
    entering: dict[Any, tuple[tuple[int, ...], str, list[Part] | None]] = {}
    leaving: dict[int, tuple[int, str]] = {}  # computing member -> largest real size that leaves
    successors = graph.successors
    for node in members:
        attributes = attributes_of[node]
        for index, producer in enumerate(attributes["operands"]):
            if producer in inside or producer in constant:
                continue
            whole = read_shape(producer, attributes["operand_shapes"][index], real)
            if whole is None:
                continue
            key = producer if producer is not None else ("argument", attributes["arguments"][index])
            parts = _parts_read(graph, attributes_of, node, inside, reader=True)
            known = entering.get(key)
            if known is not None:
                parts = None if parts is None or known[2] is None else known[2] + parts
            entering[key] = (whole, attributes["operand_dtypes"][index], parts)
        readers = set(successors(node))
        if readers and readers <= inside or results_only and not readers.isdisjoint(inside):
            continue
        source = _computing_source(attributes_of, node, inside)
        if source is not None and real[node] >= leaving.get(source, (0, ""))[0]:
            leaving[source] = (real[node], attributes["dtype"])
    read = [(key, _shape_read(whole, parts), dtype) for key, (whole, dtype, parts) in entering.items()]
    return GroupIO([(key, shape) for key, shape, _ in read],
                    sum(size for size, _ in leaving.values()),
                    [element_count(shape) * dtype_bytes(dtype) for _, shape, dtype in read],
                    sum(size * dtype_bytes(dtype) for size, dtype in leaving.values()))


#: A part of a tensor that a slice reads: its shape, and its box (``dataflow.slice_box``).
Part = tuple[tuple[int, ...], Any]


def _parts_read(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], node: int, inside: set[int],
                *, reader: bool = False) -> list[Part] | None:
    """The parts of ``node``'s result that the group ``inside`` reads (slices), or
    None for all of it: a slice reads its part; a view of the whole (``_WHOLE_VIEWS``) reads the
    parts of itself that its readers read, all of it if a reader is outside the group. With
    ``reader``, the same of the operand that ``node`` (a member) reads."""
    if reader:
        name = attributes_of[node]["name"]
        if name == "slice":
            return [(tuple(attributes_of[node]["result_shapes"][0]), attributes_of[node].get("slice"))]
        return _parts_read(graph, attributes_of, node, inside) if name in _WHOLE_VIEWS else None
    readers = set(graph.successors(node))
    if not readers or not readers <= inside:
        return None
    parts: list[Part] = []
    for member in readers:
        read = _parts_read(graph, attributes_of, member, inside, reader=True)
        if read is None:
            return None
        parts += read
    return parts


def _shape_read(whole: tuple[int, ...], parts: list[Part] | None) -> tuple[int, ...]:
    """What is read of a tensor of (real) shape ``whole`` of which the ``parts`` are read (None:
    all): one part (or several slices of the same box, as a trace without CSE has them) as its
    shape, several as their element count, at most the whole (overlapping boxes count twice)."""
    if parts is None:
        return whole
    distinct = list(dict.fromkeys(parts))
    if len(distinct) == 1 and element_count(distinct[0][0]) <= element_count(whole):
        return tuple(int(d) for d in distinct[0][0]) or (1,)
    return min(whole, (sum(element_count(shape) for shape, _ in distinct),), key=element_count)


def _computing_source(attributes_of: dict[int, dict[str, Any]], node: int, inside: set[int]) -> int | None:
    """The member that computed what ``node`` holds (``node`` itself unless it is free movement),
    or None when it views a tensor from outside the group."""
    while attributes_of[node]["name"] in FREE_MOVEMENT_OPS:
        producer = attributes_of[node]["operands"][0] if attributes_of[node]["operands"] else None
        if producer not in inside:
            return None
        node = producer
    return node


def fused_vector_works(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], rows: dict[int, OpRow],
                        vector_nodes: set[int], gemms: dict[int, Work], signatures: Signatures,
                        owners: dict[int, int], *, defer: bool = False) -> tuple[list[Work], dict[int, Work]]:
    """Fused vector kernels, and GEMMs that took a group as their epilogue (by GEMM position);
    with ``defer``, a group that a GEMM's epilogue takes or not by the sizes is left pending on
    that GEMM (:class:`PendingEpilogue`) whatever these sizes say."""
    works: list[Work] = []
    with_epilogue: dict[int, Work] = {}
    exp_ops = signatures.exp_ops
    groups, constant = _fusion_groups(graph, attributes_of, vector_nodes, owners)
    real = real_elements(attributes_of, dependency_order(graph))
    for members in sorted(groups):
        vector_rows = [rows[n] for n in members if n in vector_nodes]
        flops = sum([vector_flops(r, exp_ops) for r in vector_rows])
        entering, out_elements, in_bytes, out_bytes = group_io(graph, attributes_of, members, constant, real)
        largest = max(vector_rows, key=result_elements)
        result = largest.result_shapes[0] if largest.result_shapes else ()
        update = _slice_write_update(attributes_of, members, constant)
        if update is not None:  # written in place: reads and writes the update only
            entering, out_elements, result = [update], element_count(update[1]), update[1]
            in_bytes, out_bytes = [out_elements * dtype_bytes(largest.dtype)], out_elements * dtype_bytes(largest.dtype)
        name = signatures.fusion_name(tuple([r.op for r in vector_rows]))
        positions = tuple(members)
        # Bytes, not elements: each tensor in its own element type (a mixed-precision fusion
        # reads fp16 and writes fp16 whatever it computes in).
        op = signatures.vector_op(name, tuple((max(1, b),) for b in in_bytes), rows_of(largest, result),
                                  out_bytes or element_count(result) * dtype_bytes(largest.dtype), flops, 1)
        candidate = _epilogue_candidate(graph, members, entering, gemms, with_epilogue)
        if candidate is not None:
            gemm, side = candidate
            if defer:
                with_epilogue[gemm] = gemms[gemm]._replace(
                    positions=tuple(sorted(gemms[gemm].positions + positions)),
                    pending=PendingEpilogue(name, op, out_elements, side))
                continue
            if is_epilogue(gemms[gemm].op, out_elements, side):
                with_epilogue[gemm] = fused_epilogue(gemms[gemm], name, flops, positions)
                continue
        shapes = signatures.shapes_text(tuple([s for _, s in entering]), (result,))
        # A fused kernel runs once all its inputs are ready: at its last member.
        works.append(Work(positions[-1], positions, name, VECTOR_KIND, shapes, op=op))
    return works, with_epilogue


def fused_epilogue(gemm: Work, name: str, flops: int, positions: tuple[int, ...]) -> Work:
    """The GEMM ``gemm`` with the element-wise work ``name`` (``flops``, the ops at
    ``positions``) done in its epilogue, on its (M, N) output."""
    assert gemm.op is not None
    return gemm._replace(positions=tuple(sorted(gemm.positions + positions)), name=f"{gemm.name}+{name}",
                         epilogue=_epilogue_op(gemm.op, name, flops))


def _epilogue_op(gemm: Op, name: str, flops: int) -> Op:
    m, n = gemm.output_shape
    return Op(name, OpType.VECTOR, ((m, n),), None, (m, n), max(1, flops), gemm.bytes_per_element)


def is_epilogue(gemm: Op, out_elements: int, side_elements: Sequence[int]) -> bool:
    """Whether a group of element-wise ops that reads a GEMM's output (all of it, and nothing
    else of its size) and writes ``out_elements`` is that GEMM's epilogue: it writes the GEMM's
    (M, N) shape, and its side inputs hold at most ``EPILOGUE_SIDE_INPUT_ROWS`` rows of N."""
    m, n = gemm.output_shape
    return out_elements == m * n and sum(side_elements) <= EPILOGUE_SIDE_INPUT_ROWS * n


def resolve_epilogues(kernels: Sequence[KernelSource]) -> tuple[KernelSource, ...]:
    """``kernels`` with each pending epilogue (:class:`PendingEpilogue`) decided at the sizes
    it holds now (:func:`is_epilogue`): the GEMM with it as its fused epilogue, or the GEMM
    followed by a vector kernel of its own, as a mapping of a program of those sizes finds
    them."""
    resolved: list[KernelSource] = []
    for kernel in kernels:
        pending = kernel.pending
        if pending is None:
            resolved.append(kernel)
        elif is_epilogue(kernel.op, pending.out_elements, pending.side_elements):
            resolved.append(kernel._replace(name=f"{kernel.name}+{pending.name}", pending=None,
                                            epilogue=_epilogue_op(kernel.op, pending.name, pending.op.flops)))
        else:
            resolved += [kernel._replace(pending=None), KernelSource(pending.name, VECTOR_KIND, "", pending.op)]
    return tuple(resolved)


def result_elements(row: OpRow) -> int:
    return element_count(row.result_shapes[0]) if row.result_shapes else 0


def _slice_write_update(attributes_of: dict[int, dict[str, Any]], members: list[int],
                        constant: set[int]) -> tuple[int | None, tuple[int, ...]] | None:
    """The update of a slice write, if the group is one: ``select(pad(true), pad(update),
    buffer)``, how XLA lowers torch's ``slice_scatter`` (the PipeFusion stale K/V write,
    tracing/pipefusion.py). A fused kernel writes the update into the buffer in place, as
    ``dynamic_update_slice`` would, instead of reading and rewriting the whole buffer; the free
    movement that follows (the transpose of K for the score GEMM) is its readers' business."""
    computing = [n for n in members if attributes_of[n]["name"] not in FREE_MOVEMENT_OPS]
    if len(computing) != 1 or attributes_of[computing[0]]["name"] != "select":
        return None
    mask, data = attributes_of[computing[0]]["operands"][:2]
    if mask is None or data is None:
        return None
    mask_node, data_node = attributes_of[mask], attributes_of[data]
    if mask_node["name"] != "pad" or data_node["name"] != "pad" or \
            mask_node["operands"][0] not in constant or \
            list(mask_node["operand_shapes"][0]) != list(data_node["operand_shapes"][0]):
        return None
    return data_node["operands"][0], tuple(data_node["operand_shapes"][0])


def _epilogue_candidate(graph: nx.DiGraph, members: list[int], entering: list[tuple[int | None, tuple[int, ...]]],
                        gemms: dict[int, Work], taken: dict[int, Work]) -> tuple[int, tuple[int, ...]] | None:
    """The GEMM whose epilogue the group may be, by the program's structure (it reads one
    GEMM's output, the GEMM's only reader, not batched, not taken), and the elements of each
    side input the group reads; :func:`is_epilogue` decides by the sizes."""
    producers = [p for p, _ in entering if p in gemms]
    if len(producers) != 1 or producers[0] in taken or gemms[producers[0]].op.batch != 1:
        return None
    gemm = producers[0]
    if set(graph.successors(gemm)) - set(members):
        return None
    return gemm, tuple(element_count(s) for p, s in entering if p != gemm)
