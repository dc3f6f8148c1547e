"""The bounded backward search of ``hlo_analyzer.pairs`` (what a block's qkv projection reads through
non-GEMM ops, walked only as far as a question needs) answers as the whole walk does: against a
plain breadth-first search written here, for every node and argument of a two-pair stage, and
the pair and block owners of the analysis are the same on a graph that does not promise walk
order (where every question walks the whole way)."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from hlo_analyzer.blocks import segment_blocks
from hlo_analyzer.dataflow import GEMM_OPS, build_dataflow, operand_markers
from hlo_analyzer.mapping.apply import stdit_block_owners
from hlo_analyzer.mlir import load_module
from hlo_analyzer.pairs import _Behind, pair_owners, residual_input, residual_inputs

ROOT = Path(__file__).resolve().parent.parent
TWO_PAIRS = ROOT / "dumps" / "split" / "tiny_102_256_256_megatron_2x2_stage0_pairs0-1.mlir"


@pytest.fixture(scope="module")
def stage():
    module = load_module(TWO_PAIRS)
    graph = build_dataflow(module)
    return graph, segment_blocks(module, graph=graph)


def unordered(graph: nx.DiGraph) -> nx.DiGraph:
    """The same graph without the walk-order promise."""
    copy = graph.copy()
    del copy.graph["walk_order"]
    return copy


def read_through_non_gemm(graph: nx.DiGraph, node: int) -> set:
    """Every marker ``node`` reads, its readers followed back through non-GEMM producers (BFS)."""
    found, queue = set(), [node]
    while queue:
        current = queue.pop(0)
        for producer, marker in zip(graph.nodes[current]["operands"], operand_markers(graph.nodes[current])):
            if marker not in found:
                found.add(marker)
                if producer is not None and graph.nodes[producer]["name"] not in GEMM_OPS:
                    queue.append(producer)
    return found


def test_the_dataflow_graph_promises_walk_order_and_keeps_it(stage):
    graph, _ = stage
    assert graph.graph["walk_order"] is True
    assert all(producer < reader for producer, reader in graph.edges)


def test_bounded_answers_equal_the_whole_walk_for_every_node_and_argument(stage):
    graph, segmentation = stage
    arguments = {("argument", a) for _, attributes in graph.nodes(data=True)
                 for a in attributes["arguments"] if a is not None}
    questions = sorted(graph.nodes) + sorted(arguments)
    assert len(segmentation.blocks) == 4
    for block in segmentation.blocks:
        qkv = block.self_attention.q_proj
        expected = read_through_non_gemm(graph, qkv)
        assert len(expected) > 100  # the residual stream back to the embeddings
        # questions in position order, then backwards (each answer may walk further or not at all)
        for order in (questions, questions[::-1]):
            behind = _Behind(graph, qkv)
            assert [q for q in order if q in behind] == [q for q in order if q in expected]


def test_owners_do_not_depend_on_the_walk_order_promise(stage):
    graph, segmentation = stage
    plain = unordered(graph)
    inputs = residual_inputs(graph, segmentation)
    assert inputs == residual_inputs(plain, segmentation)
    assert all(marker is not None for marker in inputs)
    owners = pair_owners(graph, segmentation, inputs)
    assert owners == pair_owners(plain, segmentation)
    assert set(owners.values()) == {0, 1, 2}  # two pairs, then the final layer
    blocks = stdit_block_owners(graph, segmentation, owners, inputs)
    assert blocks == stdit_block_owners(plain, segmentation, owners)
    assert set(blocks.values()) == {0, 1, 2, 3}
    temporal = segmentation.blocks[1].self_attention
    assert residual_input(graph, temporal.out_proj, temporal.q_proj) == \
        residual_input(plain, temporal.out_proj, temporal.q_proj)
