"""Loops, conditionals, calls, nesting, convolution taps, replica-group forms and element sizes
of the analyzer, on small hand-written modules whose numbers are derived by hand below."""

import base64

import numpy as np
import pytest
from jax_child import run_jax
from jaxlib.mlir import ir

from hlo_analyzer import UnsupportedIRError, UsageError, analyze, load_module
from hlo_analyzer.comm import mesh_device_groups
from hlo_analyzer.control import parse_branch
from hlo_analyzer.mlir import default_context
from hlo_analyzer.table import render_report_table

DOT = "stablehlo.dot %x, %x : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>"
DOT_FLOPS = 2 * 4 * 4 * 4  # 2 * contract * prod(result) = 128


def call_chain(depth: int) -> str:
    """@f0 ... @f{depth-1}: each calls the next twice; the last holds one dot."""
    functions = []
    for level in range(depth - 1):
        functions.append(f"""  func.func private @f{level}(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %0 = func.call @f{level + 1}(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %1 = func.call @f{level + 1}(%0) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %1 : tensor<4x4xf32>
  }}""")
    functions.append(f"""  func.func private @f{depth - 1}(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %0 = {DOT}
    return %0 : tensor<4x4xf32>
  }}""")
    main = """  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = func.call @f0(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }"""
    return "module {\n" + "\n".join(functions + [main]) + "\n}\n"


def test_a_call_dag_of_depth_20_is_counted_per_call_site_from_one_walk_per_function():
    report = analyze(call_chain(20).encode())
    # @f19 is reached through 2**19 call paths, each running its dot once
    assert report.gemm_flops == 2 ** 19 * DOT_FLOPS
    assert len(report.rows) == 1 and report.rows[0].count == 2 ** 19


PUBLIC_CALLEE = f"""module {{
  func.func public @helper(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %0 = {DOT}
    return %0 : tensor<4x4xf32>
  }}
  func.func public @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %0 = func.call @helper(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %1 = func.call @helper(%0) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %1 : tensor<4x4xf32>
  }}
}}
"""


def test_a_public_function_called_from_main_is_counted_per_call_and_not_as_a_root():
    assert analyze(PUBLIC_CALLEE.encode()).gemm_flops == 2 * DOT_FLOPS  # not 3x


CYCLE = """module {
  func.func private @a(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = func.call @b(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
  func.func private @b(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = func.call @a(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = func.call @a(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}
"""


def test_a_call_cycle_is_one_error_line():
    with pytest.raises(UnsupportedIRError, match=r"call cycle @a -> @b -> @a") as error:
        analyze(CYCLE.encode())
    assert "\n" not in str(error.value)


def while_loop(limit: str, extra: str = "", direction: str = "LT") -> str:
    """A fori_loop: i from 0, i < limit, i += 1, one dot per iteration."""
    return f"""module {{
  func.func @main(%x: tensor<4x4xf32>, %n: tensor<i32>) -> tensor<4x4xf32> {{
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %zero, %acc = %x) : tensor<i32>, tensor<4x4xf32> {extra}
    cond {{
      %lim = {limit}
      %c = stablehlo.compare {direction}, %i, %lim : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    }} do {{
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      %y = stablehlo.dot %acc, %acc : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      stablehlo.return %next, %y : tensor<i32>, tensor<4x4xf32>
    }}
    return %r#1 : tensor<4x4xf32>
  }}
}}
"""


def test_a_counter_loop_counts_its_body_trip_count_times():
    report = analyze(while_loop("stablehlo.constant dense<7> : tensor<i32>").encode())
    assert report.gemm_flops == 7 * DOT_FLOPS
    assert [(loop.trip_count, loop.source) for loop in report.loops] == [(7, "counter")]
    # the compare and the add run 7 times each (one element): 14 vector FLOPs
    assert report.vector_flops == 14
    assert report.to_dict()["loops"][0]["trip_count"] == 7


def test_a_loop_bound_by_a_run_time_value_is_counted_once_and_flagged():
    report = analyze(while_loop("stablehlo.add %n, %n : tensor<i32>").encode())
    assert report.gemm_flops == DOT_FLOPS
    assert report.to_dict()["loops"][0]["trip_count"] == "unknown"
    assert any("not static" in note for note in report.notes)
    assert "unknown (body counted once)" in render_report_table(report)


def test_known_trip_count_in_backend_config_wins():
    config = 'attributes {backend_config = "{\\"known_trip_count\\":{\\"n\\":\\"3\\"}}"}'
    report = analyze(while_loop("stablehlo.add %n, %n : tensor<i32>", config).encode())
    assert report.gemm_flops == 3 * DOT_FLOPS
    assert report.loops[0].source == "known_trip_count"


CONDITIONAL = f"""module {{
  func.func @main(%p: tensor<i1>, %x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %r = "stablehlo.if"(%p) ({{
      %n = stablehlo.negate %x : tensor<4x4xf32>
      stablehlo.return %n : tensor<4x4xf32>
    }}, {{
      %d = {DOT}
      %e = stablehlo.dot %d, %d : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      stablehlo.return %e : tensor<4x4xf32>
    }}) : (tensor<i1>) -> tensor<4x4xf32>
    return %r : tensor<4x4xf32>
  }}
}}
"""


def test_a_conditional_counts_the_costliest_branch_unless_told_otherwise():
    module = CONDITIONAL.encode()
    report = analyze(module)  # max: the false branch, two dots
    assert (report.gemm_flops, report.vector_flops) == (2 * DOT_FLOPS, 0)
    assert report.conditionals[0].branch_flops == (16, 2 * DOT_FLOPS)
    assert report.conditionals[0].taken == 1
    first = analyze(module, branch=parse_branch("first"))
    assert (first.gemm_flops, first.vector_flops) == (0, 16)
    assert analyze(module, branch=parse_branch("1")).gemm_flops == 2 * DOT_FLOPS
    with pytest.raises(UsageError, match="only 2 branches"):
        analyze(module, branch=2)
    with pytest.raises(UsageError, match="--branch"):
        parse_branch("most")


def test_ten_thousand_nested_regions_are_walked_without_recursion():
    depth = 10_000  # built with the bindings: jaxlib's own parser fails far earlier
    with default_context(), ir.Location.unknown():
        module = ir.Module.parse("""module {
  func.func @main(%x: tensor<4x4xf32>, %p: tensor<i1>) -> tensor<4x4xf32> {
    return %x : tensor<4x4xf32>
  }
}""")
        entry = module.body.operations[0].regions[0].blocks[0]
        x, p = entry.arguments
        point = ir.InsertionPoint(entry.operations[0])
        for _ in range(depth):
            op = ir.Operation.create("stablehlo.if", results=[x.type], operands=[p], regions=2,
                                     ip=point)
            else_block = op.regions[1].blocks.append()
            ir.Operation.create("stablehlo.return", operands=[x], ip=ir.InsertionPoint(else_block))
            point = ir.InsertionPoint(op.regions[0].blocks.append())
        dot = ir.Operation.create("stablehlo.dot", results=[x.type], operands=[x, x], ip=point)
        ir.Operation.create("stablehlo.return", operands=[dot.result], ip=point)
    report = analyze(module)
    assert report.gemm_flops == DOT_FLOPS  # the innermost true branch is the costliest each time
    assert len(report.conditionals) == depth


def convolution(padding: str, lhs_dilation: str = "[1, 1]") -> str:
    # input 1x6x2x2 (N, C, H, W), kernel 8x6x7x7 (O, I, H, W), padding 3: output 1x8x2x2
    return f"""module {{
  func.func @main(%x: tensor<1x6x2x2xf32>, %k: tensor<8x6x7x7xf32>) -> tensor<1x8x2x2xf32> {{
    %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1],
      window = {{stride = [1, 1], pad = {padding}, lhs_dilate = {lhs_dilation}, rhs_dilate = [1, 1]}}
      {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}}
      : (tensor<1x6x2x2xf32>, tensor<8x6x7x7xf32>) -> tensor<1x8x2x2xf32>
    return %0 : tensor<1x8x2x2xf32>
  }}
}}
"""


def test_convolution_counts_only_taps_on_real_input():
    # Dense formula: 2 * (1*8*2*2 outputs) * 49 taps * 6 in-features = 18,816. Per spatial dim,
    # output o reads input o + k - 3, real for k in {3 - o, 4 - o}: 2 taps x 2 outputs = 4;
    # 4 * 4 = 16 (o, k) pairs: 2 * (1*8) * 6 * 16 = 1,536 (XLA's HloCostAnalysis figure).
    assert analyze(convolution("[[3, 3], [3, 3]]").encode()).gemm_flops == 1536


def test_f8_f4_and_i2_collectives_are_sized_in_bits():
    # 128 elements gathered over 4 devices: f8 128 B, f4 64 B, i2 32 B; each sends M * 3/4.
    for dtype, message in (("f8E4M3FN", 128), ("f4E2M1FN", 64), ("i2", 32)):
        text = f"""module {{
  func.func @main(%x: tensor<2x16x{dtype}>) -> tensor<8x16x{dtype}> {{
    %0 = "stablehlo.all_gather"(%x) {{all_gather_dim = 0 : i64,
      replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}}
      : (tensor<2x16x{dtype}>) -> tensor<8x16x{dtype}>
    return %0 : tensor<8x16x{dtype}>
  }}
}}
"""
        row = analyze(text.encode()).rows[0]
        assert (row.comm_bytes, row.comm_bytes_per_device) == (message, message * 3 / 4), dtype


def test_mesh_axes_give_the_groups_of_the_devices_that_differ_along_them():
    axes = [("x", 2), ("y", 4)]
    assert mesh_device_groups(axes, [], [("y", None)]).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh_device_groups(axes, [], [("x", None)]).tolist() == [
        [0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh_device_groups(axes, [], [("x", None), ("y", None)]).tolist() == [list(range(8))]
    # explicit device order: the mesh position (i, j) holds ids[4 * i + j]
    ids = [7, 6, 5, 4, 3, 2, 1, 0]
    assert mesh_device_groups(axes, ids, [("y", None)]).tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    # sub-axis y:(2)2 is the minor half of y (split as [pre 2, size 2, rest 1])
    assert mesh_device_groups(axes, [], [("y", (2, 2))]).tolist() == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh_device_groups(axes, [], [("y", (1, 2))]).tolist() == [
        [0, 2], [1, 3], [4, 6], [5, 7]]


MESH_AXES = """module attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=4], device_ids=[7, 6, 5, 4, 3, 2, 1, 0]>
  func.func @main(%x: tensor<2x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64,
      replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh,
        axes = [#stablehlo.axis_ref<name = "y">]>}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64,
      replica_groups = #stablehlo.replica_group_mesh_axes<mesh = #stablehlo.mesh<axes = [
        #stablehlo.mesh_axis<name = "a", size = 2>, #stablehlo.mesh_axis<name = "b", size = 4>]>,
        axes = [#stablehlo.axis_ref<name = "a">]>}> : (tensor<2x16xf32>) -> tensor<4x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
"""


def test_replica_groups_over_an_sdy_mesh_and_an_inline_mesh():
    rows = analyze(MESH_AXES.encode()).rows
    # 'y' of the sdy mesh: 4 devices, first group the mesh's ids 7, 6, 5, 4; 512 B * 3/4
    assert (rows[0].group_size, rows[0].num_groups, rows[0].replica_group) == (4, 2, (7, 6, 5, 4))
    assert rows[0].comm_bytes_per_device == 512 * 3 / 4
    # 'a' of the inline 2x4 mesh (iota): groups {0, 4}, {1, 5}, ...; 256 B * 1/2
    assert (rows[1].group_size, rows[1].num_groups, rows[1].replica_group) == (2, 4, (0, 4))
    assert rows[1].comm_bytes_per_device == 128


OPAQUE_AND_NEUTRAL = f"""module attributes {{mhlo.num_partitions = 8 : i32}} {{
  sdy.mesh @mesh = <["x"=8]>
  func.func private @gemm_impl(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %0 = {DOT}
    return %0 : tensor<4x4xf32>
  }}
  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{
    %a = sdy.sharding_constraint %x <@mesh, [{{"x"}}, {{}}]> : tensor<4x4xf32>
    %b = stablehlo.composite "my.gemm" %a {{decomposition = @gemm_impl}}
      : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %c = stablehlo.custom_call @lapack_sgetrf(%b) : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %c : tensor<4x4xf32>
  }}
}}
"""


def test_composites_custom_calls_and_shardy_annotations():
    report = analyze(OPAQUE_AND_NEUTRAL.encode())
    assert report.gemm_flops == DOT_FLOPS  # through the composite's decomposition
    assert report.custom_calls == {"lapack_sgetrf": 1}
    assert report.unhandled == {}
    assert report.program == "global"  # a sharding constraint: not yet partitioned
    assert "mesh" not in report.totals()
    assert "lapack_sgetrf x1" in render_report_table(report)


def test_a_collective_in_a_counted_loop_is_counted_per_iteration():
    body = """%g = "stablehlo.all_reduce"(%acc) ({
        ^bb0(%l: tensor<f32>, %r: tensor<f32>):
          %s = stablehlo.add %l, %r : tensor<f32>
          stablehlo.return %s : tensor<f32>
        }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4x4xf32>) -> tensor<4x4xf32>"""
    text = while_loop("stablehlo.constant dense<5> : tensor<i32>").replace(
        "%y = stablehlo.dot %acc, %acc : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>",
        body.replace("%g =", "%y ="))
    report = analyze(text.encode())
    # 64 B all-reduced over 2 devices: 2 * 64 * 1/2 = 64 B per iteration, 5 iterations
    assert report.comm_bytes_per_device == 5 * 64
    assert np.isclose(report.totals()["comm_ops"], 5)


def test_a_jax_export_artifact_is_upgraded_from_vhlo():
    serialized = run_jax("""
        import base64
        from jax import export

        exported = export.export(jax.jit(lambda a, b: a @ b))(
            jax.ShapeDtypeStruct((4, 8), "float32"), jax.ShapeDtypeStruct((8, 16), "float32"))
        emit(base64.b64encode(exported.mlir_module_serialized).decode())
    """)
    report = analyze(load_module(base64.b64decode(serialized)))
    assert report.gemm_flops == 2 * 8 * 4 * 16
