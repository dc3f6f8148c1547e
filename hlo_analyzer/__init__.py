"""hlo_analyzer: load partitioned MLIR dumps and measure them with visitors.

    from hlo_analyzer import load_module, IRVisitor

    class CountDots(IRVisitor):
        def __init__(self):
            self.count = 0
        def visit_dot_general(self, op):
            self.count += 1
            self.generic_visit(op)
"""

from hlo_analyzer.errors import InputFileError, UnsupportedIRError, UsageError
from hlo_analyzer.mlir import load_module

__all__ = ["load_module", "UsageError", "InputFileError", "UnsupportedIRError"]
