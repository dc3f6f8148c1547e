"""The bundled torch-xla dump: the three forms agree, and XLA's own cost analysis agrees."""

import json

import pytest
from jax_child import run_jax

from hlo_analyzer import analyze
from hlo_analyzer.rows import VECTOR
from hlo_trace.examples import examples_root

DUMPS = examples_root()
NAME = "example_mlp_megatron_2x2"
# XLA's HloCostAnalysis counts these as transcendentals, not flops.
TRANSCENDENTAL_OPS = {"tanh", "power", "exponential", "log", "rsqrt", "sqrt", "logistic"}


@pytest.fixture(scope="module")
def sidecar():
    return json.loads((DUMPS / f"{NAME}.json").read_text())


@pytest.fixture(scope="module")
def reports():
    return {
        form: analyze(DUMPS / f"{NAME}.{suffix}")
        for form, suffix in (("stablehlo", "stablehlo.mlir"), ("mhlo", "mhlo.mlir"),
                             ("hlo", "hlo.txt"))
    }


def test_gemm_flops_match_the_hand_count_in_the_sidecar(reports, sidecar):
    # conv 4x4x2x2 * 16x4x2x2 per device: 2*(4*16)*(2*2)*4 = 2048; fc1 (4x16)@(16x32): 4096;
    # fc2 (4x32)@(32x16): 4096 — derived by hand when the dump was made.
    assert sidecar["flops_per_device"]["gemm_total"] == 2048 + 4096 + 4096
    assert reports["stablehlo"].gemm_flops == sidecar["flops_per_device"]["gemm_total"]


def test_the_megatron_all_reduce_is_found(reports, sidecar):
    (expected,) = sidecar["expected_collectives"]
    comm = [row for row in reports["stablehlo"].rows if row.category == "comm"]
    assert [(r.comm_kind, r.comm_bytes, r.group_size) for r in comm] == [
        ("all_reduce", expected["bytes"], len(expected["replica_groups"][0]))
    ]
    assert reports["stablehlo"].num_devices == sidecar["devices"] == 4


def test_collectives_by_kind_are_an_attribute_like_the_totals(reports, sidecar):
    # one all-reduce of M bytes over a group of n: 2M(n-1)/n sent per device (ring)
    (expected,) = sidecar["expected_collectives"]
    m, n = expected["bytes"], len(expected["replica_groups"][0])
    report = reports["stablehlo"]
    assert report.comm_by_kind == {"all_reduce": {"count": 1, "bytes_per_device": 2 * m * (n - 1) / n}}
    assert report.comm_by_kind["all_reduce"]["bytes_per_device"] == report.comm_bytes_per_device
    assert report.to_dict()["comm_by_kind"] == report.comm_by_kind


def test_stablehlo_mhlo_and_hlo_text_give_the_same_totals(reports):
    totals = {form: report.totals() for form, report in reports.items()}
    assert totals["stablehlo"] == totals["mhlo"] == totals["hlo"]
    assert reports["stablehlo"].unhandled == reports["mhlo"].unhandled == {}


def test_gemm_flops_agree_with_xla_hlo_cost_analysis(reports):
    """Independent figure: XLA's HloCostAnalysis of the partitioned HLO text (per device).

    Its ``flops`` = dots and convolutions + one per element of each non-transcendental
    element-wise op + one per element combined by an all-reduce. Removing the last two (read off
    the dump) must leave exactly our GEMM count.
    """
    cost = run_jax(f"""
        import jaxlib._hlo as hlo
        import jaxlib._jax as xla

        text = open({str(DUMPS / f"{NAME}.hlo.txt")!r}).read()
        emit(xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, hlo.hlo_module_from_text(text)))
    """)
    report = reports["stablehlo"]
    elementwise = sum(row.flops for row in report.rows if row.category == VECTOR
                      and row.op.split(".")[-1] not in TRANSCENDENTAL_OPS)
    all_reduce_elements = sum(
        row.comm_bytes // 4 for row in report.rows if row.comm_kind == "all_reduce")
    assert cost["flops"] - elementwise - all_reduce_elements == report.gemm_flops
