"""Per-op mapping of any dump onto a chip: every GEMM, vector op, attention and collective
(:func:`map_program`), and the re-costing of a kernel list without the dump
(:func:`map_kernels`).

The works of the program come from the execution mode: ``fused``
(``hlo_analyzer.mapping.fusion``), ``torch`` (``hlo_analyzer.mapping.torch_kernels``) or ``eager``
(one kernel per HLO op, ``hlo_analyzer.mapping.works``), with fused attentions
(``hlo_analyzer.mapping.attention``) where the chip has the kernel. Ops run one after another (no
overlap of compute and communication), so a program's latency is the sum of its ops'. Eager
execution adds the chip's ``kernel_launch_overhead_s`` (default 0 when the hardware description
has none) to every kernel. Mappings are cached by op signature, so a dump of many identical
blocks costs one search per distinct shape. Data movement outside fusions (gather, concatenate,
dynamic_slice ...) is not charged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import networkx as nx

from hardware import (
    ChipSpec,
    Mapping,
    MappingError,
    Op,
    OpType,
    SystemSpec,
    collective_time_s,
    map_op,
)
from hlo_analyzer.dataflow import dependency_order
from hlo_analyzer.mapping.attention import find_attentions
from hlo_analyzer.mapping.fusion import fused_vector_works
from hlo_analyzer.mapping.results import (
    DEFAULT_OPTIONS,
    NO_CROSS_ATTENTION,
    KernelSource,
    MappedOp,
    MappingOptions,
    ProgramMapping,
)
from hlo_analyzer.mapping.torch_kernels import torch_works
from hlo_analyzer.mapping.works import (
    Signatures,
    Work,
    collective_work,
    read_shape,
    real_elements,
    stored_dtype,
)
from hlo_analyzer.rows import COMM, GEMM, VECTOR, OpRow

#: Launch overhead when the hardware description gives none (see the module docstring).
DEFAULT_LAUNCH_OVERHEAD_S = 0.0


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

    def __call__(self, work: Work) -> MappedOp:
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
           cross_values: Collection[int], owners: dict[int, int], residual_inputs: tuple[Any, ...]) -> list[Work]:
    attributes_of = dict(graph.nodes(data=True))
    signatures = Signatures(options.exp_ops)
    is_gemm = {p for p, r in rows.items() if r.category == GEMM and p in graph and "dot_dims" in attributes_of[p]}
    if options.execution == "torch":
        collectives = [w for r in rows.values() if r.category == COMM and (w := collective_work(r))]
        works = torch_works(graph, attributes_of, rows, chip, options, cross_values, signatures, is_gemm, owners,
                             residual_inputs)
        return sorted([*works, *collectives], key=lambda w: w.position)
    attentions = find_attentions(graph, rows, is_gemm, options, cross_values) if chip.fused_attention_kernel else []
    claimed = {p for work in attentions for p in work.positions}
    gemms = {p: w for p in sorted(is_gemm - claimed)
             if (w := signatures.gemm(p, attributes_of[p]["dot_dims"], rows[p])) is not None}
    vector_nodes = {p for p, r in rows.items() if r.category == VECTOR and p not in claimed and p in graph}
    if options.execution == "fused":
        vectors, with_epilogue = fused_vector_works(graph, attributes_of, rows, vector_nodes, gemms, signatures,
                                                    owners, defer=options.defer_epilogues)
        gemms.update(with_epilogue)
    else:
        real = real_elements(attributes_of, dependency_order(graph))

        def reads(node: int) -> tuple[tuple[tuple[int, ...] | None, str], ...]:
            attributes = attributes_of[node]
            return tuple((read_shape(p, s, real), stored_dtype(attributes_of, p, dtype)) for p, s, dtype in
                         zip(attributes["operands"], attributes["operand_shapes"], attributes["operand_dtypes"]))

        vectors = [w for p in sorted(vector_nodes) if (w := signatures.eager_vector(p, rows[p], reads(p)))]
    collectives = [w for r in rows.values() if r.category == COMM and (w := collective_work(r))]
    return sorted([*attentions, *gemms.values(), *vectors, *collectives], key=lambda w: w.position)


def _map_works(works: Sequence[Work], chip: ChipSpec, system: SystemSpec, options: MappingOptions) -> ProgramMapping:
    chip = _chip_for(chip, options)
    launch_s = getattr(chip, "kernel_launch_overhead_s", DEFAULT_LAUNCH_OVERHEAD_S) \
        if options.execution in ("eager", "torch") else 0.0
    mapper = _Mapper(chip, system, launch_s or 0.0)
    mapped = tuple(mapper(work) for work in works)
    return ProgramMapping(chip=chip.name, execution=options.execution, ops=mapped,
                          distinct_mappings=len(mapper.cache) + len(mapper.comm_cache),
                          cross_attention="all" if options.per_sample_keys is None else "per-sample",
                          per_sample_attentions=sum(1 for work in works if work.per_sample),
                          sources=tuple(KernelSource(w.name, w.kind, w.shapes, w.op, w.epilogue, w.collective, w.per_sample,
                                                     w.pending)
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
    mapping = _map_works(works, chip, system, options)
    return mapping if cross_values else replace(mapping, cross_attention=NO_CROSS_ATTENTION)


def map_kernels(kernels: Sequence[KernelSource], chip: ChipSpec, system: SystemSpec,
                options: MappingOptions = DEFAULT_OPTIONS) -> ProgramMapping:
    """Cost kernels that :func:`map_program` found before (its ``sources``) on ``chip`` with the
    same mapper, as if they were that program again: the ``i``-th kernel runs at position ``i``.
    The Ops were found on a chip of the same kind (a GPU's kernels are a GPU's); the costs come
    from ``chip`` now, so a change of a constant of its description changes them."""
    works = [Work(index, (index,), k.name, k.kind, k.shapes, op=k.op, epilogue=k.epilogue, collective=k.collective,
                   per_sample=k.per_sample) for index, k in enumerate(kernels)]
    return _map_works(works, chip, system, options)
