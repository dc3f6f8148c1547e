"""The plan search's traced-kernel estimate (issue 32, ``planning.plan_estimate``): the two
calibration shapes and the rescaling of their integers, derived by hand; and, with the trace
extra, the kernels of a calibration rescaled to a shape against the kernels a trace at that
shape finds."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from hardware import Op, OpType, load_system
from hlo_analyzer.mapping.kernel_list import sources_document, sources_from_document
from hlo_analyzer.mapping.results import KernelSource
from models.opensora.config import get_config
from models.opensora.inputs import geometry
from planning.plan_estimate import (
    CalibrationShapes,
    KernelCosts,
    _Rescaler,
    calibration_geometry,
    calibration_shapes,
    decode_exponents,
    forced_flash,
    request_config,
    rescale_value,
    scale_factors,
    self_attention_flash,
    stage_roles,
)


def test_calibration_shapes_keep_the_powers_of_two_and_the_height():
    # full at 204_640_360: T = 204*5//17 = 60 = 4 * 15, token columns 640/8/2 = 40 = 8 * 5, so
    # T0 = 3 * 4 = 12 (41 frames: 41*5//17 = 12) and W0 = 3 * 8 = 24 (24 * 2 * 8 = 384 px);
    # the second shape 3 T0 = 36 (123 frames: 615//17 = 36) and 5 W0 = 120 (1920 px).
    base, scaled, t_ratio, w_ratio = calibration_shapes(get_config("full"), "204_640_360")
    assert (base, scaled) == ("41_384_360", "123_1920_360")
    assert (t_ratio, w_ratio) == (Fraction(60, 12), Fraction(40, 24))
    # 51_1280_720: T = 15 (odd): T0 = 3; columns 80 = 16 * 5: W0 = 48
    base, scaled, t_ratio, w_ratio = calibration_shapes(get_config("full"), "51_1280_720")
    assert base == "11_768_720" and (t_ratio, w_ratio) == (5, Fraction(80, 48))


def test_the_frames_power_of_two_is_capped_by_the_stage_chips():
    # 102_1280_720: T = 102*5//17 = 30 = 2 * 15. On a stage of 2 or more chips T0 keeps the 2
    # (T0 = 6: 21 frames, 21*5//17 = 6); on one chip no split asks about it: T0 = 3, the
    # calibration of 51_1280_720 (T = 15), with T / T0 = 10.
    full = get_config("full")
    assert calibration_shapes(full, "102_1280_720", 2)[:2] == ("21_768_720", "62_3840_720")
    base, scaled, t_ratio, w_ratio = calibration_shapes(full, "102_1280_720", 1)
    assert (base, scaled) == calibration_shapes(full, "51_1280_720", 1)[:2] == ("11_768_720", "31_3840_720")
    assert (t_ratio, w_ratio) == (Fraction(30, 3), Fraction(80, 48))
    # 408_640_360: T = 120 = 8 * 15: T0 = 24 on 8 chips, 12 (204_640_360's, T = 60 = 4 * 15) on 4
    # or 6 chips (a largest power of two of 4)
    assert calibration_shapes(full, "408_640_360", 8)[0] == "82_384_360"
    assert calibration_shapes(full, "408_640_360", 4)[0] == calibration_shapes(full, "204_640_360")[0] == "41_384_360"
    assert calibration_shapes(full, "408_640_360", 6)[0] == "41_384_360"
    costs = KernelCosts(Path("unused"))
    assert costs.key("full", "408_640_360", "ds_ulysses", (2, 2), None, 1) == \
        costs.key("full", "204_640_360", "ds_ulysses", (2, 2), None, 1)
    assert scale_factors(full, "41_384_360", "408_640_360") == (Fraction(120, 12), Fraction(40, 24))


def test_calibration_shapes_keep_the_odd_primes_a_stage_splits_by():
    """full at 408_640_360: T = 120 = 8 x 3 x 5, token columns W = 40 = 8 x 5. On 15 chips every
    split divides 15: T0 keeps 2^0 (15 has no 2) and 3 x 5 (T0 = 15: 51 frames, 51*5//17 = 15),
    W0 keeps its 8 and the 5 (W0 = 40: 640 px); T0 already holds the 3 of 15 and W0 the 5, so
    the factors stay 3 and 5: 45 frames (153*5//17 = 45), 200 columns (3200 px). The powers of
    two alone (the training calibration's) gave 82_384_360 (T0 = 24, W0 = 24: 23 x 24 tokens a
    frame, no 5, while 23 x 40 has one)."""
    full = get_config("full")
    assert calibration_geometry(full, "408_640_360", 15) == CalibrationShapes(
        "51_640_360", "153_3200_360", Fraction(8), Fraction(1), (3, 5))
    assert calibration_shapes(full, "408_640_360", 15)[:2] == ("82_384_360", "245_1920_360")
    # 45 = 9 x 5 chips: T0 = 15 holds one 3 of two, so 3 cannot scale it (a split by 9 would
    # divide 3 T0 and not T0): the frames' factor is 5 (T0 holds the one 5), the columns' 7
    # (W0 = 40 has no 3; 5 is taken): 75 frames (255*5//17 = 75), 280 columns (4480 px)
    assert calibration_geometry(full, "408_640_360", 45) == CalibrationShapes(
        "51_640_360", "255_4480_360", Fraction(8), Fraction(1), (5, 7))
    # 6 chips: T0 = 2 x 3 = 6 (21 frames); W = 40 has no 3, so W0 = 8 gets the filler 5, not 3
    # (3 would make a split by 3 divide W0 and not W): W0 = 40
    six = calibration_geometry(full, "408_640_360", 6)
    assert (six.base, six.scaled) == ("21_640_360", "62_3200_360")
    # powers of two: as before (the tests above)
    eight = calibration_geometry(full, "408_640_360", 8)
    assert (eight.base, eight.scaled) == calibration_shapes(full, "408_640_360", 8)[:2]
    costs = KernelCosts(Path("unused"))
    key = costs.key("full", "408_640_360", "ring_attention", (5, 9), None, 1)
    assert (key.base_shape, key.factors) == ("51_640_360", (5, 7))


@pytest.mark.parametrize("shape", ["51_1280_720", "102_1280_720", "204_640_360", "408_640_360"])
def test_every_split_divides_the_calibration_shapes_as_it_divides_the_plans(shape):
    """For every stage of 1 to 64 chips and every split ``d`` of it (a divisor), ``d`` divides
    the frames, the token columns, a frame's tokens (rows x columns) and a sequence of all
    (frames x tokens) at both calibration shapes exactly when it divides them at the plan's."""
    full = get_config("full")

    def sizes(text: str) -> tuple[int, ...]:
        geo = geometry(full, text)
        return geo.T, geo.W_patches, geo.S, geo.T * geo.S

    plan = sizes(shape)
    for chips in range(1, 65):
        found = calibration_geometry(full, shape, chips)
        for small in (sizes(found.base), sizes(found.scaled)):
            for d in (d for d in range(2, chips + 1) if chips % d == 0):
                assert [v % d == 0 for v in small] == [v % d == 0 for v in plan], (chips, d, found)


def test_exponents_are_read_from_the_ratio_of_the_two_shapes():
    assert decode_exponents(1152, 1152) == (0, 0)
    assert decode_exponents(12, 12 * 3) == (1, 0)
    assert decode_exponents(24 * 12, 24 * 12 * 3 * 5) == (1, 1)
    assert decode_exponents(7, 7 * 25 * 9) == (2, 2)
    assert decode_exponents(7, 8) is None
    # a calibration scaled by 5 and 7 (``calibration_geometry`` on 45 chips)
    assert decode_exponents(7, 7 * 5 * 49, (5, 7)) == (1, 2)
    assert decode_exponents(7, 7 * 5 * 49) is None
    assert rescale_value(15 * 40, 75 * 280, Fraction(8), Fraction(1), (5, 7)) == (120 * 40, True)


def test_a_product_of_frames_and_columns_is_rescaled_exactly():
    # 2 samples x T x W tokens of one row: 2*12*24 at the first shape, 2*36*120 at the second;
    # at T = 60, W = 40: 2*60*40 = 4800
    assert rescale_value(2 * 12 * 24, 2 * 36 * 120, Fraction(5), Fraction(5, 3)) == (4800, True)
    # an attention's score FLOPs over W^2: 4 * 16 * 24^2 * 72 -> 4 * 16 * 40^2 * 72
    assert rescale_value(4 * 16 * 24 ** 2 * 72, 4 * 16 * 120 ** 2 * 72, Fraction(5),
                         Fraction(5, 3)) == (4 * 16 * 40 ** 2 * 72, True)
    # no product of powers (a sum: 12 + 1 -> 36 + 1): the nearest, flagged inexact
    value, exact = rescale_value(13, 37, Fraction(5), Fraction(5, 3))
    assert not exact and 13 <= value <= 13 * 5


def test_rescaling_walks_records_and_refuses_programs_that_differ():
    rescaler = _Rescaler(Fraction(2), Fraction(1))
    assert rescaler({"shape": [3, 1152], "kind": "gemm"}, {"shape": [9, 1152], "kind": "gemm"}) == \
        {"shape": [6, 1152], "kind": "gemm"}
    assert (rescaler.values, rescaler.inexact) == (2, 0)
    with pytest.raises(ValueError, match="differ"):
        rescaler([1, 2], [1, 2, 3])


def _attention_record(heads: int, s_q: int, s_kv: int, vector_flops: int) -> dict:
    q, kv = [1, heads, s_q, 72], [1, heads, s_kv, 72]
    return {"name": "flash_attention", "op_type": "FlashAttention", "input_shapes": [q, kv, kv],
            "output_shape": q, "flops": 4 * heads * s_q * s_kv * 72, "vector_flops": vector_flops}


def test_a_fused_attentions_softmax_work_is_rescaled_as_scores_and_rows():
    # A softmax is 5 ops per score and one less per row for each of its two reductions: 5 P - 2 R
    # (P = heads x S_Q x S_KV scores, R = heads x S_Q rows). The spatial attention of 2 x T
    # frames x 16 heads over S = 23 x W tokens: heads 2*16*T. At (T0, W0) = (12, 24), at
    # (36, 120), and the plan (60, 40): 1920 x 920 x 920.
    def softmax(heads, s):
        return 5 * heads * s * s - 2 * heads * s

    base = _attention_record(384, 552, 552, softmax(384, 552))
    scaled = _attention_record(1152, 2760, 2760, softmax(1152, 2760))
    rescaler = _Rescaler(Fraction(5), Fraction(5, 3))
    record = rescaler(base, scaled)
    assert record["input_shapes"][0] == [1, 1920, 920, 72]
    assert record["vector_flops"] == 5 * 1920 * 920 * 920 - 2 * 1920 * 920
    assert rescaler.inexact == 0
    # as one product of powers (the nearest), it would be off: 5 P - 2 R is none
    assert rescale_value(softmax(384, 552), softmax(1152, 2760), Fraction(5), Fraction(5, 3))[1] is False
    # the captions' cross-attention: 300 keys a row at both shapes, so scores and rows are one
    # product (3 P + 4 R = 3*300 R + 4 R): rescaled as any integer
    cross = rescaler(_attention_record(32, 552, 300, 904 * 32 * 552), _attention_record(32, 2760, 300, 904 * 32 * 2760))
    assert cross["vector_flops"] == 904 * 32 * 920


def test_the_kernel_document_round_trips_with_its_collectives():
    op = Op("stablehlo.dot", OpType.GEMM, ((64, 32),), (32, 16), (64, 16), 2 * 64 * 32 * 16)
    kernels = (KernelSource("stablehlo.dot", "gemm", "64x32->64x16", op),
               KernelSource("all_to_all", "collective", "", None, collective=("all_to_all", 4, 4096, (0, 1, 2, 3))))
    back, execution = sources_from_document(sources_document(kernels, "torch"))
    assert execution == "torch"
    assert back[0].op == op and back[1].collective == ("all_to_all", 4, 4096, (0, 1, 2, 3))


def test_calibrations_force_the_self_attention_kernel_the_plans_shape_runs(tmp_path):
    """OpenSora fuses a self-attention only over a sequence longer than its batch. full at
    408_640_360: T = 408*5//17 = 120 frames, 23 patch rows of 40 columns. With M = 4 patches a
    patch is ceil(23/4) = 6 rows, 240 tokens: the spatial attention over 240 tokens in a batch of
    2 x 120 = 240 is not longer, so no fused kernel (the temporal one, 120 frames in a batch of
    2 x 240, neither); both calibration shapes (T0 = 24, W0 = 24 columns: 6 x 24 = 144 tokens
    against 2 x 24 = 48; 72 frames, 720 tokens against 144) would fuse it, so the calibration
    forces the plan's choice. With M = 2 (12 rows, 480 tokens > 240) and at 204_640_360 with
    M = 4 (240 tokens > 2 x 60) every shape fuses it: nothing is forced."""
    full = get_config("full")
    assert self_attention_flash(full, "408_640_360", 4) == (False, False)
    assert self_attention_flash(full, "408_640_360", 2) == (True, False)
    assert self_attention_flash(full, "82_384_360", 4) == (True, False)
    assert forced_flash(full, "408_640_360", 4) == (False, False)
    assert forced_flash(full, "408_640_360", 2) is None
    assert forced_flash(full, "204_640_360", 4) is None
    costs = KernelCosts(tmp_path)
    key = costs.key("full", "408_640_360", "ds_ulysses", (2, 1), None, 4)
    assert key.flash == (False, False) and key.name.endswith("_attention-spatialplain-temporalplain")
    unforced = costs.key("full", "408_640_360", "ds_ulysses", (2, 1), None, 2)
    assert unforced.flash is None and "attention" not in unforced.name
    # the tracer gets the choice, and names its dump after it (another program)
    _, requests = costs._requests(key, stages=(0,))
    config = request_config(requests[0])
    assert config.self_attention_flash == (False, False)
    assert config.dump_name(0).endswith("_attention-spatialplain-temporalplain")
    assert request_config(costs._requests(unforced, stages=(0,))[1][0]).self_attention_flash is None


def test_stage_roles():
    assert stage_roles(1) == ("flat",)
    assert stage_roles(2) == ("first", "last")
    assert stage_roles(4) == ("first", "middle", "middle", "last")


#: The temporal attention's q/k RMSNorm and RoPE after the q/k/v projection (fused kernel name).
ROPE_EPILOGUE = "fusion(multiply,add,power,reduce,compare,divide,select,rsqrt,negate)"


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "flash", "strategy", "mesh", "hardware"), [
    ("68_256_360", None, "ds_ulysses", (1, 2), "8xh100"), ("164_64_360", (False, False), "ds_ulysses", (1, 2), "8xh100"),
    ("68_320_360", None, "ring_attention", (1, 5), "8xh100"),
    ("82_384_360", None, "megatron", (1, 4), "tx8-16"), ("102_256_360", None, "megatron", (1, 4), "tx8-16")])
def test_rescaled_calibration_kernels_cost_what_a_trace_at_the_shape_costs(tmp_path, shape, flash, strategy, mesh,
                                                                          hardware):
    """The claim of the estimate: the kernels of the two small traces, rescaled to the plan's
    shape, are the kernels a trace at that shape finds, group by group (the full model's three
    pairs at a small shape). 68_256_360 on ds_ulysses 1 x 2: T = 20, 16 token columns. At
    164_64_360 (T = 48, 23 x 4 = 92 tokens a frame) the spatial attention, 92 tokens in a batch
    of 2 x 48 = 96, runs unfused, while both calibration shapes (48 frames of 23 x 12 = 276
    tokens, 144 frames of 23 x 60) would fuse it: the calibration must force the plan's choice.
    68_320_360 on a ring of 5 (T = 20 = 4 x 5, 20 = 4 x 5 token columns, 23 x 20 = 460 tokens a
    frame, all split by 5): the calibration shapes keep the 5 (T0 = 5, W0 = 20; then 15 frames
    of 100 columns); with the powers of two alone (T0 = W0 = 12: 23 x 12 tokens, no 5) the ring
    split would pad in the first shape and not in the plan's.

    On TX8 (fused kernels) megatron 1 x 4 splits the temporal attention's q/k/v projection to
    N = 3 x 1152 / 4 = 864 columns, whose epilogue would read RoPE's tables of T x 72 (5 of
    them) and 146 elements more: 360 T + 146 elements, within 8 rows of N = 6912 up to T = 18.
    82_384_360 (T = 24: 8786, no epilogue) calibrates at T0 = 12 (4466: fused) and 36 (13106:
    not), two programs of different length; 102_256_360 (T = 30: 10946, no epilogue) at T0 = 6
    (2306) and 18 (6626), both fused where the plan's program is not. The epilogue is decided at
    the plan's shape (``fusion.resolve_epilogues``)."""
    pytest.importorskip("torch_xla")
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import NETWORK_KIND, MappingOptions
    from planning.plan_estimate import GROUPS, analyze_calibration_stage, run_calibration_traces

    system = load_system(hardware)
    # TX8's fused vector kernels hold integers that are no product of powers, which the
    # rescaling rounds (``Calibration.inexact``): a reduction's n - 1 adds a row, a kernel's
    # width (its output over its rows, rounded up: 2307 for 2306 columns at 82_384_360). They
    # move a group's time by under 10^-5; the epilogue the test is about is 3 % of a pair's.
    tolerance = 1e-9 if hardware == "8xh100" else 2e-5
    costs = KernelCosts(tmp_path)
    key = costs.key("full", shape, strategy, mesh, None, 1)
    assert key.flash == flash
    rescaled = costs.stage(key, shape, system)
    _, requests = costs._requests(key, stages=(0,))
    # the plan's own trace: the model's rule decides (nothing forced)
    direct = dict(requests[0], shape=shape, out=str(tmp_path / "direct"), flash=None)
    run_calibration_traces([direct], tmp_path)  # in a process of its own, as the estimate traces
    # as analyze-pipeline maps it: every epilogue decided by the analyzer at the plan's sizes
    part = analyze_calibration_stage(str(next((tmp_path / "direct").glob("*.mlir"))), system, defer=False)
    calibration = costs.calibration(key, system)
    rescaler = key.rescaler(shape)
    for name in GROUPS:
        kernels, execution = sources_from_document(part.groups[name])
        found, _ = sources_from_document(rescaler(calibration.base.groups[name], calibration.scaled.groups[name]))
        # the same kernels (a consumer left out of its GEMM's epilogue comes right after the GEMM)
        assert sorted(k.name for k in found) == sorted(k.name for k in kernels), name
        program = map_kernels(kernels, system.chip, system, MappingOptions(execution=execution))
        comm = sum(op.latency_s for op in program.ops if op.kind == NETWORK_KIND)
        assert rescaled.groups[name].compute_s == pytest.approx(program.latency_s - comm, rel=tolerance), name
        assert rescaled.groups[name].comm_s == pytest.approx(comm, rel=1e-9, abs=1e-15), name
    if hardware.startswith("tx8"):  # the q/k/v projection's epilogue, not taken at the plan's shape
        pair = [k.name for k in sources_from_document(part.groups["pair1"])[0]]
        assert ROPE_EPILOGUE in pair and not any(n.endswith("+" + ROPE_EPILOGUE) for n in pair), pair
