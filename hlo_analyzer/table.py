"""Plain-text rendering: a Report with its ``--hw`` sections and the pipeline analysis, in aligned
columns with numbers in units. The one home of the text form (the data forms: ``Report.to_json``
and ``Report.to_csv``, the sections' ``hlo_analyzer.mapping.render``)."""

from __future__ import annotations

from typing import Any

from hardware import model_assumptions
from hardware.spec import tiled_model_constants
from hlo_analyzer.mapping.pipeline import PipelineAnalysis
from hlo_analyzer.mapping.render import HardwareSections, block_time_records, hardware_sections
from hlo_analyzer.mapping.results import NO_CROSS_ATTENTION
from hlo_analyzer.mapping.sections import BlocksSection, MappingSection, TransformerSection
from hlo_analyzer.memory import FROM_SIDECAR, MemorySection
from hlo_analyzer.report import Report
from hlo_analyzer.training import TrainingSplit


def si(value: float | None, unit: str) -> str:
    """``1.5e12, "FLOP"`` -> ``1.50 TFLOP``; decimal prefixes, as bandwidths and FLOP rates use."""
    if value is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g} {unit}"
    return f"{int(value)} {unit}"


def memory_size(value: float | None) -> str:
    """``17179869184`` -> ``16.00 GiB``: memory sizes in binary prefixes, as the chip files state
    a DRAM's capacity (docs/hardware.md, "Units")."""
    if value is None:
        return "-"
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {unit}"
    return f"{int(value)} B"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= factor:
            return f"{value / factor:.3f} {unit}"
    return f"{value / 1e-9:.1f} ns"


def render_columns(header: list[str], rows: list[list[str]], right_align: set[int]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[Any]) -> str:
        parts = [str(c).rjust(w) if i in right_align else str(c).ljust(w)
                 for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render_report_table(report: Report, by: str = "summary") -> str:
    """The summary (per category, totals, collectives by kind, blocks, mapping, unhandled ops),
    preceded by one row per op (``by="op"``) or per labelled block GEMM (``by="block"``)."""
    lines = [f"Analysis of {report.source}", *headline_lines(report), ""]
    if by == "kernel":
        lines += kernel_table_lines(report)
    elif by == "block":
        records = report.sections.records(by, report.rows, report.source)
        timed = hardware_sections(report).mapping is not None
        header = ["block", "kind", "label", "op", "shapes", "FLOPs",
                  *(["time", "kernel (#, name)"] if timed else []), "location"]
        rows = [[str(r["block"]), r["kind"], r["label"], r["op"], _shapes(r), si(r["flops"], "FLOP"),
                 *([seconds(r["kernel_latency_s"]), "-" if r["kernel"] is None else f"#{r['kernel']} {r['kernel_name'][:32]}"]
                   if timed else []),
                 r["location"][:48]] for r in records]
        if records:
            lines += render_columns(header, rows, {0, 5, 6} if timed else {0, 5})
        if timed and records:
            lines.append("(time: the kernel that runs the op; a kernel that runs several ops, e.g. "
                         "flash attention's two GEMMs or a GEMM with its epilogue, is listed "
                         "under each)")
            lines.append("")
        if timed:
            lines += block_time_lines(hardware_sections(report)) + [""]
    elif by == "op":
        header = ["#", "op", "category", "shapes", "dtype", "FLOPs", "comm B/device", "group",
                  "runs", "location"]
        rows = []
        for index, row in enumerate(report.rows):
            rows.append([
                str(index), row.op, row.category, _shapes(row._asdict()), row.dtype,
                si(row.flops, "FLOP") if row.flops else "",
                si(row.comm_bytes_per_device, "B") if row.category == "comm" else "",
                str(row.group_size) if row.group_size else "",
                str(row.count),
                row.location[:48],
            ])
        lines += render_columns(header, rows, {0, 5, 6, 7, 8})
        lines.append("")
    header = ["category", "ops", "FLOPs", "comm bytes/device"]
    rows = [[c["category"], str(c["ops"]), si(c["flops"], "FLOP"),
             si(c["comm_bytes_per_device"], "B")] for c in report.by_category()]
    lines += render_columns(header, rows, {1, 2, 3})
    totals = report.totals()
    lines += [""] + [f"Note: {note}" for note in report.notes]
    lines += [
        "Totals for the whole program (all devices):" if report.program == "global"
        else "Totals per device:",
        f"  GEMM FLOPs            {totals['gemm_flops']:>20,}  ({si(totals['gemm_flops'], 'FLOP')})",
        f"  vector FLOPs          {totals['vector_flops']:>20,}  "
        f"({si(totals['vector_flops'], 'FLOP')})",
        f"  comm bytes sent       {totals['comm_bytes_per_device']:>20,.0f}  "
        f"({si(totals['comm_bytes_per_device'], 'B')}) in {totals['comm_ops']} collectives",
    ]
    if totals["comm_latency_s"] is not None:
        lines.append(f"  comm latency          {seconds(totals['comm_latency_s']):>20}")
    for kind, entry in report.comm_by_kind.items():
        lines.append(f"    {kind:<20}{int(entry['count']):>6} ops  {si(entry['bytes_per_device'], 'B')}")
    if "mesh" in totals:
        mesh = totals["mesh"]
        lines.append(
            f"Whole mesh ({mesh['devices']} devices): {si(mesh['gemm_flops'], 'FLOP')} GEMM, "
            f"{si(mesh['vector_flops'], 'FLOP')} vector, {si(mesh['comm_bytes'], 'B')} sent"
        )
    lines += _control_lines(report)
    lines += sections_lines(hardware_sections(report))
    if report.memory is not None:
        lines += _memory_lines(report.memory, training=report.training is not None)
    if report.training is not None:
        lines += _training_lines(report.training)
    if report.unhandled:
        listed = ", ".join(f"{name} x{count}" for name, count in report.unhandled.items())
        lines.append(f"Unhandled ops (not measured): {listed}")
    else:
        lines.append("Unhandled ops: none")
    if by == "summary":
        lines.append("(one row per op: --by op)")
    return "\n".join(lines) + "\n"


#: Kernel groups the headline lists (``--by kernel`` lists every kernel).
HEADLINE_KERNELS = 5


def headline_lines(report: Report) -> list[str]:
    """How long, and where: the total time and its split by kind, the memory verdict and the
    heaviest kernels (with ``--hw``); without a chip, the work and the traffic."""
    totals = report.totals()
    scope = "the whole program" if report.program == "global" else "per device"
    work = (f"  work ({scope}): {si(totals['gemm_flops'], 'FLOP')} GEMM, {si(totals['vector_flops'], 'FLOP')} "
            f"vector, {si(totals['comm_bytes_per_device'], 'B')} sent in {totals['comm_ops']} collectives")
    mapping = hardware_sections(report).mapping
    if mapping is None:
        return ["", work + " (times: --hw CHIP)"]
    step = mapping.totals
    where = ", ".join(f"{kind} {value / step.step_latency_s:.0%}" for kind, value in step.seconds_by_kind
                      if value > 0 and step.step_latency_s > 0)
    lines = ["", f"  {seconds(step.inference_latency_s)} on {mapping.system.system.name} "
                 f"({mapping.options.execution}), {step.total_text}",
             f"  one step {seconds(step.step_latency_s)}: {where or 'no work'}", work]
    memory = None if report.memory is None else report.memory.usage
    if memory is not None and memory.capacity_bytes is not None:
        verdict = "EXCEEDS the chip's memory" if memory.exceeds_capacity else "fits"
        lines.append(f"  memory per device {memory_size(memory.total_bytes)} of "
                     f"{memory_size(memory.capacity_bytes)}: {verdict}")
    heaviest = mapping.heaviest(HEADLINE_KERNELS)
    if heaviest:
        rows = [[g.name[:40], g.kind, g.shapes[:48], str(g.kernels), seconds(g.seconds),
                 f"{g.seconds / step.step_latency_s:.0%}" if step.step_latency_s > 0 else "-", g.bound]
                for g in heaviest]
        lines += [f"  where one step goes, the {len(heaviest)} heaviest of {len(mapping.program.ops)} kernels "
                  "(same name and shapes together; all of them: --by kernel):"]
        lines += ["    " + line for line in render_columns(["kernel", "kind", "shapes", "count", "time",
                                                            "share", "bound"], rows, {3, 4, 5})]
    return lines


def _control_lines(report: Report) -> list[str]:
    """Loops (trip count or "unknown"), conditionals (branch costs, the one counted) and
    custom_call targets (their work is not counted)."""
    lines = []
    for loop in report.loops:
        trip = "unknown (body counted once)" if loop.trip_count is None else \
            f"{loop.trip_count} ({loop.source})"
        lines.append(f"  while #{loop.position} at {loop.location or '?'}: trip count {trip}, "
                     f"reached {loop.executions}x")
    for conditional in report.conditionals:
        branches = ", ".join(f"{i}: {si(f, 'FLOP')}" for i, f in enumerate(conditional.branch_flops))
        lines.append(f"  {conditional.op} #{conditional.position} at {conditional.location or '?'}: "
                     f"branches {branches}; counted {conditional.taken}")
    if report.custom_calls:
        lines.append("  custom_call targets (work not counted): " + ", ".join(
            f"{target} x{count}" for target, count in report.custom_calls.items()))
    return ["Control flow and opaque calls:"] + lines if lines else []


def _shapes(record: dict[str, Any]) -> str:
    operands = ",".join("x".join(map(str, s)) or "()" for s in record["operand_shapes"])
    results = ",".join("x".join(map(str, s)) or "()" for s in record["result_shapes"])
    return f"{operands}->{results}"


def model_lines(model: dict[str, Any]) -> list[str]:
    """Which execution model, efficiencies and collective algorithm the figures below used."""
    execution = model["execution"]
    eff = model["efficiencies"]
    if eff.get("gemm_model") == "tiled_gemm":
        fidelity = ", ".join(f"{dtype} {value}" for dtype, value in eff["math_fidelity"].items())
        execution += (f" (GEMMs predicted by the tiled GEMM model at math fidelity {fidelity}, "
                      f"{eff['fidelity_chosen_by']}; dispatched from a trace, {seconds(eff['dispatch_trace_s'])} "
                      "per op; other ops at the tile mappers' bound)")
    elif eff:
        flash = ", ".join(f"{dim}:{value:.2f}" for dim, value in eff["flash_efficiency_by_head_dim"].items())
        execution += (f" (per-kernel overhead {seconds(eff['kernel_overhead_s'])}, GEMM mma efficiency "
                      f"{eff['gemm_mma_efficiency']:.2f} + {eff['gemm_k_overhead_elements']} K steps per tile, "
                      f"HBM {eff['hbm_efficiency']:.2f} of peak, flash attention by kernel head dim {flash}"
                      + (f" over s_kv / (s_kv + {eff['flash_kv_overhead']}) keys" if eff.get("flash_kv_overhead") else "")
                      + (", kernel classes " + ", ".join(f"{name} {value:.2f}" for name, value in eff["vector_efficiency"].items())
                         if eff.get("vector_efficiency") else "") + ")")
    network = f"{model['collective_algorithm']} on {model['topology']}"
    if model["transfers_through_dram"]:
        network += ", transfers staged through DRAM"
    nccl = model.get("nccl_table")
    if nccl:
        kinds = ", ".join(kind.replace("_", "-") for kind in nccl["kinds"])
        network += f"; {kinds} from the NCCL table {nccl['name']}"
        if nccl.get("assumption"):
            network += f" ({nccl['assumption']})"
    return [f"  model: {execution}", f"  collectives: {network}"]


def _memory_lines(section: MemorySection, *, training: bool = False) -> list[str]:
    """The memory section; in a training step the resident arguments are the parameters and the
    optimizer states (master weights, moments), split in the training section that follows."""
    memory = section.usage
    told_apart = memory.weights_source == FROM_SIDECAR
    source = ("stage inputs told apart by the sidecar" if told_apart
              else "no sidecar: every argument counted as a weight")
    resident = "weights (resident)    "
    if training and told_apart:
        resident, source = "P + OS (resident)     ", source + "; P and OS split below"
    elif training:
        resident = "arguments (resident)  "
        source = "no inputs in the sidecar: P, OS and stage inputs, split below"
    lines = ["", "Memory per device:",
             f"  {resident}{memory_size(memory.weight_bytes):>12}  "
             f"in {memory.weight_arguments} arguments ({source})",
             f"  stage inputs          {memory_size(memory.input_bytes):>12}  "
             f"in {memory.input_arguments} arguments (part of the live activations)",
             f"  peak live activations {memory_size(memory.peak_live_bytes):>12}  "
             f"at op {memory.peak_position} ({memory.peak_op.split('.', 1)[-1]})"]
    if memory.stale_kv_bytes:
        lines.append(f"  stale K/V buffers     {memory_size(memory.stale_kv_bytes):>12}")
    lines.append(f"  total                 {memory_size(memory.total_bytes):>12}")
    if memory.capacity_bytes is not None:
        verdict = "EXCEEDS the chip's memory" if memory.exceeds_capacity else "fits"
        lines.append(f"  capacity              {memory_size(memory.capacity_bytes):>12}  {verdict}")
    return lines


def _training_lines(training: TrainingSplit) -> list[str]:
    """The training step's memory by class and its traffic by phase and kind."""
    memory = training.memory
    lines = ["", "Training step, memory per device (hlo_analyzer.training):"]
    for key, label in (("param", "parameters (P)"), ("grad", "gradients (G)"),
                       ("optimizer_state", "optimizer states (OS)"),
                       ("activation", "activations kept for the backward (Act)"),
                       ("input", "stage inputs")):
        lines.append(f"  {label:<40} {memory_size(memory[key]):>12}")
    lines.append("Training step, collectives per device by phase, traffic and kind:")
    for (phase, traffic, kind), (count, volume) in sorted(training.comm.items()):
        lines.append(f"  {phase:<9} {traffic:<10} {kind:<18} x{count:<5} {si(volume, 'B'):>12}")
    return lines


def render_pipeline_table(analysis: PipelineAnalysis) -> str:
    """The ``analyze-pipeline`` report as text."""
    step, plan = analysis.step, analysis.plan
    lines = [f"Pipeline {plan.path} on {analysis.hardware}: "
             f"{len(analysis.stages)} stages, M = {plan.patches} patches, "
             f"{step.schedule} schedule", ""]
    header = ["stage", "strategy", "chips", "pairs", "compute", "collectives", "stage/patch",
              "send/patch", "transfer/patch", "memory/device"]
    rows = []
    for stage in analysis.stages:
        memory = stage.memory
        flag = " !" if memory.exceeds_capacity else ""
        rows.append([str(stage.stage), stage.strategy,
                     ",".join(map(str, stage.devices)), str(stage.block_pairs),
                     seconds(stage.compute_s), seconds(stage.comm_s),
                     seconds(stage.patch_s), si(stage.transfer_patch_bytes, "B"),
                     seconds(stage.transfer_patch_s), memory_size(memory.total_bytes) + flag])
    lines += render_columns(header, rows, {3, 4, 5, 6, 7, 8, 9})
    totals = analysis.totals
    overlapped = ("steps overlap: max(loop, M x slowest)" if step.schedule == "overlapped"
                  else "empty pipeline each step: loop + (M - 1) x slowest")
    pipelined = step.steps - min(step.warmup_steps, step.steps)
    summary = [
        ("return to stage 0 per patch (latent)",
         f"{seconds(step.return_patch_s)}  ({si(analysis.return_patch_bytes, 'B')})"),
        (f"pipelined step ({overlapped})", seconds(totals.step_s)),
        ("warm-up step (unpipelined, full latent)", seconds(totals.warmup_step_s)),
        (f"inference ({step.warmup_steps} warm-up + {pipelined} pipelined steps, "
         f"{step.schedule})", seconds(totals.inference_s)),
        ("memory per device (largest stage)", memory_size(totals.memory_per_device_bytes)),
    ]
    width = max(len(label) for label, _ in summary)
    lines += [""] + [f"  {label:<{width}}  {value}" for label, value in summary]
    if any(stage.memory.exceeds_capacity for stage in analysis.stages):
        lines.append("  ! a stage's memory exceeds the chip's DRAM capacity")
    return "\n".join(lines) + "\n"


# -- the --hw sections ------------------------------------------------------------------------------------
def kernel_table_lines(report: Report) -> list[str]:
    header = ["#", "pair", "kernel", "kind", "shapes", "latency", "util", "bound"]
    rows = [[str(r["position"]), "-" if r["pair"] is None else str(r["pair"]), r["name"][:40], r["kind"],
             r["shapes"][:48], seconds(r["latency_s"]), f"{r['utilization']:.1%}", r["bound"]]
            for r in report.sections.records("kernel", report.rows, report.source)]
    return render_columns(header, rows, {0, 1, 5, 6})


def block_time_lines(sections: HardwareSections) -> list[str]:
    """Time per block: every kernel charged to one block or to the work outside the blocks."""
    records = block_time_records(sections)
    kinds = list(dict.fromkeys(kind for r in records for kind in r["seconds_by_kind"]))
    header = ["block", "kind", "kernels", "matrix FLOPs", "time", *kinds]
    rows = [["outside" if r["block"] is None else str(r["block"]), r["kind"], str(r["kernels"]),
             si(r["matrix_flops"], "FLOP"), seconds(r["latency_s"]),
             *[seconds(r["seconds_by_kind"].get(kind, 0.0)) for kind in kinds]] for r in records]
    found = [r for r in records if r["block"] is not None]
    title = (f"Time per block ({len(found)} blocks; outside: the work before and after them):"
             if found else "Time per block: no blocks found (no attention + MLP); the whole program:")
    return [title] + render_columns(header, rows, set(range(2, len(header))))


def transformer_lines(transformer: TransformerSection) -> list[str]:
    kinds = list(dict.fromkeys(block.kind for block in transformer.blocks))
    lines = ["", f"Transformer blocks found: {len(transformer.blocks)} ({'; '.join(kinds)}); "
                 "shapes per device" + ("" if transformer.consistent else " (they differ: the first block's)")
             + ":", "  " + "  ".join(f"{key}={value}" for key, value in transformer.shapes[0])]
    return lines


def blocks_lines(blocks: BlocksSection) -> list[str]:
    lines = ["", f"STDiT3 block pairs found: {blocks.pairs} (spatial + temporal); "
                 "per-block shape dictionary (per device):"]
    items = [f"{key}={value}" for key, value in blocks.shapes.as_dict().items()]
    lines += ["  " + "  ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
    if not blocks.consistent:
        lines.append("  note: the pairs differ; the dictionary is the first pair's")
    return lines


def _cross_attention_text(mapping: MappingSection) -> str:
    program, options = mapping.program, mapping.options
    if program.cross_attention == "per-sample":
        return (f"per-sample ({options.caption_tokens} caption tokens per sample; "
                f"{program.per_sample_attentions} attention kernel(s) charged per sample)")
    if options.cross_attention == "per-sample":
        return ("all traced keys (per-sample asked, but the caption length is unknown: no "
                "caption length in a sidecar, no --caption-tokens)")
    return "all traced keys"


def mapping_lines(mapping: MappingSection) -> list[str]:
    totals = mapping.totals
    lines = ["", f"Mapping on {mapping.system.system.name}: {mapping.system.assumption}",
             f"  execution: {mapping.options.execution}; DRAM efficiency {mapping.options.dram_efficiency:g}, "
             f"{mapping.options.exp_ops} vector op(s) per exp; {len(mapping.program.ops)} kernels, "
             f"{mapping.program.distinct_mappings} distinct",
             f"  one step (this program, one device)  {seconds(totals.step_latency_s)}"]
    if mapping.program.cross_attention != NO_CROSS_ATTENTION:
        lines.insert(3, f"  cross-attention: {_cross_attention_text(mapping)}")
    lines[2:2] = model_lines(model_assumptions(mapping.system.system).as_dict())
    lines += [f"    {kind:<16}{seconds(value):>14}" for kind, value in totals.seconds_by_kind]
    lines.append(f"  GEMM utilisation (matrix FLOPs at peak / compute time)  {totals.gemm_utilization:.1%}")
    if totals.pairs_found:
        header = ["pair", "kernels", "latency", *[kind for kind, _ in totals.seconds_by_kind]]
        rows = collapsed_pair_rows([(g.pair, [str(g.kernels), seconds(g.latency_s), *[
            seconds(dict(g.seconds_by_kind).get(kind, 0.0)) for kind, _ in totals.seconds_by_kind]])
            for g in mapping.pairs])
        lines += ["  by block pair (traced ops):"] + ["    " + line for line in
                                                     render_columns(header, rows, set(range(1, len(header))))]
    elif mapping.blocks:
        header = ["block", "kernels", "latency", *[kind for kind, _ in totals.seconds_by_kind]]
        rows = collapsed_pair_rows([(g.pair, [str(g.kernels), seconds(g.latency_s), *[
            seconds(dict(g.seconds_by_kind).get(kind, 0.0)) for kind, _ in totals.seconds_by_kind]])
            for g in mapping.blocks])
        lines += ["  by block (traced ops):"] + ["    " + line for line in
                                               render_columns(header, rows, set(range(1, len(header))))]
    if mapping.classes:
        header = ["class", "kernels", "time", "bound", "time/bound", "constants from"]
        rows = [[c.name, str(c.kernels), seconds(c.seconds), seconds(c.bound_seconds), f"{c.ratio:.2f}",
                 c.provenance.split(";", 1)[0] or "-"] for c in mapping.classes]
        lines += ["  by kernel class (bound: FLOPs at peak or DRAM bytes at the datasheet bandwidth, "
                  "the longer; constants from: the chip file's provenance, whole in the JSON):"] + \
            ["    " + line for line in render_columns(header, rows, {1, 2, 3, 4})]
        lines += _tiled_constant_lines(mapping.system.system.chip)
    if mapping.reference is not None:
        lines.append(f"  reference: one pair rebuilt from the ideal shape dictionary {seconds(mapping.reference.latency_s)} "
                     "(comparison only)")
    lines += [f"  total, {totals.total_text}:  {seconds(totals.inference_latency_s)} "
              f"(communication {seconds(totals.inference_comm_s)})"]
    return lines


def _tiled_constant_lines(chip: Any) -> list[str]:
    """Each constant of a chip's tiled GEMM model with its source (none without the model)."""
    if chip.tiled_model is None:
        return []
    rows = [[key, _constant_text(value), source or "-"] for key, value, source in tiled_model_constants(chip.tiled_model)]
    return [f"  tiled GEMM model of {chip.name} ([tiled_model]; hardware/tiled_gemm.py, docs/tiled.md):"] + \
        ["    " + line for line in render_columns(["constant", "value", "source"], rows, set())]


def _constant_text(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def collapsed_pair_rows(rows: list[tuple[int | None, list[str]]]) -> list[list[str]]:
    """The by-pair table's rows, ``(pair or None for outside the pairs, cells)``, with each run
    of consecutive pairs whose cells print the same as one row labelled ``0-27 (x28)`` (the
    JSON keeps every pair)."""
    runs: list[tuple[int | None, int | None, list[str]]] = []
    for pair, cells in rows:
        if runs and pair is not None and runs[-1][1] is not None and runs[-1][1] + 1 == pair \
                and runs[-1][2] == cells:
            runs[-1] = (runs[-1][0], pair, cells)
        else:
            runs.append((pair, pair, cells))
    return [["outside" if first is None else str(first) if first == last
             else f"{first}-{last} (x{last - first + 1})", *cells]
            for first, last, cells in runs]


def sections_lines(sections: HardwareSections) -> list[str]:
    lines: list[str] = []
    if sections.blocks is not None:
        lines += blocks_lines(sections.blocks)
    if sections.transformer is not None:
        lines += transformer_lines(sections.transformer)
    if sections.mapping is not None:
        lines += mapping_lines(sections.mapping)
    return lines
