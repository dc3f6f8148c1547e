"""Kernel lists: the kernels of a mapped program, kept so that they can be costed again without
the dump.

``analyze-hlo DUMP --hw X --kernels FILE`` writes one: every kernel the mapping found (its name,
kind and shapes text, the :class:`hardware.ops.Op` it is costed from and its fused epilogue),
the block pair each belongs to, and what the totals scale by (runs of the program, pairs found
and pairs totalled). :func:`cost` maps the same kernels on a hardware description with
``hlo_analyzer.mapping.program.map_kernels`` and totals them with ``mapping.apply.program_totals``, the
functions ``analyze-hlo --hw`` uses: the result equals the report's totals on the description
the list was found on, and follows any later change of the description's constants. What the
kernels are (which library calls, which copies, which shapes) is fixed when the list is written:
a change of the analyzer that finds other kernels needs the list written again from the dump.

The file is JSON (gzip-compressed when its name ends in ``.gz``): ``format``, ``version``, the
dump's file name, the description, execution mode and DRAM efficiency it was found with, ``steps``,
``pairs_found``, ``pairs_total``, the memory analysis' ``peak_live_bytes``, a table of distinct ``ops`` (each Op's fields by name) and the
``kernels`` as ``[name, kind, shapes, op, epilogue, pair]`` (indices into ``ops``, or null).
Collectives are not kept (a kernel list is one device's kernels); a program with one is refused.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware import Op, OpType
from hardware.systems import resolve_system
from hlo_analyzer.mapping.apply import program_totals
from hlo_analyzer.mapping.fusion import resolve_epilogues
from hlo_analyzer.mapping.program import map_kernels
from hlo_analyzer.mapping.render import hardware_sections
from hlo_analyzer.mapping.results import NETWORK_KIND, KernelSource, MappingOptions, PendingEpilogue
from hlo_analyzer.mapping.sections import MappingTotals
from hlo_analyzer.report import Report

__all__ = ["FORMAT", "VERSION", "KernelList", "cost", "from_dict", "kernel_list", "read", "sources_document",
           "sources_from_document", "to_dict", "write"]

FORMAT = "hlo-trace kernel list"
VERSION = 1

_OP_FIELDS = tuple(field.name for field in dataclasses.fields(Op))
_REQUIRED_OP_FIELDS = tuple(field.name for field in dataclasses.fields(Op)
                            if field.default is dataclasses.MISSING)


@dataclass(frozen=True)
class KernelList:
    """One device's kernels of one run of a program (see the module docstring)."""

    source: str                       # the dump's file name
    hardware: str                     # the description the kernels were found with
    execution: str                    # fused / eager / torch
    kernels: tuple[KernelSource, ...]
    pair_of: tuple[int | None, ...]   # each kernel's block pair (None: outside every pair)
    steps: int                        # runs of the program the totals cover
    pairs_found: int | None           # block pairs in the program (None: no STDiT3 stage)
    pairs_total: int | None           # block pairs the totals scale them to
    #: The program's peak live activations by the memory analysis (``hlo_analyzer.memory``: the
    #: unfused program's liveness walk, an upper bound), kept for memory models; None if unknown.
    peak_live_bytes: int | None = None
    dram_efficiency: float = 1.0      # the mapping option it was found with (``--dram-efficiency``)

    def __post_init__(self) -> None:
        if len(self.pair_of) != len(self.kernels):
            raise ValueError(f"{self.source}: {len(self.kernels)} kernels but {len(self.pair_of)} pairs")
        if self.steps < 1:
            raise ValueError(f"{self.source}: steps must be at least 1, got {self.steps}")
        for kernel in self.kernels:
            if kernel.op is None or kernel.collective is not None:
                raise ValueError(f"{self.source}: kernel {kernel.name!r} is a collective; a kernel list holds "
                                 "one device's kernels")


def kernel_list(report: Report) -> KernelList:
    """The kernel list of a report mapped with ``--hw``; ValueError without a mapping or with a
    collective (a multi-device program)."""
    mapping = hardware_sections(report).mapping
    if mapping is None:
        raise ValueError(f"{report.source}: no mapping (a kernel list needs --hw)")
    program = mapping.program
    if len(program.sources) != len(program.ops):
        raise ValueError(f"{report.source}: the mapping kept no kernel sources")
    if any(op.kind == NETWORK_KIND for op in program.ops):
        raise ValueError(f"{report.source}: the program has collectives; a kernel list holds one device's kernels")
    totals = mapping.totals
    return KernelList(source=Path(report.source).name, hardware=mapping.hardware, execution=program.execution,
                      kernels=program.sources, pair_of=mapping.pair_of, steps=totals.steps,
                      pairs_found=totals.pairs_found, pairs_total=totals.pairs_total,
                      peak_live_bytes=None if report.memory is None else report.memory.usage.peak_live_bytes, dram_efficiency=mapping.options.dram_efficiency)


def cost(kernels: KernelList, hardware: str) -> MappingTotals:
    """The totals of ``kernels`` on ``hardware`` (a description name or file) as ``analyze-hlo``
    computes them, with the description's constants as they are now (one device)."""
    system = resolve_system(hardware, 1).system
    options = MappingOptions(execution=kernels.execution, dram_efficiency=kernels.dram_efficiency)
    program = map_kernels(kernels.kernels, system.chip, system, options)
    _, totals = program_totals(program, kernels.pair_of, steps=kernels.steps, pairs_found=kernels.pairs_found,
                               pairs_total=kernels.pairs_total, peak_gemm_flops_per_s=system.chip.gemm_flops_per_s)
    return totals


# -- JSON ------------------------------------------------------------------------------------------------
def _op_dict(op: Op) -> dict[str, Any]:
    record = {name: getattr(op, name) for name in _OP_FIELDS}
    record["op_type"] = op.op_type.value
    return record


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise ValueError(f"a shape must be a list of integers, got {value!r}")
    return tuple(value)


def _op(record: Any) -> Op:
    if not isinstance(record, dict):
        raise ValueError(f"an op must be an object, got {record!r}")
    unknown = set(record) - set(_OP_FIELDS)
    missing = set(_REQUIRED_OP_FIELDS) - set(record)
    if unknown or missing:
        raise ValueError(f"op {record.get('name')!r}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
    values = dict(record)
    values["op_type"] = OpType(values["op_type"])
    values["input_shapes"] = tuple(_shape(s) for s in values["input_shapes"])
    values["output_shape"] = _shape(values["output_shape"])
    if values.get("weight_shape") is not None:
        values["weight_shape"] = _shape(values["weight_shape"])
    return Op(**values)


def to_dict(kernels: KernelList) -> dict[str, Any]:
    """The JSON document of a kernel list (module docstring)."""
    table: dict[Op, int] = {}

    def index(op: Op | None) -> int | None:
        return None if op is None else table.setdefault(op, len(table))

    rows = [[k.name, k.kind, k.shapes, index(k.op), index(k.epilogue), pair]
            for k, pair in zip(kernels.kernels, kernels.pair_of)]
    per_sample = [i for i, k in enumerate(kernels.kernels) if k.per_sample]
    return {"format": FORMAT, "version": VERSION, "source": kernels.source, "hardware": kernels.hardware,
            "execution": kernels.execution, "dram_efficiency": kernels.dram_efficiency, "steps": kernels.steps, "pairs_found": kernels.pairs_found,
            "pairs_total": kernels.pairs_total, "peak_live_bytes": kernels.peak_live_bytes,
            "ops": [_op_dict(op) for op in table],
            "kernels": rows, "per_sample": per_sample}


def from_dict(document: Any) -> KernelList:
    """A kernel list from its JSON document; ValueError for anything else."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a kernel list (expected format {FORMAT!r})")
    if document.get("version") != VERSION:
        raise ValueError(f"kernel list version {document.get('version')!r}: this analyzer reads version {VERSION}")
    try:
        ops = [_op(record) for record in document["ops"]]
        per_sample = set(document.get("per_sample", []))
        kernels, pair_of = [], []
        for position, (name, kind, shapes, op, epilogue, pair) in enumerate(document["kernels"]):
            kernels.append(KernelSource(str(name), str(kind), str(shapes), ops[op],
                                        None if epilogue is None else ops[epilogue],
                                        per_sample=position in per_sample))
            pair_of.append(None if pair is None else int(pair))
        return KernelList(source=str(document["source"]), hardware=str(document["hardware"]),
                          execution=str(document["execution"]), kernels=tuple(kernels), pair_of=tuple(pair_of),
                          steps=int(document["steps"]), pairs_found=document["pairs_found"],
                          pairs_total=document["pairs_total"], peak_live_bytes=document.get("peak_live_bytes"),
                          dram_efficiency=float(document.get("dram_efficiency", 1.0)))
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(f"malformed kernel list: {type(error).__name__}: {error}") from None


def sources_document(sources: Sequence[KernelSource], execution: str) -> dict[str, Any]:
    """Kernels of a program, collectives included, as a JSON-able document: ``execution`` and the
    ``kernels`` as ``[name, kind, op, epilogue, collective, per_sample, pending]``, each Op inline
    (its fields by name; so two programs of the same kernels line up field by field), the shapes
    text left out (every number a kernel is costed from is in its Op or its collective) and a
    pending epilogue (``PendingEpilogue``, a deferred mapping's) as ``[name, op, out_elements,
    side_elements]``. Read back by :func:`sources_from_document`."""
    def op(value: Op | None) -> dict[str, Any] | None:
        return None if value is None else _op_dict(value)

    rows = [[k.name, k.kind, op(k.op), op(k.epilogue),
             None if k.collective is None else [k.collective[0], k.collective[1], k.collective[2],
                                                None if k.collective[3] is None else list(k.collective[3])],
             k.per_sample,
             None if k.pending is None else [k.pending.name, op(k.pending.op), k.pending.out_elements,
                                             list(k.pending.side_elements)]] for k in sources]
    return {"execution": execution, "kernels": rows}


def sources_from_document(document: dict[str, Any]) -> tuple[tuple[KernelSource, ...], str]:
    """The kernels and the execution mode of a :func:`sources_document`, each pending epilogue
    decided at the sizes the document holds (``fusion.resolve_epilogues``: a document rescaled
    to another shape gets that shape's kernels)."""
    kernels = []
    for name, kind, op, epilogue, collective, per_sample, *rest in document["kernels"]:
        comm = None if collective is None else (str(collective[0]), int(collective[1]), int(collective[2]),
                                                None if collective[3] is None else tuple(collective[3]))
        pending = rest[0] if rest else None
        kernels.append(KernelSource(str(name), str(kind), "", None if op is None else _op(op),
                                    None if epilogue is None else _op(epilogue), comm, bool(per_sample),
                                    None if pending is None else PendingEpilogue(
                                        str(pending[0]), _op(pending[1]), int(pending[2]),
                                        tuple(int(v) for v in pending[3]))))
    return resolve_epilogues(kernels), str(document["execution"])


def dumps(kernels: KernelList) -> str:
    """The kernel list as JSON text (compact: one line per kernel)."""
    document = to_dict(kernels)
    head = {key: value for key, value in document.items() if key not in ("ops", "kernels")}
    lines = [json.dumps(head)[:-1] + ', "ops": [']
    lines += [json.dumps(op, separators=(",", ":")) + ("," if i < len(document["ops"]) - 1 else "")
              for i, op in enumerate(document["ops"])]
    lines.append('], "kernels": [')
    lines += [json.dumps(row, separators=(",", ":")) + ("," if i < len(document["kernels"]) - 1 else "")
              for i, row in enumerate(document["kernels"])]
    lines.append("]}")
    return "\n".join(lines) + "\n"


def write(kernels: KernelList, path: str | Path) -> None:
    """Write a kernel list to ``path`` (gzip when it ends in ``.gz``, reproducible bytes)."""
    text = dumps(kernels).encode()
    path = Path(path)
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def read(path: str | Path) -> KernelList:
    """Read a kernel list written by :func:`write` or ``analyze-hlo --kernels``."""
    data = Path(path).read_bytes()
    if Path(path).suffix == ".gz":
        data = gzip.decompress(data)
    return from_dict(json.loads(data))
