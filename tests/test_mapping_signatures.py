"""Mappings by op signature: ops with the same signature share one Op and one search and map to
equal kernels; a different shape or a different option is another signature."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware.systems import resolve_system
from hlo_analyzer.dataflow import build_dataflow
from hlo_analyzer.mapping.program import map_program
from hlo_analyzer.mapping.results import MappingOptions
from hlo_analyzer.mapping.works import Signatures
from hlo_analyzer.mlir import parse_module
from hlo_analyzer.report import analyze

# Two GEMMs of one signature (64x128 @ 128x256), one of another (32x128 @ 128x256); an
# exponential of each result (two of one shape, one of another).
PROGRAM = """
module {
  func.func @main(%a: tensor<64x128xf32>, %b: tensor<64x128xf32>, %c: tensor<32x128xf32>,
                  %w: tensor<128x256xf32>) -> (tensor<64x256xf32>, tensor<64x256xf32>, tensor<32x256xf32>) {
    %0 = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
    %1 = stablehlo.dot_general %b, %w, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
    %2 = stablehlo.dot_general %c, %w, contracting_dims = [1] x [0] : (tensor<32x128xf32>, tensor<128x256xf32>) -> tensor<32x256xf32>
    %3 = stablehlo.exponential %0 : tensor<64x256xf32>
    %4 = stablehlo.exponential %1 : tensor<64x256xf32>
    %5 = stablehlo.exponential %2 : tensor<32x256xf32>
    return %3, %4, %5 : tensor<64x256xf32>, tensor<64x256xf32>, tensor<32x256xf32>
  }
}
"""


@pytest.fixture(scope="module")
def program():
    module = parse_module(PROGRAM, "signatures.mlir")
    return analyze(module).rows, build_dataflow(module), resolve_system("tx8", 1).system


def eager(program, exp_ops: int):
    rows, graph, system = program
    return map_program(rows, graph, system.chip, system, MappingOptions(execution="eager", exp_ops=exp_ops))


def test_same_signature_same_kernel_other_shape_other_kernel(program):
    mapping = eager(program, exp_ops=1)
    gemm_a, gemm_b, gemm_c, exp_a, exp_b, exp_c = mapping.ops
    assert [op.kind for op in mapping.ops] == ["gemm"] * 3 + ["vector"] * 3
    # One search per signature: 64x128x256 and 32x128x256 GEMMs, exp of 64x256 and of 32x256.
    assert mapping.distinct_mappings == 4
    for first, second in ((gemm_a, gemm_b), (exp_a, exp_b)):
        assert second.position != first.position
        assert replace(second, position=first.position, positions=first.positions) == first
    # The other shape: 2*M*K*N = 2*64*128*256 = 4194304 against 2*32*128*256 = 2097152 FLOPs;
    # an exp costs one vector op per element: 64*256 = 16384 against 32*256 = 8192.
    assert (gemm_a.flops, gemm_c.flops) == (4194304, 2097152)
    assert (exp_a.flops, exp_c.flops) == (16384, 8192)
    assert gemm_c.latency_s != gemm_a.latency_s and exp_c.latency_s != exp_a.latency_s


def test_an_option_is_part_of_the_signature(program):
    once, four = eager(program, exp_ops=1), eager(program, exp_ops=4)
    # exp_ops=4 charges four vector ops per exponential element: 4*16384 and 4*8192; the GEMMs
    # do not depend on it.
    assert [op.flops for op in four.ops[3:]] == [65536, 65536, 32768]
    assert [op.flops for op in once.ops[3:]] == [16384, 16384, 8192]
    assert four.ops[:3] == once.ops[:3]
    assert four.ops[3].latency_s > once.ops[3].latency_s


def test_signatures_share_one_op_per_signature(program):
    rows, _, _ = program
    gemm_a, gemm_b, gemm_c = [row for row in rows if row.category == "gemm"]
    signatures = Signatures(exp_ops=1)
    first = signatures.gemm(gemm_a.position, (64, 128, 256, 1), gemm_a)
    second = signatures.gemm(gemm_b.position, (64, 128, 256, 1), gemm_b)
    other = signatures.gemm(gemm_c.position, (32, 128, 256, 1), gemm_c)
    assert first is not None and second is not None and other is not None
    assert second.op is first.op and (first.position, second.position) == (gemm_a.position, gemm_b.position)
    assert other.op is not first.op and other.op.flops == 2 * 32 * 128 * 256
    # An empty GEMM (M = 0) is no kernel, and stays none when asked again.
    assert signatures.gemm(0, (0, 128, 256, 1), gemm_a) is None
    assert signatures.gemm(1, (0, 128, 256, 1), gemm_a) is None
