"""One dump analysed on one hardware choice: the recipe every command shares.

``analyze_dump(path, hardware, options)`` reads the dump's sidecar once (or takes the one the
caller read), builds the mapping options from it (:func:`mapping_options`: the caption length
of one sample, the library calls, the hardware's default execution), measures the program
(``hlo_analyzer.measurement``: FLOPs, collectives, memory, a training step's split) and maps
every op (``hlo_analyzer.mapping.apply.add_hardware_sections``) on the hardware, loaded once by
the command (``hardware.systems.Hardware``; None: measured only). The result is an
:class:`Analysis`: the report with its typed sections, and what it was made from.
``analyze-hlo``, ``analyze-pipeline`` and the plan search's estimates all analyse through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

from hardware.spec import ChipSpec
from hardware.systems import Hardware, load_choice
from hlo_analyzer.comm import RingLink
from hlo_analyzer.mapping.apply import add_hardware_sections
from hlo_analyzer.mapping.library_calls import sidecar_call_regions, sidecar_traced_pytorch
from hlo_analyzer.mapping.render import hardware_sections
from hlo_analyzer.mapping.results import MappingOptions, default_execution
from hlo_analyzer.mapping.sections import BlocksSection, MappingSection
from hlo_analyzer.measurement import MeasureOptions, as_usage_error, measure
from hlo_analyzer.memory import MemorySection
from hlo_analyzer.mlir import load_module
from hlo_analyzer.report import Report
from hlo_analyzer.sidecar import Sidecar, read_sidecar, sidecar_for
from hlo_analyzer.training import TrainingSplit

log = logging.getLogger(__name__)

#: The hop latency of ``--link-bandwidth`` without ``--hop-latency`` (no ``--hw``): 1 us, the
#: order of one NVLink or ICI hop.
DEFAULT_HOP_LATENCY_S = 1e-6


@dataclass(frozen=True)
class AnalysisOptions:
    """What a command asks of the mapping. ``execution`` None: the hardware's default for the
    dump (``default_execution``); ``caption_tokens`` None: the sidecar's when cross-attention is
    charged per sample; ``steps``/``pairs``: as ``add_hardware_sections`` takes them. Without
    a hardware: ``link_bandwidth_bytes_per_s`` (and ``hop_latency_s``, ``bruck``) time the
    collectives on a plain ring. ``branch``: the conditional branch counted; ``attention_memory``:
    ``written`` (the program as written) or ``fused`` (every attention held in tiles, as a fused
    flash-attention kernel holds it); ``parallel_memory``: the memory measured in a forked child
    (``hlo_analyzer.measurement.run_in_parallel``)."""

    steps: int | None = None
    pairs: int | None = None
    execution: str | None = None
    dram_efficiency: float = 1.0
    exp_ops: int = 1
    cross_attention: str = "per-sample"
    caption_tokens: int | None = None
    fidelity: str | None = None
    link_bandwidth_bytes_per_s: float | None = None
    hop_latency_s: float | None = None
    bruck: bool = False
    branch: str | int = "max"
    attention_memory: str = "written"
    parallel_memory: bool = False
    #: ``MappingOptions.defer_epilogues`` (kernel documents to be rescaled to another shape).
    defer_epilogues: bool = False


DEFAULT_ANALYSIS = AnalysisOptions()


def mapping_options(sidecar: Sidecar | None, chip: ChipSpec, options: AnalysisOptions) -> MappingOptions:
    """The mapping's options: ``options``, with the caption length and library calls of the
    dump's ``sidecar`` and the ``chip``'s default execution."""
    caption_tokens = options.caption_tokens
    if caption_tokens is None and options.cross_attention == "per-sample" and sidecar is not None:
        caption_tokens = sidecar.caption_tokens
    document = None if sidecar is None else dict(sidecar.document)
    library_calls = sidecar_call_regions(document)
    execution = options.execution or default_execution(
        chip, library_calls, traced_pytorch=sidecar_traced_pytorch(document))
    return MappingOptions(execution=execution, dram_efficiency=options.dram_efficiency,
                          exp_ops=options.exp_ops, cross_attention=options.cross_attention,
                          caption_tokens=caption_tokens, library_calls=library_calls,
                          fidelity=options.fidelity, defer_epilogues=options.defer_epilogues)


@dataclass(frozen=True)
class Analysis:
    """A dump measured and mapped: the ``report`` (its typed sections below), the parsed
    ``module``, the ``sidecar`` read for it, the mapping ``options`` used (None: measured on no
    hardware) and the dataflow ``graph`` the mapping walked."""

    path: str
    report: Report
    module: ir.Module
    sidecar: Sidecar | None
    options: MappingOptions | None
    graph: Any = None

    @property
    def memory(self) -> MemorySection:
        memory = self.report.memory
        assert memory is not None
        return memory

    @property
    def training(self) -> TrainingSplit | None:
        return self.report.training

    @property
    def mapping(self) -> MappingSection:
        mapping = hardware_sections(self.report).mapping
        assert mapping is not None
        return mapping

    @property
    def blocks(self) -> BlocksSection | None:
        return hardware_sections(self.report).blocks


def add_mapping(report: Report, module: ir.Module, hardware: Hardware, options: MappingOptions,
                analysis: AnalysisOptions, graph: Any = None) -> None:
    """Map ``report``'s ops on ``hardware`` with ``options`` (the sections go into ``report``)."""
    add_hardware_sections(report, module, hardware, steps=analysis.steps, pairs=analysis.pairs,
                          options=options, graph=graph,
                          link_bandwidth_bytes_per_s=analysis.link_bandwidth_bytes_per_s,
                          hop_latency_s=analysis.hop_latency_s)


def analyze_dump(path: str, hardware: str | Hardware | None,
                 options: AnalysisOptions = DEFAULT_ANALYSIS, *,
                 sidecar: Sidecar | None = None) -> Analysis:
    """``path`` measured and mapped on ``hardware`` (module docstring; None: measured only).
    ``sidecar``: the dump's when the caller has read it; else the one beside the dump, if any."""
    choice = None if hardware is None else load_choice(hardware)
    if sidecar is None:
        sidecar = read_sidecar(sidecar_for(path))
    log.info("loading %s", path)
    module = load_module(path)
    mapping = None if choice is None else mapping_options(sidecar, choice.chip, options)
    log.info("counting FLOPs, collectives and memory")
    measured = measure(module, path, sidecar, MeasureOptions(
        collective_time=None if choice is not None else _plain_ring(options),
        bruck=options.bruck, branch=options.branch,
        capacity_bytes=None if choice is None else choice.chip.dram_capacity_bytes,
        parallel=options.parallel_memory, attention_memory=options.attention_memory,
        dataflow=mapping is not None,
        locations=mapping is not None and mapping.execution == "torch"))
    if choice is not None:
        assert mapping is not None
        log.info("mapping every op on %s", choice.name)
        with as_usage_error(path, f"cannot be mapped on {choice.name}"):
            add_mapping(measured.report, module, choice, mapping, options, measured.graph)
    return Analysis(path, measured.report, module, sidecar, mapping, measured.graph)


def _plain_ring(options: AnalysisOptions) -> RingLink | None:
    """The collectives' time on a plain ring of ``link_bandwidth_bytes_per_s`` (None: none)."""
    if options.link_bandwidth_bytes_per_s is None:
        return None
    hop = DEFAULT_HOP_LATENCY_S if options.hop_latency_s is None else options.hop_latency_s
    return RingLink(bandwidth_bytes_per_s=options.link_bandwidth_bytes_per_s, hop_latency_s=hop,
                    bruck=options.bruck)


__all__ = ["DEFAULT_ANALYSIS", "Analysis", "AnalysisOptions", "analyze_dump",
           "mapping_options"]
