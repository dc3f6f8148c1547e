"""Per-op mapping of any dump onto a chip: every GEMM, vector op, attention and collective.

What becomes what (positions are the walk positions of ``OpRow.position`` and the dataflow graph):

* **GEMM**: every ``dot``, ``dot_general`` and ``convolution`` as ``(M, K) x (K, N)``; batch
  dimensions make it one batched GEMM (``Op.batch`` instances): one kernel, one launch, whose
  tiling spreads the instances over the tiles (``hardware.gemm_mapper``) or CTAs
  (``hardware.kernel_model``) with M, N and K; a convolution as its im2col GEMM
  (``hlo_analyzer.dataflow.conv_dims``).
* **flash attention**: where the chip has a fused attention kernel
  (``ChipSpec.fused_attention_kernel``), every pattern of the dataflow graph "score GEMM(s) ->
  non-GEMM ops with an ``exponential`` (the softmax) -> value GEMM" with matching shapes becomes one
  ``FlashAttention`` op: heads = the GEMMs' batch, ``S_KV`` = the sum of the score GEMMs' N (ring
  attention has one score GEMM per K/V block), the absorbed vector ops' FLOPs its softmax work.
  **Per-sample cross-attention** (``MappingOptions.cross_attention``, default ``per-sample``):
  OpenSora flattens the queries of all samples into one sequence and the caption tokens of all
  samples into another and masks the cross terms block-diagonally; its real kernel (xformers'
  block-diagonal mask) reads only each sample's own caption tokens. A cross-attention (one whose
  value GEMM the caller names in ``cross_values``: ``hlo_analyzer.blocks`` finds attentions whose
  q and k/v come from different projections) whose key length is ``k > 1`` times
  ``caption_tokens`` is charged as ``k`` samples, each of ``S_Q / k`` queries against its own
  ``caption_tokens`` keys (all ``S_Q`` queries against ``caption_tokens`` keys when ``S_Q`` does
  not split in ``k``): the same queries, ``1/k`` of the score and value FLOPs and of the softmax
  work. ``all`` charges the traced (masked) ``k * caption_tokens`` keys. A chip without a fused
  attention kernel runs the traced GEMMs and softmax in either mode.
* **vector**: element-wise ops and reductions. ``eager``: one kernel per op; an element-wise op's
  rows are its result's leading dims, a reduction's rows its result elements (each reads one row;
  a ``select_and_scatter``'s rows are its windows, one per source element).
  ``fused``: ops joined by data dependencies with no GEMM, collective or other unfusable op between
  them form one kernel (one pass: reads the tensors entering the group once, writes the tensors
  leaving it once; LayerNorm + modulate and residual + next LayerNorm are such groups). Free data
  movement (broadcast, reshape, convert, transpose, slice, copy) joins groups and costs nothing;
  constants are free. A group whose only large input is one GEMM's output (all of whose readers are
  in the group), whose output has that GEMM's shape and whose other inputs are at most
  ``EPILOGUE_SIDE_INPUT_ROWS`` rows of N (bias, scale, gate vectors) is that GEMM's epilogue.
  A slice write (``select(pad(true), pad(update), buffer)``, XLA's lowering of torch's
  ``slice_scatter``) reads and writes the update only: done in place, as
  ``dynamic_update_slice``.
* **collective**: timed on the system's chip-to-chip network (:func:`hardware.collective_time_s`).

Ops run one after another (no overlap of compute and communication), so a program's latency is
the sum of its ops'. Eager mode adds the chip's ``kernel_launch_overhead_s`` (default 0 when the
hardware description has none) to every kernel. Mappings are cached by op signature, so a dump of
many identical blocks costs one search per distinct shape. Data movement outside fusions
(gather, concatenate, dynamic_slice ...) is not charged.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import networkx as nx

from hardware import (
    MEMORY_KERNEL_CLASSES,
    ROW_KERNEL_CLASSES,
    ChipSpec,
    Mapping,
    MappingError,
    Op,
    OpType,
    SystemSpec,
    collective_time_s,
    map_op,
)
from hlo_analyzer.dataflow import (
    CONSTANT_OPS,
    FREE_MOVEMENT_OPS,
    SOFTMAX_SPAN_LIMIT,
    Marker,
    after_exponential,
    operand_markers,
    walk_until,
)
from hlo_analyzer.library_calls import (
    ATTENTION_CALL,
    COPY_CALL,
    LINEAR_CALL,
    TRANSPOSED_TOKENS_CALL,
    CallRegion,
    call_groups,
    folded_constants,
)
from hlo_analyzer.rows import COMM, GEMM, VECTOR, OpRow
from hlo_analyzer.tensors import ELEMENT_BYTES
from hlo_analyzer.torch_layouts import (
    COPY_CLASS,
    TRANSPOSED,
    layouts,
    mixes_transposed,
    noncontiguous_behind,
)

__all__ = ["CROSS_ATTENTION_MODES", "DEFAULT_OPTIONS", "EXECUTION_MODES", "KINDS", "MappedOp", "MappingOptions",
           "KernelClass", "KernelSource", "ProgramMapping", "default_execution", "kernel_class_of", "map_kernels",
           "map_program"]

EXECUTION_MODES = ("fused", "eager", "torch")
#: How a cross-attention over the flattened samples is charged (module docstring); the first is
#: the default, docs/hardware.md says why.
CROSS_ATTENTION_MODES = ("per-sample", "all")
GEMM_KIND, VECTOR_KIND, FLASH_KIND, NETWORK_KIND = "gemm", "vector", "flash_attention", "collective"
#: The kinds of mapped op, which are also the timeline's compute tracks.
KINDS = (GEMM_KIND, VECTOR_KIND, FLASH_KIND, NETWORK_KIND)
#: Reductions: a kernel's rows are their windows, one output each. ``select_and_scatter`` is a
#: windowed reduction too (each element of its source selects one element of its window of the
#: operand and adds itself there): its windows are its source's elements (``WINDOWS_OF_OPERAND``),
#: not its result's, which has the operand's shape.
REDUCTION_OPS = frozenset({"reduce", "reduce_window", "select_and_scatter"})
#: Reductions whose windows are the elements of one of their operands (by index), not of the result.
WINDOWS_OF_OPERAND = {"select_and_scatter": 1}
#: A fused epilogue may read side inputs of up to this many rows of the GEMM's N outputs (a bias,
#: the scale/shift/gate vectors of a few samples) without their reads being charged: at most a
#: few per cent of the GEMM's output bytes for M >= 256 rows.
EPILOGUE_SIDE_INPUT_ROWS = 8
#: Kernel class of a library call's kind (``hlo_analyzer.library_calls``): the GPU kernel model
#: gives each class its own in-model bandwidth efficiency (``KernelModel.vector_efficiency``).
KERNEL_CLASSES = {"layer_norm": "layer_norm", "group_norm": "group_norm", "softmax": "softmax",
                  "tanh_gelu": "gelu", "gelu": "gelu", COPY_CALL: "copy"}
#: Torch calls that torch-xla lowers with a dot (a one-hot product) but PyTorch runs as one
#: memory-bound kernel that gathers its input.
GATHER_CALLS = frozenset({"upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"})
#: Norms: one kernel each that needs contiguous rows (PyTorch copies a permuted input first).
NORM_CLASSES = frozenset({"layer_norm", "group_norm"})
ELEMENTWISE_CLASS = "elementwise"
#: Library calls that write a contiguous result whatever the layout of their inputs
#: (:mod:`hlo_analyzer.torch_layouts`); element-wise calls write in their first input's layout.
CONTIGUOUS_CALLS = frozenset({*NORM_CLASSES, "softmax", COPY_CALL, LINEAR_CALL, ATTENTION_CALL})
TORCH_KERNEL_CLASSES = frozenset(MEMORY_KERNEL_CLASSES)
#: Launch overhead when the hardware description gives none (see the module docstring).
DEFAULT_LAUNCH_OVERHEAD_S = 0.0


@dataclass(frozen=True)
class MappingOptions:
    """How the program is executed and the cost-model parameters that are options, with defaults.

    ``execution``: ``fused`` or ``eager`` (module docstring). ``dram_efficiency``: the fraction of
    the DRAM bandwidth sustained (1.0 = the datasheet figure; docs/hardware-model.md).
    ``exp_ops``: vector operations charged per element of an ``exponential`` (1 = as cheap as an
    add; a vector unit without a hardware exp may need several). ``cross_attention``: one of
    ``CROSS_ATTENTION_MODES``; ``per-sample`` needs ``caption_tokens``, the caption (key) tokens of
    one sample (the tracer's sidecar has it as ``model_max_length``); without it the traced key
    length is charged and the mapping says so (``ProgramMapping.cross_attention``).
    """

    execution: str = "fused"
    dram_efficiency: float = 1.0
    exp_ops: int = 1
    cross_attention: str = CROSS_ATTENTION_MODES[0]
    caption_tokens: int | None = None
    library_calls: tuple[CallRegion, ...] = ()

    def __post_init__(self) -> None:
        if self.execution not in EXECUTION_MODES:
            raise ValueError(f"execution must be one of {', '.join(EXECUTION_MODES)}, got {self.execution!r}")
        if not 0 < self.dram_efficiency <= 1:
            raise ValueError(f"dram_efficiency must be in (0, 1], got {self.dram_efficiency}")
        if self.exp_ops < 1:
            raise ValueError(f"exp_ops must be at least 1, got {self.exp_ops}")
        if self.cross_attention not in CROSS_ATTENTION_MODES:
            raise ValueError(f"cross_attention must be one of {', '.join(CROSS_ATTENTION_MODES)}, "
                             f"got {self.cross_attention!r}")
        if self.caption_tokens is not None and self.caption_tokens < 1:
            raise ValueError(f"caption_tokens must be at least 1, got {self.caption_tokens}")

    @property
    def per_sample_keys(self) -> int | None:
        """Keys per sample of a cross-attention when charged per sample, else None."""
        return self.caption_tokens if self.cross_attention == "per-sample" else None


DEFAULT_OPTIONS = MappingOptions()


def default_execution(chip: ChipSpec, library_calls: Sequence[CallRegion]) -> str:
    """``torch`` for a traced PyTorch model (its sidecar lists its library calls) on a GPU (a
    chip with a kernel model: PyTorch runs eagerly there, as published measurements do);
    ``fused`` for anything else (a compiled graph: TX8, a JAX program)."""
    return "torch" if chip.kernel_model is not None and library_calls else "fused"


@dataclass(frozen=True)
class MappedOp:
    """One kernel of the program on the chip (or one collective on the network)."""

    position: int                 # walk position where it runs (a fusion: its last member)
    positions: tuple[int, ...]    # every HLO op it charges (a fusion or an attention has several)
    name: str
    kind: str                     # one of KINDS
    shapes: str                   # e.g. "4x64x32->4x64x128"
    latency_s: float
    compute_s: float
    dram_s: float
    noc_s: float
    utilization: float
    bound: str
    flops: int
    dram_bytes: float = 0.0       # DRAM traffic the kernel's model charges


class KernelSource(NamedTuple):
    """What one kernel is costed from, without the dump: its name, kind and shapes text as
    :class:`MappedOp` has them, the Op and its fused epilogue (both None for a collective,
    which keeps its collective instead: kind, group size, bytes, devices)."""

    name: str
    kind: str
    shapes: str
    op: Op | None
    epilogue: Op | None = None
    collective: tuple[str, int, int, tuple[int, ...] | None] | None = None
    per_sample: bool = False      # a cross-attention charged per sample (its Op is one sample's)


@dataclass(frozen=True)
class KernelClass:
    """The kernels of one class in a program (``gemm``, ``flash_attention``, ``collective``; under
    ``--exec torch`` the memory-bound classes ``layer_norm``, ``softmax``, ``gelu``, ``elementwise``,
    ``copy``; else ``vector``) and their first-principles bound: each kernel's FLOPs at the chip's
    peak or its DRAM bytes at the datasheet bandwidth, whichever is longer (collectives: their
    own time). ``ratio`` is how much more the model charges than that bound."""

    name: str
    kernels: int
    seconds: float
    bound_seconds: float
    #: Where the chip description's constants for this class come from (``KernelModel.provenance``:
    #: a measurement's file, a public table or a transfer rule); '' on a chip without a kernel model.
    provenance: str = ""

    @property
    def ratio(self) -> float:
        return self.seconds / self.bound_seconds if self.bound_seconds > 0 else 1.0


@dataclass(frozen=True)
class ProgramMapping:
    """Every kernel of one program (one step on one device), in program order, and the totals."""

    chip: str
    execution: str
    ops: tuple[MappedOp, ...]
    distinct_mappings: int        # searches actually run (the rest came from the cache)
    #: The cross-attention mode applied: ``per-sample`` when it was asked for and the caption
    #: length is known, else ``all``; and how many attention kernels were charged per sample.
    cross_attention: str = "all"
    per_sample_attentions: int = 0
    #: What each kernel of ``ops`` was costed from (same order), for a kernel list that is
    #: re-costed without the dump (``hlo_analyzer.kernel_list``); empty when not kept.
    sources: tuple[KernelSource, ...] = ()

    @property
    def latency_s(self) -> float:
        return sum(op.latency_s for op in self.ops)

    def seconds_by_kind(self) -> dict[str, float]:
        totals = dict.fromkeys(KINDS, 0.0)
        for op in self.ops:
            totals[op.kind] += op.latency_s
        return totals

    def matrix_flops(self) -> int:
        return sum(op.flops for op in self.ops if op.kind in (GEMM_KIND, FLASH_KIND))

    def kernel_classes(self, chip: ChipSpec) -> tuple[KernelClass, ...]:
        """The kernels by class (:class:`KernelClass`), the longest first."""
        totals: dict[str, list[float]] = {}
        for op in self.ops:
            name = kernel_class_of(op)
            if op.kind == NETWORK_KIND:
                bound = op.latency_s
            else:
                peak = chip.vector_flops_per_s if op.kind == VECTOR_KIND else chip.gemm_flops_per_s
                bound = max(op.flops / peak, op.dram_bytes / chip.dram_bandwidth_bytes_per_s)
            entry = totals.setdefault(name, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += op.latency_s
            entry[2] += bound
        model = chip.kernel_model
        classes = [KernelClass(name, int(n), seconds, bound, model.provenance_of(_PROVENANCE_KEY.get(name, name)) if model else "")
                   for name, (n, seconds, bound) in totals.items()]
        return tuple(sorted(classes, key=lambda c: -c.seconds))


#: The provenance entry of a class that is named otherwise in the kernel model: a memory-bound
#: kernel of no class streams at ``hbm_efficiency``; a collective's time is the network's.
_PROVENANCE_KEY = {VECTOR_KIND: "hbm_efficiency", NETWORK_KIND: "network"}


def kernel_class_of(op: MappedOp) -> str:
    """The class of a kernel (:class:`KernelClass`): its kind, or for a memory-bound kernel of
    ``--exec torch`` the class it is named after (``layer_norm``, ``gelu(tanh_gelu)`` -> ``gelu``)."""
    if op.kind != VECTOR_KIND:
        return op.kind
    name = op.name.split("(", 1)[0]
    return name if name in TORCH_KERNEL_CLASSES else VECTOR_KIND


class _Work(NamedTuple):
    """One thing to map: an Op for the chip, or a collective for the network (internal: a
    NamedTuple, built once per kernel several times faster than a frozen dataclass)."""

    position: int
    positions: tuple[int, ...]
    name: str
    kind: str
    shapes: str
    op: Op | None = None
    epilogue: Op | None = None
    collective: tuple[str, int, int, tuple[int, ...] | None] | None = None
    per_sample: bool = False      # a cross-attention charged per sample


# -- shapes ------------------------------------------------------------------------------------------
def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape) or (1,)


def _shapes_text(operands: Iterable[Sequence[int]], results: Iterable[Sequence[int]]) -> str:
    def one(shapes: Iterable[Sequence[int]]) -> str:
        return ",".join("x".join(map(str, s)) or "()" for s in shapes)

    return f"{one(operands)}->{one(results)}"


def _bytes(dtype: str) -> int:
    return ELEMENT_BYTES.get(dtype, 2)


def _elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


# -- GEMMs and attention --------------------------------------------------------------------------------
def _gemm_op(dims: tuple[int, int, int, int], row: OpRow) -> tuple[Op, str] | None:
    """The (batched) GEMM Op and the shapes text, or None for an empty GEMM."""
    m, k, n, batch = dims
    if min(m, k, n, batch) <= 0:
        return None
    op = Op(row.op, OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * batch * m * k * n, _bytes(row.dtype),
            batch=batch)
    return op, _shapes_text(row.operand_shapes, row.result_shapes)


def _softmax_path(graph: nx.DiGraph, start: int | None, is_gemm: set[int]) -> tuple[set[int], set[int]]:
    """(GEMMs reached, non-GEMM ops passed) walking back from ``start`` until GEMMs; nothing
    reached beyond ``SOFTMAX_SPAN_LIMIT`` ops."""
    return walk_until(graph, [start], backward=True, stop=is_gemm.__contains__, limit=SOFTMAX_SPAN_LIMIT)


def _probabilities(graph: nx.DiGraph, value_gemm: int, is_gemm: set[int]) -> tuple[int, set[int], set[int]] | None:
    """(operand index of the probabilities, score GEMMs, softmax ops) of a value GEMM, or None."""
    softmax_outputs = after_exponential(graph)
    for index in (0, 1):
        if graph.nodes[value_gemm]["operands"][index] not in softmax_outputs:
            continue
        scores, passed = _softmax_path(graph, graph.nodes[value_gemm]["operands"][index], is_gemm)
        if scores and any(graph.nodes[p]["name"] == "exponential" for p in passed):
            return index, scores, passed
    return None


def _attention_work(graph: nx.DiGraph, value_gemm: int, is_gemm: set[int], rows: dict[int, OpRow],
                    claimed: set[int], exp_ops: int) -> _Work | None:
    found = _probabilities(graph, value_gemm, is_gemm)
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
    vector_rows = [rows[p] for p in passed if p in rows and rows[p].category == VECTOR]
    softmax_flops = sum(_vector_flops(r, exp_ops) for r in vector_rows)
    q = (1, heads, s_q, head_dim)
    kv = (1, heads, s_kv, head_dim)
    row = rows[value_gemm]
    op = Op("flash_attention", OpType.FLASH_ATTENTION, (q, kv, kv), None, q, 4 * heads * s_q * s_kv * head_dim,
            _bytes(row.dtype), vector_flops=softmax_flops)
    positions = tuple(sorted(scores | {r.position for r in vector_rows} | {value_gemm}))
    return _Work(value_gemm, positions, "flash_attention", FLASH_KIND,
                 f"q {heads}x{s_q}x{head_dim}, kv {heads}x{s_kv}x{head_dim}", op=op)


def _per_sample(work: _Work, keys_per_sample: int) -> _Work | None:
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


def _attentions(graph: nx.DiGraph, rows: dict[int, OpRow], is_gemm: set[int], options: MappingOptions,
                cross_values: Collection[int]) -> list[_Work]:
    works: list[_Work] = []
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


# -- real sizes ---------------------------------------------------------------------------------------------
def real_elements(attributes_of: dict[int, dict[str, Any]]) -> dict[int, int]:
    """Elements a kernel reads from memory for each node's result: its result's, except that free
    data movement holds no more data than its operand (a broadcast of a 2x6x1152 modulation
    vector to a whole activation is still 2x6x1152 values, which the reading kernel broadcasts
    on the fly) and constants hold none (they are folded into the kernels that use them)."""
    real: dict[int, int] = {}
    for node in sorted(attributes_of):
        attributes = attributes_of[node]
        name = attributes["name"]
        if name in CONSTANT_OPS:
            real[node] = 0
            continue
        size = sum(map(_elements, attributes["result_shapes"]))
        if name in FREE_MOVEMENT_OPS and attributes["operands"]:
            producer = attributes["operands"][0]
            source = real[producer] if producer is not None else _elements(attributes["operand_shapes"][0])
            size = min(size, source)
        real[node] = size
    return real


def _read_shape(producer: int | None, shape: Sequence[int], real: dict[int, int]) -> tuple[int, ...] | None:
    """What a kernel reads for one operand: its shape (a scalar as ``(1,)``), or its real element
    count where the producer holds less (:func:`real_elements`); None for a constant."""
    if producer is None:
        return _dims(shape)
    size = real[producer]
    if size == 0:
        return None
    return _dims(shape) if size == _elements(shape) else (size,)


# -- vector ops -------------------------------------------------------------------------------------------
def _vector_flops(row: OpRow, exp_ops: int) -> int:
    scale = exp_ops if row.op.endswith("exponential") else 1
    return row.flops * scale


def _vector_op(name: str, inputs: Sequence[Sequence[int]], rows: int, out_elements: int, flops: int,
               bytes_per_element: int) -> Op:
    width = max(1, math.ceil(out_elements / rows))
    shapes = tuple(_dims(s) for s in inputs if _elements(s) > 0) or ((1,),)
    return Op(name, OpType.VECTOR, shapes, None, (rows, width), max(1, flops), bytes_per_element)


def _rows_of(row: OpRow, result: Sequence[int]) -> int:
    """Rows of a vector kernel whose largest op is ``row``, of result ``result``: a reduction's
    windows, else its result's leading dims."""
    name = row.op.split(".", 1)[-1]
    if name in REDUCTION_OPS:
        source = WINDOWS_OF_OPERAND.get(name)
        if source is not None and source < len(row.operand_shapes):
            return max(1, _elements(row.operand_shapes[source]))
        return max(1, _elements(result))
    return max(1, _elements(result[:-1]))


def _eager_vector_op(row: OpRow, reads: tuple[tuple[int, ...] | None, ...], exp_ops: int) -> tuple[Op, str, str] | None:
    """(Op, kernel name, shapes text) of one element-wise op or reduction run alone, or None
    for an empty result. ``reads``: what it reads of each operand (:func:`_read_shape`)."""
    result = row.result_shapes[0] if row.result_shapes else ()
    if _elements(result) == 0:
        return None
    short = row.op.split(".", 1)[-1]
    inputs = [s for s in reads if s is not None]  # a constant is folded in: nothing read
    op = _vector_op(short, inputs, _rows_of(row, result), _elements(result), _vector_flops(row, exp_ops),
                    _bytes(row.dtype))
    return op, short, _shapes_text(row.operand_shapes, row.result_shapes)


_MISSING = object()


class _Signatures:
    """Ops and shapes texts by op signature, each made once per program: a transformer repeats
    a few dozen distinct kernels thousands of times. A GEMM's signature is its op name, shapes,
    dtype and (M, K, N, batch); an element-wise op's its op name, shapes, dtype and FLOPs; a
    fused kernel's the arguments of its Op. The options enter through ``exp_ops`` (fixed here)
    and the chip (the ``_Mapper``'s, which caches the mappings by the Ops' signatures)."""

    def __init__(self, exp_ops: int) -> None:
        self.exp_ops = exp_ops
        self._gemms: dict[tuple[Any, ...], tuple[Op, str] | None] = {}
        self._vectors: dict[tuple[Any, ...], tuple[Op, str, str] | None] = {}
        self._vector_ops: dict[tuple[Any, ...], Op] = {}
        self._texts: dict[tuple[Any, ...], str] = {}
        self._names: dict[tuple[str, ...], str] = {}

    def gemm(self, node: int, dims: tuple[int, int, int, int], row: OpRow) -> _Work | None:
        key = (dims, row.op, row.dtype, row.operand_shapes, row.result_shapes)
        made = self._gemms.get(key, _MISSING)
        if made is _MISSING:
            made = self._gemms[key] = _gemm_op(dims, row)
        if made is None:
            return None
        op, shapes = made  # type: ignore[misc]
        return _Work(node, (node,), row.op, GEMM_KIND, shapes, op=op)

    def eager_vector(self, node: int, row: OpRow, reads: tuple[tuple[int, ...] | None, ...]) -> _Work | None:
        key = (row.op, reads, row.result_shapes, row.dtype, row.flops)
        made = self._vectors.get(key, _MISSING)
        if made is _MISSING:
            made = self._vectors[key] = _eager_vector_op(row, reads, self.exp_ops)
        if made is None:
            return None
        op, name, shapes = made  # type: ignore[misc]
        return _Work(node, (node,), name, VECTOR_KIND, shapes, op=op)

    def vector_op(self, name: str, inputs: tuple[tuple[int, ...], ...], rows: int, out_elements: int,
                  flops: int, bytes_per_element: int, row_length: int = 0) -> Op:
        key = (name, inputs, rows, out_elements, flops, bytes_per_element, row_length)
        op = self._vector_ops.get(key)
        if op is None:
            op = _vector_op(name, inputs, rows, out_elements, flops, bytes_per_element)
            if row_length:
                op = replace(op, row_length=row_length)
            self._vector_ops[key] = op
        return op

    def shapes_text(self, operands: tuple[tuple[int, ...], ...], results: tuple[tuple[int, ...], ...]) -> str:
        key = (operands, results)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = _shapes_text(operands, results)
        return text

    def fusion_name(self, ops: tuple[str, ...]) -> str:
        """``fusion(a,b,...)`` of the distinct short names of the vector ops ``ops``."""
        name = self._names.get(ops)
        if name is None:
            name = self._names[ops] = "fusion(" + ",".join(dict.fromkeys(op.split(".", 1)[-1] for op in ops)) + ")"
        return name


class _Groups:
    """Union-find of fusable nodes (fused mode). A group's root is its least node, so a node's
    parent is never greater than the node."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def add(self, node: int, joining: Sequence[int] = ()) -> None:
        """A new node (greater than every node added before), in one group with the nodes
        ``joining`` (alone if none)."""
        if len(joining) == 1:  # the common case
            self.parent[node] = self.find(joining[0])
            return
        roots = {self.find(other) for other in joining}
        root = min(roots, default=node)
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
    for node in sorted(attributes_of):
        attributes = attributes_of[node]
        operands = attributes["operands"]
        name = attributes["name"]
        movement = name in FREE_MOVEMENT_OPS
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


class _GroupIO(NamedTuple):
    """What a kernel over a group of nodes reads and writes (:func:`_group_io`)."""

    entering: list[tuple[Any, tuple[int, ...]]]  # (producer or ("argument", i), what is read of it)
    out_elements: int
    entering_bytes: list[int]  # of each entering tensor, in its element type
    out_bytes: int


def _group_io(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], members: list[int],
              constant: set[int], real: dict[int, int]) -> _GroupIO:
    """The tensors entering the group and the elements of the tensors leaving it, and both in
    bytes (each tensor in its own element type). Both at their real size
    (:func:`real_elements`): a broadcast entering the group is read as its operand; a view
    leaving it is written once per tensor it views, and not at all when it views a tensor that
    entered the group (its readers read that)."""
    inside = set(members)
    entering: dict[Any, tuple[int | None, tuple[int, ...] | None, str]] = {}
    leaving: dict[int, tuple[int, str]] = {}  # computing member -> largest real size that leaves
    successors = graph.successors
    for node in members:
        attributes = attributes_of[node]
        for index, producer in enumerate(attributes["operands"]):
            if producer in inside or producer in constant:
                continue
            key = producer if producer is not None else ("argument", attributes["arguments"][index])
            entering[key] = (producer, _read_shape(producer, attributes["operand_shapes"][index], real),
                             attributes["operand_dtypes"][index])
        readers = set(successors(node))
        if readers and readers <= inside:
            continue
        source = _computing_source(attributes_of, node, inside)
        if source is not None and real[node] >= leaving.get(source, (0, ""))[0]:
            leaving[source] = (real[node], attributes["dtype"])
    read = [(key, shape, dtype) for key, (_, shape, dtype) in entering.items() if shape is not None]
    return _GroupIO([(key, shape) for key, shape, _ in read],
                    sum(size for size, _ in leaving.values()),
                    [_elements(shape) * _bytes(dtype) for _, shape, dtype in read],
                    sum(size * _bytes(dtype) for size, dtype in leaving.values()))


def _computing_source(attributes_of: dict[int, dict[str, Any]], node: int, inside: set[int]) -> int | None:
    """The member that computed what ``node`` holds (``node`` itself unless it is free movement),
    or None when it views a tensor from outside the group."""
    while attributes_of[node]["name"] in FREE_MOVEMENT_OPS:
        producer = attributes_of[node]["operands"][0] if attributes_of[node]["operands"] else None
        if producer not in inside:
            return None
        node = producer
    return node


def _fused_vector_works(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], rows: dict[int, OpRow],
                        vector_nodes: set[int], gemms: dict[int, _Work], signatures: _Signatures,
                        owners: dict[int, int]) -> tuple[list[_Work], dict[int, _Work]]:
    """Fused vector kernels, and GEMMs that took a group as their epilogue (by GEMM position)."""
    works: list[_Work] = []
    with_epilogue: dict[int, _Work] = {}
    exp_ops = signatures.exp_ops
    groups, constant = _fusion_groups(graph, attributes_of, vector_nodes, owners)
    real = real_elements(attributes_of)
    for members in sorted(groups):
        vector_rows = [rows[n] for n in members if n in vector_nodes]
        flops = sum([_vector_flops(r, exp_ops) for r in vector_rows])
        entering, out_elements, _, _ = _group_io(graph, attributes_of, members, constant, real)
        largest = max(vector_rows, key=_result_elements)
        result = largest.result_shapes[0] if largest.result_shapes else ()
        update = _slice_write_update(attributes_of, members, constant)
        if update is not None:  # written in place: reads and writes the update only
            entering, out_elements, result = [update], _elements(update[1]), update[1]
        name = signatures.fusion_name(tuple([r.op for r in vector_rows]))
        positions = tuple(members)
        epilogue_of = _epilogue_target(graph, members, entering, out_elements, gemms, with_epilogue)
        inputs = tuple([s for _, s in entering])
        shapes = signatures.shapes_text(inputs, (result,))
        if epilogue_of is not None:
            with_epilogue[epilogue_of] = _with_epilogue(gemms[epilogue_of], name, flops, positions)
            continue
        op = signatures.vector_op(name, inputs, _rows_of(largest, result),
                                  out_elements or _elements(result), flops, _bytes(largest.dtype))
        # A fused kernel runs once all its inputs are ready: at its last member.
        works.append(_Work(positions[-1], positions, name, VECTOR_KIND, shapes, op=op))
    return works, with_epilogue


def _with_epilogue(gemm: _Work, name: str, flops: int, positions: tuple[int, ...]) -> _Work:
    """The GEMM ``gemm`` with the element-wise work ``name`` (``flops``, the ops at
    ``positions``) done in its epilogue, on its (M, N) output."""
    assert gemm.op is not None
    m, n = gemm.op.output_shape
    epilogue = Op(name, OpType.VECTOR, ((m, n),), None, (m, n), max(1, flops), gemm.op.bytes_per_element)
    return gemm._replace(positions=tuple(sorted(gemm.positions + positions)), name=f"{gemm.name}+{name}",
                         epilogue=epilogue)


def _result_elements(row: OpRow) -> int:
    return _elements(row.result_shapes[0]) if row.result_shapes else 0


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


def _epilogue_target(graph: nx.DiGraph, members: list[int], entering: list[tuple[int | None, tuple[int, ...]]],
                     out_elements: int, gemms: dict[int, _Work], taken: dict[int, _Work]) -> int | None:
    producers = [p for p, _ in entering if p in gemms]
    if len(producers) != 1 or producers[0] in taken or gemms[producers[0]].op.batch != 1:
        return None
    gemm = producers[0]
    m, n = gemms[gemm].op.output_shape
    side = sum(_elements(s) for p, s in entering if p != gemm)
    if out_elements != m * n or side > EPILOGUE_SIDE_INPUT_ROWS * n:
        return None
    if set(graph.successors(gemm)) - set(members):
        return None
    return gemm


# -- torch eager: one kernel per library call -------------------------------------------------------
#: Ops that launch nothing: function returns, sharding annotations, tuples of values.
_NOT_KERNELS = frozenset({"return", "custom_call", "tuple", "get_tuple_element", "optimization_barrier",
                          "after_all", "while", "if", "case", "call"})


def _computes(attributes_of: dict[int, dict[str, Any]], nodes: Iterable[int]) -> bool:
    """True when a kernel has work to do: an op that is not a view (a dtype cast is a kernel)."""
    return any(attributes_of[n]["name"] not in FREE_MOVEMENT_OPS or attributes_of[n]["name"] == "convert"
               for n in nodes)


def _torch_works(graph: nx.DiGraph, attributes_of: dict[int, dict[str, Any]], rows: dict[int, OpRow],
                 chip: ChipSpec, options: MappingOptions, cross_values: Collection[int],
                 signatures: _Signatures, is_gemm: set[int], owners: dict[int, int],
                 residual_inputs: tuple[Any, ...]) -> list[_Work]:
    """Kernels as PyTorch launches them eagerly: one per library call (module docstring of
    :mod:`hlo_analyzer.library_calls`). A call with a GEMM is that GEMM, its element-wise ops its
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
        attentions = [w for w in _attentions(graph, rows, is_gemm, options, cross_values)
                      if w.position in fused or _reaches(graph, w.position, fused, is_gemm)]
    fused_calls = {id(call_of[w.position]) for w in attentions if w.position in call_of}
    claimed = {p for work in attentions for p in work.positions} | _inside_fused_attentions(graph, attentions, is_gemm)
    gemms = {p: w for p in sorted(is_gemm - claimed)
             if (w := signatures.gemm(p, attributes_of[p]["dot_dims"], rows[p])) is not None}
    constant = folded_constants(graph)
    real = real_elements(attributes_of)

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
              and (copy := _layout_copy(attributes_of, operand, shape, _elements(shape) * _bytes(dtype), p, layout,
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
               if (copy := _layout_copy(attributes_of, operand, shape, _elements(shape) * _bytes(dtype), p, layout,
                                        signatures)) is not None]
    vectors: list[_Work] = []
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
        io = _group_io(graph, attributes_of, rest, constant, real)
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
            flops = sum(_vector_flops(rows[p], signatures.exp_ops) for p in rest if p in rows)
            gemms[gemm] = _with_epilogue(gemms[gemm], call.kind, flops, tuple(rest))
            continue
        vector_rows = [rows[p] for p in rest if p in rows and rows[p].category == VECTOR]
        flops = sum(_vector_flops(r, signatures.exp_ops) for r in vector_rows)
        largest = max(vector_rows, key=_result_elements) if vector_rows else None
        result = largest.result_shapes[0] if largest is not None and largest.result_shapes else \
            attributes_of[rest[-1]]["result_shapes"][0]
        if mixes_transposed(attributes_of, io.entering, _elements(result), layout):
            kernel = "strided"
        else:
            kernel = KERNEL_CLASSES.get(call.kind) or _elementwise_variant(attributes_of, rest, constant, real, io)
        if kernel in NORM_CLASSES:  # it needs contiguous rows
            copies += [copy for (key, shape), size in zip(io.entering, io.entering_bytes)
                       if (copy := _layout_copy(attributes_of, key, shape, size, rest[0], layout, signatures))]
        rows_count = _rows_of(largest, result) if largest is not None else 1
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
        vectors.append(_Work(positions[-1], positions, f"{kernel}({call.kind})" if kernel != call.kind else kernel,
                             VECTOR_KIND, shapes, op=op))
    return [*attentions, *gemms.values(), *vectors, *copies]


def _row_length(kernel: str, entering: Sequence[tuple[Any, Sequence[int]]], result: Sequence[int], rows: int) -> int:
    """Elements a row of a row-wise kernel (``ROW_KERNEL_CLASSES``) spans: a reduction's largest
    input over its rows, a norm's or softmax's last dim; 0 for any other kernel."""
    if kernel not in ROW_KERNEL_CLASSES:
        return 0
    if kernel == "reduction":
        largest = max((_elements(shape) for _, shape in entering), default=0)
        return max(1, largest // max(1, rows))
    return max(1, int(result[-1])) if result else 0


def _layout_copy(attributes_of: dict[int, dict[str, Any]], operand: Any, shape: Sequence[int], size: int,
                 reader: int, layout: dict[int, str], signatures: _Signatures) -> _Work | None:
    """The copy PyTorch makes of a non-contiguous ``operand`` before ``reader``, a kernel that
    needs contiguous rows (:mod:`hlo_analyzer.torch_layouts`), or None when it is contiguous."""
    kind = noncontiguous_behind(attributes_of, operand, layout)
    if kind is None:
        return None
    name = COPY_CLASS[kind]
    op = signatures.vector_op(name, ((size,),), 1, size, 0, 1)
    text = signatures.shapes_text((tuple(shape),), (tuple(shape),))
    return _Work(reader, (reader,), f"{name}({kind} input)", VECTOR_KIND, text, op=op)


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


def _cudnn_layout_transposes(attributes: dict[str, Any], position: int, signatures: _Signatures) -> list[_Work]:
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
        size = _elements(shape) * _bytes(dtype)
        op = signatures.vector_op(LAYOUT_TRANSPOSE_CLASS, ((size,),), 1, size, 0, 1)
        text = signatures.shapes_text((tuple(shape),), (tuple(shape),))
        transposes.append(_Work(position, (position,), f"{LAYOUT_TRANSPOSE_CLASS}(convolution {side})",
                                VECTOR_KIND, text, op=op))
    return transposes


def _elementwise_variant(attributes_of: dict[int, dict[str, Any]], members: list[int], constant: set[int],
                         real: dict[int, int], io: _GroupIO) -> str:
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
        if attributes["name"] == "broadcast_in_dim" and 1 < real[node] < _elements(attributes["result_shapes"][0]):
            return True
        for producer, shape in zip(attributes["operands"], attributes["operand_shapes"]):
            if producer is not None and producer not in inside and producer not in constant \
                    and 1 < real[producer] < _elements(shape):
                return True
    return False


def _inside_fused_attentions(graph: nx.DiGraph, attentions: list[_Work], is_gemm: set[int]) -> set[int]:
    """What a fused attention kernel does inside besides its GEMMs and softmax: the casts on the
    way from the scores to the probabilities, and the scaling of q by a scalar (flash-attn and
    xformers apply the scale and keep the scores in registers)."""
    inside: set[int] = set()
    nodes = graph.nodes
    for work in attentions:
        found = _probabilities(graph, work.position, is_gemm)
        if found is None:
            continue
        _, scores, passed = found
        inside |= passed
        for score in scores:
            for operand in nodes[score]["operands"]:
                producer = _behind_views(nodes, operand)
                if producer is not None and nodes[producer]["name"] == "multiply" and \
                        min(map(_elements, nodes[producer]["operand_shapes"])) <= 1:
                    inside.add(producer)
    return inside


def _reaches(graph: nx.DiGraph, value_gemm: int, fused: set[int], is_gemm: set[int]) -> bool:
    """True when the value GEMM's result reaches a ``flash_attention`` call before any other GEMM
    (directly, or through a ring attention's combining ops): the model declared that the official
    code runs this attention as one fused kernel."""
    reached, _ = walk_until(graph, graph.successors(value_gemm), backward=False,
                            stop=lambda n: n in fused or n in is_gemm, limit=SOFTMAX_SPAN_LIMIT)
    return not reached.isdisjoint(fused)


#: Ops that cut a piece of an operand (GSPMD's local slice of a weight).
OPERAND_SLICES = frozenset({"dynamic_slice", "slice"})


def _feeds(graph: nx.DiGraph, node: int, gemms: dict[int, _Work]) -> bool:
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


def _behind_views(attributes_of: Any, node: int | None) -> int | None:
    """The op whose result ``node`` holds, followed back through views (a cast is no view: it
    is a kernel in PyTorch); an argument as it is given (None, or ``("argument", i)``)."""
    while isinstance(node, int) and attributes_of[node]["name"] in FREE_MOVEMENT_OPS \
            and attributes_of[node]["name"] != "convert" and attributes_of[node]["operands"]:
        node = attributes_of[node]["operands"][0]
    return node


def _gemm_behind(attributes_of: dict[int, dict[str, Any]], node: int | None, gemms: dict[int, _Work]) -> int | None:
    """The GEMM whose result ``node`` holds, through views, or None."""
    producer = _behind_views(attributes_of, node)
    return producer if producer in gemms else None


# -- collectives -----------------------------------------------------------------------------------------
def _collective_work(row: OpRow) -> _Work | None:
    if row.group_size <= 1:
        return None
    devices = row.replica_group if len(row.replica_group) == row.group_size else None
    return _Work(row.position, (row.position,), row.comm_kind, NETWORK_KIND,
                 _shapes_text(row.operand_shapes, row.result_shapes),
                 collective=(row.comm_kind, row.group_size, row.comm_bytes, devices))


# -- mapping ----------------------------------------------------------------------------------------------
def _bound_mapping(op: Op, chip: ChipSpec) -> Mapping:
    """When no tiling fits SRAM (a single huge row): read inputs, write the output, at peak rates."""
    q = op.bytes_per_element
    dram_bytes = (op.input_elements + op.weight_elements + op.output_elements) * q
    dram_s = dram_bytes / chip.dram_bandwidth_bytes_per_s
    peak = chip.vector_flops_per_s if op.op_type is OpType.VECTOR else chip.gemm_flops_per_s
    compute_s = op.flops / peak
    latency_s = max(dram_s, compute_s)
    return Mapping(op.name, op.op_type.value, "streaming_bound", latency_s, compute_s, dram_s, 0.0,
                   compute_s / latency_s if latency_s else 0.0, op.flops, dram_bytes, None,  # type: ignore[arg-type]
                   "dram" if dram_s >= compute_s else "compute")


def _signature(op: Op, epilogue: Op | None) -> tuple:
    def one(o: Op | None) -> tuple | None:
        # a memory-bound kernel's name is its class, which picks its efficiency on a GPU
        return None if o is None else (o.op_type, o.input_shapes, o.weight_shape, o.output_shape, o.flops,
                                       o.vector_flops, o.bytes_per_element, o.batch,
                                       o.name if o.op_type is OpType.VECTOR else None)

    return one(op), one(epilogue)


class _Mapper:
    """Maps works on one chip and system, one search per distinct op signature."""

    def __init__(self, chip: ChipSpec, system: SystemSpec, launch_s: float) -> None:
        self.chip = chip
        self.system = system
        self.launch_s = launch_s
        self.cache: dict[tuple, Mapping] = {}
        self.comm_cache: dict[tuple, float] = {}
        self._by_identity: dict[tuple[int, int], tuple[Op, Op | None, Mapping]] = {}

    def _mapping(self, op: Op, epilogue: Op | None) -> Mapping:
        key = _signature(op, epilogue)
        if key not in self.cache:
            try:
                self.cache[key] = map_op(op, self.chip, epilogue=epilogue)
            except MappingError:
                self.cache[key] = _bound_mapping(op, self.chip)
        return self.cache[key]

    def __call__(self, work: _Work) -> MappedOp:
        if work.collective is not None:
            if work.collective not in self.comm_cache:
                kind, group, message, devices = work.collective
                self.comm_cache[work.collective] = collective_time_s(kind, group, message, self.system,
                                                                     devices=devices)
            seconds = self.comm_cache[work.collective]
            return MappedOp(work.position, work.positions, work.name, work.kind, work.shapes, seconds,
                            0.0, 0.0, 0.0, 0.0, "network", 0)
        assert work.op is not None
        # Works share their Op objects (``_Signatures``): look those up by identity first (the
        # entry holds the Ops, so their ids stay theirs), then by signature.
        known = self._by_identity.get((id(work.op), id(work.epilogue)))
        if known is None:
            known = self._by_identity[(id(work.op), id(work.epilogue))] = (
                work.op, work.epilogue, self._mapping(work.op, work.epilogue))
        mapping = known[2]
        return MappedOp(work.position, work.positions, work.name, work.kind, work.shapes,
                        mapping.latency_s + self.launch_s, mapping.compute_s, mapping.dram_s,
                        mapping.noc_s, mapping.utilization, mapping.bound, mapping.flops, mapping.dram_bytes)


def _chip_for(chip: ChipSpec, options: MappingOptions) -> ChipSpec:
    if options.dram_efficiency == 1.0:
        return chip
    return replace(chip, dram_bandwidth_bytes_per_s=chip.dram_bandwidth_bytes_per_s * options.dram_efficiency)


def _works(graph: nx.DiGraph, rows: dict[int, OpRow], chip: ChipSpec, options: MappingOptions,
           cross_values: Collection[int], owners: dict[int, int], residual_inputs: tuple[Any, ...]) -> list[_Work]:
    attributes_of = dict(graph.nodes(data=True))
    signatures = _Signatures(options.exp_ops)
    is_gemm = {p for p, r in rows.items() if r.category == GEMM and p in graph and "dot_dims" in attributes_of[p]}
    if options.execution == "torch":
        collectives = [w for r in rows.values() if r.category == COMM and (w := _collective_work(r))]
        works = _torch_works(graph, attributes_of, rows, chip, options, cross_values, signatures, is_gemm, owners,
                             residual_inputs)
        return sorted([*works, *collectives], key=lambda w: w.position)
    attentions = _attentions(graph, rows, is_gemm, options, cross_values) if chip.fused_attention_kernel else []
    claimed = {p for work in attentions for p in work.positions}
    gemms = {p: w for p in sorted(is_gemm - claimed)
             if (w := signatures.gemm(p, attributes_of[p]["dot_dims"], rows[p])) is not None}
    vector_nodes = {p for p, r in rows.items() if r.category == VECTOR and p not in claimed and p in graph}
    if options.execution == "fused":
        vectors, with_epilogue = _fused_vector_works(graph, attributes_of, rows, vector_nodes, gemms, signatures,
                                                    owners)
        gemms.update(with_epilogue)
    else:
        real = real_elements(attributes_of)

        def reads(node: int) -> tuple[tuple[int, ...] | None, ...]:
            attributes = attributes_of[node]
            return tuple(_read_shape(p, s, real) for p, s in zip(attributes["operands"], attributes["operand_shapes"]))

        vectors = [w for p in sorted(vector_nodes) if (w := signatures.eager_vector(p, rows[p], reads(p)))]
    collectives = [w for r in rows.values() if r.category == COMM and (w := _collective_work(r))]
    return sorted([*attentions, *gemms.values(), *vectors, *collectives], key=lambda w: w.position)


def _map_works(works: Sequence[_Work], chip: ChipSpec, system: SystemSpec, options: MappingOptions) -> ProgramMapping:
    chip = _chip_for(chip, options)
    launch_s = getattr(chip, "kernel_launch_overhead_s", DEFAULT_LAUNCH_OVERHEAD_S) \
        if options.execution in ("eager", "torch") else 0.0
    mapper = _Mapper(chip, system, launch_s or 0.0)
    mapped = tuple(mapper(work) for work in works)
    return ProgramMapping(chip=chip.name, execution=options.execution, ops=mapped,
                          distinct_mappings=len(mapper.cache) + len(mapper.comm_cache),
                          cross_attention="all" if options.per_sample_keys is None else "per-sample",
                          per_sample_attentions=sum(1 for work in works if work.per_sample),
                          sources=tuple(KernelSource(w.name, w.kind, w.shapes, w.op, w.epilogue, w.collective, w.per_sample)
                                        for w in works))


def map_program(rows: Sequence[OpRow], graph: nx.DiGraph, chip: ChipSpec, system: SystemSpec,
                options: MappingOptions = DEFAULT_OPTIONS, *, cross_values: Collection[int] = (),
                owners: dict[int, int] | None = None, residual_inputs: Collection[Any] = ()) -> ProgramMapping:
    """Map every op of a program (its report rows and dataflow graph) on ``chip``; collectives on
    ``system``. ``cross_values``: value-GEMM positions of the program's cross-attentions (charged
    per sample when ``options`` ask for it). ``owners``: the block pair of each node
    (:func:`hlo_analyzer.pairs.pair_owners`), so that no fused kernel spans two pairs.
    ``residual_inputs``: each pair's input on the residual stream
    (:func:`hlo_analyzer.pairs.residual_inputs`), channel-major under ``--exec torch`` when the
    model declares ``transposed_tokens``. See the module docstring for what becomes what."""
    by_position = {row.position: row for row in rows}
    works = _works(graph, by_position, _chip_for(chip, options), options, frozenset(cross_values), owners or {},
                   tuple(residual_inputs))
    return _map_works(works, chip, system, options)


def map_kernels(kernels: Sequence[KernelSource], chip: ChipSpec, system: SystemSpec,
                options: MappingOptions = DEFAULT_OPTIONS) -> ProgramMapping:
    """Cost kernels that :func:`map_program` found before (its ``sources``) on ``chip`` with the
    same mapper, as if they were that program again: the ``i``-th kernel runs at position ``i``.
    The Ops were found on a chip of the same kind (a GPU's kernels are a GPU's); the costs come
    from ``chip`` now, so a change of a constant of its description changes them."""
    works = [_Work(index, (index,), k.name, k.kind, k.shapes, op=k.op, epilogue=k.epilogue, collective=k.collective,
                   per_sample=k.per_sample) for index, k in enumerate(kernels)]
    return _map_works(works, chip, system, options)
