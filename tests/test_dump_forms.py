"""Dumps users bring that the analyzer misread (issue 33, "every dump read right"), each built here:

* XLA's ``before_spmd-partitioning`` dump of a JAX program (``--xla_dump_to``; Shardy's shardings
  arrive there as HLO ``sharding={...}`` on the ops), in HLO text and converted to StableHLO and
  MHLO: the global program, never multiplied by the device count;
* ``#mhlo.replica_group_mesh_axes``, MHLO's spelling of mesh-axes replica groups: read as the
  StableHLO and HLO text forms are;
* a ``while`` whose bound is a loop variable carried unchanged from a constant outside the loop
  (the pattern of torch-xla's ``max_pool2d_with_indices``; the torch-xla program itself:
  ``tests/test_max_pool_torch.py``): its trip count is found;
* ``select_and_scatter``: measured, by a hand count that XLA's HloCostAnalysis confirms, and mapped
  as a windowed reduction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jax_child import run_jax

from hardware import Op, OpType, load_chip, map_op
from hlo_analyzer import analyze
from hlo_analyzer.cli import analyze_command
from hlo_analyzer.mlir import hlo_text_to_mlir_text, load_module_text
from hlo_analyzer.tensors import splits_tensor
from hlo_trace.cli import run_click

F32 = 4
DIALECTS = ("hlo", "stablehlo", "mhlo")


def in_dialect(hlo_text: str, dialect: str):
    """The module of an HLO text as given, or converted to StableHLO or MHLO text first (the
    project's converters, as a user's tool would write it)."""
    if dialect == "hlo":
        return load_module_text(hlo_text)
    return load_module_text(hlo_text_to_mlir_text(hlo_text, dialect))


def analyze_json(capsys, *args) -> dict:
    code = run_click(analyze_command, [str(a) for a in args] + ["--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


# -- the before_spmd-partitioning dump ------------------------------------------------------------
#: An MLP, tensor parallel on a 2x4 mesh (x: batch, y: the hidden dimension), compiled once by
#: jax with XLA dumping the SPMD partitioner's input and output.
JAX_MLP = """
    import glob, os
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))
    def arg(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
    def mlp(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2
    jax.jit(mlp, out_shardings=NamedSharding(mesh, P("x", None))).lower(
        arg((16, 64), P("x", None)), arg((64, 128), P(None, "y")),
        arg((128, 64), P("y", None))).compile()
    emit(sorted(os.path.basename(p) for p in glob.glob(os.path.join(os.environ["DUMP"], "*.txt"))))
"""


@pytest.fixture(scope="module")
def mlp_dumps(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("xla_dump")
    flags = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={out} "
             "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning")
    names = run_jax(JAX_MLP, env={"XLA_FLAGS": flags, "DUMP": str(out)})
    # jax/jaxlib 0.10.2 name the partitioner's input after Shardy's export pass:
    # module_0000.jit_mlp.0000.spmd-partitioner.after_shardy-xla.before_spmd-partitioning.txt
    [before] = [n for n in names if "after_shardy-xla.before_spmd-partitioning" in n]
    [after] = [n for n in names if "after_spmd-partitioning" in n]
    return {"before": out / before, "after": out / after}


#: Hand counts: x 16x64 @ w1 64x128 and tanh(.) 16x128 @ w2 128x64, 2 FLOPs per multiply-add:
#: 2 * 16*64*128 * 2 = 524,288 for the whole mesh; tanh 16*128 = 2,048. Split over 2 x 4 devices
#: each device computes 65,536 GEMM FLOPs and 256 tanh elements.
GLOBAL_GEMM, GLOBAL_TANH, DEVICES = 524_288, 2_048, 8


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_before_spmd_partitioning_dump_is_the_global_program(mlp_dumps, dialect):
    text = mlp_dumps["before"].read_text()
    assert "sharding={devices=[2,4]" in text  # Shardy's sharding of the first dot's result
    report = analyze(in_dialect(text, dialect))
    assert report.num_devices == DEVICES
    assert report.program == "global"
    assert "mesh" not in report.totals()  # no whole-mesh multiplication
    assert (report.gemm_flops, report.vector_flops) == (GLOBAL_GEMM, GLOBAL_TANH)
    assert report.unhandled == {}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_partitioned_dump_of_the_same_compile_stays_per_device(mlp_dumps, dialect):
    """Its arguments keep their shardings, its ops have none: one device's program, whose mesh
    total is the global program's."""
    report = analyze(in_dialect(mlp_dumps["after"].read_text(), dialect))
    assert report.program == "per-device"
    assert report.gemm_flops == GLOBAL_GEMM // DEVICES
    assert report.totals()["mesh"]["gemm_flops"] == GLOBAL_GEMM


def test_the_command_reports_the_dump_file_as_global(capsys, mlp_dumps):
    document = analyze_json(capsys, mlp_dumps["before"])
    assert document["program"] == "global"
    assert "mesh" not in document["totals"]
    assert document["totals"]["gemm_flops"] == GLOBAL_GEMM


@pytest.mark.parametrize(("sharding", "splits"), [
    ("{devices=[2,4]<=[8]}", True),
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", True),  # 2 tiles, each on 4 devices
    ("{{devices=[2,4]<=[8]}, {replicated}}", True),  # a tuple: one element is split
    ("{devices=[1,1,8]<=[8] last_tile_dim_replicate}", False),  # all 8 hold the whole tensor
    ("{devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}", False),
    ("{replicated}", False), ("{maximal device=0}", False), ("{manual}", False), ("{}", False),
    ("not a sharding", False),
])
def test_which_shardings_split_a_tensor(sharding, splits):
    assert splits_tensor(sharding) is splits


REPLICATED_OPS = """module attributes {mhlo.num_partitions = 8 : i32} {
  func.func @main(%x: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"})
      -> tensor<4x4xf32> {
    %0 = stablehlo.dot %x, %x {mhlo.sharding = "{replicated}"} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}
"""


def test_shardings_that_split_nothing_leave_a_program_per_device():
    """An op every device computes whole (replicated) says nothing of partitioning; an argument's
    sharding is kept after partitioning too."""
    assert analyze(REPLICATED_OPS.encode()).program == "per-device"
    split = REPLICATED_OPS.replace('{mhlo.sharding = "{replicated}"}',
                                   '{mhlo.sharding = "{devices=[2,4]<=[8]}"}')
    assert analyze(split.encode()).program == "global"


# -- #mhlo.replica_group_mesh_axes ----------------------------------------------------------------
#: Collectives whose groups are mesh axes of a 2x4 mesh ('x' major), as jax 0.10 writes them in
#: partitioned HLO: an all-reduce of f32[4] (16 B) over y, an all-gather of f32[2,16] to
#: f32[4,16] over x, an all-reduce over the sub-axis y:(2)2 (y split as [2, 2], the second half).
MESH_AXES_HLO = """HloModule mesh_axes, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[4], q: f32[2,16]) -> (f32[4], f32[4,16], f32[4]) {
  %p = f32[4]{0} parameter(0)
  %q = f32[2,16]{1,0} parameter(1)
  %over_y = f32[4]{0} all-reduce(%p), channel_id=1, replica_groups=mesh['x'=2,'y'=4] {'y'}, use_global_device_ids=true, to_apply=%add
  %over_x = f32[4,16]{1,0} all-gather(%q), channel_id=2, replica_groups=mesh['x'=2,'y'=4] {'x'}, dimensions={0}, use_global_device_ids=true
  %over_sub = f32[4]{0} all-reduce(%p), channel_id=3, replica_groups=mesh['x'=2,'y'=4] {'y':(2)2}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[4]{0}, f32[4,16]{1,0}, f32[4]{0}) tuple(%over_y, %over_x, %over_sub)
}
"""

#: (group size, groups, first group, bytes each device sends), by hand. Device (i, j) of the iota
#: mesh is 4i + j. Over y: {0, 1, 2, 3}, {4, ...}; all-reduce 2 * 16 * 3/4 = 24 B. Over x: {0, 4},
#: {1, 5}, ...; all-gather of the 256 B result * 1/2 = 128 B. Over y:(2)2 (the minor half of y):
#: {0, 1}, {2, 3}, ...; 2 * 16 * 1/2 = 16 B.
MESH_AXES_EXPECTED = [(4, 2, (0, 1, 2, 3), 24.0), (2, 4, (0, 4), 128.0), (2, 4, (0, 1), 16.0)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mesh_axes_replica_groups_read_alike_in_every_spelling(dialect):
    module = in_dialect(MESH_AXES_HLO, dialect)
    if dialect == "mhlo":
        assert "#mhlo.replica_group_mesh_axes" in str(module)
    rows = [row for row in analyze(module).rows if row.category == "comm"]
    assert [(r.group_size, r.num_groups, r.replica_group, r.comm_bytes_per_device)
            for r in rows] == MESH_AXES_EXPECTED


def test_the_command_reads_an_mhlo_dump_with_mesh_axes(capsys, tmp_path):
    dump = tmp_path / "mesh_axes.mhlo.mlir"
    dump.write_text(hlo_text_to_mlir_text(MESH_AXES_HLO, "mhlo"))
    document = analyze_json(capsys, dump)
    assert document["totals"]["comm_bytes_per_device"] == sum(e[3] for e in MESH_AXES_EXPECTED)


# -- a loop bound carried through the loop ---------------------------------------------------------
CARRIED_BOUND = """func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %seven = stablehlo.constant dense<7> : tensor<i32>
  %r:3 = stablehlo.while(%i = %zero, %n = %seven, %acc = %x) : tensor<i32>, tensor<i32>, tensor<4x4xf32>
    cond {
      %c = stablehlo.compare COMPARE, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      BOUND_UPDATE
      %y = stablehlo.dot %acc, %acc : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      stablehlo.return %next, %m, %y : tensor<i32>, tensor<i32>, tensor<4x4xf32>
    }
  return %r#2 : tensor<4x4xf32>
}
"""
#: One 4x4 @ 4x4 dot per iteration: 2 * 4 * 4 * 4 = 128 FLOPs.
DOT = 128


def carried_bound(update: str, compare: str = "LT, %i, %n") -> str:
    return CARRIED_BOUND.replace("BOUND_UPDATE", update).replace("COMPARE, %i, %n", compare)


@pytest.mark.parametrize(("update", "compare"), [
    ("%m = mhlo.copy %n : tensor<i32>", "LT, %i, %n"),  # for (i = 0; i < n; i++), n = 7
    ("%m = stablehlo.convert %n : tensor<i32>", "GT, %n, %i"),  # n > i, through a no-op convert
    ("%m = stablehlo.reshape %n : (tensor<i32>) -> tensor<i32>", "LE, %i, %n"),  # 8 trips
])
def test_a_bound_carried_unchanged_from_a_constant_gives_the_trip_count(update, compare):
    report = analyze(carried_bound(update, compare).encode())
    trips = 8 if compare.startswith("LE") else 7
    [loop] = report.loops
    assert (loop.trip_count, loop.source) == (trips, "counter")
    assert report.gemm_flops == trips * DOT
    assert not report.notes


@pytest.mark.parametrize("update", [
    # the bound moves: i < n - k, an unknown number of trips as far as the pattern goes
    "%m = stablehlo.subtract %n, %one : tensor<i32>",
    # through i8 and back: a round trip that changes values past 127 is no proof of "unchanged"
    "%narrow = stablehlo.convert %n : (tensor<i32>) -> tensor<i8>\n"
    "      %m = stablehlo.convert %narrow : (tensor<i8>) -> tensor<i32>",
    # another loop variable handed back in its place
    "%m = mhlo.copy %i : tensor<i32>",
])
def test_a_bound_the_body_may_change_stays_unknown(update):
    report = analyze(carried_bound(update).encode())
    [loop] = report.loops
    assert (loop.trip_count, loop.source) == (None, "unknown")
    assert report.gemm_flops == DOT  # the body counted once, and said so
    assert any("not static" in note for note in report.notes)


# -- select_and_scatter ----------------------------------------------------------------------------
#: Max pool's backward on 2x3x8x8 f32: 3x3 windows at stride 2 give a 2x3x3x3 source.
SELECT_AND_SCATTER = """HloModule select_and_scatter

%ge (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=GE
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[2,3,8,8], s: f32[2,3,3,3]) -> f32[2,3,8,8] {
  %x = f32[2,3,8,8]{3,2,1,0} parameter(0)
  %s = f32[2,3,3,3]{3,2,1,0} parameter(1)
  %zero = f32[] constant(0)
  ROOT %r = f32[2,3,8,8]{3,2,1,0} select-and-scatter(%x, %s, %zero), window={size=1x1x3x3 stride=1x1x2x2}, select=%ge, scatter=%add
}
"""
#: Per source element (2*3*3*3 = 54) one window of 9: 8 selects pick the element, 1 scatter adds.
SOURCE, WINDOW = 2 * 3 * 3 * 3, 9


@pytest.mark.parametrize("dialect", DIALECTS)
def test_select_and_scatter_is_measured(dialect):
    report = analyze(in_dialect(SELECT_AND_SCATTER, dialect))
    assert report.unhandled == {}
    [row] = report.rows
    assert row.op.endswith("select_and_scatter") and row.category == "vector"
    assert row.flops == SOURCE * WINDOW == 486


def test_select_and_scatter_flops_equal_xla_cost_analysis():
    xla = run_jax(f"""
        from jaxlib import _hlo, _jax
        module = _hlo.hlo_module_from_text({SELECT_AND_SCATTER!r})
        emit(_jax.hlo_module_cost_analysis(jax.devices()[0].client, module)["flops"])
    """)
    assert analyze(load_module_text(SELECT_AND_SCATTER)).vector_flops == xla == SOURCE * WINDOW


def test_select_and_scatter_maps_as_a_windowed_reduction(capsys, tmp_path):
    """One kernel whose rows are the 54 windows (not the 384 elements of its result), reading
    the operand and the source (the scalar init is a constant, folded in), writing the result:
    the Op below, on TX8; under --exec torch a kernel of the reduction class."""
    dump = tmp_path / "select_and_scatter.hlo.txt"
    dump.write_text(SELECT_AND_SCATTER)
    [kernel] = analyze_json(capsys, dump, "--hw", "tx8", "--exec", "eager")["mapping"]["kernels"]
    result = 2 * 3 * 8 * 8
    # in bytes, each tensor in its own element type (all f32 here): 54 rows of ceil(384 x 4 / 54) B
    hand = Op("select_and_scatter", OpType.VECTOR, ((2 * 3 * 8 * 8 * F32,), (2 * 3 * 3 * 3 * F32,)), None,
              (SOURCE, -(-result * F32 // SOURCE)), SOURCE * WINDOW, 1)
    expected = map_op(hand, load_chip("tx8"))
    assert (kernel["flops"], kernel["dram_s"]) == (hand.flops, pytest.approx(expected.dram_s, rel=1e-12))
    assert kernel["latency_s"] == pytest.approx(expected.latency_s, rel=1e-12)
    [torch_kernel] = analyze_json(capsys, dump, "--hw", "h100-sxm", "--exec", "torch")["mapping"]["kernels"]
    assert torch_kernel["name"].startswith("reduction(")

