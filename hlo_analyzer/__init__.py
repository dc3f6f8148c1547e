"""hlo_analyzer: load partitioned MLIR dumps and measure them with visitors.

    from hlo_analyzer import load_module, IRVisitor, analyze
    from hlo_trace.examples import example_dump  # the bundled example, from any directory

    class CountDots(IRVisitor):
        def __init__(self):
            super().__init__()
            self.count = 0

        def visit_dot_general(self, op):  # stablehlo.dot_general and mhlo.dot_general
            self.count += 1

    visitor = CountDots()
    visitor.visit(load_module(example_dump()))
    report = analyze(example_dump())
    print(report.gemm_flops, report.comm_bytes_per_device)

``analyze_dump(path, hardware, options)`` is the whole analysis of a dump on a hardware (its
sidecar read once, the program measured, the ops mapped; ``hardware`` None: measured only):
what ``analyze-hlo``, ``analyze-pipeline`` and the plan search compute with.
``load_module`` takes a path, always; dump content held in memory goes through
``load_module_text``. See ``hlo_analyzer.visitor`` for the visitor manual.
"""

from __future__ import annotations

try:
    import hlo_trace  # noqa: F401 - first: Ctrl-C while the command imports is one line (quiet_interrupts)
except KeyboardInterrupt:  # Ctrl-C in the instant before hlo_trace's hook exists: the same line
    import os
    os.write(2, b"Interrupted.\n")
    os._exit(130)

import importlib
from typing import TYPE_CHECKING, Any

from hlo_trace.errors import InputFileError, UnsupportedIRError, UsageError

if TYPE_CHECKING:
    from hlo_analyzer.comm import CommVisitor, RingLink
    from hlo_analyzer.flops import FlopsVisitor
    from hlo_analyzer.mapping.analysis import Analysis, AnalysisOptions, analyze_dump
    from hlo_analyzer.mlir import load_module, load_module_text
    from hlo_analyzer.report import Report, analyze
    from hlo_analyzer.sidecar import Sidecar, read_sidecar
    from hlo_analyzer.visitor import IRVisitor

#: Where each name of the API lives. They are imported on first use (PEP 562), so that the
#: commands' modules (``hlo_analyzer.cli``...) import in milliseconds and load jaxlib's MLIR
#: bindings (a second or more) inside the command, where an interrupt is one line.
_HOMES = {
    "CommVisitor": "hlo_analyzer.comm", "RingLink": "hlo_analyzer.comm",
    "FlopsVisitor": "hlo_analyzer.flops", "load_module": "hlo_analyzer.mlir",
    "load_module_text": "hlo_analyzer.mlir", "Report": "hlo_analyzer.report",
    "analyze": "hlo_analyzer.report", "IRVisitor": "hlo_analyzer.visitor",
    "Sidecar": "hlo_analyzer.sidecar", "read_sidecar": "hlo_analyzer.sidecar",
    "Analysis": "hlo_analyzer.mapping.analysis", "AnalysisOptions": "hlo_analyzer.mapping.analysis",
    "analyze_dump": "hlo_analyzer.mapping.analysis",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hlo_analyzer' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))

__all__ = [
    "Analysis",
    "AnalysisOptions",
    "CommVisitor",
    "FlopsVisitor",
    "IRVisitor",
    "InputFileError",
    "Report",
    "RingLink",
    "Sidecar",
    "UnsupportedIRError",
    "UsageError",
    "analyze",
    "analyze_dump",
    "load_module",
    "load_module_text",
    "read_sidecar",
]
