"""IRVisitor dispatch, walking order and the known-op check of the shipped visitors."""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from analyzer_samples import CALLS, COLLECTIVES, GEMM_AND_VECTOR
from jaxlib.mlir import ir

from hlo_analyzer import (
    CommVisitor,
    FlopsVisitor,
    IRVisitor,
    load_module,
    load_module_text,
    tensors,
)
from hlo_analyzer import visitor as visitor_module
from hlo_analyzer.mlir import module_to_text, stablehlo_to_mhlo
from hlo_analyzer.visitor import known_op_names, short_op_name


class DotCounter(IRVisitor):
    """The README's few-line visitor: counts dot_general ops of either dialect."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def visit_dot_general(self, op):
        self.count += 1


class OrderRecorder(IRVisitor):
    def __init__(self):
        super().__init__()
        self.names = []

    def visit(self, node):
        if not isinstance(node, (ir.Module, ir.Region, ir.Block)):
            self.names.append(node.operation.name)
        return super().visit(node)


def test_a_new_visitor_in_a_few_lines_runs_on_both_dialects():
    stablehlo_module = load_module_text(GEMM_AND_VECTOR)
    mhlo_module = stablehlo_to_mhlo(load_module_text(GEMM_AND_VECTOR))
    for module in (stablehlo_module, mhlo_module):
        visitor = DotCounter()
        visitor.visit(module)
        assert visitor.count == 1


def test_generic_visit_walks_regions_blocks_and_ops_in_program_order():
    recorder = OrderRecorder()
    recorder.visit(load_module_text(CALLS))
    # main first (the public entry), then @mlp's body once (two call sites recorded);
    # @never_called is unreachable
    assert recorder.names == [
        "func.func", "func.call", "func.call", "stablehlo.negate", "func.return",
        "func.func", "stablehlo.dot", "func.return",
    ]
    assert [site.callee for site in recorder.call_sites] == ["mlp", "mlp"]
    assert recorder.walked_functions == ["main", "mlp"]


NESTED = """module {
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %c = stablehlo.constant dense<true> : tensor<i1>
    %r = "stablehlo.if"(%c) ({
      %n = stablehlo.negate %x : tensor<4xf32>
      stablehlo.return %n : tensor<4xf32>
    }, {
      stablehlo.return %x : tensor<4xf32>
    }) : (tensor<i1>) -> tensor<4xf32>
    %a = stablehlo.abs %r : tensor<4xf32>
    return %a : tensor<4xf32>
  }
}
"""


def test_a_block_or_region_visited_alone_walks_the_regions_of_its_ops_once():
    # The walk leaves a block's op loop to walk an op's regions and comes back to the op after
    # it: each op once, in program order, from a block or a region as from the module.
    module = load_module_text(NESTED)
    body = module.body.operations[0].operation.regions[0]
    expected = ["stablehlo.constant", "stablehlo.if", "stablehlo.negate", "stablehlo.return",
                "stablehlo.return", "stablehlo.abs", "func.return"]
    for node in (body, body.blocks[0]):
        recorder = BoundedRecorder()
        recorder.visit(node)
        assert recorder.names == expected


class BoundedRecorder(OrderRecorder):
    """Fails, where a walk that starts a block again would run forever."""

    def visit(self, node):
        assert len(self.names) < 20, "the walk went round again"
        return super().visit(node)


def test_reducer_bodies_are_walked_unless_a_visitor_opts_out():
    recorder = OrderRecorder()
    recorder.visit(load_module_text(GEMM_AND_VECTOR))
    assert "stablehlo.reduce" in recorder.names
    assert recorder.names.count("stablehlo.add") == 2  # the add op and the reducer's scalar add


def test_short_op_names():
    assert short_op_name("stablehlo.dot_general") == "dot_general"
    assert short_op_name("mhlo.dot_general") == "dot_general"
    assert short_op_name("func.call") == "call"
    assert short_op_name("mhlo.cross-replica-sum") == "cross_replica_sum"


def test_every_shipped_visit_method_names_a_known_op():
    known = known_op_names() | {"module", "region", "block"}
    assert {"dot_general", "all_to_all", "rsqrt", "call"} <= known
    for visitor_class in (IRVisitor, FlopsVisitor, CommVisitor):
        methods = [name for name, _ in inspect.getmembers(visitor_class) if name.startswith("visit_")]
        unknown = [m for m in methods if m.removeprefix("visit_") not in known]
        assert unknown == [], f"{visitor_class.__name__} has visit methods for no op: {unknown}"


def test_module_round_trips_through_text():
    module = load_module_text(GEMM_AND_VECTOR)
    again = load_module_text(module_to_text(module))
    assert module_to_text(again) == module_to_text(module)


def test_followers_see_the_walk_of_their_own():
    """One shared walk (``walk_with``) gives the follower exactly the rows its own walk gives:
    same ops, positions and scopes, on dumps with collectives (checked by the two-visitor
    merge of ``analyze``, which relies on equal positions)."""
    for source in ("dumps/stablehlo/tiny_28_64_64_ring_attention_2x2_stage1_pairs1-1.mlir",
                   "dumps/mhlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir", COLLECTIVES):
        module = load_module_text(source) if source is COLLECTIVES else load_module(source)
        alone = CommVisitor()
        alone.visit(module)
        leader, follower = FlopsVisitor(), CommVisitor()
        leader.walk_with(module, follower)
        assert alone.rows, source
        assert follower.rows == alone.rows
        solo = FlopsVisitor()
        solo.visit(module)
        assert leader.rows == solo.rows and leader.scopes == solo.scopes


def test_only_ops_defined_without_regions_skip_the_read_of_their_regions():
    from jaxlib.mlir.dialects import func, stablehlo

    from hlo_analyzer.visitor import _has_no_regions

    assert _has_no_regions(stablehlo.AddOp) and _has_no_regions(stablehlo.DotGeneralOp)
    # a fixed count above zero, a variadic count, and an op class that says nothing
    for op_class in (stablehlo.WhileOp, stablehlo.ReduceOp, stablehlo.CaseOp, func.FuncOp,
                     ir.OpView):
        assert not _has_no_regions(op_class), op_class


def test_the_visitor_writers_page_runs_and_reads_the_ops_as_it_says():
    # docs/visitors.md's example on the bundled dump; the figures are read off the dump's text:
    # %3 = stablehlo.dot (4x16xf32, 16x32xf32) -> 4x32xf32: 4*32 elements of 4 bytes = 512;
    # the all-reduce's replica_groups = dense<[[0, 1], [2, 3]]> over a 4x16xf32: 256 bytes
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "visitors.md").read_text()
    [code] = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "stablehlo.dot (4, 16) (16, 32) -> (4, 32) f32 32 bits, 512 bytes at aten__mm @ " \
        "make_example_dump.py:93" in lines
    assert "stablehlo.dot (4, 32) (32, 16) -> (4, 16) f32 32 bits, 256 bytes at aten__mm @ " \
        "make_example_dump.py:95" in lines
    assert "convolution: spatial dims [2, 3] strides [2, 2]" in lines
    assert "all_reduce over [[0, 1], [2, 3]] of 256 bytes" in lines
    # every helper the page names exists where it says
    for name in re.findall(r"`(\w+)\(", page.split("## Shapes and element sizes")[1].split("## An example")[0]):
        assert callable(getattr(tensors, name)), name
    for name in ("TypeTable", "ELEMENT_BYTES"):
        assert hasattr(tensors, name), name
    for name in ("short_op_name", "SCALAR_BODY_OPS"):
        assert hasattr(visitor_module, name), name
