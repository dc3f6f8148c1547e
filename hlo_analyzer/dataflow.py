"""DataflowVisitor: the module's producer -> consumer graph, as a networkx DiGraph.

Nodes are walk positions (the same numbers as ``OpRow.position``); each node carries ``name``
(short op name), ``op`` (full name), ``operands`` (producer node of each operand, ``None`` for a
function or block argument, in operand order), ``arguments`` (for each operand that is a function
or block argument, a number naming that argument, else ``None``), ``operand_shapes``, ``result_shapes`` and, for dots,
``dot_dims`` (M, K, N, batch; a convolution as the GEMM it is, see :func:`conv_dims`). Dumps list ops in a topological order that interleaves unrelated
work (the first block with the embeddings), so analyses that need structure follow these edges
rather than the order of the lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import networkx as nx
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import mhlo, stablehlo

from hlo_analyzer.tensors import TypeTable
from hlo_analyzer.visitor import IRVisitor, short_op_name

GEMM_OPS = frozenset({"dot", "dot_general"})
_DIALECTS = {"stablehlo": stablehlo, "mhlo": mhlo}


class DataflowVisitor(IRVisitor):
    """Builds ``self.graph``: one node per op, an edge from each producer to each consumer."""

    skip_scalar_bodies = True

    def __init__(self) -> None:
        super().__init__()
        self.graph = nx.DiGraph()
        #: node -> producers of its operands (the ``operands`` attribute), for fast backward walks
        self.graph.graph["producers"] = {}
        self.types = TypeTable()
        self._producer: dict[ir.Value, int] = {}
        self._arguments: dict[ir.Value, int] = {}

    def generic_visit(self, node: Any) -> None:
        if isinstance(node, (ir.Region, ir.Block)) or node.operation.name == "func.func":
            super().generic_visit(node)
            return
        operation = node.operation
        position = self.position
        producers = [self._producer.get(value) for value in operation.operands]
        name = short_op_name(operation.name)
        attributes: dict[str, Any] = {
            "name": name,
            "op": operation.name,
            "operands": producers,
            "arguments": [None if producer is not None else self._argument(value)
                          for producer, value in zip(producers, operation.operands)],
            "operand_shapes": self.types.shapes(operation.operands, node),
            "result_shapes": self.types.shapes(operation.results, node),
            "dtype": self.types.dtype(operation.results[0]) if len(operation.results) else "",
        }
        if name in GEMM_OPS:
            attributes["dot_dims"] = dot_dims(node, attributes["operand_shapes"],
                                              attributes["result_shapes"][0])
        elif name == "convolution":
            attributes["dot_dims"] = conv_dims(node, attributes["operand_shapes"],
                                               attributes["result_shapes"][0])
        self.graph.add_node(position, **attributes)
        self.graph.graph["producers"][position] = [p for p in producers if p is not None]
        for producer in producers:
            if producer is not None:
                self.graph.add_edge(producer, position)
        for value in operation.results:
            self._producer[value] = position
        super().generic_visit(node)


    def _argument(self, value: ir.Value) -> int:
        return self._arguments.setdefault(value, len(self._arguments))


def dot_dims(op: Any, operand_shapes: tuple, result_shape: tuple) -> tuple[int, int, int, int]:
    """(M, K, N, batch) of a dot or dot_general: rows, contraction, columns, batch size."""
    lhs, rhs = operand_shapes[0], operand_shapes[1]
    operation = op.operation
    if short_op_name(operation.name) == "dot":
        k = lhs[-1] if lhs else 1
        m = lhs[0] if len(lhs) == 2 else 1
        n = rhs[-1] if len(rhs) == 2 else 1
        return m, k, n, 1
    dialect = _DIALECTS[operation.name.split(".", 1)[0]]
    dims = dialect.DotDimensionNumbers(operation.attributes["dot_dimension_numbers"])
    lhs_contract, rhs_contract = list(dims.lhs_contracting_dimensions), list(
        dims.rhs_contracting_dimensions)
    lhs_batch, rhs_batch = list(dims.lhs_batching_dimensions), list(dims.rhs_batching_dimensions)
    k = math.prod(lhs[d] for d in lhs_contract)
    batch = math.prod(lhs[d] for d in lhs_batch)
    m = math.prod(s for d, s in enumerate(lhs) if d not in lhs_contract and d not in lhs_batch)
    n = math.prod(s for d, s in enumerate(rhs) if d not in rhs_contract and d not in rhs_batch)
    return m, k, n, batch


def conv_dims(op: Any, operand_shapes: tuple, result_shape: tuple) -> tuple[int, int, int, int]:
    """A convolution as (M, K, N, batch) GEMMs: ``batch`` = feature groups, ``N`` = output
    features per group, ``K`` = kernel window x input features per group, ``M`` = output
    positions (result elements / output features); ``2*M*K*N*batch`` is the FLOP count of
    ``FlopsVisitor.visit_convolution``."""
    operation = op.operation
    dialect = _DIALECTS[operation.name.split(".", 1)[0]]
    dims = dialect.ConvDimensionNumbers(operation.attributes["dimension_numbers"])
    kernel = operand_shapes[1]
    groups = ir.IntegerAttr(operation.attributes["feature_group_count"]).value \
        if "feature_group_count" in operation.attributes else 1
    out_features = kernel[dims.kernel_output_feature_dimension]
    k = math.prod(kernel[d] for d in dims.kernel_spatial_dimensions) * kernel[
        dims.kernel_input_feature_dimension]
    m = math.prod(result_shape) // max(1, out_features)
    return m, k, out_features // max(1, groups), max(1, groups)


def build_dataflow(module: ir.Module) -> nx.DiGraph:
    visitor = DataflowVisitor()
    visitor.visit(module)
    return visitor.graph


#: How many ops a softmax (with its mask, scale and dropout) may span between its two GEMMs: the
#: walks that look for attentions give up beyond it, which keeps them linear on a residual stream
#: that runs back through every layer without a GEMM (torch-xla's softmax is about 10-30 ops).
SOFTMAX_SPAN_LIMIT = 128


def after_exponential(graph: nx.DiGraph) -> frozenset[int]:
    """Nodes with an ``exponential`` behind them on a path that crosses no GEMM (the exp itself
    included): only a GEMM operand in this set can be a softmax's output. One linear pass, cached
    on the graph; it lets the attention searches skip every other GEMM."""
    cached = graph.graph.get("after_exponential")
    if cached is None:
        producers = graph.graph["producers"]
        names = dict(graph.nodes(data="name"))
        reached: set[int] = set()
        for node in sorted(graph.nodes):
            if names[node] == "exponential" or any(
                    p in reached and names[p] not in GEMM_OPS for p in producers[node]):
                reached.add(node)
        cached = graph.graph["after_exponential"] = frozenset(reached)
    return cached


def walk_until(graph: nx.DiGraph, starts: Iterable[int | None], *, backward: bool,
               stop: Callable[[int], bool], limit: int | None = None) -> tuple[set[int], set[int]]:
    """Breadth-first from ``starts`` along (or against) the edges, not passing nodes where
    ``stop`` holds. Returns (stopping nodes reached, every node passed through); with ``limit``,
    a walk that passes more nodes than that gives up and reaches nothing."""
    producers = graph.graph.get("producers")
    if backward and producers is not None:
        neighbours = producers.__getitem__
    else:
        neighbours = graph.predecessors if backward else graph.successors
    reached: set[int] = set()
    passed: set[int] = set()
    frontier = [node for node in starts if node is not None]
    while frontier:
        node = frontier.pop()
        if node in passed or node in reached:
            continue
        if stop(node):
            reached.add(node)
            continue
        passed.add(node)
        if limit is not None and len(passed) > limit:
            return set(), passed
        frontier.extend(neighbours(node))
    return reached, passed
