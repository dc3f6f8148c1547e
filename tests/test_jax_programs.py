"""analyze-hlo on real JAX programs: 8 virtual CPU devices, a 2x4 mesh ('x', 'y'), each program
in the four export forms (tests/jax_programs.py, run once in a subprocess so that the 8-device
XLA flag never reaches this process).

For every form: GEMM FLOPs equal a hand count (global for the pre-partition forms, per device
for the partitioned ones) and XLA's HloCostAnalysis after the reconciliation documented in
hlo_analyzer/flops.py; communication bytes equal a hand count from the ring formulas.
"""

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hlo_analyzer import IRVisitor, analyze, load_module
from hlo_analyzer.flops import XLA_TRANSCENDENTAL_OPS
from hlo_analyzer.visitor import short_op_name

pytest.importorskip("jax")

FORMS = ("lowered.mlir", "lowered.hlo.txt", "compiled.hlo.txt", "spmd.hlo.txt")
GLOBAL_FORMS = ("lowered.mlir", "lowered.hlo.txt")
F32 = 4


@dataclass(frozen=True)
class Expected:
    global_gemm: int
    device_gemm: int
    device_comm: float  # bytes each device sends in the partitioned forms
    global_comm: float = 0.0  # pre-partition: only shard_map bodies hold collectives
    trip_count: int | None = None


# Hand counts (2 FLOPs per multiply-add; ring volumes, M the formula's tensor, n the group):
EXPECTED = {
    # x 16x64 @ w1 64x128, tanh, @ w2 128x64: 2*16*64*128 * 2 = 524,288; split 2 (x) * 4 (y).
    # Partial sums of the local 8x64 f32 result all-reduced over y (n=4): 2 * 2048 * 3/4.
    "mlp": Expected(524_288, 65_536, 2 * 8 * 64 * F32 * 3 / 4),
    # q, k, v, o projections 4 * 2*128*64*64 = 4,194,304; scores and p@v 2 * 2*(8*4)*16*16*16
    # = 524,288; total 4,718,592, split 8 ways; the 4x16x64 f32 output all-reduced over y.
    "attention": Expected(4_718_592, 589_824, 2 * 4 * 16 * 64 * F32 * 3 / 4),
    # 6 layers of 16x64 @ 64x64 = 6 * 131,072; batch split over x (2).
    "scan": Expected(786_432, 393_216, 0, trip_count=6),
    # 5 iterations of 16x64 @ 64x64; batch split over x.
    "fori": Expected(655_360, 327_680, 0, trip_count=5),
    # the costliest branch: two 16x64 @ 64x64 (the other is a tanh); batch split over x.
    "cond": Expected(262_144, 131_072, 0),
    # shard_map over a (8, 16) f32 block (512 B), group y (n=4): psum 2*512*3/4 = 768,
    # all_gather of the 32x16 result 2048*3/4 = 1536, psum_scatter of 2048 B 1536,
    # ppermute 512, all_to_all 512*3/4 = 384: 4,736 in every form.
    "collectives": Expected(0, 0, 4_736, global_comm=4_736),
    # 8x8x10x10 input, 16x2x3x3 kernel, 4 groups: output 8x16x8x8, each summing 2*3*3 taps:
    # 2 * 8192 * 18 = 294,912. The partitioner all-gathers the batch (4 -> 8 rows, 25,600 B,
    # over x, n=2: 12,800 B) and every device computes the whole convolution.
    "conv_grouped": Expected(294_912, 294_912, 8 * 8 * 10 * 10 * F32 / 2),
    # 8x4x5x5 input, lhs dilation 2 (9x9), padding 2 (13x13), 6x4x3x3 kernel: 11x11 outputs.
    # Per dimension output o reads dilated position o + k - 2, real when even and in [0, 9):
    # 15 (o, k) pairs; 2 * (8*6) * 4 * 15 * 15 = 86,400 (the dense formula: 209,088).
    # Batch split over x: 43,200.
    "conv_padded": Expected(86_400, 43_200, 0),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jax_programs")
    script = Path(__file__).with_name("jax_programs.py")
    result = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                            text=True, timeout=300)
    if result.returncode == 3:
        pytest.skip("jax cannot make 8 virtual CPU devices")
    assert result.returncode == 0, result.stderr[-2000:]
    return out


class ConvertElements(IRVisitor):
    """Elements produced by ``convert`` ops, each region walked once (XLA's while convention)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def visit_convert(self, op):
        self.elements += math.prod(op.operation.results[0].type.shape)


def xla_convention_flops(report, module) -> float:
    """Our measurement in XLA HloCostAnalysis's conventions: each op once (a while body once,
    the costliest branch), dots/convolutions + non-transcendental element-wise ops + one per
    element of convert and of all-reduce results (its additions), and -1 per custom_call
    (HloCostAnalysis's 'unknown cost')."""
    flops = 0.0
    for row in report.rows:
        if row.count == 0:
            continue
        if row.category == "gemm":
            flops += row.flops
        elif row.category == "vector" and short_op_name(row.op) not in XLA_TRANSCENDENTAL_OPS:
            flops += row.flops
        elif row.op.endswith("all_reduce"):
            flops += row.comm_bytes / F32
    converts = ConvertElements()
    converts.visit(module)
    return flops + converts.elements - sum(report.custom_calls.values())


def gemm_once(report) -> int:
    return sum(row.flops for row in report.rows if row.category == "gemm" and row.count)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_jax_program_in_every_form(programs, name, form):
    expected = EXPECTED[name]
    module = load_module(programs / f"{name}.{form}")
    report = analyze(module, name=f"{name}.{form}")
    is_global = form in GLOBAL_FORMS
    assert report.program == ("global" if is_global else "per-device")
    assert ("mesh" in report.totals()) is (not is_global)
    assert report.unhandled == {}
    assert report.gemm_flops == (expected.global_gemm if is_global else expected.device_gemm)
    assert report.comm_bytes_per_device == (expected.global_comm if is_global
                                            else expected.device_comm)
    if expected.trip_count is not None:
        assert [loop.trip_count for loop in report.loops] == [expected.trip_count]
        assert gemm_once(report) * expected.trip_count == report.gemm_flops
    xla = json.loads((programs / f"{name}.json").read_text())[form]
    if form == "lowered.mlir":
        # XLA analyzed the HLO text of this program, where the export adds xla.sdy.* custom_calls
        # (sharding bookkeeping) that it charges -1 each: add them back.
        xla += sum(analyze(programs / f"{name}.lowered.hlo.txt").custom_calls.values())
    assert xla_convention_flops(report, module) == xla
