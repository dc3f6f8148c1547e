"""An ``analyze-hlo --format json`` report read back, its sections typed.

Where an analysis crosses a process (the strategy study and the training study run
``analyze-hlo`` and keep its JSON), the reader of the file gets the sections the report was
written from, each read by the ``from_dict`` of its own dataclass: the totals
(``hlo_analyzer.report.ReportTotals``), the collectives by kind (``CollectiveTotal``), the
memory (``MemorySection``), a training step's split (``TrainingSplit``) and, with ``--hw``, the
mapping's system, totals (``MappingTotals``) and kernels (``KernelRecord``) and the blocks'
labelled GEMMs (``BlockLabels``). A document that is not such a report is one
``InputFileError`` naming the file and the section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hlo_analyzer.mapping.sections import BlockLabels, KernelRecord, MappingTotals
from hlo_analyzer.memory import MemorySection
from hlo_analyzer.report import CollectiveTotal, ReportTotals
from hlo_analyzer.training import TrainingSplit
from hlo_trace.documents import load_json, loads_json
from hlo_trace.errors import InputFileError, shown

#: What the errors say the document is.
WHAT = "an analyze-hlo JSON report"
#: The largest report read: a full-size stage's, with a row per op and a record per kernel, is
#: tens of MB.
MAX_REPORT_BYTES = 2**30


@dataclass(frozen=True)
class MappingSummary:
    """The ``mapping`` section of an ``analyze-hlo --hw`` report: the system's and the chip's
    names, the totals and every kernel."""

    hardware: str
    chip: str
    system: str
    totals: MappingTotals
    kernels: tuple[KernelRecord, ...]

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> MappingSummary:
        where = f"{origin}: mapping"
        try:
            return cls(hardware=str(document["hardware"]), chip=str(document["chip"]),
                       system=str(document["system"]["name"]),
                       totals=MappingTotals.from_dict(document["totals"], where),
                       kernels=tuple(KernelRecord.from_dict(kernel, where)
                                     for kernel in document["kernels"]))
        except (KeyError, TypeError) as error:
            raise InputFileError(f"{where}: not a mapping section ({error!r})") from None


@dataclass(frozen=True)
class JsonReport:
    """The sections of an ``analyze-hlo --format json`` report that other files compute with
    (``memory``, ``training``, ``mapping``: None where the report has none; ``block_labels``
    empty without a segmentation)."""

    totals: ReportTotals
    comm_by_kind: Mapping[str, CollectiveTotal]
    memory: MemorySection | None = None
    training: TrainingSplit | None = None
    mapping: MappingSummary | None = None
    block_labels: tuple[BlockLabels, ...] = ()

    @classmethod
    def from_dict(cls, document: Any, origin: str, *,
                  required: tuple[str, ...] = ()) -> JsonReport:
        """The report ``document`` (``origin`` names it in errors), which must have the
        ``required`` sections (``memory``, ``training``, ``mapping``)."""
        if not isinstance(document, dict):
            raise InputFileError(f"{origin}: a JSON {type(document).__name__}; expected {WHAT}")
        missing = [name for name in required if document.get(name) is None]
        if missing:
            raise InputFileError(f"{origin}: no {' and no '.join(missing)} section; expected "
                                 f"{WHAT} that has it (analyze-hlo --hw)")

        def section(name: str, reader: Any) -> Any:
            return None if document.get(name) is None else reader(document[name], origin)

        try:
            comm = {kind: CollectiveTotal.from_dict(entry, f"{origin}: comm_by_kind.{kind}")
                    for kind, entry in document["comm_by_kind"].items()}
            labels = (document.get("blocks") or {}).get("labels", [])
            return cls(totals=ReportTotals.from_dict(document["totals"], origin),
                       comm_by_kind=MappingProxyType(comm),
                       memory=section("memory", MemorySection.from_dict),
                       training=section("training", TrainingSplit.from_dict),
                       mapping=section("mapping", MappingSummary.from_dict),
                       block_labels=tuple(BlockLabels.from_dict(block, f"{origin}: blocks")
                                          for block in labels))
        except (KeyError, TypeError, AttributeError) as error:
            raise InputFileError(f"{origin}: not {WHAT} ({error!r})") from None

    @classmethod
    def from_json(cls, text: str, origin: str, *, required: tuple[str, ...] = ()) -> JsonReport:
        return cls.from_dict(loads_json(text, origin, WHAT), origin, required=required)

    @classmethod
    def read(cls, path: str | Path, *, required: tuple[str, ...] = ()) -> JsonReport:
        """The report in the file at ``path`` (errors name the file)."""
        return cls.from_dict(load_json(path, WHAT, max_bytes=MAX_REPORT_BYTES), shown(path),
                             required=required)
