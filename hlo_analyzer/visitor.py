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
walked too calls ``self.generic_visit(op)`` itself, exactly as with ``ast.NodeVisitor``
(``walk_regions(op)`` is its op half, for a method that knows it holds an op).

The walk is iterative (an explicit stack, no Python recursion), so nesting of any depth works.
Because of that, ``generic_visit(op)`` *schedules* the op's regions: they are walked right after the
current ``visit_*`` method returns, before the op's next sibling (pre-order, as before).

Called computations are reachable, and each function is walked **once**: ``visit_module`` starts
at the public functions (normally ``main``), and ``visit_call`` (and a ``composite``'s
decomposition) records a call site and schedules the callee if it was not walked yet. How often a
function runs is worked out afterwards from the call sites (``hlo_analyzer.control``), so a call
DAG of any depth costs one walk per function. A private function that nothing calls is not walked.

Every visited op sits in a *scope*: the region it belongs to. ``self.scope`` is the index of the
current one in ``self.scopes`` (``Scope``: parent scope, function, owning op's position and name,
region index). Measuring visitors stamp rows with it, so that loops (a ``while`` body runs its
trip count times), conditionals (one branch runs) and calls (a function runs once per call) can
be weighed after the walk. ``self.call_sites`` lists every call; ``self.structure_ops`` maps the
position of each ``while``/``if``/``case`` to the op and its scope.

Example::

    from hlo_analyzer import IRVisitor, load_module

    class DotShapes(IRVisitor):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def visit_dot_general(self, op):
            self.shapes.append([list(v.type.shape) for v in op.operation.operands])

    visitor = DotShapes()
    visitor.visit(load_module(example_dump()))  # from hlo_trace.examples import example_dump
    print(visitor.shapes)
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterator
from functools import cache
from itertools import chain
from typing import Any, NamedTuple

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


#: Ops whose regions run a data-dependent number of times (weighed by ``hlo_analyzer.control``).
CONTROL_OPS = frozenset({"while", "if", "case"})

#: Scope index of the ops at module level (``sdy.mesh`` ...), outside any function.
MODULE_SCOPE = 0


class Scope(NamedTuple):
    """One region of the walk. ``parent`` is -1 for a function's (or the module's) root scope."""

    parent: int
    function: str
    owner: int  # walk position of the op that owns the region; -1 for a root scope
    owner_name: str  # short name of that op ("while", "if", "fusion", ...); "" for a root
    region: int  # index of the region in its owner


class CallSite(NamedTuple):
    scope: int
    position: int
    callee: str


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
        self.op_name = ""  # the full name of the op being visited (read once per op)
        self._method_cache: dict[str, Callable[[Any], Any]] = {}
        self._symbols: dict[str, Any] = {}
        self.scopes: list[Scope] = [Scope(-1, "", -1, "", 0)]
        self.scope = MODULE_SCOPE
        self.call_sites: list[CallSite] = []
        self.structure_ops: dict[int, tuple[Any, int]] = {}
        self.walked_functions: list[str] = []
        self._scheduled: set[str] = set()
        self._pending: deque[str] = deque()
        self._stack: list[tuple[Iterator[Any], int]] | None = None
        self._followers: tuple[IRVisitor, ...] = ()
        # op name -> (this visitor's method, (follower, its method) for each follower)
        self._follow_cache: dict[str, tuple[Callable[[Any], Any],
                                            tuple[tuple[IRVisitor, Callable[[Any], Any]], ...]]] = {}
        self.following = False  # True while a leader walks for this visitor (``walk_with``)

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
        name = self.op_name = node.operation.name
        method = self._method_cache.get(name)
        if method is None:
            method = getattr(self, "visit_" + short_op_name(name), self.generic_visit)
            self._method_cache[name] = method
        return method(node)

    def walk_with(self, module: ir.Module, *followers: IRVisitor) -> None:
        """Walk ``module`` once for this visitor and ``followers`` together.

        This visitor leads: its methods decide which regions and functions are walked, and its
        records of the walk (``scopes``, ``call_sites``, ``structure_ops``,
        ``walked_functions``) are shared with the followers (the same objects). Each follower
        sees every op the leader reaches, in the same order, with the leader's ``position`` and
        ``scope``, through the method its own walk would dispatch to (its ``visit_<opname>`` or
        its ``generic_visit``); while it follows, the base class's walking (scheduling regions
        and callees) is left to the leader. So a follower gets the same results as from its own
        walk when both walk alike (e.g. both ``skip_scalar_bodies``), for one pass over the
        bindings instead of one each.
        """
        for follower in followers:
            follower.following = True
            follower.scopes, follower.call_sites = self.scopes, self.call_sites
            follower.structure_ops = self.structure_ops
            follower.walked_functions = self.walked_functions
            follower.begin_module(module)
        self._followers, self._follow_cache = followers, {}
        try:
            self.visit_module(module)
        finally:
            # Drop every reference to the followers (the caches hold their bound methods), so
            # that they are freed with their last user even while garbage collection is off.
            self._followers, self._follow_cache = (), {}
            for follower in followers:
                follower.following = False
                follower._symbols = self._symbols

    def _follower_methods(self, name: str) -> tuple[tuple[IRVisitor, Callable[[Any], Any]], ...]:
        """(follower, bound method) for each follower with work to do on ops named ``name``."""
        methods = []
        for follower in self._followers:
            method = getattr(follower, "visit_" + short_op_name(name), follower.generic_visit)
            if getattr(method, "__func__", None) not in _WALK_ONLY:
                methods.append((follower, method))
        return tuple(methods)

    def generic_visit(self, node: Any) -> None:
        if self.following:  # the leader walks
            return
        if isinstance(node, ir.Region):
            self._schedule(_region_operations(node), self.scope)
        elif isinstance(node, ir.Block):
            self._schedule(chain(node.operations), self.scope)  # see _region_operations
        else:
            self.walk_regions(node)

    def walk_regions(self, op: Any) -> None:
        """Walk the regions of ``op`` (the op being visited), right after it: what
        ``generic_visit`` does for an op, for a subclass that knows it has an op."""
        if self.following or _has_no_regions(type(op)):  # the leader walks; or nothing below
            return
        regions = op.operation.regions
        if not len(regions):  # most ops: nothing below them
            return
        name = short_op_name(op.operation.name)
        if self.skip_scalar_bodies and name in SCALAR_BODY_OPS:
            return
        if name in CONTROL_OPS:
            self.structure_ops[self.position] = (op, self.scope)
        parent, function = self.scope, self.scopes[self.scope].function
        # pushed last-first, so that region 0 is walked first
        for index in range(len(regions) - 1, -1, -1):
            self.scopes.append(Scope(parent, function, self.position, name, index))
            self._schedule(_region_operations(regions[index]), len(self.scopes) - 1)

    def visit_region(self, region: ir.Region) -> None:
        self.generic_visit(region)

    def visit_block(self, block: ir.Block) -> None:
        self.generic_visit(block)

    # -- the iterative walk ---------------------------------------------------------------------
    def _schedule(self, operations: Iterator[Any], scope: int) -> None:
        if self._stack is not None:
            self._stack.append((operations, scope))
            return
        self._stack = [(operations, scope)]
        try:
            self._run()
        finally:
            self._stack = None

    def _run(self) -> None:
        stack = self._stack
        assert stack is not None
        # The hot loop: skip visit()'s type tests, unless a subclass overrides visit().
        dispatch = self._visit_operation if type(self).visit is IRVisitor.visit else self.visit
        if self._followers:
            dispatch = self._visit_followed
        while stack:
            operations, scope = stack[-1]
            depth = len(stack)
            self.scope = scope
            for op in operations:
                dispatch(op)
                if len(stack) != depth:  # the op scheduled its regions: walk them first
                    break
                self.scope = scope
            else:
                stack.pop()

    def _visit_followed(self, node: Any) -> None:
        """Dispatch ``node`` to this visitor, then to each follower at the same position."""
        self.position += 1
        name = self.op_name = node.operation.name
        followed = self._follow_cache.get(name)
        if followed is None:
            followed = self._follow_cache[name] = (
                getattr(self, "visit_" + short_op_name(name), self.generic_visit),
                self._follower_methods(name))
        followed[0](node)
        if followed[1]:
            position, scope = self.position, self.scope
            for follower, follower_method in followed[1]:
                follower.position, follower.scope, follower.op_name = position, scope, name
                follower_method(node)

    # -- modules and calls ----------------------------------------------------------------------
    def begin_module(self, module: ir.Module) -> None:
        """Read what the visitor needs from ``module`` before its ops (a hook; nothing here)."""

    def visit_module(self, module: ir.Module) -> None:
        """Walk the public functions and, once each, every function they call."""
        self.begin_module(module)
        functions = [op for op in module.body.operations if op.operation.name == "func.func"]
        self._symbols = {symbol_name(op): op for op in functions}
        public = [op for op in functions if not _is_private(op)]
        for op in public or functions:
            self._schedule_function(symbol_name(op))
        while self._pending:
            name = self._pending.popleft()
            self.walked_functions.append(name)
            self.scopes.append(Scope(-1, name, -1, "", 0))
            self._schedule(iter((self._symbols[name],)), len(self.scopes) - 1)
        others = [op for op in module.body.operations if op.operation.name != "func.func"]
        self._schedule(iter(others), MODULE_SCOPE)

    def _schedule_function(self, name: str) -> None:
        if name not in self._scheduled:
            self._scheduled.add(name)
            self._pending.append(name)

    def visit_call(self, op: Any) -> None:
        """Record the call; the callee is walked once, after the current function."""
        self._record_call(op, flat_symbol(op.operation.attributes["callee"]))

    def visit_composite(self, op: Any) -> None:
        """A ``stablehlo.composite`` runs its decomposition function: measured as a call."""
        self._record_call(op, flat_symbol(op.operation.attributes["decomposition"]))

    def visit_async_start(self, op: Any) -> None:
        """``mhlo.async_start`` runs ``called_computation``: measured as a call."""
        attributes = op.operation.attributes
        if "called_computation" in attributes:
            self._record_call(op, flat_symbol(attributes["called_computation"]))
        self.generic_visit(op)

    def _record_call(self, op: Any, callee: str) -> None:
        if self.following or callee not in self._symbols:
            return
        self.call_sites.append(CallSite(self.scope, self.position, callee))
        self._schedule_function(callee)


def _has_no_regions(op_class: type) -> bool:
    """Whether ops of this class never have regions: the class generated from their definition
    says none (ODS's ``_ODS_REGIONS == (0, True)``, no region and a fixed count, which the
    verifier holds them to). Reading an op's regions costs ~0.2 us; most ops have none."""
    known = _NO_REGIONS.get(op_class)
    if known is None:
        # the class's own (ir.OpView, the class of ops with no class of their own, says (0, True))
        known = _NO_REGIONS[op_class] = (op_class is not ir.OpView
                                         and vars(op_class).get("_ODS_REGIONS") == (0, True))
    return known


_NO_REGIONS: dict[type, bool] = {}


def _region_operations(region: ir.Region) -> Iterator[Any]:
    """The ops of ``region``'s blocks, in order, without a Python frame per op. (Not
    ``iter(block.operations)``: ``iter()`` of the bindings' iterator is a copy, so the walk, which
    leaves and resumes its loop, would start again where it first began.)"""
    return chain.from_iterable(block.operations for block in region.blocks)


def symbol_name(function_op: Any) -> str:
    """The name of a ``func.func`` (its ``sym_name``)."""
    return ir.StringAttr(function_op.operation.attributes["sym_name"]).value


def _is_private(function_op: Any) -> bool:
    attributes = function_op.operation.attributes
    if "sym_visibility" not in attributes:
        return False
    return ir.StringAttr(attributes["sym_visibility"]).value == "private"


def flat_symbol(attribute: ir.Attribute) -> str:
    return ir.FlatSymbolRefAttr(attribute).value


#: Base-class methods that only steer the walk: a follower has nothing to do in them.
_WALK_ONLY = frozenset({IRVisitor.generic_visit, IRVisitor.visit_call, IRVisitor.visit_composite})
