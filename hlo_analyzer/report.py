"""``analyze``: run the measuring visitors over a module and gather one deterministic Report, which
writes itself as JSON and CSV (its text form: ``hlo_analyzer.table.render_report_table``)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from jaxlib.mlir import ir

from hlo_analyzer.comm import CollectiveTime, CommVisitor, _module_num_partitions
from hlo_analyzer.control import ConditionalInfo, Cost, LoopInfo, resolve
from hlo_analyzer.flops import FlopsVisitor
from hlo_analyzer.memory import MemorySection
from hlo_analyzer.mlir import load_module
from hlo_analyzer.rows import CATEGORIES, COMM, GEMM, VECTOR, OpRow
from hlo_analyzer.tensors import TypeTable, splits_tensor
from hlo_analyzer.training import TrainingSplit
from hlo_analyzer.visitor import IRVisitor
from hlo_trace.documents import dataclass_from_dict
from hlo_trace.errors import UnsupportedIRError, UsageError

PER_DEVICE = "per-device"
GLOBAL = "global"

#: custom_call targets that only exist before SPMD partitioning (the partitioner consumes them).
PRE_PARTITION_TARGETS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})
#: Function argument/result attribute that only a pre-partition module carries (Shardy's).
SHARDY_ATTRIBUTE = "sdy.sharding"
#: Result attribute that jax writes when it lowers (before partitioning; with more than one
#: partition the shapes are then global).
JAX_LOWERED_ATTRIBUTE = "jax.result_info"

GLOBAL_NOTE = (
    "pre-partition module (sharding annotations, global shapes): the numbers are the whole "
    "program's, for all devices together, and are not multiplied by the device count. For the "
    "per-device program analyze the partitioned HLO: jax's jit(f).lower(...).compile().as_text(), "
    "or XLA's dump with XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text "
    "--xla_dump_hlo_pass_re=spmd-partitioning' (file *after_spmd-partitioning*.txt).")


#: What ``--by kernel`` and ``--by block`` need that the measurement alone does not give.
NEEDS_SECTIONS = {
    "kernel": "--by kernel needs --hw NAME",
    "block": "--by block needs --hw NAME (the block segmentation and the time per block)",
}


class Sections(Protocol):
    """What a layer above the measurement adds to a Report, written into the same JSON document
    and CSV: ``hlo_analyzer.mapping.render.HardwareSections`` (the block pairs and the hardware
    mapping of ``--hw``). The Report knows this protocol only, never the layer that fills it."""

    def json_sections(self, *, kernels: bool = True) -> dict[str, Any]:
        """The sections as JSON values by key (``kernels`` false: a long list left as a
        placeholder that :meth:`splice_json` fills)."""
        ...

    def splice_json(self, text: str) -> str:
        """``text``, the indented JSON document, with the placeholders filled."""
        ...

    def records(self, by: str, rows: Sequence[OpRow], source: str) -> list[dict[str, Any]]:
        """The CSV records of ``--by kernel`` or ``--by block``."""
        ...


class NoSections:
    """A Report's sections before a layer above adds any: nothing to write; ``--by kernel`` and
    ``--by block`` are refused."""

    def json_sections(self, *, kernels: bool = True) -> dict[str, Any]:
        return {}

    def splice_json(self, text: str) -> str:
        return text

    def records(self, by: str, rows: Sequence[OpRow], source: str) -> list[dict[str, Any]]:
        raise UsageError(f"{source}: {NEEDS_SECTIONS[by]}")


@dataclass(frozen=True)
class MeshTotals:
    """An SPMD program's totals over its whole mesh: every device runs the same program."""

    devices: int
    gemm_flops: int
    vector_flops: int
    comm_bytes: float


@dataclass(frozen=True)
class ReportTotals:
    """The report's ``totals``: one device's FLOPs and collectives (``mesh``: the whole mesh's,
    for a per-device program that records its device count)."""

    gemm_flops: int
    vector_flops: int
    comm_bytes_per_device: float
    comm_ops: int
    comm_latency_s: float | None
    mesh: MeshTotals | None = None

    @property
    def total_flops(self) -> int:
        return self.gemm_flops + self.vector_flops

    def to_dict(self) -> dict[str, Any]:
        totals: dict[str, Any] = {
            "gemm_flops": self.gemm_flops,
            "vector_flops": self.vector_flops,
            "total_flops": self.total_flops,
            "comm_bytes_per_device": self.comm_bytes_per_device,
            "comm_ops": self.comm_ops,
            "comm_latency_s": self.comm_latency_s,
        }
        if self.mesh is not None:
            totals["mesh"] = asdict(self.mesh)
        return totals

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> ReportTotals:
        """The totals :meth:`to_dict` wrote, read back (``origin`` names them in errors)."""
        return dataclass_from_dict(cls, document, origin, "a report's totals", mesh=lambda mesh: (
            None if mesh is None else dataclass_from_dict(MeshTotals, mesh, origin, "a mesh's totals")))


@dataclass(frozen=True)
class CollectiveTotal:
    """One kind of collective in the report's ``comm_by_kind``: how many run and the bytes one
    device sends in them."""

    count: int
    bytes_per_device: float

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> CollectiveTotal:
        return dataclass_from_dict(cls, document, origin, "a collective's total")


class _Sums:
    """Running totals of one category (``Report._category_sums``)."""

    __slots__ = ("ops", "flops", "comm_bytes", "latency")

    def __init__(self) -> None:
        self.ops = self.flops = 0
        self.comm_bytes: float = 0
        self.latency: float | None = 0


@dataclass
class Report:
    """Everything one analysis found. ``sections`` holds what a layer above adds (``--hw``: the
    block pairs and the hardware mapping, ``hlo_analyzer.mapping.apply``) so that it travels in
    the same JSON document."""

    source: str
    num_devices: int | None
    rows: list[OpRow]
    unhandled: dict[str, int]
    op_counts: dict[str, int]
    sections: Sections = field(default_factory=NoSections)
    #: One device's memory (``hlo_analyzer.measurement`` adds it) and a training step's split
    #: by class, phase and traffic (when the sidecar describes one).
    memory: MemorySection | None = None
    training: TrainingSplit | None = None
    program: str = PER_DEVICE  # or GLOBAL: a pre-partition module
    loops: tuple[LoopInfo, ...] = ()
    conditionals: tuple[ConditionalInfo, ...] = ()
    custom_calls: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    _sums: tuple[list[OpRow], int, dict[str, _Sums], list[OpRow]] | None = field(
        default=None, init=False, repr=False, compare=False)

    # -- totals ---------------------------------------------------------------------------------
    def _category_sums(self) -> dict[str, _Sums]:
        """Per category, in one pass over the rows, each row times its execution count (kept
        until ``rows`` is replaced: checking and rendering a report both need them); the
        collectives' rows picked out in the same pass (``_comm_rows``)."""
        cached = self._sums
        if cached is not None and cached[0] is self.rows and cached[1] == len(self.rows):
            return cached[2]
        sums = {category: _Sums() for category in CATEGORIES}
        latency: float | None = 0
        comm_rows = []
        for row in self.rows:
            entry = sums[row.category]
            count = row.count
            entry.ops += count
            entry.flops += row.flops * count
            entry.comm_bytes += row.comm_bytes_per_device * count
            if row.category == COMM:
                comm_rows.append(row)
                latency = (None if latency is None or row.comm_latency_s is None
                           else latency + row.comm_latency_s * count)
        sums[COMM].latency = latency if comm_rows else None
        self._sums = (self.rows, len(self.rows), sums, comm_rows)
        return sums

    def _comm_rows(self) -> list[OpRow]:
        """The collectives' rows, in order (picked out by ``_category_sums``)."""
        self._category_sums()
        assert self._sums is not None
        return self._sums[3]

    @property
    def gemm_flops(self) -> int:
        return int(self._category_sums()[GEMM].flops)

    @property
    def vector_flops(self) -> int:
        return int(self._category_sums()[VECTOR].flops)

    @property
    def comm_bytes_per_device(self) -> float:
        return self._category_sums()[COMM].comm_bytes

    @property
    def comm_latency_s(self) -> float | None:
        return self._category_sums()[COMM].latency

    def totals(self) -> dict[str, Any]:
        return self._totals(self._category_sums())

    def _totals(self, sums: dict[str, _Sums]) -> dict[str, Any]:
        gemm_flops, vector_flops = int(sums[GEMM].flops), int(sums[VECTOR].flops)
        comm_bytes = sums[COMM].comm_bytes
        mesh = None
        if self.num_devices and self.program == PER_DEVICE:
            # SPMD: every device runs this same program, so the mesh does num_devices times it.
            mesh = MeshTotals(devices=self.num_devices, gemm_flops=gemm_flops * self.num_devices,
                              vector_flops=vector_flops * self.num_devices,
                              comm_bytes=_exact(comm_bytes * self.num_devices))
        return ReportTotals(gemm_flops=gemm_flops, vector_flops=vector_flops,
                            comm_bytes_per_device=_exact(comm_bytes), comm_ops=sums[COMM].ops,
                            comm_latency_s=sums[COMM].latency, mesh=mesh).to_dict()

    def by_category(self) -> list[dict[str, Any]]:
        return self._by_category(self._category_sums())

    @staticmethod
    def _by_category(sums: dict[str, _Sums]) -> list[dict[str, Any]]:
        return [{"category": category, "ops": sums[category].ops, "flops": sums[category].flops,
                 "comm_bytes_per_device": _exact(sums[category].comm_bytes)}
                for category in CATEGORIES]

    @property
    def comm_by_kind(self) -> dict[str, dict[str, float]]:
        """Per collective kind (sorted): ``count`` (times run) and ``bytes_per_device`` sent."""
        kinds: dict[str, dict[str, float]] = {}
        for row in self._comm_rows():
            entry = kinds.setdefault(row.comm_kind, {"count": 0, "bytes_per_device": 0.0})
            entry["count"] += row.count
            entry["bytes_per_device"] += row.comm_bytes_per_device * row.count
        for entry in kinds.values():
            entry["bytes_per_device"] = _exact(entry["bytes_per_device"])
        return dict(sorted(kinds.items()))

    # -- output ---------------------------------------------------------------------------------
    def to_dict(self, with_ops: bool = True, with_kernels: bool = True) -> dict[str, Any]:
        """The JSON document as a dict (without the ``ops`` rows if ``with_ops`` is false; with
        the mapping's kernel list as a placeholder string if ``with_kernels`` is false)."""
        document = self._summary_dict()
        if with_ops:
            document["ops"] = [_row_dict(row) for row in self.rows]
        document.update(self._later_sections(with_kernels))
        return document

    def _later_sections(self, with_kernels: bool = True) -> dict[str, Any]:
        """The memory and training sections and the sections added from above."""
        later: dict[str, Any] = {}
        if self.memory is not None:
            later["memory"] = self.memory.to_dict()
        if self.training is not None:
            later["training"] = self.training.to_dict()
        return later | self.sections.json_sections(kernels=with_kernels)

    def _summary_dict(self) -> dict[str, Any]:
        """Every section but ``ops`` and the later ones."""
        sums = self._category_sums()
        return {
            "source": self.source,
            "program": self.program,
            "notes": list(self.notes),
            "totals": self._totals(sums),
            "loops": [_loop_dict(loop) for loop in self.loops],
            "conditionals": [asdict(conditional) for conditional in self.conditionals],
            "custom_calls": self.custom_calls,
            "comm_by_kind": self.comm_by_kind,
            "by_category": self._by_category(sums),
            "unhandled": self.unhandled,
            "op_counts": self.op_counts,
        }

    def to_json(self) -> str:
        return "".join(self.json_pieces())

    def json_pieces(self) -> Iterator[str]:
        """The JSON document in pieces (to be written as they come: a 1M-op report is 230 MB).
        Indented, but one line per op row: readable, and fast on 1M ops because each distinct
        row goes once through json's C encoder (indentation forces the pure-Python one) and the
        rows that repeat it differ only in their position (``_RowLines``); the mapping's kernels
        likewise skip that encoder (``Sections.splice_json``)."""
        document = self.to_dict(with_ops=False, with_kernels=False)
        head = self.sections.splice_json(json.dumps(document, indent=1, sort_keys=True))  # ends with "\n}"
        if not self.rows:
            yield head[:-2] + ',\n "ops": [\n ]\n}\n'
            return
        yield f'{head[:-2]},\n "ops": [\n  '
        lines, rows = _RowLines(), self.rows
        for start in range(0, len(rows), _ROWS_PER_PIECE):
            piece = lines.text(rows[start:start + _ROWS_PER_PIECE])
            yield piece if start == 0 else _ROW_SEPARATOR + piece
        yield "\n ]\n}\n"

    def to_csv(self, by: str = "summary") -> str:
        buffer = io.StringIO()
        if by in ("summary", "category"):
            records = self.by_category()
        elif by == "kernel":
            records = self.sections.records(by, self.rows, self.source)
        elif by == "block":
            records = self.sections.records(by, self.rows, self.source)
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


def analyze(source: ir.Module | str | os.PathLike | bytes, *,
            collective_time: CollectiveTime | None = None, bruck: bool = False,
            name: str | None = None, branch: str | int = "max",
            followers: Sequence[IRVisitor] = (), types: TypeTable | None = None) -> Report:
    """Measure a module (or load one from a path, or from content given as bytes, first) with
    the FLOPs and comm visitors.

    ``collective_time(kind, group_size, comm_bytes) -> seconds`` turns collectives into latency
    (e.g. ``RingLink`` or a hardware system model); without it latencies are ``None``.
    ``branch`` picks the branch of each conditional that is counted (``hlo_analyzer.control``).
    ``followers`` are more visitors that walk alike (``skip_scalar_bodies``; e.g. a
    ``MemoryVisitor``, a ``DataflowVisitor``), measured in the same walk
    (``IRVisitor.walk_with``); made with the same ``types``, they read each op's values once.
    """
    module = source if isinstance(source, ir.Module) else load_module(source)
    if name is None:
        name = str(source) if isinstance(source, (str, os.PathLike)) else "<module>"
    num_devices = _module_num_partitions(module)

    types = types if types is not None else TypeTable()
    flops = FlopsVisitor(types)
    comm = CommVisitor(collective_time=collective_time, bruck=bruck, num_devices=num_devices,
                       types=types)
    try:
        flops.walk_with(module, comm, *followers)  # one walk: all walk alike
        control = resolve(flops.scopes, flops.call_sites, flops.structure_ops,
                          flops.walked_functions, _scope_costs(flops.rows, comm.rows), branch)
    except UnsupportedIRError as exc:
        raise UnsupportedIRError(f"{name}: {str(exc).replace(' at -:', ' at line ')}") from None

    counts = control.scope_counts
    rows = sorted(flops.rows + comm.rows, key=attrgetter("position"))
    if any(count != 1 for count in counts):  # loops, calls, branches not taken
        rows = [row if counts[row.scope] == 1 else row._replace(count=counts[row.scope])
                for row in rows]
    op_counts = flops.op_counts
    program = GLOBAL if _is_pre_partition(module, flops, op_counts, num_devices) else PER_DEVICE
    notes = [GLOBAL_NOTE] if program == GLOBAL else []
    unknown = [loop for loop in control.loops if loop.trip_count is None]
    if unknown:
        notes.append(f"{len(unknown)} while loop(s) with a trip count that is not static: "
                     "their bodies are counted once")
    return Report(
        source=name,
        num_devices=num_devices,
        rows=rows,
        unhandled=dict(sorted(flops.unhandled.items())),
        op_counts=dict(sorted(op_counts.items())),
        program=program,
        loops=control.loops,
        conditionals=control.conditionals,
        custom_calls=dict(sorted(flops.custom_calls.items())),
        notes=tuple(notes),
    )


def _scope_costs(flops_rows: list[OpRow], comm_rows: list[OpRow]) -> dict[int, Cost]:
    """(FLOPs, bytes sent) of the ops directly in each scope, for one execution of it."""
    flops: dict[int, float] = {}
    for row in flops_rows:
        if row.flops:
            flops[row.scope] = flops.get(row.scope, 0.0) + row.flops
    sent: dict[int, float] = {}
    for row in comm_rows:
        sent[row.scope] = sent.get(row.scope, 0.0) + row.comm_bytes_per_device
    return {scope: (flops.get(scope, 0.0), sent.get(scope, 0.0)) for scope in {**flops, **sent}}


def _is_pre_partition(module: ir.Module, flops: FlopsVisitor, op_counts: Counter[str],
                      num_devices: int | None) -> bool:
    """A module before SPMD partitioning: Shardy ops or sharding attributes, the partitioner's
    own custom_calls, or (with more than one partition) an op whose ``mhlo.sharding`` splits its
    result over devices (XLA's ``before_spmd-partitioning`` dump, where Shardy's shardings are
    HLO ``sharding={...}`` on the ops; after partitioning only arguments keep one) or the result
    attribute jax writes when it lowers."""
    if any(name.startswith("sdy.") and name != "sdy.mesh" for name in op_counts):
        return True
    if any(target in PRE_PARTITION_TARGETS or target.startswith("xla.sdy.")
           for target in flops.custom_calls):
        return True
    if (num_devices or 1) > 1 and any(map(splits_tensor, flops.op_shardings)):
        return True
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        for key in ("arg_attrs", "res_attrs"):
            if key not in op.operation.attributes:
                continue
            for dictionary in ir.ArrayAttr(op.operation.attributes[key]):
                attributes = ir.DictAttr(dictionary)
                if SHARDY_ATTRIBUTE in attributes or (
                        JAX_LOWERED_ATTRIBUTE in attributes and (num_devices or 1) > 1):
                    return True
    return False


def _loop_dict(loop: LoopInfo) -> dict[str, Any]:
    record = asdict(loop)
    record["trip_count"] = loop.trip_count if loop.trip_count is not None else "unknown"
    return record


_ROW_FIELDS = OpRow._fields
#: Op rows per piece of ``Report.json_pieces``: large enough that joining is cheap, small
#: enough that a 1M-op report is never held whole.
_ROWS_PER_PIECE = 10_000
_ROW_SEPARATOR = ",\n  "  # between two op rows' lines in the JSON


def _exact(value: float) -> float | int:
    """Byte counts are whole numbers unless a ring formula leaves a fraction: print them so."""
    return int(value) if float(value).is_integer() else value


def _row_dict(row: OpRow) -> dict[str, Any]:
    # json writes the shape tuples as lists.
    record = row._asdict()
    record["comm_bytes_per_device"] = _exact(row.comm_bytes_per_device)
    return record


class _RowLines:
    """One op row as a JSON line (keys sorted), encoded once per distinct row: a transformer's
    layers repeat the same ops, shapes and locations, so most rows differ from one seen before
    only in ``position``. The line of a new row is json's own encoding with a marker position,
    split around it; later rows equal in every other field reuse the two halves."""

    _MARKER = '"position": -1, '

    def __init__(self) -> None:
        self._encode = json.JSONEncoder(sort_keys=True).encode
        self._halves: dict[tuple[Any, ...], tuple[str, str]] = {}

    def text(self, rows: list[OpRow]) -> str:
        """The lines of ``rows``, joined by ``_ROW_SEPARATOR``: their parts are joined once,
        not each line first (~0.3 us less a row)."""
        parts: list[str] = []
        append, known = parts.append, self._halves
        for row in rows:
            # the key: every field but position (equal floats and ints print alike: _exact)
            before, after = known.get(row[1:]) or self._new_halves(row)
            append(before)
            append(str(row.position))
            append(after)
            append(_ROW_SEPARATOR)
        return "".join(parts[:-1])

    def _new_halves(self, row: OpRow) -> tuple[str, str]:
        text = self._encode(_row_dict(row._replace(position=-1)))
        before, marker, after = text.partition(self._MARKER)
        assert marker and self._MARKER not in after, text
        halves = self._halves[row[1:]] = (before + '"position": ', ", " + after)
        return halves


def _shapes_text(shapes: list[list[int]]) -> str:
    return ";".join("x".join(str(d) for d in shape) or "scalar" for shape in shapes)
