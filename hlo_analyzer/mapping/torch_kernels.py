"""``--exec torch``: PyTorch run eagerly, one kernel per library call.

The tracer's sidecar lists the library calls of a traced PyTorch model
(``hlo_analyzer.mapping.library_calls``); each call's HLO ops are one kernel of the call's class
(``KERNEL_CLASSES``: a LayerNorm, a GELU, a softmax, a linear layer with its bias in the GEMM's
epilogue), the ops outside any call one element-wise kernel each. Where a norm, a softmax or a
linear layer reads a tensor in a permuted layout (``hlo_analyzer.mapping.torch_layouts``), PyTorch first
copies it contiguous: a copy kernel is charged; cuDNN's convolutions add their layout
transposes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import networkx as nx

from hardware import ROW_KERNEL_CLASSES, ChipSpec
from hlo_analyzer.dataflow import FREE_MOVEMENT_OPS, Marker, dependency_order, operand_markers
from hlo_analyzer.mapping.attention import find_attentions, inside_fused_attentions, reaches
from hlo_analyzer.mapping.fusion import GroupIO, fused_epilogue, group_io, result_elements
from hlo_analyzer.mapping.library_calls import (
    ATTENTION_CALL,
    COPY_CALL,
    LINEAR_CALL,
    TRANSPOSED_TOKENS_CALL,
    call_groups,
    folded_constants,
)
from hlo_analyzer.mapping.results import VECTOR_KIND, MappingOptions
from hlo_analyzer.mapping.torch_layouts import (
    COPY_CLASS,
    TRANSPOSED,
    layouts,
    mixes_transposed,
    noncontiguous_behind,
)
from hlo_analyzer.mapping.works import (
    REDUCTION_OPS,
    Signatures,
    Work,
    behind_views,
    dtype_bytes,
    element_count,
    real_elements,
    rows_of,
    vector_flops,
)
from hlo_analyzer.rows import COMM, VECTOR, OpRow

#: Kernel class of a library call's kind (``hlo_analyzer.mapping.library_calls``): the GPU kernel model
#: gives each class its own in-model bandwidth efficiency (``KernelModel.vector_efficiency``).
KERNEL_CLASSES = {"layer_norm": "layer_norm", "group_norm": "group_norm", "softmax": "softmax",
                  "tanh_gelu": "gelu", "gelu": "gelu", COPY_CALL: "copy"}
#: Torch calls that torch-xla lowers with a dot (a one-hot product) but PyTorch runs as one
#: memory-bound kernel that gathers its input.
GATHER_CALLS = frozenset({"upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"})
#: Norms: one kernel each that needs contiguous rows (PyTorch copies a permuted input first).
NORM_CLASSES = frozenset({"layer_norm", "group_norm"})
ELEMENTWISE_CLASS = "elementwise"
#: Library kernels that write their result alone, their temporaries kept in registers: autograd
#: saves a GELU's input, a softmax's output (a LayerNorm's mean and rstd too: a value per row,
#: left out), and the backward kernel computes from those. torch-xla's backward shares the
#: forward's IR nodes, so its dump reads the temporaries of the forward's call (a tanh GELU's
#: three); written by that call, they cost a traced training step's forward LayerNorms and
#: GELUs 1.5-2.5x their PyTorch bytes, and a checkpoint's first forward (whose temporaries
#: nothing reads) not.
TEMPORARIES_KEPT_CALLS = frozenset({"layer_norm", "group_norm", "softmax", "tanh_gelu", "gelu"})
#: Library calls that write a contiguous result whatever the layout of their inputs
#: (:mod:`hlo_analyzer.mapping.torch_layouts`); element-wise calls write in their first input's layout.
CONTIGUOUS_CALLS = frozenset({*NORM_CLASSES, "softmax", COPY_CALL, LINEAR_CALL, ATTENTION_CALL})


# -- torch eager: one kernel per library call -------------------------------------------------------
#: Ops that launch nothing: function returns, sharding annotations, tuples of values.
_NOT_KERNELS = frozenset({"return", "custom_call", "tuple", "get_tuple_element", "optimization_barrier",
                          "after_all", "while", "if", "case", "call"})


def _computes(attributes_of: dict[int, dict[str, Any]], nodes: Iterable[int]) -> bool:
    """True when a kernel has work to do: an op that is not a view (a dtype cast is a kernel)."""
    return any(attributes_of[n]["name"] not in FREE_MOVEMENT_OPS or attributes_of[n]["name"] == "convert"
               for n in nodes)


def torch_works(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], rows: dict[int, OpRow],
                 chip: ChipSpec, options: MappingOptions, cross_values: Collection[int],
                 signatures: Signatures, is_gemm: set[int], owners: dict[int, int],
                 residual_inputs: tuple[Any, ...]) -> list[Work]:
    """Kernels as PyTorch launches them eagerly: one per library call (module docstring of
    :mod:`hlo_analyzer.mapping.library_calls`). A call with a GEMM is that GEMM, its element-wise ops its
    epilogue (``addmm``'s bias; a ``linear`` call's bias add reading a GEMM outside the call); a
    ``flash_attention`` call whose attention is found is one fused kernel, its other ops inside it;
    any other call that computes is one memory-bound kernel reading what enters it and writing
    what leaves it, each tensor in its own element type."""
    if not graph.graph.get("locations", True):
        raise ValueError("--exec torch needs the ops' locations: build the dataflow graph with locations")
    nodes = [p for p in graph if (rows.get(p) is None or rows[p].category != COMM)
             and attributes_of[p]["result_shapes"] and attributes_of[p]["name"] not in _NOT_KERNELS]
    calls = call_groups(graph, nodes, options.library_calls, owners)
    call_of = {node: call for call in calls for node in call.nodes}
    # torch-xla lowers a nearest upsampling to a product with a one-hot matrix; PyTorch runs it
    # as one memory-bound kernel (upsample_nearest2d): no GEMM.
    is_gemm = {p for p in is_gemm if p not in call_of or call_of[p].kind not in GATHER_CALLS}
    attentions = []
    if chip.fused_attention_kernel:
        fused = {n for call in calls if call.in_region and call.kind == ATTENTION_CALL for n in call.nodes}
        attentions = [w for w in find_attentions(graph, rows, is_gemm, options, cross_values)
                      if w.position in fused or reaches(graph, w.position, fused, is_gemm)]
    # the calls a found attention runs in: its value GEMM's, and every flash_attention call it
    # took ops of (an einsum's GEMMs are keyed by torch's frame, outside the model's call)
    fused_calls = {id(call_of[w.position]) for w in attentions if w.position in call_of} | \
        {id(call_of[p]) for w in attentions for p in w.positions
         if p in call_of and call_of[p].kind == ATTENTION_CALL and call_of[p].in_region}
    claimed = {p for work in attentions for p in work.positions} | inside_fused_attentions(graph, attentions, is_gemm)
    gemms = {p: w for p in sorted(is_gemm - claimed)
             if (w := signatures.gemm(p, attributes_of[p]["dot_dims"], rows[p])) is not None}
    constant = folded_constants(graph)
    real = real_elements(attributes_of, dependency_order(graph))

    convolutions = {p for p in gemms if attributes_of[p]["name"] == "convolution"}
    # A call with a GEMM writes a contiguous result; so does one whose GEMM a fused attention
    # took (an einsum's value product, whose output XLA transposes to the einsum's axis order:
    # the fused kernel writes what the model's merge of its heads declares).
    with_gemm = {id(call) for call in calls if any(n in gemms or n in claimed for n in call.nodes)}
    with_convolution = {id(call) for call in calls if any(n in convolutions for n in call.nodes)}
    gather_input = {node: entering for call in calls if call.kind in GATHER_CALLS
                    for entering in [_call_input(attributes_of, call.nodes)] for node in call.nodes}

    def writes_contiguous(node: int) -> bool:  # a GEMM's call (a convolution's: its input decides)
        call = call_of.get(node)
        return (node in gemms and node not in convolutions) or node in claimed or \
            (call is not None and id(call) not in with_convolution and
             (call.kind in CONTIGUOUS_CALLS or id(call) in with_gemm))

    def keeps_channels_last(node: int) -> Marker | None:
        if node in convolutions:
            return operand_markers(attributes_of[node])[0]
        return gather_input.get(node)

    transposed = any(region.kind == TRANSPOSED_TOKENS_CALL for region in options.library_calls)
    layout = layouts(attributes_of, sorted(graph), writes_contiguous, real, lambda node: _feeds(graph, node, gemms),
                     dict.fromkeys(residual_inputs, TRANSPOSED) if transposed else {}, keeps_channels_last)
    copies = [copy for p in gemms for operand, shape, dtype in
              zip(operand_markers(attributes_of[p]), attributes_of[p]["operand_shapes"], attributes_of[p]["operand_dtypes"])
              if not (p in convolutions and noncontiguous_behind(attributes_of, operand, layout) == TRANSPOSED)
              and (copy := _layout_copy(attributes_of, operand, shape, element_count(shape) * dtype_bytes(dtype), p, layout,
                                        signatures)) is not None]
    copies += [copy for p in sorted(convolutions)
               if noncontiguous_behind(attributes_of, operand_markers(attributes_of[p])[0], layout) != TRANSPOSED
               for copy in _cudnn_layout_transposes(attributes_of[p], p, signatures)]
    # A collective reads contiguous buffers: the official all-to-all splits its input and makes
    # each piece contiguous (a copy of a permuted q, k or v, which one device makes before its
    # batched matmul instead), NCCL reads contiguous buffers. It writes a contiguous result.
    collectives = {p for p in graph if rows.get(p) is not None and rows[p].category == COMM}
    copies += [copy for p in sorted(collectives) for operand, shape, dtype in
               zip(operand_markers(attributes_of[p]), attributes_of[p]["operand_shapes"], attributes_of[p]["operand_dtypes"])
               if (copy := _layout_copy(attributes_of, operand, shape, element_count(shape) * dtype_bytes(dtype), p, layout,
                                        signatures)) is not None]
    vectors: list[Work] = []
    for call in calls:
        rest = [n for n in call.nodes if n not in claimed and n not in gemms]
        if any(n in gemms for n in call.nodes):
            # the slice of a weight that GSPMD cut for a GEMM is what that GEMM reads, no kernel
            rest = [n for n in rest if attributes_of[n]["name"] not in OPERAND_SLICES
                    or not _feeds(graph, n, gemms)]
        if id(call) in fused_calls or not rest:
            continue  # inside a fused attention kernel, or a GEMM with nothing around it
        if call.kind != COPY_CALL and not _computes(attributes_of, rest):
            continue  # views only
        io = group_io(graph, attributes_of, rest, constant, real,
                      results_only=call.kind in TEMPORARIES_KEPT_CALLS)
        if call.kind == COPY_CALL and io.entering and all(p in collectives for p, _ in io.entering):
            # the part of a copy after a collective that GSPMD put inside it lays out the
            # collective's result, which the collective wrote contiguous: the copy is the part before
            continue
        feeding = {_gemm_behind(attributes_of, p, gemms) for p, _ in io.entering} - {None}
        # A call's element-wise work on one GEMM's result runs in that GEMM's epilogue (an
        # nn.Linear's bias in cuBLASLt), except after a convolution: PyTorch adds a convolution's
        # bias in a kernel of its own (aten/src/ATen/native/Convolution.cpp, ``output.add_``).
        if len(feeding) == 1 and (call.kind == LINEAR_CALL or not call.in_region) and \
                (gemm := feeding.pop()) in gemms and gemms[gemm].epilogue is None and \
                attributes_of[gemm]["name"] != "convolution" and \
                gemms[gemm].op.batch == 1 and (call.kind == LINEAR_CALL or gemm in call.nodes):
            flops = sum(vector_flops(rows[p], signatures.exp_ops) for p in rest if p in rows)
            gemms[gemm] = fused_epilogue(gemms[gemm], call.kind, flops, tuple(rest))
            continue
        vector_rows = [rows[p] for p in rest if p in rows and rows[p].category == VECTOR]
        flops = sum(vector_flops(r, signatures.exp_ops) for r in vector_rows)
        largest = max(vector_rows, key=result_elements) if vector_rows else None
        result = largest.result_shapes[0] if largest is not None and largest.result_shapes else \
            attributes_of[rest[-1]]["result_shapes"][0]
        if mixes_transposed(attributes_of, io.entering, element_count(result), layout):
            kernel = "strided"
        else:
            kernel = KERNEL_CLASSES.get(call.kind) or _elementwise_variant(attributes_of, rest, constant, real, io)
        if kernel in NORM_CLASSES:  # it needs contiguous rows
            copies += [copy for (key, shape), size in zip(io.entering, io.entering_bytes)
                       if (copy := _layout_copy(attributes_of, key, shape, size, rest[0], layout, signatures))]
        rows_count = rows_of(largest, result) if largest is not None else 1
        if kernel == "group_norm":
            rows_count = _group_norm_rows(attributes_of, rest) or rows_count
        # Bytes, not elements: a kernel reads and writes tensors of several element types. A
        # copy's views leave as views of what entered, yet the copy writes all it reads.
        out_bytes = io.out_bytes or (sum(io.entering_bytes) if call.kind == COPY_CALL else 0)
        op = signatures.vector_op(kernel, tuple((max(1, b),) for b in io.entering_bytes),
                                  rows_count, max(1, out_bytes), flops, 1,
                                  _row_length(kernel, io.entering, result, rows_count))
        positions = tuple(rest)
        shapes = signatures.shapes_text(tuple(s for _, s in io.entering), (tuple(result),))
        vectors.append(Work(positions[-1], positions, f"{kernel}({call.kind})" if kernel != call.kind else kernel,
                             VECTOR_KIND, shapes, op=op))
    return [*attentions, *gemms.values(), *vectors, *copies]


def _row_length(kernel: str, entering: Sequence[tuple[Any, Sequence[int]]], result: Sequence[int], rows: int) -> int:
    """Elements a row of a row-wise kernel (``ROW_KERNEL_CLASSES``) spans: a reduction's largest
    input over its rows, a norm's or softmax's last dim; 0 for any other kernel."""
    if kernel not in ROW_KERNEL_CLASSES:
        return 0
    if kernel == "reduction":
        largest = max((element_count(shape) for _, shape in entering), default=0)
        return max(1, largest // max(1, rows))
    return max(1, int(result[-1])) if result else 0


def _layout_copy(attributes_of: dict[int, dict[str, Any]], operand: Any, shape: Sequence[int], size: int,
                 reader: int, layout: dict[int, str], signatures: Signatures) -> Work | None:
    """The copy PyTorch makes of a non-contiguous ``operand`` before ``reader``, a kernel that
    needs contiguous rows (:mod:`hlo_analyzer.mapping.torch_layouts`), or None when it is contiguous."""
    kind = noncontiguous_behind(attributes_of, operand, layout)
    if kind is None:
        return None
    name = COPY_CLASS[kind]
    op = signatures.vector_op(name, ((size,),), 1, size, 0, 1)
    text = signatures.shapes_text((tuple(shape),), (tuple(shape),))
    return Work(reader, (reader,), f"{name}({kind} input)", VECTOR_KIND, text, op=op)


def _call_input(attributes_of: dict[int, dict[str, Any]], members: Iterable[int]) -> Marker | None:
    """The first value that enters a call from outside it (a node or an argument)."""
    inside = set(members)
    for node in sorted(inside):
        for operand in operand_markers(attributes_of[node]):
            if operand not in inside:
                return operand
    return None


def _group_norm_rows(attributes_of: dict[int, dict[str, Any]], members: list[int]) -> int | None:
    """The (sample, group) rows of a GroupNorm call: torch-xla lowers ``native_group_norm`` to a
    ``batch_norm_training`` over a (1, N * G, rest) view, its features the rows; None when the
    call holds no such op."""
    for node in members:
        attributes = attributes_of[node]
        if attributes["name"] == "batch_norm_training" and len(attributes["operand_shapes"][0]) >= 2:
            return int(attributes["operand_shapes"][0][1])
    return None


#: The kernel class of the transposes cuDNN runs around a convolution (hardware.spec).
LAYOUT_TRANSPOSE_CLASS = "layout_transpose"


def _cudnn_layout_transposes(attributes: dict[str, Any], position: int, signatures: Signatures) -> list[Work]:
    """The layout transposes PyTorch's cuDNN convolution runs around a convolution with a window
    (not 1x1) on a channels-first tensor (the caller leaves out a channels-last one, which cuDNN
    reads and writes as it is): cuDNN's fast kernels on Hopper read and write
    channels-last, so the input is transposed to NHWC first and the result back to NCHW, each a
    kernel of its own (``nchwToNhwcKernel`` / ``nhwcToNchwKernel``: measured by
    benchmarks/gpu_vae_decode.py). The weights' transposes (a few MB) are not charged."""
    layout = attributes.get("conv_layout")
    if layout is None or not layout.channels_first or layout.window_taps == 1:
        return []
    transposes = []
    for shape, dtype, side in ((attributes["operand_shapes"][0], attributes["operand_dtypes"][0], "input"),
                               (attributes["result_shapes"][0], attributes["dtype"], "output")):
        size = element_count(shape) * dtype_bytes(dtype)
        op = signatures.vector_op(LAYOUT_TRANSPOSE_CLASS, ((size,),), 1, size, 0, 1)
        text = signatures.shapes_text((tuple(shape),), (tuple(shape),))
        transposes.append(Work(position, (position,), f"{LAYOUT_TRANSPOSE_CLASS}(convolution {side})",
                                VECTOR_KIND, text, op=op))
    return transposes


def _elementwise_variant(attributes_of: dict[int, dict[str, Any]], members: list[int], constant: set[int],
                         real: dict[int, int], io: GroupIO) -> str:
    """The class of an element-wise kernel of PyTorch (``MEMORY_KERNEL_CLASSES``): a row
    reduction, a ``where``, one that reads a tensor broadcast along an axis, a widening cast, or
    a plain (contiguous, same-shape) element-wise kernel."""
    names = {attributes_of[n]["name"] for n in members}
    if names & REDUCTION_OPS:
        return "reduction"
    if "select" in names:
        return "select"
    if _reads_broadcast(attributes_of, members, constant, real):
        return "broadcast"
    if all(name in FREE_MOVEMENT_OPS for name in names) and io.out_bytes > sum(io.entering_bytes):
        return "widening_cast"  # converts (and views) alone, writing more than they read
    return ELEMENTWISE_CLASS


def _reads_broadcast(attributes_of: dict[int, dict[str, Any]], members: list[int], constant: set[int],
                     real: dict[int, int]) -> bool:
    """True when the kernel reads a tensor of more than one value broadcast to a larger shape:
    a broadcast among its ops, or entering it (``real_elements`` holds a broadcast at its
    operand's size)."""
    inside = set(members)
    for node in members:
        attributes = attributes_of[node]
        if attributes["name"] == "broadcast_in_dim" and 1 < real[node] < element_count(attributes["result_shapes"][0]):
            return True
        for producer, shape in zip(attributes["operands"], attributes["operand_shapes"]):
            if producer is not None and producer not in inside and producer not in constant \
                    and 1 < real[producer] < element_count(shape):
                return True
    return False


#: Ops that cut a piece of an operand (GSPMD's local slice of a weight).
OPERAND_SLICES = frozenset({"dynamic_slice", "slice"})


def _feeds(graph: nx.DiGraph, node: int, gemms: dict[int, Work]) -> bool:
    """True when ``node``'s result goes (through views) into a GEMM and nowhere else."""
    readers = list(graph.successors(node))
    while readers:
        reader = readers.pop()
        if reader in gemms:
            continue
        if graph.nodes[reader]["name"] not in FREE_MOVEMENT_OPS:
            return False
        readers.extend(graph.successors(reader))
    return True


def _gemm_behind(attributes_of: dict[int, dict[str, Any]], node: int | None, gemms: dict[int, Work]) -> int | None:
    """The GEMM whose result ``node`` holds, through views, or None."""
    producer = behind_views(attributes_of, node)
    return producer if producer in gemms else None
