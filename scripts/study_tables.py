"""Tables and plots of the strategy study (``scripts/sweep.py``) from its cached analyses.

Each case (shape x strategy) has one ``analyze-hlo --hw ... --format json`` document and one
trace sidecar per pipeline stage; a case's whole-model figures are the sums over its stages,
because every stage runs on the same chips one after the other.  Numbers are per device and per
denoising step unless a column says otherwise.

Tables (markdown and CSV, same rows):
  flops            per shape: traced GEMM / vector TFLOPs next to the analytic GEMM count;
  communication    per shape x strategy: per-device bytes by collective kind next to theory;
  latency          per shape x strategy: inference latency on the hardware system, memory per
                   device;
  pipelines        per pipeline configuration x patch count M: PipeFusion latency,
                   communication and memory per device (``analyze-pipeline``);
  block_ops_SHAPE  per strategy: latency and utilisation of each op of one block pair.

Memory per device of a flat strategy: its stages run one after the other on the same chips, so a
device keeps the weights of every stage and, at any time, the live values of one stage: the sum
of the stages' weights plus the largest of their peak live bytes (``analyze-hlo``'s memory
section). A pipeline's device belongs to one stage: the largest stage total.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from hardware.collectives import COLLECTIVE_KINDS as ALL_COLLECTIVE_KINDS
from hlo_analyzer.mapping.json_report import JsonReport
from hlo_analyzer.mapping.pipeline import PipelineReport
from hlo_analyzer.mapping.sections import MappingTotals
from hlo_analyzer.memory import MemorySection, MemoryUsage
from hlo_analyzer.sidecar import TraceStatistics
from hlo_trace.atomic import atomic_write, write_png
from models.opensora.parallel import STRATEGIES

#: The table columns: every collective kind but broadcast, which no strategy emits.
COLLECTIVE_KINDS = tuple(k for k in ALL_COLLECTIVE_KINDS if k != "collective_broadcast")
TERA, GIGA = 1e12, 1e9
#: The latency-memory plot draws the chip's capacity as a line when it is at most this many times
#: the largest memory plotted; beyond, only the legend states it.
CAPACITY_LINE_SPAN = 4
#: The sections of ``analyze-hlo --hw``'s report the tables read (``sweep.load_case`` requires them).
STUDY_SECTIONS = ("memory", "mapping")
#: The mapping's totals the tables sum over a case's stages.
LATENCY, COMM, COMPUTE = (attrgetter(name) for name in (
    "inference_latency_s", "inference_comm_s", "inference_compute_s"))


class _Outcome:
    """Both kinds of case: results, or the one-line ``error`` that stopped them."""

    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class StageResult:
    """One traced stage of a case: what its trace cost (its sidecar's statistics) and its
    ``analyze-hlo --hw`` report (with its memory and mapping sections)."""

    statistics: TraceStatistics
    analysis: JsonReport


@dataclass(frozen=True)
class CaseMemory:
    """Bytes per device of a flat strategy over the whole model (module doc)."""

    weight_bytes: int
    live_bytes: int
    capacity_bytes: float | None

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.live_bytes


@dataclass
class CaseResult(_Outcome):
    """One case of the sweep: its stages, or its error."""

    config: str
    shape: str
    strategy: str
    mesh: str
    stages: list[StageResult] = field(default_factory=list)
    error: str | None = None
    #: The analysis of stage 0 traced with one pair and totalled with ``--pairs`` (the one-pair
    #: check), or None.
    one_pair: JsonReport | None = None

    @property
    def devices(self) -> int:
        x, y = (int(part) for part in self.mesh.split("x"))
        return x * y

    @property
    def gemm_flops_per_device(self) -> float:
        return sum(stage.analysis.totals.gemm_flops for stage in self.stages)

    @property
    def vector_flops_per_device(self) -> float:
        return sum(stage.analysis.totals.vector_flops for stage in self.stages)

    def comm_bytes_by_kind(self) -> dict[str, float]:
        sums = dict.fromkeys(COLLECTIVE_KINDS, 0.0)
        for stage in self.stages:
            for kind, entry in stage.analysis.comm_by_kind.items():
                sums[kind] = sums.get(kind, 0.0) + entry.bytes_per_device
        return sums

    def mapping_total(self, value: Callable[[MappingTotals], float]) -> float:
        """The sum over the stages of one ``value`` of their mapping's totals."""
        return sum(value(mapped_totals(stage.analysis)) for stage in self.stages)

    @property
    def block_mapping(self) -> PairView:
        """The first stage's first block pair, from the per-op mapping of the traced ops: its
        kernels (labelled GEMMs named by their label), time shares and utilisation."""
        return pair_view(self.stages[0].analysis)

    @property
    def memory(self) -> CaseMemory:
        """Bytes per device over the whole model (module doc): weights, peak live, total."""
        usages = [stage_memory(stage.analysis).usage for stage in self.stages]
        weights = sum(usage.weight_bytes for usage in usages)
        live = max(usage.total_bytes - usage.weight_bytes for usage in usages)
        return CaseMemory(weights, live, usages[0].capacity_bytes)

    @property
    def trace_seconds(self) -> float:
        return sum(stage.statistics.seconds_total for stage in self.stages)

    @property
    def peak_rss_bytes(self) -> int:
        return max(stage.statistics.peak_rss_bytes for stage in self.stages)


def mapped_totals(analysis: JsonReport) -> MappingTotals:
    """The mapping's totals of a study's analysis (``STUDY_SECTIONS``)."""
    assert analysis.mapping is not None
    return analysis.mapping.totals


def stage_memory(analysis: JsonReport) -> MemorySection:
    """The memory section of a study's analysis (``STUDY_SECTIONS``)."""
    assert analysis.memory is not None
    return analysis.memory


@dataclass
class PipelineResult(_Outcome):
    """One pipeline case of the sweep: its ``analyze-pipeline --format json`` document, or its
    error."""

    config: str
    shape: str
    stages: int
    chips: int
    strategy: str
    patches: int
    analysis: PipelineReport | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.stages}x{self.chips}:{self.strategy}"

    @property
    def report(self) -> PipelineReport:
        assert self.analysis is not None
        return self.analysis

    @property
    def largest_stage_memory(self) -> MemoryUsage:
        """The memory of the stage whose device holds the most."""
        return self.report.largest_stage_memory


# ---------------------------------------------------------------------------------------------
# Tables: each a list of header + rows of plain values, rendered to markdown and CSV.
# ---------------------------------------------------------------------------------------------

Table = tuple[list[str], list[list[Any]]]


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def to_markdown(table: Table) -> str:
    headers, rows = table
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    headers, rows = table
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(["" if value is None else value for value in row] for row in rows)
    return buffer.getvalue()


def _by_shape(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    shapes: dict[str, list[CaseResult]] = {}
    for result in results:
        shapes.setdefault(result.shape, []).append(result)
    return shapes


def analytic_gemm_flops(config: str, shape: str) -> int:
    from models.opensora.config import get_config
    from models.opensora.flops import gemm_flops

    return gemm_flops(get_config(config), shape, official=True)["forward"]["total"]  # the sweep's path


def flops_table(results: list[CaseResult]) -> Table:
    """Whole-model FLOPs of one denoising step per shape.  The one-device baseline (``none``)
    holds the whole program, so its GEMM count is the model's; a parallel strategy's per-device
    count times its devices exceeds it by the work every device repeats (embeddings, norms that
    a strategy leaves unsplit), shown as a ratio."""
    parallel = [s for s in STRATEGIES if s != "none"]
    strategies = [s for s in parallel if any(r.strategy == s for r in results)]
    headers = ["shape", "analytic GEMM TFLOP", "traced GEMM TFLOP (none)", "difference %",
               "traced vector TFLOP (none)"]
    headers += [f"{s}: devices x per-device GEMM / analytic" for s in strategies]
    rows = []
    for shape, cases in _by_shape(results).items():
        analytic = analytic_gemm_flops(cases[0].config, shape)
        baseline = next((c for c in cases if c.strategy == "none" and c.ok), None)
        traced = baseline.gemm_flops_per_device if baseline else None
        row = [shape, analytic / TERA, traced / TERA if traced else None,
               100 * (traced - analytic) / analytic if traced else None,
               baseline.vector_flops_per_device / TERA if baseline else None]
        for strategy in strategies:
            case = next((c for c in cases if c.strategy == strategy), None)
            row.append(case.devices * case.gemm_flops_per_device / analytic
                       if case is not None and case.ok else None)
        rows.append(row)
    return headers, rows


def _dims_and_mesh(result: CaseResult):
    from models.opensora.config import get_config
    from models.opensora.theory import block_dims

    x, y = (int(part) for part in result.mesh.split("x"))
    return block_dims(get_config(result.config), result.shape), (x, y)


def theory_bytes_by_kind(result: CaseResult, depth: int) -> dict[str, float]:
    """The layout formula's per-device bytes of one block pair x depth plus the final layer's,
    by collective kind (``models.opensora.theory``: the layout the tracer traces)."""
    from models.opensora.config import get_config
    from models.opensora.theory import final_layer_collectives, layout_bytes_by_kind

    dims, mesh = _dims_and_mesh(result)
    sums = {kind: depth * volume
            for kind, volume in layout_bytes_by_kind(result.strategy, dims, mesh, official=True).items()}  # the sweep's path
    out_features = get_config(result.config).final_out_features
    for term in final_layer_collectives(result.strategy, dims, mesh, out_features):
        sums[term.kind] = sums.get(term.kind, 0.0) + term.bytes_per_device
    return sums


def theory_bytes_per_device(result: CaseResult, depth: int) -> float:
    """The layout formula's per-device bytes of one block pair x depth, all kinds."""
    return sum(theory_bytes_by_kind(result, depth).values())


def note_bytes_per_device(result: CaseResult, depth: int) -> float | None:
    """The reference notes' formula for the strategy (another layout, see docs/model.md), x depth;
    None where the notes have none (megatron_sp, none) or its split condition fails."""
    from hlo_trace.errors import UsageError
    from models.opensora.theory import NOTE_STRATEGIES, note_communication_per_device

    if result.strategy not in NOTE_STRATEGIES:
        return None
    dims, mesh = _dims_and_mesh(result)
    try:
        return depth * note_communication_per_device(result.strategy, dims, result.devices,
                                                     mesh if mesh[0] > 1 else None)
    except UsageError:  # the formula's own split condition fails (dp with B=2 on 16 devices)
        return None


def communication_table(results: list[CaseResult]) -> Table:
    """Per-device bytes by collective kind, traced next to the layout formula (ratio of the
    totals, and the largest per-kind deviation) and, labelled, the notes' formula."""
    from models.opensora.config import get_config

    headers = (["shape", "strategy", "mesh"] + [f"{kind} GB" for kind in COLLECTIVE_KINDS]
               + ["traced total GB", "layout kinds", "theory GB", "traced / theory",
                  "worst kind traced / theory", "notes' formula GB"])
    rows = []
    for result in results:
        if not result.ok:
            rows.append([result.shape, result.strategy, result.mesh]
                        + [None] * (len(headers) - 3))
            continue
        depth = get_config(result.config).depth
        by_kind = result.comm_bytes_by_kind()
        theory = theory_bytes_by_kind(result, depth)
        traced_total, theory_total = sum(by_kind.values()), sum(theory.values())
        kinds = sorted(set(theory) | {k for k, v in by_kind.items() if v})
        worst = max((by_kind.get(k, 0.0) / theory[k] if theory.get(k) else float("inf")
                     for k in kinds if by_kind.get(k, 0.0) or theory.get(k)), default=1.0,
                    key=lambda ratio: abs(ratio - 1.0))
        note = note_bytes_per_device(result, depth)
        rows.append([result.shape, result.strategy, result.mesh]
                    + [by_kind[kind] / GIGA for kind in COLLECTIVE_KINDS]
                    + [traced_total / GIGA, "+".join(STRATEGIES[result.strategy].kinds) or "-",
                       theory_total / GIGA,
                       traced_total / theory_total if theory_total else
                       (1.0 if not traced_total else None),
                       worst, None if note is None else note / GIGA])
    return headers, rows


def latency_table(results: list[CaseResult], steps: int) -> Table:
    headers = ["shape", "strategy", "mesh", f"latency s ({steps} steps)", "compute s", "comm s",
               "comm share %", "GEMM utilisation %", "GEMM time %", "vector time %",
               "flash-attention time %", "memory GB/device", "fits in chip memory", "error"]
    rows = []
    for result in results:
        if not result.ok:
            rows.append([result.shape, result.strategy, result.mesh] + [None] * 10 + [result.error])
            continue
        memory = result.memory
        latency = result.mapping_total(LATENCY)
        comm = result.mapping_total(COMM)
        share = result.block_mapping.time_share_by_type
        rows.append([result.shape, result.strategy, result.mesh, latency,
                     result.mapping_total(COMPUTE), comm, 100 * comm / latency,
                     100 * result.block_mapping.totals.gemm_utilization,
                     100 * share.get("GEMM", 0.0), 100 * share.get("Vector", 0.0),
                     100 * share.get("FlashAttention", 0.0), memory.total_bytes / GIGA,
                     _fits(memory.total_bytes, memory.capacity_bytes), ""])
    return headers, rows


def split_table(results: list[CaseResult], steps: int) -> Table:
    """The inference latency from the stage traces beside the one from one traced pair (stage 0
    of ``0-0,1-27``, ``analyze-hlo --pairs 28``): the time model charges every op to its pair,
    so the two agree (the one-pair figure lacks the final layer and the second stage's copy of
    the RoPE tables)."""
    headers = ["shape", "strategy", "mesh", f"stage traces s ({steps} steps)",
               f"one pair x pairs s ({steps} steps)", "difference %"]
    rows = []
    for result in results:
        if not result.ok or result.one_pair is None:
            continue
        staged = result.mapping_total(LATENCY)
        one = mapped_totals(result.one_pair).inference_latency_s
        rows.append([result.shape, result.strategy, result.mesh, staged, one, 100 * (one - staged) / staged])
    return headers, rows


def _fits(total_bytes: float, capacity_bytes: float | None) -> str | None:
    return None if capacity_bytes is None else ("yes" if total_bytes <= capacity_bytes else "NO")


def pipeline_table(pipelines: list[PipelineResult], steps: int) -> Table:
    """One row per pipeline case: its PipeFusion schedule (an analysis made before schedules
    were named was ``per-step``), latency, communication and memory per device (the device of
    the stage that holds the most; its parts beside the total)."""
    headers = ["shape", "pipeline", "stages", "chips/stage", "strategy in stage", "M", "schedule",
               f"latency s ({steps} steps)", "pipelined step s", "warm-up step s",
               "slowest stage per patch ms", "send per patch MB (stage 0)",
               "comm GB/device per step", "weights GB/device", "stale K/V GB/device",
               "peak live GB/device", "memory GB/device", "fits in chip memory", "error"]
    rows = []
    for result in pipelines:
        head = [result.shape, result.label, result.stages, result.chips, result.strategy,
                result.patches]
        if not result.ok:
            rows.append(head + [None] * 12 + [result.error])
            continue
        analysis, memory = result.report, result.largest_stage_memory
        totals, stages = analysis.totals, analysis.stages
        rows.append(head + [
            analysis.schedule, totals.inference_s, totals.step_s, totals.warmup_step_s,
            max(stage.patch_s for stage in stages) * 1e3,
            stages[0].transfer_patch_bytes / 1e6, totals.comm_bytes_per_device / GIGA,
            memory.weight_bytes / GIGA, memory.stale_kv_bytes / GIGA,
            memory.peak_live_bytes / GIGA, totals.memory_per_device_bytes / GIGA,
            _fits(totals.memory_per_device_bytes, memory.capacity_bytes), ""])
    return headers, rows


def block_ops_table(results: list[CaseResult], shape: str) -> Table:
    headers = ["strategy", "op", "type", "latency us", "utilisation %", "bound", "share of block %"]
    rows = []
    for result in results:
        if result.shape != shape or not result.ok:
            continue
        ops = result.block_mapping.ops
        block_s = sum(op.latency_s for op in ops)
        for op in ops:
            rows.append([result.strategy, op.name, op.type, op.latency_s * 1e6,
                         100 * op.utilization, op.bound, 100 * op.latency_s / block_s])
    return headers, rows


def block_ops_pivot(results: list[CaseResult], shape: str) -> Table:
    """The block-op table with one column per strategy: "latency us (utilisation %)"."""
    headers_long, rows_long = block_ops_table(results, shape)
    strategies = list(dict.fromkeys(row[0] for row in rows_long))
    cells: dict[tuple[str, str], str] = {}
    op_types: dict[str, str] = {}
    for strategy, op, op_type, latency_us, utilisation, _bound, _share in rows_long:
        cells[(op, strategy)] = f"{latency_us:.4g} ({utilisation:.3g}%)"
        op_types.setdefault(op, op_type)
    headers = ["op", "type"] + [f"{strategy} us (util)" for strategy in strategies]
    rows = [[op, op_type] + [cells.get((op, strategy)) for strategy in strategies]
            for op, op_type in op_types.items()]
    return headers, rows


def runs_table(results: list[CaseResult]) -> Table:
    headers = ["shape", "strategy", "mesh", "trace+write s (all stages)", "peak RSS GiB",
               "dump MiB", "error"]
    rows = []
    for result in results:
        if not result.ok:
            rows.append([result.shape, result.strategy, result.mesh, None, None, None, result.error])
            continue
        dump_bytes = sum(stage.statistics.mlir_bytes or 0 for stage in result.stages)
        rows.append([result.shape, result.strategy, result.mesh, result.trace_seconds,
                     result.peak_rss_bytes / 2**30, dump_bytes / 2**20, ""])
    return headers, rows


_KIND_TYPES = {"gemm": "GEMM", "vector": "Vector", "flash_attention": "FlashAttention",
               "collective": "Collective"}


@dataclass(frozen=True)
class PairOp:
    """One kernel of a block pair: its name, compute type, time, utilisation and bound."""

    name: str
    type: str
    latency_s: float
    utilization: float
    bound: str


@dataclass(frozen=True)
class PairView:
    """One block pair of an analysis (:func:`pair_view`)."""

    ops: tuple[PairOp, ...]
    time_share_by_type: dict[str, float]
    totals: MappingTotals
    chip: str
    hardware: str


def pair_view(analysis: JsonReport, pair: int = 0) -> PairView:
    """One block pair of an ``analyze-hlo --hw --format json`` report: its kernels (in program
    order, a kernel holding a labelled GEMM named ``<spatial|temporal> <label>``), the time share
    of each compute type over the pair's compute time, and the mapping's totals."""
    mapping = analysis.mapping
    assert mapping is not None
    labels = {}
    for block in analysis.block_labels:
        if block.index // 2 == pair:
            for label, positions in block.ops:
                labels.update({position: f"{block.kind} {label}" for position in positions})
    ops, seen = [], set()
    for kernel in mapping.kernels:
        if kernel.pair != pair:
            continue
        named = [labels[p] for p in kernel.hlo_positions if p in labels]
        name = "+".join(dict.fromkeys(named)) if named else kernel.name
        while name in seen:
            name += "'"
        seen.add(name)
        ops.append(PairOp(name, _KIND_TYPES[kernel.kind], kernel.latency_s, kernel.utilization,
                          kernel.bound))
    compute = [op for op in ops if op.type != "Collective"]
    compute_s = sum(op.latency_s for op in compute) or 1.0
    shares = {kind: sum(op.latency_s for op in compute if op.type == kind) / compute_s
              for kind in ("GEMM", "Vector", "FlashAttention")}
    return PairView(tuple(ops), shares, mapping.totals, mapping.chip, mapping.system)


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def plot_results(results: list[CaseResult], shape: str, out_dir: Path) -> list[Path]:
    """The per-op time share and utilisation of one block per strategy at ``shape`` (the
    reference's per-layer chart), and the latency of every strategy per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    at_shape = [r for r in results if r.shape == shape and r.ok]
    if at_shape:
        fig, axes = plt.subplots(len(at_shape), 1, figsize=(12, 3.2 * len(at_shape)), squeeze=False)
        colours = {"GEMM": "tab:blue", "Vector": "tab:orange", "FlashAttention": "tab:green"}
        for axis, result in zip(axes[:, 0], at_shape):
            ops = result.block_mapping.ops
            block_s = sum(op.latency_s for op in ops)
            names = [op.name for op in ops]
            axis.bar(names, [100 * op.latency_s / block_s for op in ops],
                     color=[colours.get(op.type, "tab:gray") for op in ops])
            axis.set_ylabel("time share %")
            axis.set_title(f"{shape} {result.strategy} ({result.mesh}): one block pair on "
                           f"{result.block_mapping.chip}")
            twin = axis.twinx()
            twin.plot(names, [100 * op.utilization for op in ops], "k.-", linewidth=0.8)
            twin.set_ylabel("utilisation %")
            axis.tick_params(axis="x", labelrotation=90, labelsize=7)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        fig.legend(handles, list(colours), loc="upper right")
        fig.tight_layout()
        written.append(_save(fig, out_dir / f"per_op_{shape}.png"))
        plt.close(fig)

    if at_shape:
        written.append(_plot_time_share(at_shape, shape, out_dir, plt))

    shapes = list(_by_shape(results))
    strategies = list(dict.fromkeys(r.strategy for r in results))
    fig, axis = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(strategies), 1)
    for index, strategy in enumerate(strategies):
        values = []
        for shape_name in shapes:
            case = next((r for r in results if r.shape == shape_name and r.strategy == strategy), None)
            values.append(case.mapping_total(LATENCY) if case and case.ok else 0.0)
        axis.bar([i + index * width for i in range(len(shapes))], values, width, label=strategy)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes)
    axis.set_yscale("log")
    axis.set_ylabel("inference latency, s (log)")
    axis.set_title("latency per strategy and shape (a missing bar: the case failed)")
    axis.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "latency.png"))
    plt.close(fig)
    return written


def _plot_time_share(cases: list[CaseResult], shape: str, out_dir: Path, plt) -> Path:
    """Stacked bars per strategy: the inference time spent in GEMM, vector and flash-attention
    ops and in communication."""
    fig, axis = plt.subplots(figsize=(8, 4.5))
    names = [f"{case.strategy}\n{case.mesh}" for case in cases]
    bottoms = [0.0] * len(cases)
    for kind in ("GEMM", "Vector", "FlashAttention", "communication"):
        values = []
        for case in cases:
            if kind == "communication":
                values.append(case.mapping_total(COMM))
            else:
                share = case.block_mapping.time_share_by_type.get(kind, 0.0)
                values.append(share * case.mapping_total(COMPUTE))
        axis.bar(names, values, bottom=bottoms, label=kind)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    axis.set_ylabel("inference latency, s")
    axis.set_title(f"{shape}: where the time goes on {cases[0].block_mapping.hardware}")
    return _finish(fig, axis, out_dir / f"time_share_{shape}.png", plt)


def plot_latency_memory(results: list[CaseResult], pipelines: list[PipelineResult], shape: str,
                        out_dir: Path) -> Path | None:
    """Inference latency against memory per device at ``shape``: every flat strategy and every
    pipeline configuration (one colour per configuration, its points labelled with M), with the
    chip's memory capacity as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flat = [r for r in results if r.shape == shape and r.ok]
    piped = [p for p in pipelines if p.shape == shape and p.ok]
    if not flat and not piped:
        return None
    fig, axis = plt.subplots(figsize=(9, 5.5))
    for result in flat:
        x, y = result.memory.total_bytes / GIGA, result.mapping_total(LATENCY)
        axis.scatter(x, y, marker="o", color="black")
        axis.annotate(f"{result.strategy} {result.mesh}", (x, y), fontsize=7,
                      xytext=(4, 2), textcoords="offset points")
    for label in dict.fromkeys(p.label for p in piped):
        series = sorted((p for p in piped if p.label == label), key=lambda p: p.patches)
        xs = [p.report.totals.memory_per_device_bytes / GIGA for p in series]
        ys = [p.report.totals.inference_s for p in series]
        line, = axis.plot(xs, ys, marker="s", linestyle="--", label=f"pipeline {label}")
        for point, x, y in zip(series, xs, ys):
            axis.annotate(f"M={point.patches}", (x, y), fontsize=7, color=line.get_color(),
                          xytext=(4, -8), textcoords="offset points")
    capacities = {r.memory.capacity_bytes for r in flat} | {
        p.largest_stage_memory.capacity_bytes for p in piped}
    largest = max([r.memory.total_bytes for r in flat] + [
        p.report.totals.memory_per_device_bytes for p in piped])
    for capacity in filter(None, capacities):
        if capacity <= CAPACITY_LINE_SPAN * largest:  # else the line would squash the points
            axis.axvline(capacity / GIGA, color="red", linewidth=0.8, linestyle=":",
                         label=f"chip memory {capacity / GIGA:.3g} GB")
        else:
            axis.plot([], [], " ", label=f"chip memory {capacity / GIGA:.3g} GB (off the chart)")
    axis.scatter([], [], marker="o", color="black", label="flat strategy (its mesh)")
    axis.set_yscale("log")
    axis.set_xlabel("memory per device, GB (weights + stale K/V + peak live activations)")
    axis.set_ylabel("inference latency, s (log)")
    axis.set_title(f"{shape}: latency against memory per device")
    return _finish(fig, axis, out_dir / f"latency_memory_{shape}.png", plt)


def _finish(fig, axis, path: Path, plt) -> Path:
    """Legend, layout, write the PNG and free the figure."""
    axis.legend(fontsize=8)
    fig.tight_layout()
    saved = _save(fig, path)
    plt.close(fig)
    return saved


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_png(fig, path, force=True)


# ---------------------------------------------------------------------------------------------


def write_results(results: list[CaseResult], run: dict[str, Any], out_dir: Path, *,
                  plots: bool = True, pipelines: list[PipelineResult] = ()) -> list[Path]:
    """Write every table as NAME.md and NAME.csv, summary.md with all of them, run.json, and the
    plots; returns the written paths.  Tables are regenerated on every run (force)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    detail_shape = "204_640_360" if any(r.shape == "204_640_360" for r in results) else results[0].shape
    tables = {
        "flops": ("Whole-model FLOPs of one denoising step (TFLOP)", flops_table(results)),
        "communication": ("Per-device communication of one denoising step, by collective (GB)",
                          communication_table(results)),
        "latency": (f"Latency on {run['hardware']}", latency_table(results, run["steps"])),
        "split": (f"Stage traces against one traced pair on {run['hardware']}",
                  split_table(results, run["steps"])),
        "pipelines": (f"Pipelines (PipeFusion) on {run['hardware']}",
                      pipeline_table(list(pipelines), run["steps"])),
        f"block_ops_{detail_shape}": (f"One block pair at {detail_shape}, per op",
                                      block_ops_table(results, detail_shape)),
        "runs": ("Trace runs", runs_table(results)),
    }
    if not pipelines:
        del tables["pipelines"]
    written = []
    summary = [f"# Strategy study\n\nMade by `{run['command']}`.\n"]
    for name, (title, table) in tables.items():
        # The per-op table is long (ops x strategies): markdown shows it one column per strategy.
        shown = block_ops_pivot(results, detail_shape) if name.startswith("block_ops") else table
        written.append(atomic_write(out_dir / f"{name}.md", f"# {title}\n\n" + to_markdown(shown),
                                    force=True))
        written.append(atomic_write(out_dir / f"{name}.csv", to_csv(table), force=True))
        summary.append(f"## {title}\n\n{to_markdown(shown)}")
    written.append(atomic_write(out_dir / "summary.md", "\n".join(summary), force=True))
    written.append(atomic_write(out_dir / "run.json", json.dumps(run, indent=2) + "\n", force=True))
    if plots:
        try:
            written += plot_results(results, detail_shape, out_dir / "plots")
            written += filter(None, [plot_latency_memory(results, list(pipelines), detail_shape,
                                                         out_dir / "plots")])
        except ImportError:
            import logging

            logging.getLogger(__name__).warning(
                "matplotlib is not installed: no plots (pip install -e '.[plot]')")
    return written
