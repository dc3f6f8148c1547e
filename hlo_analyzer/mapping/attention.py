"""Fused attention: where the chip has a fused attention kernel (``ChipSpec.fused_attention_kernel``),
every pattern of the dataflow graph "score GEMM(s) -> non-GEMM ops with an ``exponential`` (the
softmax) -> value GEMM" with matching shapes becomes one ``FlashAttention`` op: heads = the GEMMs'
batch, ``S_KV`` = the sum of the score GEMMs' N (ring attention has one score GEMM per K/V block),
the absorbed vector ops' FLOPs its softmax work.

**Per-sample cross-attention** (``MappingOptions.cross_attention``, default ``per-sample``):
OpenSora flattens the queries of all samples into one sequence and the caption tokens of all
samples into another and masks the cross terms block-diagonally; its real kernel (xformers'
block-diagonal mask) reads only each sample's own caption tokens. A cross-attention (one whose
value GEMM the caller names in ``cross_values``: ``hlo_analyzer.blocks`` finds attentions whose q
and k/v come from different projections) whose key length is ``k > 1`` times ``caption_tokens``
is charged as ``k`` samples, each of ``S_Q / k`` queries against its own ``caption_tokens`` keys
(all ``S_Q`` queries against ``caption_tokens`` keys when ``S_Q`` does not split in ``k``): the
same queries, ``1/k`` of the score and value FLOPs and of the softmax work. ``all`` charges the
traced (masked) ``k * caption_tokens`` keys. A chip without a fused attention kernel runs the
traced GEMMs and softmax in either mode.
"""

from __future__ import annotations

from collections.abc import Collection

import networkx as nx

from hardware import Op, OpType
from hlo_analyzer.dataflow import (
    SOFTMAX_SPAN_LIMIT,
    after_exponential,
    attention_probabilities,
    walk_until,
)
from hlo_analyzer.mapping.results import FLASH_KIND, MappingOptions
from hlo_analyzer.mapping.works import Work, behind_views, dtype_bytes, element_count, vector_flops
from hlo_analyzer.rows import COMM, VECTOR, OpRow


def _attention_work(graph: nx.DiGraph, value_gemm: int, is_gemm: set[int], rows: dict[int, OpRow],
                    claimed: set[int], exp_ops: int) -> Work | None:
    found = attention_probabilities(graph, value_gemm, is_gemm)
    if found is None:
        return None
    side, scores, passed = found
    # A ring attention's later block reaches the earlier blocks' scores too, through the running
    # row maximum its rescale reads: those belong to the earlier blocks' kernels, found first. It
    # still has an exponential of its own; a backward product (dS @ K) reaches only the forward's.
    scores, passed = scores - claimed, passed - claimed
    if not scores or not any(graph.nodes[p]["name"] == "exponential" for p in passed) or \
            any(rows[p].category == COMM for p in passed if p in rows):
        return None
    m_v, k_v, n_v, heads = graph.nodes[value_gemm]["dot_dims"]
    # probabilities (S_Q x S_KV) @ v (S_KV x head_dim), or v^T @ probabilities^T
    s_q, head_dim = (m_v, n_v) if side == 0 else (n_v, m_v)
    parts = []
    for score in scores:
        m, k, n, b = graph.nodes[score]["dot_dims"]
        if k != head_dim or b != heads or s_q not in (m, n):
            return None
        parts.append(n if m == s_q else m)
    s_kv = sum(parts)
    if k_v not in (s_kv, *parts):
        return None
    passed |= row_statistics(graph, passed, claimed)
    vector_rows = [rows[p] for p in passed if p in rows and rows[p].category == VECTOR]
    softmax_flops = sum(vector_flops(r, exp_ops) for r in vector_rows)
    q = (1, heads, s_q, head_dim)
    kv = (1, heads, s_kv, head_dim)
    row = rows[value_gemm]
    op = Op("flash_attention", OpType.FLASH_ATTENTION, (q, kv, kv), None, q, 4 * heads * s_q * s_kv * head_dim,
            dtype_bytes(row.dtype), vector_flops=softmax_flops)
    positions = tuple(sorted(scores | {r.position for r in vector_rows} | {value_gemm}))
    return Work(value_gemm, positions, "flash_attention", FLASH_KIND,
                 f"q {heads}x{s_q}x{head_dim}, kv {heads}x{s_kv}x{head_dim}", op=op)


def row_statistics(graph: nx.DiGraph, softmax: set[int], claimed: set[int]) -> set[int]:
    """The reductions that read the softmax's probabilities (its ops from the ``exponential`` on:
    not a constant or a scale it shares with other ops) besides the path to the value GEMM: the row
    sums of a normalisation deferred past the value GEMM (flash-attn's epilogue, the log-sum-exp a
    ring step returns). The fused kernel keeps the probabilities in on-chip tiles and takes these
    sums there; charged outside, each would read the S_Q x S_KV probabilities from memory."""
    nodes, probabilities = graph.nodes, after_exponential(graph)
    return {user for node in softmax if node in probabilities for user in graph.successors(node)
            if nodes[user]["name"] == "reduce" and user not in softmax and user not in claimed}


def _per_sample(work: Work, keys_per_sample: int) -> Work | None:
    """The cross-attention ``work`` with each query reading only its own sample's keys, or None
    when its key length is not several samples of ``keys_per_sample`` (module docstring)."""
    assert work.op is not None
    q, kv, _ = work.op.input_shapes
    _, heads, s_q, head_dim = q
    s_kv = kv[2]
    samples = s_kv // keys_per_sample
    if samples < 2 or s_kv % keys_per_sample:
        return None
    groups = samples if s_q % samples == 0 else 1
    q_shape = (groups, heads, s_q // groups, head_dim)
    kv_shape = (groups, heads, keys_per_sample, head_dim)
    op = Op(work.op.name, OpType.FLASH_ATTENTION, (q_shape, kv_shape, kv_shape), None, q_shape,
            4 * heads * s_q * keys_per_sample * head_dim, work.op.bytes_per_element,
            vector_flops=work.op.vector_flops // samples)
    shapes = (f"q {heads}x{s_q}x{head_dim}, kv {heads}x{keys_per_sample}x{head_dim} per sample x {samples} "
              f"(traced kv {heads}x{s_kv}x{head_dim})")
    return work._replace(name=f"{work.name}(per-sample)", shapes=shapes, op=op, per_sample=True)


def find_attentions(graph: nx.DiGraph, rows: dict[int, OpRow], is_gemm: set[int], options: MappingOptions,
                cross_values: Collection[int]) -> list[Work]:
    works: list[Work] = []
    claimed: set[int] = set()
    keys_per_sample = options.per_sample_keys
    softmax_outputs = after_exponential(graph)
    nodes = graph.nodes
    for node in sorted(is_gemm):
        operands = nodes[node]["operands"]
        if operands[0] not in softmax_outputs and operands[1] not in softmax_outputs:
            continue  # no softmax output among its operands: not a value GEMM
        work = _attention_work(graph, node, is_gemm, rows, claimed, options.exp_ops)
        if work is not None:
            claimed |= set(work.positions)
            if keys_per_sample is not None and node in cross_values:
                work = _per_sample(work, keys_per_sample) or work
            works.append(work)
    return works


def inside_fused_attentions(graph: nx.DiGraph, attentions: list[Work], is_gemm: set[int]) -> set[int]:
    """What a fused attention kernel does inside besides its GEMMs and softmax: the casts on the
    way from the scores to the probabilities, and the scaling of q by a scalar (flash-attn and
    xformers apply the scale and keep the scores in registers)."""
    inside: set[int] = set()
    nodes = graph.nodes
    for work in attentions:
        found = attention_probabilities(graph, work.position, is_gemm)
        if found is None:
            continue
        _, scores, passed = found
        inside |= passed
        for score in scores:
            for operand in nodes[score]["operands"]:
                producer = behind_views(nodes, operand)
                if producer is not None and nodes[producer]["name"] == "multiply" and \
                        min(map(element_count, nodes[producer]["operand_shapes"])) <= 1:
                    inside.add(producer)
    return inside


def reaches(graph: nx.DiGraph, value_gemm: int, fused: set[int], is_gemm: set[int]) -> bool:
    """True when the value GEMM's result reaches a ``flash_attention`` call before any other GEMM
    (directly, or through a ring attention's combining ops): the model declared that the official
    code runs this attention as one fused kernel."""
    reached, _ = walk_until(graph, graph.successors(value_gemm), backward=False,
                            stop=lambda n: n in fused or n in is_gemm, limit=SOFTMAX_SPAN_LIMIT)
    return not reached.isdisjoint(fused)
