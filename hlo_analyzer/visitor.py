"""IRVisitor: walk an MLIR module the way ``ast.NodeVisitor`` walks a Python AST.

Manual
------
``visit(node)`` dispatches on what ``node`` is:

* an operation -> ``visit_<opname>`` where ``<opname>`` is the op name without its dialect prefix
  (``stablehlo.dot_general`` and ``mhlo.dot_general`` both go to ``visit_dot_general``;
  ``func.call`` to ``visit_call``); a ``-`` in a name becomes ``_``;
* an ``ir.Module`` -> ``visit_module``, an ``ir.Region`` -> ``visit_region``,
  an ``ir.Block`` -> ``visit_block``.

When no such method exists, ``generic_visit(node)`` walks the children in order: an operation's
regions, a region's blocks, a block's operations. A ``visit_*`` method that wants the children
walked too calls ``self.generic_visit(op)`` itself, exactly as with ``ast.NodeVisitor``.

Called computations are reachable. ``visit_module`` starts at the public functions (normally
``main``) and ``visit_call`` walks the callee's body each time it is called, so a function called
twice is measured twice and a private function that nothing calls is not measured at all.
Fusions, ``while`` and ``case`` bodies are regions, so ``generic_visit`` reaches them.

Example::

    from hlo_analyzer import IRVisitor, load_module

    class DotShapes(IRVisitor):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def visit_dot_general(self, op):
            self.shapes.append([list(v.type.shape) for v in op.operation.operands])

    visitor = DotShapes()
    visitor.visit(load_module("dumps/example_mlp_megatron_2x2.stablehlo.mlir"))
    print(visitor.shapes)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

from jaxlib.mlir import ir

#: Dialects whose op names a visitor method may refer to.
_DIALECT_MODULES = ("stablehlo", "mhlo", "chlo", "func", "sdy")


def short_op_name(full_name: str) -> str:
    """``stablehlo.dot_general`` -> ``dot_general``; the dispatch key of ``visit_<name>``."""
    return full_name.split(".", 1)[-1].replace("-", "_").replace(".", "_")


@cache
def known_op_names() -> frozenset[str]:
    """Short names of every op registered by the dialects the analyzer loads (for checks)."""
    import importlib

    names = set()
    for module_name in _DIALECT_MODULES:
        module = importlib.import_module(f"jaxlib.mlir.dialects.{module_name}")
        for value in vars(module).values():
            op_name = getattr(value, "OPERATION_NAME", None)
            if inspect.isclass(value) and isinstance(op_name, str):
                names.add(short_op_name(op_name))
    return frozenset(names)


#: Ops whose regions are a scalar combiner (``add(a, b)``) applied per element rather than code
#: that runs once: a measuring visitor charges the owning op and sets ``skip_scalar_bodies``.
SCALAR_BODY_OPS = frozenset(
    {"reduce", "all_reduce", "reduce_scatter", "reduce_window", "scatter", "select_and_scatter",
     "sort", "map"}
)


class IRVisitor:
    """Base class of every visitor; see the module docstring for the manual.

    ``position`` counts the operations dispatched so far; visitors that record rows stamp them
    with it, so rows from two visitors of one module merge back into walk order. Set
    ``skip_scalar_bodies = True`` in a measuring visitor so that ``generic_visit`` does not walk
    into reducer bodies (see ``SCALAR_BODY_OPS``).
    """

    skip_scalar_bodies = False

    def __init__(self) -> None:
        self.position = -1
        self._method_cache: dict[str, Callable[[Any], Any]] = {}
        self._symbols: dict[str, ir.Operation] = {}
        self._call_stack: list[str] = []

    # -- dispatch -------------------------------------------------------------------------------
    def visit(self, node: Any) -> Any:
        if isinstance(node, ir.Module):
            return self.visit_module(node)
        if isinstance(node, ir.Region):
            return self.visit_region(node)
        if isinstance(node, ir.Block):
            return self.visit_block(node)
        return self._visit_operation(node)

    def _visit_operation(self, node: Any) -> Any:
        self.position += 1
        name = node.operation.name
        method = self._method_cache.get(name)
        if method is None:
            method = getattr(self, "visit_" + short_op_name(name), self.generic_visit)
            self._method_cache[name] = method
        return method(node)

    def generic_visit(self, node: Any) -> None:
        if isinstance(node, ir.Region):
            for block in node.blocks:
                self.visit(block)
        elif isinstance(node, ir.Block):
            # The hot loop: skip visit()'s type tests, unless a subclass overrides visit().
            fast = type(self).visit is IRVisitor.visit
            visit_operation = self._visit_operation if fast else self.visit
            for op in node.operations:
                visit_operation(op)
        else:
            regions = node.operation.regions
            if not len(regions):  # most ops: nothing below them
                return
            if self.skip_scalar_bodies and short_op_name(node.operation.name) in SCALAR_BODY_OPS:
                return
            for region in regions:
                self.visit(region)

    def visit_region(self, region: ir.Region) -> None:
        self.generic_visit(region)

    def visit_block(self, block: ir.Block) -> None:
        self.generic_visit(block)

    # -- modules and calls ----------------------------------------------------------------------
    def visit_module(self, module: ir.Module) -> None:
        """Visit the public functions; private ones are reached through ``func.call``."""
        functions = [op for op in module.body.operations if op.operation.name == "func.func"]
        self._symbols = {_symbol_name(op): op for op in functions}
        public = [op for op in functions if not _is_private(op)]
        for op in public or functions:
            self.visit(op)
        for op in module.body.operations:
            if op.operation.name != "func.func":
                self.visit(op)

    def visit_call(self, op: Any) -> None:
        """Walk the callee's body once per call (recursion is cut, it has no static cost)."""
        callee = _flat_symbol(op.operation.attributes["callee"])
        function = self._symbols.get(callee)
        if function is None or callee in self._call_stack:
            return
        self._call_stack.append(callee)
        try:
            for region in function.operation.regions:
                self.visit(region)
        finally:
            self._call_stack.pop()


def _symbol_name(function_op: Any) -> str:
    return ir.StringAttr(function_op.operation.attributes["sym_name"]).value


def _is_private(function_op: Any) -> bool:
    attributes = function_op.operation.attributes
    if "sym_visibility" not in attributes:
        return False
    return ir.StringAttr(attributes["sym_visibility"]).value == "private"


def _flat_symbol(attribute: ir.Attribute) -> str:
    return ir.FlatSymbolRefAttr(attribute).value
