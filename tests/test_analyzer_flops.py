"""FLOPs of hand-written programs; every expected number is derived in the comment beside it."""

from analyzer_samples import CALLS, GEMM_AND_VECTOR, UNKNOWN_OP
from jax_child import run_jax

from hlo_analyzer import FlopsVisitor, analyze, load_module_text
from hlo_analyzer.mlir import module_to_text, stablehlo_to_mhlo


def flops_by_op(source: str) -> list[tuple[str, int]]:
    visitor = FlopsVisitor()
    visitor.visit(load_module_text(source))
    return [(row.op, row.flops) for row in visitor.rows]


def test_each_op_kind_has_its_hand_derived_flops():
    assert flops_by_op(GEMM_AND_VECTOR) == [
        # dot_general (2,3,4)x(2,4,5), batch dim 0, contract 4: 2 * 4 * (2*3*5) = 240
        ("stablehlo.dot_general", 240),
        # dot (4,8)x(8,16): 2 * 8 * (4*16) = 1024
        ("stablehlo.dot", 1024),
        # conv, 2 feature groups: kernel (6,2,3,3) -> 2 in-features per group, window 3*3,
        # result (1,6,6,6) = 216 elements: 2 * 216 * 9 * 2 = 7776
        ("stablehlo.convolution", 7776),
        # conv, 2 batch groups: input batch 4 -> output batch 2, kernel (2,3,2,2): 3 in-features,
        # window 2*2, result (2,2,4,4) = 64 elements: 2 * 64 * 4 * 3 = 1536
        ("stablehlo.convolution", 1536),
        ("stablehlo.add", 64),  # one per element of 4x16
        ("stablehlo.rsqrt", 64),
        ("stablehlo.reduce", 60),  # 4x16 -> 4: 64 - 4 combines
    ]


def test_gemm_and_vector_totals_split_by_category():
    report = analyze(load_module_text(GEMM_AND_VECTOR))
    assert report.gemm_flops == 240 + 1024 + 7776 + 1536
    assert report.vector_flops == 64 + 64 + 60
    assert report.unhandled == {}
    # transpose and constant are data movement: handled, no FLOPs, no row
    assert report.op_counts["stablehlo.transpose"] == 1


def test_convolution_flops_agree_with_xla_cost_analysis():
    """Independent figure: XLA's HloCostAnalysis on the same convolutions compiled by jax."""
    xla_flops = run_jax("""
        def grouped(lhs, rhs):
            return jax.lax.conv_general_dilated(lhs, rhs, (1, 1), "VALID", feature_group_count=2)

        lhs, rhs = jnp.zeros((1, 4, 8, 8)), jnp.zeros((6, 2, 3, 3))
        emit(jax.jit(grouped).lower(lhs, rhs).compile().cost_analysis()["flops"])
    """)
    assert xla_flops == 7776


def test_calls_are_followed_once_per_call_and_dead_functions_are_not_counted():
    # @mlp is called twice: 2 * (2 * 8 * 32) = 1024; negate 32; @never_called contributes nothing.
    report = analyze(load_module_text(CALLS))
    assert report.gemm_flops == 1024
    assert report.vector_flops == 32
    assert report.unhandled == {}


def test_ops_no_visitor_handles_are_listed_not_dropped():
    report = analyze(load_module_text(UNKNOWN_OP))
    assert report.unhandled == {"stablehlo.cholesky": 2}


def test_mhlo_form_gives_the_same_numbers_as_stablehlo():
    stablehlo_report = analyze(load_module_text(GEMM_AND_VECTOR))
    mhlo_text = module_to_text(stablehlo_to_mhlo(load_module_text(GEMM_AND_VECTOR)))
    assert "mhlo.dot_general" in mhlo_text and "stablehlo." not in mhlo_text
    mhlo_report = analyze(load_module_text(mhlo_text))
    assert [r.flops for r in mhlo_report.rows] == [r.flops for r in stablehlo_report.rows]
    assert mhlo_report.unhandled == {}


def test_a_compute_row_is_the_row_built_by_keywords():
    # rows.compute_row builds the tuple itself (speed): it must equal OpRow's own construction,
    # field for field, whatever fields OpRow gains.
    from hlo_analyzer.rows import VECTOR, OpRow, compute_row

    fast = compute_row(7, "stablehlo.add", "model.py:3", VECTOR, ((4, 8), (4, 8)), ((4, 8),),
                       "f32", 32, 2)
    assert fast == OpRow(7, "stablehlo.add", "model.py:3", VECTOR, ((4, 8), (4, 8)), ((4, 8),),
                         "f32", flops=32, scope=2)
    assert type(fast) is OpRow and fast.count == 1 and fast.comm_latency_s is None
