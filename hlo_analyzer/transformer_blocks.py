"""The repeated blocks of a generic transformer: a pre-norm (or post-norm) decoder or encoder block
(RMSNorm or LayerNorm; multi-head or grouped-query attention with fused or separate q/k/v
projections; a GELU MLP or a gated one, SwiGLU), a DiT block (the same with adaLN modulation), a
block with a cross-attention between its self-attention and its MLP.

Found by the dataflow search of the STDiT3 segmentation (``hlo_analyzer.blocks``), never by
line order:

1. The **attentions** are ``find_attentions``': a value product whose lhs reaches back through a
   softmax to score products, whose operands lead back to one q and one k projection (and the
   values to a v projection reading k's input, or to k's own fused projection). One whose q and
   k projections read the same tensor is a **self-attention**; the others are cross-attentions.
2. Self-attentions in dependency order are the blocks. Each block's **output projection** is the
   GEMM its values flow into; a **cross-attention** is the first one whose q projection reads
   it; the **MLP**'s up projections are the first GEMM after that (not an attention's) and every
   other GEMM that reaches the same down projection (SwiGLU's gate and up); the **down
   projection** is the first GEMM after the first up projection.
3. **Ownership** (``hlo_analyzer.pairs.unit_owners``): each op belongs to the block whose input on
   the residual stream it depends on, with side work that only one block reads (its
   modulation), so that every kernel's time is charged to one block or to the work outside
   them (embeddings, head).

Labels per block: ``qkv`` (fused) or ``q``, ``kv`` / ``k``, ``v``; ``scores``, ``values``,
``proj``; ``cross_q``, ``cross_kv`` (or ``cross_k``, ``cross_v``), ``cross_scores``,
``cross_values``, ``cross_proj`` when there is a cross-attention; ``fc1``, ``fc2`` for an MLP,
``gate``, ``up``, ``down`` for a gated one.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from hlo_analyzer.blocks import Attention, attention_gemm_nodes, find_attentions
from hlo_analyzer.dataflow import GEMM_OPS, gemm_input, walk_until
from hlo_analyzer.pairs import unit_owners

#: Ops between an MLP's up and down projections that name its activation: GELU's tanh or erf;
#: SiLU's sigmoid, a ``logistic`` (torch-xla) or written out as 1 / (1 + exp(-x)) (JAX).
_GELU_OPS = frozenset({"tanh", "erf"})
_SILU_OPS = frozenset({"logistic", "exponential"})


def is_self_attention(graph: nx.DiGraph, attention: Attention) -> bool:
    """q, k and v from one tensor: one fused projection, or projections of the same input."""
    return attention.is_self or gemm_input(graph, attention.q_proj) == gemm_input(
        graph, attention.kv_proj)


@dataclass(frozen=True)
class TransformerBlock:
    """One block: its attention(s) and its MLP's GEMMs (walk positions)."""

    attention: Attention
    cross_attention: Attention | None
    up: tuple[int, ...]  # fc1, or (gate, up) of a gated MLP: the order of the dump
    down: int
    kind: str  # in words: "attention (GQA) + SwiGLU MLP" and kin (``block_kind``)

    def labels(self) -> dict[str, list[int]]:
        labels = _attention_labels(self.attention, "")
        if self.cross_attention is not None:
            labels |= _attention_labels(self.cross_attention, "cross_")
        if len(self.up) > 1:
            labels |= {"gate": [self.up[0]], "up": list(self.up[1:]), "down": [self.down]}
        else:
            labels |= {"fc1": list(self.up), "fc2": [self.down]}
        return labels


def block_kind(graph: nx.DiGraph, attention: Attention, cross: Attention | None,
               up: tuple[int, ...], activation: str) -> str:
    """A block's kind in words: grouped-query attention when its k projection has fewer
    features than its q projection; the MLP by its gate and its activation ("gelu": a ``tanh``
    or ``erf`` between the up and down projections, "silu": a ``logistic``)."""
    def features(node: int) -> int:
        return graph.nodes[node]["dot_dims"][2]

    words = "attention"
    if attention.q_proj != attention.kv_proj and features(attention.kv_proj) < features(attention.q_proj):
        words += " (GQA)"
    if cross is not None:
        words += " + cross-attention"
    gated = len(up) > 1
    mlp = {("silu", True): "SwiGLU MLP", ("gelu", True): "GeGLU MLP",
           ("gelu", False): "GELU MLP", ("silu", False): "SiLU MLP"}.get(
        (activation, gated), "gated MLP" if gated else "MLP")
    return f"{words} + {mlp}"


def _attention_labels(attention: Attention, prefix: str) -> dict[str, list[int]]:
    if attention.q_proj == attention.kv_proj:
        labels = {f"{prefix}qkv": [attention.q_proj]}
    elif attention.v_proj is None:
        labels = {f"{prefix}q": [attention.q_proj], f"{prefix}kv": [attention.kv_proj]}
    else:
        labels = {f"{prefix}q": [attention.q_proj], f"{prefix}k": [attention.kv_proj],
                  f"{prefix}v": [attention.v_proj]}
    labels |= {f"{prefix}scores": list(attention.scores), f"{prefix}values": list(attention.values)}
    if attention.out_proj is not None:
        labels[f"{prefix}proj"] = [attention.out_proj]
    return labels


@dataclass(frozen=True)
class TransformerSegmentation:
    """The blocks found, each op's block (``owners``: graph node -> block index; the work after
    the last block has ``len(blocks)``, the work before the first none) and the shape summary of
    each block (``shapes``)."""

    blocks: tuple[TransformerBlock, ...]
    owners: dict[int, int]
    shapes: tuple[tuple[tuple[str, int], ...], ...]

    @property
    def consistent(self) -> bool:
        return all(shapes == self.shapes[0] for shapes in self.shapes)


def _gemms_after(graph: nx.DiGraph, nodes: list[int], is_gemm) -> set[int]:
    starts = [s for node in nodes for s in graph.successors(node)]
    return walk_until(graph, starts, backward=False, stop=is_gemm)[0]


def segment_transformer(graph: nx.DiGraph,
                        attentions: list[Attention] | None = None) -> TransformerSegmentation | None:
    """The transformer blocks of the program (module docstring), or None when it has none."""
    attentions = find_attentions(graph) if attentions is None else attentions
    is_gemm = frozenset(n for n, name in graph.nodes(data="name") if name in GEMM_OPS).__contains__
    selves = sorted((a for a in attentions if is_self_attention(graph, a)), key=lambda a: a.q_proj)
    crosses = sorted((a for a in attentions if not is_self_attention(graph, a)),
                     key=lambda a: a.q_proj)
    if not selves:
        return None
    attention_gemms = attention_gemm_nodes(attentions)
    blocks = []
    for attention in selves:
        after_values = _gemms_after(graph, attention.values, is_gemm) - attention_gemms
        if not after_values:
            return None
        attention.out_proj = min(after_values)
        last = attention.out_proj
        readers = _gemms_after(graph, [last], is_gemm)
        cross = next((c for c in crosses if c.q_proj in readers), None)
        if cross is not None:
            cross_after = _gemms_after(graph, cross.values, is_gemm) - attention_gemms
            if not cross_after:
                return None
            cross.out_proj = min(cross_after)
            last = cross.out_proj
        candidates = _gemms_after(graph, [last], is_gemm) - attention_gemms
        if not candidates:
            return None
        first = min(candidates)
        down_candidates = _gemms_after(graph, [first], is_gemm) - attention_gemms
        if not down_candidates:
            return None
        down = min(down_candidates)
        up = tuple(sorted(g for g in candidates
                          if g == first or down in _gemms_after(graph, [g], is_gemm)))
        passed = walk_until(graph, [s for g in up for s in graph.successors(g)], backward=False,
                            stop=is_gemm)[1]
        names = {graph.nodes[n]["name"] for n in passed}
        activation = "gelu" if names & _GELU_OPS else "silu" if names & _SILU_OPS else ""
        blocks.append(TransformerBlock(attention, cross, up, down,
                                       block_kind(graph, attention, cross, up, activation)))
    labelled = {position: index for index, block in enumerate(blocks)
                for positions in block.labels().values() for position in positions}
    anchors = [(block.attention.out_proj, block.attention.q_proj) for block in blocks]
    owners = unit_owners(graph, anchors, (blocks[-1].down, blocks[-1].attention.q_proj), labelled)
    return TransformerSegmentation(tuple(blocks), owners,
                                   tuple(block_shapes(graph, block) for block in blocks))


def block_shapes(graph: nx.DiGraph, block: TransformerBlock) -> tuple[tuple[str, int], ...]:
    """A block's shapes per device, read off its GEMMs (M, K, N, batch): tokens and hidden size
    (the q projection's rows and contraction), q and k/v features, the attention's batch x
    heads product, query and key lengths and head size (the score product), the MLP's hidden
    size (the first up projection's columns)."""
    def dims(node: int) -> tuple[int, int, int, int]:
        return graph.nodes[node]["dot_dims"]

    attention = block.attention
    tokens, hidden, q_features, _ = dims(attention.q_proj)
    _, _, kv_features, _ = dims(attention.kv_proj)
    query_len, head_dim, key_len, batch_heads = dims(attention.scores[0])
    _, _, mlp_hidden, _ = dims(block.up[0])
    return (("tokens", tokens), ("hidden", hidden), ("q_features", q_features),
            ("kv_features", kv_features), ("batch_x_heads", batch_heads),
            ("query_len", query_len), ("key_len", key_len * len(attention.scores)),
            ("head_dim", head_dim), ("mlp_hidden", mlp_hidden))
