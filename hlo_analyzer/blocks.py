"""Cut an STDiT3 stage's op stream into blocks and recover the per-block shape dictionary.

How (all by data dependencies in the module's dataflow graph, never by line order):

1. An **attention** is found at its value product: a GEMM whose lhs reaches back, through
   non-GEMM ops that include an ``exponential`` (the softmax), to score GEMMs. The scores' lhs
   leads back to the q projection, their rhs and the values' rhs to the k/v projection. One
   projection for q, k and v is a **self-attention** (fused qkv, and the q/k RMSNorm ``rsqrt``
   markers lie on that path); two different ones are a **cross-attention** (q, kv). Ring
   attention has several score/value GEMMs per attention: they share the projections.
2. The attention's **output projection** is the GEMM its values flow into.
3. Self-attentions in dependency order are the blocks (spatial, temporal, spatial, ...). Each
   block's **cross-attention** is the first one whose q projection reads the block's
   self-attention output; its **MLP** (fc1, fc2) is the first GEMM pair after the
   cross-attention's output projection. The residual stream connects every block to all later
   ones, so "first" means least in a topological order, which dependencies make unambiguous.

Labels per block: qkv, scores, values, proj, cross_q, cross_kv, cross_scores, cross_values,
cross_proj, fc1, fc2. The shape dictionary is a ``models.opensora.block_ops.BlockShapes`` (its one home).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
from jaxlib.mlir import ir

from hlo_analyzer.dataflow import (
    GEMM_OPS,
    SOFTMAX_SPAN_LIMIT,
    after_exponential,
    behind_buffers,
    build_dataflow,
    gemm_input,
    walk_until,
)
from hlo_analyzer.tensors import ELEMENT_BYTES
from hlo_trace.errors import UsageError
from models.opensora.block_ops import BlockShapes

LABELS = ("qkv", "scores", "values", "proj", "cross_q", "cross_kv", "cross_scores",
          "cross_values", "cross_proj", "fc1", "fc2")


class NotSTDiTError(UsageError):
    """The dump does not have the structure of an STDiT3 stage."""


@dataclass
class Attention:
    q_proj: int
    kv_proj: int  # the k projection (fused with v unless ``v_proj`` is set)
    scores: list[int]
    values: list[int]
    q_norms: list[int] = field(default_factory=list)  # rsqrt nodes on the q path
    out_proj: int | None = None
    #: A v projection of its own (Llama's ``k_proj`` / ``v_proj``), reading the input that the
    #: k projection reads; None when k and v come from one fused projection.
    v_proj: int | None = None

    @property
    def is_self(self) -> bool:
        """One fused projection for q, k and v (STDiT3's self-attention)."""
        return self.q_proj == self.kv_proj

    def projections(self) -> list[int]:
        return [p for p in dict.fromkeys((self.q_proj, self.kv_proj, self.v_proj)) if p is not None]


@dataclass
class Block:
    kind: str  # "spatial" or "temporal"
    self_attention: Attention
    cross_attention: Attention
    fc1: int
    fc2: int

    def labels(self) -> dict[str, list[int]]:
        attn, cross = self.self_attention, self.cross_attention
        return {
            "qkv": [attn.q_proj], "scores": attn.scores, "values": attn.values,
            "proj": [attn.out_proj], "cross_q": [cross.q_proj], "cross_kv": [cross.kv_proj],
            "cross_scores": cross.scores, "cross_values": cross.values,
            "cross_proj": [cross.out_proj], "fc1": [self.fc1], "fc2": [self.fc2],
        }


@dataclass
class Segmentation:
    blocks: list[Block]
    shapes: BlockShapes  # the per-block shape dictionary of the first pair
    per_pair_shapes: list[BlockShapes]

    @property
    def pairs(self) -> int:
        return len(self.blocks) // 2

    @property
    def consistent(self) -> bool:
        """Every pair has the first pair's shape dictionary."""
        return all(shapes == self.shapes for shapes in self.per_pair_shapes)


def segment_blocks(module: ir.Module, source: str = "<module>", *,
                   graph: nx.DiGraph | None = None,
                   attentions: list[Attention] | None = None) -> Segmentation:
    """Find the STDiT3 blocks of a stage dump (``graph``: its dataflow graph, ``attentions``: its
    :func:`find_attentions`, if already built); raises NotSTDiTError (one line) if it has none."""
    graph = build_dataflow(module) if graph is None else graph
    attentions = find_attentions(graph) if attentions is None else attentions
    attentions = _not_recomputed(graph, attentions)
    self_attentions = sorted((a for a in attentions if a.is_self), key=lambda a: a.q_proj)
    cross_attentions = sorted((a for a in attentions if not a.is_self), key=lambda a: a.q_proj)
    if not self_attentions:
        raise NotSTDiTError(f"{source}: does not look like an STDiT3 stage: no self-attention "
                            "(softmax between two GEMMs sharing one q/k/v projection) found")
    if len(self_attentions) % 2:
        raise NotSTDiTError(f"{source}: does not look like an STDiT3 stage: "
                            f"{len(self_attentions)} self-attentions, expected spatial/temporal pairs")
    attention_gemms = attention_gemm_nodes(attentions)

    cross_of = {c.q_proj: c for c in reversed(cross_attentions)}  # the first of a q_proj wins
    blocks = []
    for index, attention in enumerate(self_attentions):
        attention.out_proj = _first_gemm_after(graph, attention.values)
        cross_q = _first_gemm_after(graph, [attention.out_proj], cross_of.__contains__, required=False)
        if cross_q is None:
            raise NotSTDiTError(f"{source}: does not look like an STDiT3 stage: block {index} "
                                "has no cross-attention after its self-attention")
        cross = cross_of[cross_q]
        cross.out_proj = _first_gemm_after(graph, cross.values)
        fc1 = _first_gemm_after(graph, [cross.out_proj], lambda g: g not in attention_gemms)
        fc2 = _first_gemm_after(graph, [fc1])
        kind = "spatial" if index % 2 == 0 else "temporal"
        blocks.append(Block(kind, attention, cross, fc1, fc2))

    try:
        per_pair = [_pair_shapes(graph, blocks[i], blocks[i + 1], len(blocks) // 2)
                    for i in range(0, len(blocks), 2)]
    except ValueError as error:
        raise NotSTDiTError(f"{source}: does not look like an STDiT3 stage: {error}") from None
    return Segmentation(blocks, per_pair[0], per_pair)


def _not_recomputed(graph: nx.DiGraph, attentions: list[Attention]) -> list[Attention]:
    """The attentions but those behind an optimization barrier (``dataflow.behind_buffers``)
    when there are others: a training step with activation checkpointing runs each block's
    forward again inside the backward, behind the checkpoint's barrier, and that rerun is no
    block of the stage (its kernels are charged as the backward's)."""
    behind = behind_buffers(graph)
    kept = [a for a in attentions if behind.isdisjoint(a.values)]
    return kept if kept else attentions


def attention_gemm_nodes(attentions: list[Attention]) -> set[int]:
    """Every projection, score and value GEMM of the attentions (not their output projections)."""
    return {p for a in attentions for p in a.projections()} | {
        g for a in attentions for g in a.scores + a.values}


# -- finding the pieces ---------------------------------------------------------------------------
def _gemm_nodes(graph: nx.DiGraph) -> frozenset[int]:
    """The graph's GEMM nodes (cached on the graph)."""
    gemms = graph.graph.get("gemms")
    if gemms is None:
        gemms = graph.graph["gemms"] = frozenset(n for n, name in graph.nodes(data="name") if name in GEMM_OPS)
    return gemms


def _gemms_before(graph: nx.DiGraph, node: int, operand: int, *,
                  limit: int | None = None) -> tuple[set[int], set[int]]:
    producer = graph.nodes[node]["operands"][operand]
    return walk_until(graph, [producer], backward=True, stop=_gemm_nodes(graph).__contains__, limit=limit)


class _Projections:
    """The GEMMs an operand of a node reaches back to (and the nodes passed on the way), walked
    once per producer: the q, k and v paths of an attention often start at one node."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        self.is_gemm = _gemm_nodes(graph).__contains__
        self.walks: dict[int | None, tuple[set[int], set[int]]] = {}

    def before(self, node: int, operand: int) -> tuple[set[int], set[int]]:
        """(GEMMs reached, nodes passed); the sets are shared: do not change them."""
        producer = self.graph.nodes[node]["operands"][operand]
        walk = self.walks.get(producer)
        if walk is None:
            walk = self.walks[producer] = walk_until(self.graph, [producer], backward=True, stop=self.is_gemm)
        return walk


def find_attentions(graph: nx.DiGraph) -> list[Attention]:
    """Every attention of the graph (step 1 of the module docstring), self- and cross-.

    XLA may put either operand of a product first (JAX's ``einsum("bhqk,bkhd->bqhd", p, v)``
    partitions to ``dot_general(v, p)``): the softmax output is whichever operand follows an
    ``exponential``; of the score product's two operands, k is the one whose projection reads
    the v projection's input (or is v's own fused projection), the one of v's width when both
    do (grouped-query attention's k and v are narrower than q), else the second."""
    by_projections: dict[tuple[int, int], Attention] = {}
    softmax_outputs = after_exponential(graph)
    projections = _Projections(graph)
    nodes = graph.nodes
    for node in sorted(_gemm_nodes(graph)):
        operands = nodes[node]["operands"]
        if operands[0] in softmax_outputs:
            probs_operand = 0
        elif operands[1] in softmax_outputs:
            probs_operand = 1
        else:
            continue
        scores, passed = _gemms_before(graph, node, probs_operand, limit=SOFTMAX_SPAN_LIMIT)
        if not scores or not any(nodes[p]["name"] == "exponential" for p in passed):
            continue
        sides: list[set[int]] = [set(), set()]
        paths: list[set[int]] = [set(), set()]
        for score in scores:
            for operand in (0, 1):
                gemms, nodes_passed = projections.before(score, operand)
                sides[operand] |= gemms
                paths[operand] |= nodes_passed
        v_side = projections.before(node, 1 - probs_operand)[0]
        if len(sides[0]) != 1 or len(sides[1]) != 1 or len(v_side) != 1:
            continue  # not an attention: a product fed by several projections
        v_proj = next(iter(v_side))
        order = _query_key_order(graph, next(iter(sides[0])), next(iter(sides[1])), v_proj)
        if order is None:
            continue  # k and v of different inputs: no attention (a backward product, ...)
        q_operand = order
        q_proj, k_proj = next(iter(sides[q_operand])), next(iter(sides[1 - q_operand]))
        key = (q_proj, k_proj)
        attention = by_projections.setdefault(key, Attention(
            key[0], key[1], [], [], v_proj=None if v_proj == k_proj else v_proj))
        attention.values.append(node)
        attention.scores.extend(s for s in sorted(scores) if s not in attention.scores)
        attention.q_norms = sorted(set(attention.q_norms) | {
            p for p in paths[q_operand] if nodes[p]["name"] == "rsqrt"})
    return list(by_projections.values())


def _query_key_order(graph: nx.DiGraph, first: int, second: int, v_proj: int) -> int | None:
    """Which operand of the score product holds q (0 or 1; the other holds k), given the
    projections they lead back to and the v projection; None when neither can be k."""
    def can_be_k(proj: int) -> bool:
        return proj == v_proj or gemm_input(graph, proj) == gemm_input(graph, v_proj)

    candidates = [q_operand for q_operand, k_proj in ((0, second), (1, first)) if can_be_k(k_proj)]
    if len(candidates) == 2:  # both read v's input: k is the one of v's width, else the second
        width = graph.nodes[v_proj]["dot_dims"][2]
        if graph.nodes[second]["dot_dims"][2] != width and graph.nodes[first]["dot_dims"][2] == width:
            return 1
        return 0
    return candidates[0] if candidates else None


def _first(graph: nx.DiGraph, nodes: set[int]) -> int:
    # Positions are a topological order: of two dependent ops the producer comes first.
    return min(nodes)


def _first_gemm_after(graph: nx.DiGraph, nodes: list[int], accept: Callable[[int], bool] | None = None, *,
                      required: bool = True) -> int | None:
    """The first GEMM (smallest position) that the results of ``nodes`` reach without passing
    another GEMM, of those ``accept`` takes (the others stop the walk too). The walk goes in
    position order and stops at the first: positions are a topological order (of two dependent
    ops the producer comes first), so no GEMM found later has a smaller position. Without one:
    ValueError (None when not ``required``)."""
    is_gemm = _gemm_nodes(graph).__contains__
    heap = sorted({s for node in nodes for s in graph.successors(node)})
    seen = set(heap)
    while heap:
        node = heapq.heappop(heap)
        if is_gemm(node):
            if accept is None or accept(node):
                return node
            continue
        for reader in graph.successors(node):
            if reader not in seen:
                seen.add(reader)
                heapq.heappush(heap, reader)
    if required:
        raise ValueError(f"no GEMM after {nodes[:3]}")
    return None


# -- the dictionary -------------------------------------------------------------------------------
def _mkn(graph: nx.DiGraph, node: int) -> tuple[int, int, int, int]:
    return graph.nodes[node]["dot_dims"]


def _attention_shapes(graph: nx.DiGraph, attention: Attention) -> dict[str, int]:
    """Shapes of one attention: its (batch x heads) product, its own local head count, lengths."""
    m, k, n, batch = _mkn(graph, attention.scores[0])
    # The q RMSNorm runs on (B', heads, L, head_dim): its rsqrt has shape (B', heads, L, 1), so
    # B' is its first dimension, whatever the attention GEMM flattened.  The cross-attention has
    # no q norm: OpenSora flattens all samples into one sequence, so its batch is 1 and every
    # (batch x heads) entry is a head.
    norm_shapes = [graph.nodes[p]["result_shapes"][0] for p in attention.q_norms]
    batch_rows = norm_shapes[0][0] if norm_shapes and len(norm_shapes[0]) == 4 else 1
    # Ring attention has one score GEMM per K/V block passed round the ring: the key length of
    # the attention is their sum.
    return {"product": batch, "heads": max(1, batch // batch_rows), "s_q": m,
            "s_kv": n * len(attention.scores), "head_dim": k}


def _pair_shapes(graph: nx.DiGraph, spatial: Block, temporal: Block, pairs: int) -> BlockShapes:
    spt = _attention_shapes(graph, spatial.self_attention)
    tmp = _attention_shapes(graph, temporal.self_attention)
    cro = _attention_shapes(graph, spatial.cross_attention)
    # One N_A serves the three attentions, which a strategy may split differently (DS-Ulysses
    # keeps the heads of the local self-attention whole and splits those of the other one and
    # of the cross-attention): N_A is the largest head count that divides all three, and each
    # batch B_* = its (batch x heads) product / N_A, so B_* * N_A is every attention's
    # product exactly -- what the hardware mapping costs.
    heads = math.gcd(spt["heads"], tmp["heads"], cro["heads"])
    _, d_qkv, h_qkv, _ = _mkn(graph, spatial.self_attention.q_proj)
    _, d_o_spt, h_o_spt, _ = _mkn(graph, spatial.self_attention.out_proj)
    _, d_o_tmp, h_o_tmp, _ = _mkn(graph, temporal.self_attention.out_proj)
    _, d_o_cro, h_o_cro, _ = _mkn(graph, spatial.cross_attention.out_proj)
    _, d_fu, h_fu, _ = _mkn(graph, spatial.fc1)
    _, d_fd, h_fd, _ = _mkn(graph, spatial.fc2)
    dtype = graph.nodes[spatial.self_attention.q_proj]["dtype"]
    return BlockShapes(
        B_spt=spt["product"] // heads, S_Q_spt=spt["s_q"], S_KV_spt=spt["s_kv"],
        D_QKV=d_qkv, H_QKV=h_qkv, N_A=heads, H_A=spt["head_dim"],
        D_O_spt=d_o_spt, H_O_spt=h_o_spt,
        B_tmp=tmp["product"] // heads, S_Q_tmp=tmp["s_q"], S_KV_tmp=tmp["s_kv"],
        D_O_tmp=d_o_tmp, H_O_tmp=h_o_tmp,
        B_cro=cro["product"] // heads, S_Q_cro=cro["s_q"], S_KV_cro=cro["s_kv"],
        D_O_cro=d_o_cro, H_O_cro=h_o_cro,
        D_FU=d_fu, H_FU=h_fu, D_FD=d_fd, H_FD=h_fd,
        L=pairs, Q=ELEMENT_BYTES.get(dtype, 2),
    )
