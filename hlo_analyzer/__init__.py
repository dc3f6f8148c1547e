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

``load_module`` takes a path, always; dump content held in memory goes through
``load_module_text``. See ``hlo_analyzer.visitor`` for the visitor manual.
"""

from hlo_analyzer.comm import CommVisitor, RingLink
from hlo_analyzer.flops import FlopsVisitor
from hlo_analyzer.mlir import load_module, load_module_text
from hlo_analyzer.report import Report, analyze
from hlo_analyzer.visitor import IRVisitor
from hlo_trace.errors import InputFileError, UnsupportedIRError, UsageError

__all__ = [
    "CommVisitor",
    "FlopsVisitor",
    "IRVisitor",
    "InputFileError",
    "Report",
    "RingLink",
    "UnsupportedIRError",
    "UsageError",
    "analyze",
    "load_module",
    "load_module_text",
]
