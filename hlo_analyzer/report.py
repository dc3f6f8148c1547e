"""``analyze``: run the measuring visitors over a module and gather one deterministic Report."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from jaxlib.mlir import ir

from hlo_analyzer.comm import CollectiveTime, CommVisitor, _module_num_partitions
from hlo_analyzer.flops import FlopsVisitor
from hlo_analyzer.mlir import load_module
from hlo_analyzer.rows import CATEGORIES, COMM, GEMM, VECTOR, OpRow
from hlo_trace.errors import UnsupportedIRError, UsageError


@dataclass
class Report:
    """Everything one analysis found. ``extra`` holds sections added by later stages (blocks,
    hardware mapping) so that they travel in the same JSON document."""

    source: str
    num_devices: int | None
    rows: list[OpRow]
    unhandled: dict[str, int]
    op_counts: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)

    # -- totals ---------------------------------------------------------------------------------
    def _sum(self, category: str, attribute: str) -> float:
        return sum(getattr(row, attribute) for row in self.rows if row.category == category)

    @property
    def gemm_flops(self) -> int:
        return int(self._sum(GEMM, "flops"))

    @property
    def vector_flops(self) -> int:
        return int(self._sum(VECTOR, "flops"))

    @property
    def comm_bytes_per_device(self) -> float:
        return self._sum(COMM, "comm_bytes_per_device")

    @property
    def comm_latency_s(self) -> float | None:
        latencies = [row.comm_latency_s for row in self.rows if row.category == COMM]
        if not latencies or any(value is None for value in latencies):
            return None
        return sum(latencies)

    def totals(self) -> dict[str, Any]:
        totals: dict[str, Any] = {
            "gemm_flops": self.gemm_flops,
            "vector_flops": self.vector_flops,
            "total_flops": self.gemm_flops + self.vector_flops,
            "comm_bytes_per_device": _exact(self.comm_bytes_per_device),
            "comm_ops": sum(1 for row in self.rows if row.category == COMM),
            "comm_latency_s": self.comm_latency_s,
        }
        if self.num_devices:
            # SPMD: every device runs this same program, so the mesh does num_devices times it.
            totals["mesh"] = {
                "devices": self.num_devices,
                "gemm_flops": self.gemm_flops * self.num_devices,
                "vector_flops": self.vector_flops * self.num_devices,
                "comm_bytes": _exact(self.comm_bytes_per_device * self.num_devices),
            }
        return totals

    def by_category(self) -> list[dict[str, Any]]:
        summary = []
        for category in CATEGORIES:
            rows = [row for row in self.rows if row.category == category]
            summary.append({
                "category": category,
                "ops": len(rows),
                "flops": sum(row.flops for row in rows),
                "comm_bytes_per_device": _exact(sum(row.comm_bytes_per_device for row in rows)),
            })
        return summary

    def comm_by_kind(self) -> dict[str, dict[str, float]]:
        kinds: dict[str, dict[str, float]] = {}
        for row in self.rows:
            if row.category != COMM:
                continue
            entry = kinds.setdefault(row.comm_kind, {"count": 0, "bytes_per_device": 0.0})
            entry["count"] += 1
            entry["bytes_per_device"] += row.comm_bytes_per_device
        for entry in kinds.values():
            entry["bytes_per_device"] = _exact(entry["bytes_per_device"])
        return dict(sorted(kinds.items()))

    # -- output ---------------------------------------------------------------------------------
    def block_rows(self) -> list[dict[str, Any]]:
        """One row per labelled GEMM of each STDiT3 block (needs the ``blocks`` section)."""
        if "blocks" not in self.extra:
            raise UsageError(f"{self.source}: --by block needs the STDiT3 block segmentation; "
                             "pass --hw NAME")
        by_position = {row.position: row for row in self.rows}
        records = []
        for block in self.extra["blocks"]["labels"]:
            for label, positions in block["ops"].items():
                for position in positions:
                    row = by_position[position]
                    records.append({
                        "block": block["index"], "kind": block["kind"], "label": label,
                        "op": row.op, "operand_shapes": row.operand_shapes,
                        "result_shapes": row.result_shapes, "flops": row.flops,
                        "location": row.location,
                    })
        return records

    def to_dict(self) -> dict[str, Any]:
        document = {
            "source": self.source,
            "totals": self.totals(),
            "comm_by_kind": self.comm_by_kind(),
            "by_category": self.by_category(),
            "unhandled": self.unhandled,
            "op_counts": self.op_counts,
            "ops": [_row_dict(row) for row in self.rows],
        }
        document.update(self.extra)
        return document

    def to_json(self) -> str:
        """Indented JSON, but one line per op row: readable, and fast on 100k ops because the
        row lines go through json's C encoder (indentation forces the pure-Python one)."""
        document = self.to_dict()
        rows = document.pop("ops")
        head = json.dumps(document, indent=1, sort_keys=True)  # ends with "\n}"
        encode = json.JSONEncoder(sort_keys=True).encode
        row_lines = "".join(f"\n  {encode(row)}," for row in rows)
        return head[:-2] + f',\n "ops": [{row_lines.rstrip(",")}\n ]\n}}\n'


    def to_csv(self, by: str = "summary") -> str:
        buffer = io.StringIO()
        if by in ("summary", "category"):
            records = self.by_category()
        elif by == "block":
            records = self.block_rows()
            for record in records:
                record["operand_shapes"] = _shapes_text(record["operand_shapes"])
                record["result_shapes"] = _shapes_text(record["result_shapes"])
        else:
            records = [_row_dict(row) for row in self.rows]
            for record in records:  # shapes as "4x8;8x16" in one CSV cell
                record["operand_shapes"] = _shapes_text(record["operand_shapes"])
                record["result_shapes"] = _shapes_text(record["result_shapes"])
        fields = list(records[0]) if records else list(_ROW_FIELDS)
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return buffer.getvalue()

    def to_table(self, by: str = "summary") -> str:
        from hlo_analyzer.table import render_report_table

        return render_report_table(self, by)


def analyze(source: ir.Module | str | os.PathLike | bytes, *,
            collective_time: CollectiveTime | None = None, bruck: bool = False,
            name: str | None = None) -> Report:
    """Measure a module (or load one from a path/content first) with the FLOPs and comm visitors.

    ``collective_time(kind, group_size, comm_bytes) -> seconds`` turns collectives into latency
    (e.g. ``RingLink`` or a hardware system model); without it latencies are ``None``.
    """
    module = source if isinstance(source, ir.Module) else load_module(source)
    if name is None:
        name = str(source) if isinstance(source, (str, os.PathLike)) else "<module>"
    num_devices = _module_num_partitions(module)

    flops = FlopsVisitor()
    comm = CommVisitor(collective_time=collective_time, bruck=bruck, num_devices=num_devices)
    try:
        flops.visit(module)
        comm.visit(module)
    except UnsupportedIRError as exc:
        raise UnsupportedIRError(f"{name}: {str(exc).replace(' at -:', ' at line ')}") from None

    rows = sorted(flops.rows + comm.rows, key=lambda row: row.position)
    return Report(
        source=name,
        num_devices=num_devices,
        rows=rows,
        unhandled=dict(sorted(flops.unhandled.items())),
        op_counts=dict(sorted(Counter(flops.op_counts).items())),
    )


_ROW_FIELDS = OpRow._fields


def _exact(value: float) -> float | int:
    """Byte counts are whole numbers unless a ring formula leaves a fraction: print them so."""
    return int(value) if float(value).is_integer() else value


def _row_dict(row: OpRow) -> dict[str, Any]:
    # json writes the shape tuples as lists.
    record = row._asdict()
    record["comm_bytes_per_device"] = _exact(row.comm_bytes_per_device)
    return record


def _shapes_text(shapes: list[list[int]]) -> str:
    return ";".join("x".join(str(d) for d in shape) or "scalar" for shape in shapes)
