"""``analyze-hlo --hw``: every op of the dump mapped onto a hardware system.

1. The system: ``hardware.systems.resolve_system`` (a chip name on an N-device dump is N chips on
   the chip's default network; ``--link-bandwidth``/``--hop-latency`` override it).
2. Every op: ``hlo_analyzer.mapping.program.map_program`` on the dump's rows and dataflow graph, with
   the cross-attentions that ``hlo_analyzer.blocks.find_attentions`` finds (charged per sample
   when the options ask for it; the caption length of one sample comes from the options or the
   tracer's sidecar, ``Sidecar.caption_tokens``). The collectives' latencies go back into the
   report's rows, so the report's ``totals.comm_latency_s`` is the one communication figure (per
   step, on this system).
3. If the dump is an STDiT3 stage (``hlo_analyzer.blocks``), every op is given to its block
   pair first (``hlo_analyzer.pairs.pair_owners``: from the pair's input on the residual stream
   to its output, with its own modulation wherever XLA listed it), so that no fused kernel spans
   two pairs, and the kernels are grouped by pair; with identical pairs every pair is charged the
   same, and a one-pair trace with ``--pairs N`` gives the N-pair total. The op list rebuilt from
   the ideal shape dictionary is mapped too, as a labelled comparison.
"""

from __future__ import annotations

import logging

import networkx as nx
from jaxlib.mlir import ir

from hardware import map_block
from hardware.systems import Hardware, load_choice, resolve_system
from hlo_analyzer.blocks import (
    Attention,
    NotSTDiTError,
    Segmentation,
    find_attentions,
    segment_blocks,
)
from hlo_analyzer.dataflow import Marker, build_dataflow
from hlo_analyzer.mapping.program import map_program
from hlo_analyzer.mapping.render import HardwareSections
from hlo_analyzer.mapping.results import (
    DEFAULT_OPTIONS,
    FLASH_KIND,
    GEMM_KIND,
    NETWORK_KIND,
    MappingOptions,
    ProgramMapping,
)
from hlo_analyzer.mapping.sections import (
    BlockLabels,
    BlocksSection,
    MappingSection,
    MappingTotals,
    PairGroup,
    TransformerSection,
)
from hlo_analyzer.pairs import pair_owners, residual_input, residual_inputs, unit_owners
from hlo_analyzer.report import Report
from hlo_analyzer.rows import COMM
from hlo_analyzer.transformer_blocks import (
    TransformerSegmentation,
    is_self_attention,
    segment_transformer,
)
from hlo_trace.errors import UsageError
from models.opensora.block_ops import build_stdit_block_ops

log = logging.getLogger(__name__)

#: Sampling steps of one OpenSora inference: the total of an STDiT3 stage when none is asked for.
DIFFUSION_STEPS = 30


def blocks_section(segmentation: Segmentation) -> BlocksSection:
    labels = tuple(
        BlockLabels(index, block.kind, tuple((label, tuple(p for p in positions if p is not None))
                                             for label, positions in block.labels().items()))
        for index, block in enumerate(segmentation.blocks))
    return BlocksSection(segmentation.shapes, segmentation.pairs, segmentation.consistent, labels)


def transformer_section(segmentation: TransformerSegmentation) -> TransformerSection:
    labels = tuple(BlockLabels(index, block.kind, tuple((label, tuple(positions))
                                                        for label, positions in block.labels().items()))
                   for index, block in enumerate(segmentation.blocks))
    return TransformerSection(labels, segmentation.shapes, segmentation.consistent)


def stdit_block_owners(graph: nx.DiGraph, segmentation: Segmentation,
                       pair_owner: dict[int, int],
                       pair_inputs: list[Marker | None] | None = None) -> dict[int, int]:
    """Graph node -> STDiT3 block (spatial ``2k``, temporal ``2k+1``) within its pair's work
    (``pair_owner``): an op of pair ``k`` is the temporal block's when it depends on that block's
    input on the residual stream or is side work only the temporal block reads
    (``pairs.unit_owners`` over the blocks), else the spatial block's. So a pair's two blocks
    add up to the pair. ``pair_inputs``: ``pairs.residual_inputs`` when already found (a pair's
    input is its spatial block's)."""
    blocks = segmentation.blocks
    anchors = [(block.self_attention.out_proj, block.self_attention.q_proj) for block in blocks]
    labelled = {position: index for index, block in enumerate(blocks)
                for positions in block.labels().values() for position in positions if position is not None}
    last = blocks[-1]
    inputs = None if pair_inputs is None else [
        pair_inputs[index // 2] if index % 2 == 0 and index // 2 < len(pair_inputs)
        else residual_input(graph, proj, qkv) for index, (proj, qkv) in enumerate(anchors)]
    by_block = unit_owners(graph, anchors, (last.fc2, last.self_attention.q_proj), labelled, inputs)
    pairs = len(blocks) // 2
    return {node: 2 * pair + 1 if by_block.get(node) == 2 * pair + 1 else 2 * pair
            for node, pair in pair_owner.items() if pair < pairs}


def _by_kind(items: dict[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(items.items())


def _pair_groups(program: ProgramMapping, pair_of: tuple[int | None, ...]) -> tuple[PairGroup, ...]:
    """The kernels grouped by their unit (a pair, or a block: ``pair_of``), None last-but-first."""
    groups: dict[int | None, dict[str, float]] = {}
    counts: dict[int | None, int] = {}
    for op, pair in zip(program.ops, pair_of):
        seconds = groups.setdefault(pair, {})
        seconds[op.kind] = seconds.get(op.kind, 0.0) + op.latency_s
        counts[pair] = counts.get(pair, 0) + 1
    order = sorted(groups, key=lambda p: -1 if p is None else p)
    return tuple(PairGroup(p, sum(groups[p].values()), _by_kind(groups[p]), counts[p]) for p in order)


def _totals(program: ProgramMapping, pairs: tuple[PairGroup, ...], *, steps: int | None,
            pairs_found: int | None, pairs_total: int | None,
            peak_gemm_flops_per_s: float) -> MappingTotals:
    """``steps`` None: :data:`DIFFUSION_STEPS` on an STDiT3 stage (``pairs_found``), one run of
    any other program; the totals' ``basis`` says which."""
    if steps is not None:
        basis = "steps"
    elif pairs_found:
        steps, basis = DIFFUSION_STEPS, "diffusion"
    else:
        steps, basis = 1, "one-run"
    by_kind = program.seconds_by_kind()
    compute_s = program.latency_s - by_kind[NETWORK_KIND]
    matrix_s_peak = program.matrix_flops() / peak_gemm_flops_per_s
    utilization = matrix_s_peak / compute_s if compute_s > 0 else 0.0
    step_s, comm_s = program.latency_s, by_kind[NETWORK_KIND]
    if pairs_found:
        inside = [g for g in pairs if g.pair is not None]
        outside = [g for g in pairs if g.pair is None]
        scale = (pairs_total or pairs_found) / pairs_found

        def comm(groups: list[PairGroup]) -> float:
            return sum(dict(g.seconds_by_kind).get(NETWORK_KIND, 0.0) for g in groups)

        step_s = sum(g.latency_s for g in outside) + scale * sum(g.latency_s for g in inside)
        comm_s = comm(outside) + scale * comm(inside)
    return MappingTotals(
        step_latency_s=program.latency_s, seconds_by_kind=_by_kind(by_kind), gemm_utilization=utilization,
        steps=steps, pairs_found=pairs_found, pairs_total=(pairs_total or pairs_found) if pairs_found else None,
        inference_latency_s=steps * step_s, inference_comm_s=steps * comm_s, basis=basis)


def program_totals(program: ProgramMapping, pair_of: tuple[int | None, ...], *, steps: int | None,
                   pairs_found: int | None, pairs_total: int | None,
                   peak_gemm_flops_per_s: float) -> tuple[tuple[PairGroup, ...], MappingTotals]:
    """The kernels by block pair (``pair_of``: each kernel's pair, None outside every pair) and
    the totals of ``steps`` runs with the traced pairs scaled to ``pairs_total`` (``_totals``)."""
    groups = _pair_groups(program, pair_of)
    return groups, _totals(program, groups, steps=steps, pairs_found=pairs_found, pairs_total=pairs_total,
                           peak_gemm_flops_per_s=peak_gemm_flops_per_s)


def _with_collective_latencies(report: Report, program: ProgramMapping) -> None:
    """Write each collective's latency on the system into its report row (one figure: the report's)."""
    seconds = {op.position: op.latency_s for op in program.ops if op.kind == NETWORK_KIND}
    report.rows = [row._replace(comm_latency_s=seconds.get(row.position, 0.0)) if row.category == COMM else row
                   for row in report.rows]


def _segment(module: ir.Module, report: Report, graph: nx.DiGraph,
             attentions: list[Attention]) -> Segmentation | None:
    try:
        segmentation = segment_blocks(module, report.source, graph=graph, attentions=attentions)
    except NotSTDiTError as error:
        log.info("no block view: %s", error)
        return None
    log.info("found %d STDiT3 blocks (%d pairs)", len(segmentation.blocks), segmentation.pairs)
    return segmentation


def add_hardware_sections(report: Report, module: ir.Module, hardware: str | Hardware, *, steps: int | None = None,
                          pairs: int | None = None, options: MappingOptions = DEFAULT_OPTIONS,
                          link_bandwidth_bytes_per_s: float | None = None,
                          hop_latency_s: float | None = None, graph: nx.DiGraph | None = None) -> None:
    """Map every op of ``module`` on ``hardware`` and put the typed sections into ``report``.
    ``graph``: the module's dataflow graph if already built (a ``DataflowVisitor`` that followed
    the report's walk), else it is built here. ``steps``: runs of the program totalled; None: a
    diffusion inference (:data:`DIFFUSION_STEPS`) on an STDiT3 stage, else one run."""
    choice = load_choice(hardware)
    resolved = resolve_system(choice, report.num_devices or 1,
                              link_bandwidth_bytes_per_s=link_bandwidth_bytes_per_s,
                              hop_latency_s=hop_latency_s, fidelity=options.fidelity)
    graph = build_dataflow(module) if graph is None else graph
    attentions = find_attentions(graph)
    cross_values = {v for attention in attentions if not is_self_attention(graph, attention)
                    for v in attention.values}
    segmentation = _segment(module, report, graph, attentions)
    if segmentation is None and pairs is not None:
        raise UsageError(f"{report.source}: --pairs needs an STDiT3 stage (no block pairs found)")
    inputs = residual_inputs(graph, segmentation) if segmentation is not None else []
    owners = pair_owners(graph, segmentation, inputs) if segmentation is not None else {}
    transformer = segment_transformer(graph, attentions) if segmentation is None else None
    if segmentation is not None:
        block_owner = stdit_block_owners(graph, segmentation, owners, inputs)
        blocks_found = len(segmentation.blocks)
    elif transformer is not None:
        log.info("found %d transformer blocks (%s)", len(transformer.blocks), transformer.blocks[0].kind)
        block_owner, blocks_found = transformer.owners, len(transformer.blocks)
    else:
        block_owner, blocks_found = {}, 0
    residual = [m for m in inputs if m is not None]
    program = map_program(report.rows, graph, resolved.system.chip, resolved.system, options,
                          cross_values=cross_values, owners=owners or block_owner,
                          residual_inputs=residual)
    log.info("mapped %d kernels (%d distinct searches); cross-attention: %s (%d kernels per sample)",
             len(program.ops), program.distinct_mappings, program.cross_attention,
             program.per_sample_attentions)
    _with_collective_latencies(report, program)
    blocks = blocks_section(segmentation) if segmentation is not None else None
    found = blocks.pairs if blocks else 0
    pair_of = tuple(p if (p := owners.get(op.position)) is not None and p < found else None
                    for op in program.ops)
    reference = map_block(build_stdit_block_ops(blocks.shapes), resolved.system.chip) if blocks else None
    groups, totals = program_totals(program, pair_of, steps=steps, pairs_found=blocks.pairs if blocks else None,
                                    pairs_total=pairs, peak_gemm_flops_per_s=resolved.system.chip.gemm_flops_per_s)
    block_of = tuple(b if (b := block_owner.get(op.position)) is not None and b < blocks_found
                     else None for op in program.ops) if blocks_found else ()
    mapping = MappingSection(choice.name, resolved, options, program, pair_of, groups, totals, reference,
                             program.kernel_classes(resolved.system.chip), block_of,
                             _pair_groups(program, block_of) if blocks_found else ())
    report.sections = HardwareSections(
        blocks=blocks, mapping=mapping,
        transformer=transformer_section(transformer) if transformer is not None else None)



__all__ = ["FLASH_KIND", "GEMM_KIND", "add_hardware_sections", "blocks_section", "program_totals",
           "stdit_block_owners", "transformer_section"]
