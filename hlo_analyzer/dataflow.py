"""DataflowVisitor: the module's producer -> consumer graph, as a networkx DiGraph.

Nodes are walk positions (the same numbers as ``OpRow.position``); each node carries ``name``
(short op name), ``op`` (full name), ``operands`` (producer node of each operand, ``None`` for a
function or block argument, in operand order), ``arguments`` (for each operand that is a function
or block argument, a number naming that argument, else ``None``), ``operand_shapes``, ``result_shapes`` and, for dots,
``dot_dims`` (M, K, N, batch; a convolution as the GEMM it is, see :func:`conv_dims`), for slices
``slice`` (:func:`slice_box`). Dumps list ops in a topological order that interleaves unrelated
work (the first block with the embeddings), so analyses that need structure follow these edges
rather than the order of the lines.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import networkx as nx
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import mhlo, stablehlo

from hlo_analyzer.tensors import SAME_SHAPE_OPS, TypeTable
from hlo_analyzer.visitor import IRVisitor, flat_symbol, short_op_name, symbol_name

GEMM_OPS = frozenset({"dot", "dot_general"})
#: Data movement that copies or views a tensor without computing on it: an XLA-style loop fusion
#: absorbs it for free, and a kernel reading its result reads (at most) its operand's data.
FREE_MOVEMENT_OPS = frozenset({"broadcast", "broadcast_in_dim", "reshape", "convert", "bitcast_convert",
                               "transpose", "slice", "copy", "reverse", "reduce_precision"})
#: Ops with no operands that only make constants.
CONSTANT_OPS = frozenset({"constant", "iota"})
#: Ops each of whose results is a tensor in memory of its own, which its readers read as they
#: read a function argument (``("argument", i)``, one per result), not as the op's product: an
#: ``optimization_barrier`` hands on each operand unchanged, one to one, and keeps XLA from
#: fusing or moving work across it. Its readers so neither depend on its other operands (as one
#: node for all its results would make them: a rerun forward behind a checkpoint's barrier,
#: whose operands are the block's input, the captions and every weight, would read all of them
#: at each op, join every computation reading any of them and never find its cross-attention's
#: query and keys apart) nor fuse with the work that made its operands. The op stays a node,
#: with its operands' edges; its ``buffers`` attribute names the argument standing for each
#: result.
BUFFER_RESULT_OPS = frozenset({"optimization_barrier"})
_DIALECTS = {"stablehlo": stablehlo, "mhlo": mhlo}
#: Ops whose operands have the result's type (shape and element type): the same-shape ops but
#: those whose result is a predicate (a compare of f32 reads f32).
_SAME_TYPE_OPS = frozenset(name for name in SAME_SHAPE_OPS if short_op_name(name) not in ("compare", "is_finite"))


class DataflowVisitor(IRVisitor):
    """Builds ``self.graph``: one node per op, an edge from each producer to each consumer.

    It walks like the measuring visitors (``skip_scalar_bodies``), so it can follow them in one
    walk (``IRVisitor.walk_with``; ``hlo_analyzer.report.analyze(..., followers=...)``) and
    number its nodes with the same positions as the report's rows; made with their ``types``, it
    reads each op's values once for all of them. Values are keyed by ``hash(value)`` (the
    bindings hash a value by its MLIR pointer, as ``hlo_analyzer.memory`` does), which keeps no
    value object alive. The walk records nodes and edges; ``graph`` assembles them (in walk
    order) on first use.
    """

    skip_scalar_bodies = True

    def __init__(self, types: TypeTable | None = None, *, locations: bool = True) -> None:
        super().__init__()
        self.types = types if types is not None else TypeTable()
        #: record each op's location (``--exec torch`` reads them; a fifth of the walk's time)
        self.locations = locations
        self.types.reads_values = True  # producers are found by the operand values
        self._nodes: list[tuple[int, dict[str, Any]]] = []
        self._producers: dict[int, list[int]] = {}  # node -> producers of its operands
        self._producer: dict[int, int] = {}
        self._arguments: dict[int, int] = {}
        #: (op name, operand types, result types) -> the attributes read off them (``_template``)
        self._signatures: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._dims: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}
        #: call position -> (callee, producer of each operand, argument of each operand, argument
        #: standing for each result); function -> arguments of its parameters, its return node
        self._calls: dict[int, tuple[str, list[int | None], list[int | None], list[int]]] = {}
        self._parameters: dict[str, list[int]] = {}
        self._returns: dict[str, int] = {}
        #: argument standing for a result of a BUFFER_RESULT_OPS op -> the operand it hands on
        self._buffers: dict[int, Marker] = {}
        self._graph: nx.DiGraph | None = None

    @property
    def graph(self) -> nx.DiGraph:
        """The dataflow graph (module docstring); ``graph.graph["producers"]`` maps each node to
        the producers of its operands, for fast backward walks; ``graph.graph["walk_order"]``
        says that each producer's node precedes its readers' (a value is found as a producer only
        once its op was walked; false once a call is inlined: :meth:`_inline_calls`), which bounds backward searches (``hlo_analyzer.pairs``);
        ``graph.graph["buffers"]`` maps each argument that stands for a result of
        :data:`BUFFER_RESULT_OPS` to the operand it hands on (a node or ``("argument", i)``:
        :func:`behind_buffers`, ``hlo_analyzer.pairs``)."""
        if self._graph is None:
            inlined = self._inline_calls()
            graph = self._graph = nx.DiGraph(producers=self._producers, locations=self.locations,
                                             walk_order=not inlined, buffers=self._buffers)
            graph.add_nodes_from([node for node, _ in self._nodes])
            nodes = graph.nodes
            for node, attributes in self._nodes:  # faster than add_nodes_from's (node, dict) pairs
                nodes[node].update(attributes)
            graph.add_edges_from((producer, node) for node, producers in self._producers.items()
                                 for producer in producers)
        return self._graph

    def visit_region(self, region: ir.Region) -> None:
        IRVisitor.generic_visit(self, region)

    def visit_block(self, block: ir.Block) -> None:
        IRVisitor.generic_visit(self, block)

    def visit_func(self, op: Any) -> None:
        """A function is no node: its body is walked."""
        self._parameters[symbol_name(op)] = [self._argument(value)
                                             for value in op.operation.regions[0].blocks[0].arguments]
        IRVisitor.generic_visit(self, op)

    def visit_call(self, op: Any) -> None:
        """A ``func.call`` is no node: its results stand for what the callee returns, its
        operands for the callee's parameters (:meth:`_inline_calls`)."""
        facts = self.types.facts(op)
        producers = [self._producer.get(hash(value)) for value in facts.operands]
        arguments = [None if producer is not None else self._argument(value)
                     for producer, value in zip(producers, facts.operands)]
        self._calls[self.position] = (flat_symbol(op.operation.attributes["callee"]), producers, arguments,
                                      [self._argument(value) for value in facts.results])
        IRVisitor.visit_call(self, op)

    def visit_return(self, op: Any) -> None:
        self.generic_visit(op)
        if self.op_name == "func.return":
            self._returns[self.scopes[self.scope].function] = self.position

    def _inline_calls(self) -> bool:
        """Join the dataflow of each function called once to its call: a value the call returns
        is the callee's returned value, a parameter of the callee the call's operand (XLA
        inlines calls before fusion; ``jax.nn.silu`` is a call). A function called more often
        is walked once for all its calls and stays apart (a reader of its result reads an
        argument). True when a call was inlined."""
        sites = Counter(callee for callee, *_ in self._calls.values())
        stands: dict[int, tuple[int | None, int | None]] = {}  # argument -> (producer, argument)
        attributes_at = dict(self._nodes)
        returns = set()  # of the inlined callees: they hand their values to the call's readers
        for callee, producers, arguments, results in self._calls.values():
            parameters, returned = self._parameters.get(callee), attributes_at.get(self._returns.get(callee, -1))
            if sites[callee] != 1 or parameters is None or returned is None or \
                    len(parameters) != len(producers) or len(returned["operands"]) != len(results):
                continue
            stands.update(zip(parameters, zip(producers, arguments)))
            stands.update(zip(results, zip(returned["operands"], returned["arguments"])))
            returns.add(self._returns[callee])
        if not stands:
            return False
        self._nodes = [(node, attributes) for node, attributes in self._nodes if node not in returns]
        for node in returns:
            del self._producers[node]
        for node, attributes in self._nodes:
            if stands.keys().isdisjoint(attributes["arguments"]):
                continue
            operands = [_resolve(stands, producer, argument)
                        for producer, argument in zip(attributes["operands"], attributes["arguments"])]
            attributes["operands"] = [producer for producer, _ in operands]
            attributes["arguments"] = [argument for _, argument in operands]
            self._producers[node] = [producer for producer, _ in operands if producer is not None]
        return True

    def generic_visit(self, node: Any) -> None:
        full_name = self.op_name  # set by the walk (IRVisitor)
        types = self.types
        facts = types.facts(node)
        operands = facts.operands
        if full_name in _SAME_TYPE_OPS:  # the operands have the result's type: not read
            key: tuple[Any, ...] = (full_name, len(operands), facts.result_types)
        else:
            key = (full_name, *types.value_types(node))
        template = self._signatures.get(key)
        if template is None:
            template = self._signatures[key] = self._template(node, *key)
        producer_of = self._producer.get
        producers = [producer_of(hash(value)) for value in operands]
        if None in producers:
            arguments = [None if producer is not None else self._argument(value)
                         for producer, value in zip(producers, operands)]
            known = [p for p in producers if p is not None]
        else:
            arguments, known = [None] * len(producers), list(producers)
        attributes = template.copy()  # the signature's values, in the attributes' order
        attributes["operands"], attributes["arguments"] = producers, arguments
        name = template["name"]
        if self.locations:
            attributes["location"] = types.location(node)
            if name == "transpose":  # which axes a view permutes decides PyTorch's strides
                attributes["permutation"] = permutation(node)
            elif name == "convolution":  # cuDNN's layout transposes around it (hlo_analyzer.mapping.torch_kernels)
                attributes["conv_layout"] = conv_layout(node)
        if name == "slice":  # which part of its operand it reads (a fused kernel reads only that)
            attributes["slice"] = slice_box(node)
        if name in GEMM_OPS or name == "convolution":
            attributes["dot_dims"] = self._gemm_dims(node, name, template["operand_shapes"],
                                                     template["result_shapes"][0])
        position = self.position
        self._nodes.append((position, attributes))
        self._producers[position] = known
        if name in BUFFER_RESULT_OPS:  # result i: operand i, in memory
            attributes["buffers"] = tuple(self._argument(value) for value in facts.results)
            for buffer, operand, argument in zip(attributes["buffers"], producers, arguments, strict=True):
                self._buffers[buffer] = operand if operand is not None else ("argument", argument)
        else:
            producer = self._producer
            for value in facts.results:
                producer[hash(value)] = position
        if not self.following:  # (following, the leader walks the regions)
            IRVisitor.generic_visit(self, node)

    def _template(self, op: Any, full_name: str, operands: tuple[ir.Type, ...] | int,
                  result_types: tuple[ir.Type, ...]) -> dict[str, Any]:
        """The attributes that every op of this signature has alike (``_signature``), with
        ``operands`` and ``arguments`` to be filled in (keys in the nodes' order)."""
        name, operand_shapes, result_shapes, dtype, operand_dtypes = self._signature(
            op, full_name, operands, result_types)
        return {"name": name, "op": full_name, "operands": None, "arguments": None,
                "operand_shapes": operand_shapes, "result_shapes": result_shapes, "dtype": dtype,
                "operand_dtypes": operand_dtypes}

    def _signature(self, op: Any, full_name: str, operands: tuple[ir.Type, ...] | int,
                   result_types: tuple[ir.Type, ...]) -> tuple[str, tuple, tuple, str, tuple]:
        """(short name, operand shapes, result shapes, dtype, operand dtypes) of ops with this
        name, operand types (or count, for ``_SAME_TYPE_OPS``) and result types."""
        types = self.types
        result_shapes = types.type_shapes(result_types, op)
        dtype = types.info(result_types[0], op)[1] if result_types else ""
        if isinstance(operands, int):
            operand_shapes, operand_dtypes = (result_shapes[0],) * operands, (dtype,) * operands
        else:
            operand_shapes = types.type_shapes(operands, op)
            operand_dtypes = tuple(types.info(t, op)[1] for t in operands)
        return short_op_name(full_name), operand_shapes, result_shapes, dtype, operand_dtypes

    def _argument(self, value: ir.Value) -> int:
        return self._arguments.setdefault(hash(value), len(self._arguments))

    def _gemm_dims(self, op: Any, name: str, operand_shapes: tuple,
                   result_shape: tuple) -> tuple[int, int, int, int]:
        """:func:`dot_dims` or :func:`conv_dims`, once per distinct op name, dimension numbers
        and shapes (the attributes are uniqued in their context, so equal ones are one key)."""
        attributes = op.operation.attributes
        numbers = tuple(attributes[key] for key in _GEMM_DIMENSION_ATTRIBUTES[name]
                        if key in attributes)
        key = (name, numbers, operand_shapes, result_shape)
        dims = self._dims.get(key)
        if dims is None:
            measure = conv_dims if name == "convolution" else dot_dims
            dims = self._dims[key] = measure(op, operand_shapes, result_shape)
        return dims


def _resolve(stands: dict[int, tuple[int | None, int | None]], producer: int | None,
             argument: int | None) -> tuple[int | None, int | None]:
    """What an operand is once calls are inlined: an argument that stands for another value
    (a parameter for a call's operand, a call's result for the callee's returned value), followed
    to a node or to an argument that stands for nothing."""
    seen = set()
    while producer is None and argument in stands and argument not in seen:
        seen.add(argument)
        producer, argument = stands[argument]
    return producer, argument


#: A value of the dataflow graph: the node that made it, or ``("argument", i)``.
Marker = int | tuple[str, int]


def operand_markers(attributes: dict[str, Any]) -> list[Marker]:
    """A node's operands as values: the producing node, or ``("argument", i)``."""
    return [producer if producer is not None else ("argument", argument)
            for producer, argument in zip(attributes["operands"], attributes["arguments"])]


def permutation(op: Any) -> tuple[int, ...]:
    """The ``permutation`` of a transpose op (an i64 array in StableHLO, dense elements in MHLO)."""
    return _integers(op.operation.attributes["permutation"])


def slice_box(op: Any) -> tuple[tuple[int, ...], ...]:
    """``(start_indices, limit_indices, strides)`` of a slice op."""
    attributes = op.operation.attributes
    return tuple(_integers(attributes[key]) for key in ("start_indices", "limit_indices", "strides"))


def _integers(attribute: ir.Attribute) -> tuple[int, ...]:
    """An i64 array (StableHLO) or dense integer elements (MHLO) as a tuple."""
    try:
        return tuple(ir.DenseI64ArrayAttr(attribute))
    except (ValueError, TypeError):  # MHLO: dense integer elements
        return tuple(int(v) for v in ir.DenseIntElementsAttr(attribute))


#: The attributes that, with the operand shapes, decide a GEMM's (M, K, N, batch).
_GEMM_DIMENSION_ATTRIBUTES = {
    "dot": (),
    "dot_general": ("dot_dimension_numbers",),
    "convolution": ("dimension_numbers", "feature_group_count"),
}


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


@dataclass(frozen=True)
class ConvLayout:
    """How a convolution lays out its input: features right after the batch (PyTorch's NCHW /
    NCDHW) or last, and how many taps its window has (1 for a 1x1 convolution)."""

    channels_first: bool
    window_taps: int


def conv_layout(op: Any) -> ConvLayout:
    operation = op.operation
    dialect = _DIALECTS[operation.name.split(".", 1)[0]]
    dims = dialect.ConvDimensionNumbers(operation.attributes["dimension_numbers"])
    kernel = ir.RankedTensorType(operation.operands[1].type).shape
    taps = math.prod(kernel[d] for d in dims.kernel_spatial_dimensions)
    return ConvLayout(channels_first=dims.input_feature_dimension == 1, window_taps=taps)


def gemm_input(graph: nx.DiGraph, node: int, operand: int = 0) -> Marker:
    """The value a GEMM's operand (its lhs by default) holds, followed back through free data
    movement (``FREE_MOVEMENT_OPS``) to the op that made it, or ``("argument", i)``: two
    projections of one tensor (the k and v of an attention) read the same value."""
    nodes = graph.nodes
    attributes = nodes[node]
    producer, marker = attributes["operands"][operand], operand_markers(attributes)[operand]
    while producer is not None and nodes[producer]["name"] in FREE_MOVEMENT_OPS:
        attributes = nodes[producer]
        if len(attributes["operands"]) != 1:
            break
        producer, marker = attributes["operands"][0], operand_markers(attributes)[0]
    return marker


def dependency_order(graph: nx.DiGraph) -> list[int]:
    """The nodes, each after the producers of its operands: the walk order where the graph keeps
    it (``walk_order``), else (a call inlined) the least node whose producers are placed."""
    if graph.graph.get("walk_order", True):
        return sorted(graph)
    return list(nx.lexicographical_topological_sort(graph))


def behind_buffers(graph: nx.DiGraph) -> frozenset[int]:
    """The nodes that read, directly or through other nodes, a result of an op of
    :data:`BUFFER_RESULT_OPS` (``graph.graph["buffers"]``): behind a checkpoint's optimization
    barrier, the forward run again inside the backward, and the backward that reads it. One
    linear pass, cached on the graph."""
    cached = graph.graph.get("behind_buffers")
    if cached is None:
        buffers = graph.graph.get("buffers", {})
        behind: set[int] = set()
        if buffers:
            producers = graph.graph["producers"]
            for node in dependency_order(graph):
                arguments = graph.nodes[node]["arguments"]
                if not buffers.keys().isdisjoint(arguments) or not behind.isdisjoint(producers[node]):
                    behind.add(node)
        cached = graph.graph["behind_buffers"] = frozenset(behind)
    return cached


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
        for node in sorted(names):
            if names[node] == "exponential":
                reached.add(node)
                continue
            for p in producers[node]:
                if p in reached and names[p] not in GEMM_OPS:
                    reached.add(node)
                    break
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


def attention_probabilities(graph: nx.DiGraph, value_gemm: int,
                            is_gemm: Collection[int]) -> tuple[int, set[int], set[int]] | None:
    """(operand index of the probabilities, score GEMMs, softmax ops) of an attention's value
    GEMM, or None when no softmax over GEMM scores feeds it: walking back from the operand
    until GEMMs (nothing reached beyond ``SOFTMAX_SPAN_LIMIT`` ops), an ``exponential`` passed."""
    softmax_outputs = after_exponential(graph)
    for index in (0, 1):
        start = graph.nodes[value_gemm]["operands"][index]
        if start not in softmax_outputs:
            continue
        scores, passed = walk_until(graph, [start], backward=True, stop=is_gemm.__contains__,
                                    limit=SOFTMAX_SPAN_LIMIT)
        if scores and any(graph.nodes[p]["name"] == "exponential" for p in passed):
            return index, scores, passed
    return None


def attention_internals(graph: nx.DiGraph) -> frozenset[int]:
    """The ops whose results a fused (flash) attention kernel keeps in on-chip tiles and never
    writes to memory: of every attention (a value GEMM fed by a softmax of score GEMMs), the
    score GEMMs and the softmax's ops; the value GEMM's result is the kernel's output."""
    nodes = graph.nodes
    is_gemm = {node for node, name in nodes(data="name") if name in GEMM_OPS}
    softmax_outputs = after_exponential(graph)
    internal: set[int] = set()
    for node in sorted(is_gemm):
        if not softmax_outputs.intersection(nodes[node]["operands"][:2]):
            continue
        found = attention_probabilities(graph, node, is_gemm)
        if found is not None:
            internal |= found[1] | found[2]
    return frozenset(internal)
