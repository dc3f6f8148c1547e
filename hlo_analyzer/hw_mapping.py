"""``analyze-hlo --hw``: the dump's STDiT3 blocks mapped onto a hardware model.

Takes the per-block shape dictionary recovered from the dump (``hlo_analyzer.blocks``), builds
one block's op list (``hardware.build_stdit_block_ops``), maps it on the chip, and adds the
dump's own collectives timed on the system's chip-to-chip network. The results go into the
report as two sections, ``blocks`` and ``mapping``.
"""

from __future__ import annotations

import logging
from typing import Any

from jaxlib.mlir import ir

from hlo_analyzer.blocks import Segmentation
from hlo_analyzer.report import Report
from hlo_analyzer.rows import COMM
from hlo_trace.errors import UsageError

log = logging.getLogger(__name__)


def load_system(name_or_path: str) -> Any:
    from hardware import as_system, load_hardware

    return as_system(load_hardware(name_or_path))


def blocks_section(segmentation: Segmentation) -> dict[str, Any]:
    return {
        "config": segmentation.config,
        "count": segmentation.pairs,
        "consistent": all(c == segmentation.config for c in segmentation.per_pair_configs),
        "labels": [
            {"index": index, "kind": block.kind, "ops": block.labels()}
            for index, block in enumerate(segmentation.blocks)
        ],
    }


def mapping_section(report: Report, segmentation: Segmentation, system: Any, *, steps: int,
                    blocks: int | None = None) -> dict[str, Any]:
    """Per-op latency/utilisation of one block on ``system.chip`` and the inference totals."""
    from hardware import (
        build_stdit_block_ops,
        collective_time_s,
        inference_totals,
        map_block,
        model_assumptions,
    )

    block_count = blocks if blocks is not None else segmentation.pairs
    block_mapping = map_block(build_stdit_block_ops(segmentation.config), system.chip)
    comm_s = 0.0
    for row in report.rows:
        if row.category != COMM or row.group_size <= 1:
            continue
        if row.group_size > system.chip_count:
            raise UsageError(
                f"{report.source}: the collective {row.comm_kind} spans {row.group_size} devices but "
                f"{system.name} has {system.chip_count} chip(s); pass a system such as --hw tx8-16"
            )
        devices = row.replica_group if len(row.replica_group) == row.group_size else None
        comm_s += collective_time_s(row.comm_kind, row.group_size, row.comm_bytes, system,
                                    devices=devices)
    totals = inference_totals(block_mapping, block_count, steps, comm_latency_s_per_step=comm_s)
    return {
        "hardware": system.name,
        "chip": system.chip.name,
        "chips": system.chip_count,
        "steps": steps,
        "blocks": block_count,
        "model": model_assumptions(system).as_dict(),
        "ops": [
            {"name": m.op_name, "type": m.op_type, "latency_s": m.latency_s,
             "utilization": m.utilization, "compute_s": m.compute_s, "dram_s": m.dram_s,
             "noc_s": m.noc_s, "bound": m.bound, "flops": m.flops}
            for m in block_mapping.mappings
        ],
        "time_share_by_type": block_mapping.time_share_by_type,
        "totals": {
            "block_latency_s": totals.block_latency_s,
            "compute_latency_s": totals.compute_latency_s,
            "comm_latency_s": totals.comm_latency_s,
            "comm_latency_s_per_step": comm_s,
            "inference_latency_s": totals.inference_latency_s,
            "gemm_utilization": block_mapping.gemm_utilization,
        },
    }


def add_hardware_sections(report: Report, module: ir.Module, hardware: str, *, steps: int = 30,
                          blocks: int | None = None) -> None:
    """Segment ``module`` and add ``blocks`` and ``mapping`` to ``report``."""
    from hlo_analyzer.blocks import segment_blocks

    system = load_system(hardware)
    segmentation = segment_blocks(module, report.source)
    log.info("found %d STDiT3 blocks (%d pairs)", len(segmentation.blocks), segmentation.pairs)
    report.extra["blocks"] = blocks_section(segmentation)
    report.extra["mapping"] = mapping_section(report, segmentation, system, steps=steps,
                                              blocks=blocks)
