"""The page of one analysis: ``analyze-hlo DUMP [--hw H] --format json`` and, optionally, its
``--timeline`` trace.

Summary (FLOPs, collectives, memory, and with ``--hw`` the system and the latencies), then the
figures (time by kernel class against its first-principles bound, time by kind per block pair,
the timeline) and the sortable tables (collectives by kind, per op, per kernel, per block).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from hlo_report.document import Document
from hlo_report.figures import bars, timeline
from hlo_report.page import Download, Fact, Figure, Item, Page, Section, Table, Text, columns

WHAT = "analyze-hlo DUMP --format json output"
TIMELINE_WHAT = "analyze-hlo --timeline output (Chrome trace-event JSON)"

#: Rows of the per-op and per-kernel tables at most: the ops of most FLOPs and the slowest
#: kernels (a full-size stage has tens of thousands; the JSON keeps every one).
MAX_ROWS = 2000


def analysis_page(report: Document, trace: Document | None = None,
                  trace_name: str = "timeline.json") -> Page:
    sections = [Section("Summary", tuple(_summary(report)))]
    mapping = report.child("mapping", optional=True)
    if mapping is not None:
        sections.append(Section(f"On {mapping.text('hardware')}", tuple(_mapping_summary(mapping))))
        sections.append(Section("Where the time goes", tuple(_mapping_figures(mapping))))
    if trace is not None:
        sections.append(Section("Timeline", (
            timeline("timeline", "Kernels on the chip's units", trace,
                     note="One bar per kernel and unit; hover for its name, start and duration. "
                          "Drag to zoom, double-click to zoom out."),
            Text("For a closer look, save the trace below and open it in Perfetto "
                 "(ui.perfetto.dev: 'Open trace file') or chrome://tracing."),
            Download("timeline", f"Save the trace ({trace_name})", trace_name,
                     json.dumps(trace.data)))))
    sections.append(Section("Tables", tuple(_tables(report, mapping))))
    sources = (report.origin,) + ((trace.origin,) if trace is not None else ())
    return Page(f"Analysis of {report.text('source')}", "analysis", sources, tuple(sections))


def _summary(report: Document) -> Iterator[Item]:
    yield Fact("program", "program", report.text("program"))
    transformer = report.child("transformer", optional=True)
    if transformer is not None:
        kinds = sorted({block.text("kind") for block in transformer.children("labels")})
        yield Fact("transformer_blocks", "transformer blocks found", transformer.number("blocks"))
        yield Fact("block_kind", "block kind", ", ".join(kinds))
    totals = report.child("totals")
    yield Fact("devices", "devices (mesh)", totals.number("mesh.devices"))
    for key, label in (("gemm_flops", "GEMM FLOPs per device"),
                       ("vector_flops", "vector FLOPs per device"),
                       ("total_flops", "FLOPs per device")):
        yield Fact(key, label, totals.number(key))
    yield Fact("comm_ops", "collectives", totals.number("comm_ops"))
    yield Fact("comm_bytes_per_device", "bytes sent per device", totals.number("comm_bytes_per_device"), "B")
    if totals.has("comm_latency_s"):
        yield Fact("comm_latency_s", "collectives' latency", totals.number("comm_latency_s"), "s")
    memory = report.child("memory")
    for key, label in (("weight_bytes", "weights per device"),
                       ("peak_live_bytes", "peak live activations"),
                       ("total_bytes", "memory per device")):
        yield Fact(key, label, memory.number(key), "B")
    if memory.has("capacity_bytes"):
        yield Fact("capacity_bytes", "chip memory", memory.number("capacity_bytes"), "B")
        yield Fact("fits", "fits in chip memory", not memory.flag("exceeds_capacity"))


def _mapping_summary(mapping: Document) -> Iterator[Item]:
    yield Text(mapping.text("system.assumed") or "")
    yield Fact("execution", "execution", mapping.text("execution"))
    totals = mapping.child("totals")
    yield Fact("step_latency_s", "one run of the program", totals.number("step_latency_s"), "s")
    yield Fact("inference_latency_s", "total", totals.number("inference_latency_s"), "s")
    yield Fact("total_basis", "total of", totals.text("total"))
    yield Fact("gemm_utilization", "GEMM utilisation", _percent(totals.number("gemm_utilization")), "%")
    for kind, seconds in totals.numbers("seconds_by_kind").items():
        yield Fact(f"seconds_{kind}", f"{kind} time per run", seconds, "s")
    nccl = mapping.child("model.nccl_table", optional=True)
    if nccl is not None and nccl.text("assumption", optional=True):
        yield Text(f"Collectives: {nccl.text('assumption')}.")


def _mapping_figures(mapping: Document) -> Iterator[Figure]:
    classes = [c for c in mapping.children("classes") if c.text("class") not in UNBOUNDED_CLASSES]
    if classes:
        yield bars("classes", "Time by kernel class against its bound",
                   [kernel_class.text("class") for kernel_class in classes],
                   {"modelled time": [c.number("seconds") for c in classes],
                    "bound (FLOPs at peak or bytes at datasheet bandwidth)":
                        [c.number("bound_seconds") for c in classes]},
                   y_title="seconds per run (log)", log=True, foot_below=True,
                   note="The bound is the class's first-principles time; the model's time "
                        "over it is what the class loses to tiling, bandwidth efficiency and "
                        "launch overhead. Collectives are left out: their time is their own "
                        "bound (the network model).")
    groups, unit = _groups(mapping)
    if groups:
        kinds = sorted({kind for group in groups for kind in group.numbers("seconds_by_kind")})
        yield bars(f"{unit}s", f"Time by kind per {_UNIT_TITLE[unit]}",
                   [_group_name(group, unit) for group in groups],
                   {kind: [group.numbers("seconds_by_kind").get(kind, 0.0) for group in groups]
                    for kind in kinds},
                   y_title="seconds per run", stacked=True)


#: Kernel classes whose bound is their modelled time (no first-principles bound apart).
UNBOUNDED_CLASSES = ("collective",)
_UNIT_TITLE = {"pair": "block pair", "block": "block"}


def _groups(mapping: Document) -> tuple[list[Document], str]:
    """The kernels' groups the text report shows: STDiT3's block pairs when the dump is a
    stage, else the transformer blocks (``block``) when it has some, else the one group of the
    whole program (``pair`` None)."""
    blocks = list(mapping.children("blocks"))
    if blocks and not mapping.number("totals.pairs_found", optional=True):
        return blocks, "block"
    return list(mapping.children("pairs")), "pair"


def _group_name(group: Document, unit: str) -> str:
    number = group.number(unit, optional=True)
    return f"outside the {unit}s" if number is None else f"{unit} {number}"


def _percent(fraction: int | float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def _tables(report: Document, mapping: Document | None) -> Iterator[Table]:
    kinds = report.child("comm_by_kind")
    yield Table("collectives", "Collectives by kind", columns("kind", "count", "bytes per device", text=("kind",)),
                tuple((kind, kinds.number(f"{kind}.count"), kinds.number(f"{kind}.bytes_per_device"))
                      for kind in kinds.data))
    yield Table("categories", "By category", columns("category", "ops", "FLOPs", "bytes per device", text=("category",)),
                tuple((row.text("category"), row.number("ops"), row.number("flops"),
                       row.number("comm_bytes_per_device")) for row in report.children("by_category")))
    ops = list(report.children("ops"))
    shown_ops = sorted(ops, key=lambda op: -(op.number("flops") or 0))[:MAX_ROWS]
    yield Table("ops", "Per op", columns("position", "op", "category", "shapes", "dtype", "count", "FLOPs",
                                         "bytes per device", "group", "location",
                                         text=("op", "category", "shapes", "dtype", "location")),
                tuple((op.number("position"), op.text("op"), op.text("category"), _shapes(op),
                       op.text("dtype"), op.number("count"), op.number("flops"),
                       op.number("comm_bytes_per_device"), op.number("group_size"),
                       op.text("location")) for op in shown_ops),
                note=_cap_note(len(ops), "ops", "FLOPs"))
    if mapping is None:
        return
    kernels = list(mapping.children("kernels"))
    shown_kernels = sorted(kernels, key=lambda kernel: -(kernel.number("latency_s") or 0))[:MAX_ROWS]
    groups, unit = _groups(mapping)
    yield Table("kernels", "Per kernel", columns("position", "kernel", "kind", unit, "shapes", "FLOPs",
                                                 "latency s", "bound", "utilisation %", "compute s",
                                                 "DRAM s", "NoC s",
                                                 text=("kernel", "kind", "shapes", "bound")),
                tuple((kernel.number("position"), kernel.text("name"), kernel.text("kind"),
                       kernel.number(unit, optional=True), kernel.text("shapes"),
                       kernel.number("flops"), kernel.number("latency_s"), kernel.text("bound"),
                       _percent(kernel.number("utilization")), kernel.number("compute_s"),
                       kernel.number("dram_s"), kernel.number("noc_s")) for kernel in shown_kernels),
                note=_cap_note(len(kernels), "kernels", "latency"))
    yield Table("pairs" if unit == "pair" else "block_times", f"Per {_UNIT_TITLE[unit]}",
                columns(unit, "kernels", "latency s", text=(unit,)),
                tuple((_group_name(group, unit), group.number("kernels"), group.number("latency_s"))
                      for group in groups))
    blocks = report.child("blocks", optional=True) or report.child("transformer", optional=True)
    if blocks is not None:
        yield _block_table(blocks, ops, kernels)


def _block_table(blocks: Document, ops: list[Document], kernels: list[Document]) -> Table:
    """The labelled GEMMs of each block (``--by block``): their FLOPs and the time of the
    kernels that run them."""
    flops = {int(op.number("position")): op.number("flops") for op in ops}
    kernel_of: dict[int, tuple[int | float, int | float]] = {}  # op -> (kernel, its time)
    for kernel in kernels:
        for position in kernel.counts("hlo_positions"):
            kernel_of[position] = (kernel.number("position"), kernel.number("latency_s"))
    rows = []
    for block in blocks.children("labels"):
        labels = block.child("ops")
        for label in labels.data:
            positions = labels.counts(label)
            running = {kernel_of[p] for p in positions if p in kernel_of}
            rows.append((block.number("index"), block.text("kind"), label, len(positions),
                         sum(flops.get(p, 0) for p in positions),
                         sum(time for _, time in running) if running else None))
    return Table("blocks", "Per block: the labelled GEMMs",
                 columns("block", "kind", "GEMM", "ops", "FLOPs", "kernel time s", text=("kind", "GEMM")),
                 tuple(rows), note="The kernel time is that of the kernels that run the GEMM "
                                   "(a fused kernel counts once).")


def _shapes(op: Document) -> str:
    operands = ",".join("x".join(map(str, shape)) for shape in op.shapes("operand_shapes"))
    results = ",".join("x".join(map(str, shape)) for shape in op.shapes("result_shapes"))
    return f"{operands}->{results}"


def _cap_note(total: int, what: str, by: str) -> str:
    if total <= MAX_ROWS:
        return ""
    return f"The {MAX_ROWS:,} {what} of most {by} of {total:,}; the JSON lists every one."
