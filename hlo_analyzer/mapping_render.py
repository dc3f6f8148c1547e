"""Rendering of the ``--hw`` sections: JSON-ready dicts, table lines and CSV records."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hlo_analyzer.sections import BlocksSection, HardwareSections, MappingSection
from hlo_analyzer.table import model_lines, render_columns, seconds
from hlo_trace.errors import UsageError

if TYPE_CHECKING:
    from hlo_analyzer.report import Report



# -- JSON -------------------------------------------------------------------------------------------
def blocks_dict(blocks: BlocksSection) -> dict[str, Any]:
    return {
        "shapes": blocks.shapes.as_dict(),
        "pairs": blocks.pairs,
        "consistent": blocks.consistent,
        "labels": [{"index": b.index, "kind": b.kind, "ops": {label: list(p) for label, p in b.ops}}
                   for b in blocks.blocks],
    }


def kernel_records(mapping: MappingSection) -> list[dict[str, Any]]:
    return [{"position": op.position, "pair": pair, "name": op.name, "kind": op.kind, "shapes": op.shapes,
             "latency_s": op.latency_s, "utilization": op.utilization, "bound": op.bound,
             "compute_s": op.compute_s, "dram_s": op.dram_s, "noc_s": op.noc_s, "flops": op.flops,
             "hlo_positions": list(op.positions)}
            for op, pair in zip(mapping.program.ops, mapping.pair_of)]


def _system_dict(mapping: MappingSection) -> dict[str, Any]:
    system = mapping.system.system
    return {"name": system.name, "chip": system.chip.name, "chips": system.chip_count,
            "dump_devices": mapping.system.devices, "topology": system.topology,
            "grid": f"{system.topology_rows}x{system.topology_cols}",
            # a single chip has no network: infinite bandwidth, written as null (JSON has no inf)
            "link_bandwidth_bytes_per_s": (None if math.isinf(system.link_bandwidth_bytes_per_s)
                                           else system.link_bandwidth_bytes_per_s),
            "hop_latency_s": system.hop_latency_s, "assumed": mapping.system.assumption}


def _reference_dict(mapping: MappingSection) -> dict[str, Any] | None:
    reference = mapping.reference
    if reference is None:
        return None
    return {"label": "one pair rebuilt from the ideal shape dictionary (comparison only; totals come "
                     "from the traced ops)",
            "pair_latency_s": reference.latency_s,
            "ops": [{"name": m.op_name, "type": m.op_type, "latency_s": m.latency_s,
                     "utilization": m.utilization, "bound": m.bound, "flops": m.flops}
                    for m in reference.mappings]}


def mapping_dict(mapping: MappingSection) -> dict[str, Any]:
    totals = mapping.totals
    options = mapping.options
    from hardware import model_assumptions

    return {
        "hardware": mapping.hardware,
        "chip": mapping.program.chip,
        "chips": mapping.system.system.chip_count,
        "system": _system_dict(mapping),
        "model": model_assumptions(mapping.system.system).as_dict(),
        "execution": options.execution,
        "options": {"dram_efficiency": options.dram_efficiency, "exp_ops": options.exp_ops,
                    "cross_attention": mapping.program.cross_attention,
                    "caption_tokens": options.caption_tokens,
                    "per_sample_attentions": mapping.program.per_sample_attentions},
        "distinct_mappings": mapping.program.distinct_mappings,
        "kernels": kernel_records(mapping),
        "pairs": [{"pair": g.pair, "latency_s": g.latency_s, "kernels": g.kernels,
                   "seconds_by_kind": dict(g.seconds_by_kind)} for g in mapping.pairs],
        "reference": _reference_dict(mapping),
        "totals": {
            "step_latency_s": totals.step_latency_s,
            "seconds_by_kind": dict(totals.seconds_by_kind),
            "gemm_utilization": totals.gemm_utilization,
            "steps": totals.steps,
            "pairs_found": totals.pairs_found,
            "pairs_total": totals.pairs_total,
            "inference_latency_s": totals.inference_latency_s,
            "inference_comm_s": totals.inference_comm_s,
            "inference_compute_s": totals.inference_compute_s,
        },
    }


def sections_dict(sections: HardwareSections) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if sections.blocks is not None:
        document["blocks"] = blocks_dict(sections.blocks)
    if sections.mapping is not None:
        document["mapping"] = mapping_dict(sections.mapping)
    return document


# -- rows for --by block / --by kernel ------------------------------------------------------------------
def block_rows(report: Report) -> list[dict[str, Any]]:
    """One row per labelled GEMM of each STDiT3 block (needs the blocks section)."""
    blocks = report.sections.blocks
    if blocks is None:
        raise UsageError(f"{report.source}: --by block needs an STDiT3 block segmentation; pass --hw NAME "
                         "on an STDiT3 stage")
    by_position = {row.position: row for row in report.rows}
    records = []
    for block in blocks.blocks:
        for label, positions in block.ops:
            for position in positions:
                row = by_position[position]
                records.append({
                    "block": block.index, "kind": block.kind, "label": label,
                    "op": row.op, "operand_shapes": row.operand_shapes,
                    "result_shapes": row.result_shapes, "flops": row.flops,
                    "location": row.location,
                })
    return records


def kernel_rows(report: Report) -> list[dict[str, Any]]:
    if report.sections.mapping is None:
        raise UsageError(f"{report.source}: --by kernel needs --hw NAME")
    return kernel_records(report.sections.mapping)


# -- table ------------------------------------------------------------------------------------------------
def kernel_table_lines(report: Report) -> list[str]:
    header = ["#", "pair", "kernel", "kind", "shapes", "latency", "util", "bound"]
    rows = [[str(r["position"]), "-" if r["pair"] is None else str(r["pair"]), r["name"][:40], r["kind"],
             r["shapes"][:48], seconds(r["latency_s"]), f"{r['utilization']:.1%}", r["bound"]]
            for r in kernel_rows(report)]
    return render_columns(header, rows, {0, 1, 5, 6})


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
        return "all traced keys (per-sample asked, but the caption length is unknown: no sidecar, no --caption-tokens)"
    return "all traced keys"


def mapping_lines(mapping: MappingSection) -> list[str]:
    totals = mapping.totals
    lines = ["", f"Mapping on {mapping.system.system.name}: {mapping.system.assumption}",
             f"  execution: {mapping.options.execution}; DRAM efficiency {mapping.options.dram_efficiency:g}, "
             f"{mapping.options.exp_ops} vector op(s) per exp; {len(mapping.program.ops)} kernels, "
             f"{mapping.program.distinct_mappings} distinct",
             f"  cross-attention: {_cross_attention_text(mapping)}",
             f"  one step (this program, one device)  {seconds(totals.step_latency_s)}"]
    from hardware import model_assumptions

    lines[2:2] = model_lines(model_assumptions(mapping.system.system).as_dict())
    lines += [f"    {kind:<16}{seconds(value):>14}" for kind, value in totals.seconds_by_kind]
    lines.append(f"  GEMM utilisation (matrix FLOPs at peak / compute time)  {totals.gemm_utilization:.1%}")
    if totals.pairs_found:
        header = ["pair", "kernels", "latency", *[kind for kind, _ in totals.seconds_by_kind]]
        rows = [["before" if g.pair is None else str(g.pair), str(g.kernels), seconds(g.latency_s),
                 *[seconds(dict(g.seconds_by_kind).get(kind, 0.0)) for kind, _ in totals.seconds_by_kind]]
                for g in mapping.pairs]
        lines += ["  by block pair (traced ops):"] + ["    " + line for line in
                                                     render_columns(header, rows, set(range(1, len(header))))]
    if mapping.reference is not None:
        lines.append(f"  reference: one pair rebuilt from the ideal shape dictionary {seconds(mapping.reference.latency_s)} "
                     "(comparison only)")
    scope = f"{totals.pairs_total} pairs x " if totals.pairs_total else ""
    lines += [f"  inference ({scope}{totals.steps} steps)  {seconds(totals.inference_latency_s)} "
              f"(communication {seconds(totals.inference_comm_s)})"]
    return lines


def sections_lines(sections: HardwareSections) -> list[str]:
    lines: list[str] = []
    if sections.blocks is not None:
        lines += blocks_lines(sections.blocks)
    if sections.mapping is not None:
        lines += mapping_lines(sections.mapping)
    return lines
