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

import pytest
from jax_child import run_jax

from hardware import Op, OpType, load_chip, map_op
from hlo_analyzer import analyze
from hlo_analyzer.cli import analyze_command
from hlo_analyzer.mlir import hlo_text_to_mlir_text, load_module_text
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
    hand = Op("select_and_scatter", OpType.VECTOR, ((2, 3, 8, 8), (2, 3, 3, 3)), None,
              (SOURCE, -(-result // SOURCE)), SOURCE * WINDOW, F32)
    expected = map_op(hand, load_chip("tx8"))
    assert (kernel["flops"], kernel["dram_s"]) == (hand.flops, pytest.approx(expected.dram_s, rel=1e-12))
    assert kernel["latency_s"] == pytest.approx(expected.latency_s, rel=1e-12)
    [torch_kernel] = analyze_json(capsys, dump, "--hw", "h100-sxm", "--exec", "torch")["mapping"]["kernels"]
    assert torch_kernel["name"].startswith("reduction(")

