"""Inference sizing's confirmation (``planning.sizing.confirm_inference``): the answer is the
smallest traced count that meets the target, and the next smaller count's best estimated plan is
traced too and shown to miss. Hand-made curves and tracers; no trace. And plans the traced-kernel
estimate cannot calibrate are left out of the ranking, and the report says so."""

from __future__ import annotations

from hardware import load_system
from planning.sizing import SizingPoint, SizingResult, confirm_inference
from planning.sizing_cli import render_sizing

SHAPE = "28_64_64"
#: A shape the tiny model's calibration accepts (a temporal patch of 1, a latent width the
#: patch divides).
TINY_SHAPE = "68_256_360"


def _result(seconds: dict[int, float], target: float) -> SizingResult:
    curve = tuple(SizingPoint(n, 1, f"plan{n}", s, 1e9) for n, s in seconds.items())
    answer = next(p for p in curve if p.seconds <= target)
    return SizingResult("infer", "tiny", SHAPE, "x", target, 2e9, curve, answer, f"p{answer.devices}",
                        plans=tuple((n, f"p{n}") for n in seconds))


def _tracer(factor: float, order: list[str]):
    def trace(plan: str):
        order.append(plan)
        return (factor * 8.0 / int(plan[1:]), 1e9)
    return trace


def test_the_smaller_neighbour_of_a_confirmed_answer_is_traced_and_shown_to_miss():
    """Estimates 8, 4, 2, 1 s on 1, 2, 4, 8 devices, traced as estimated, target 4.5 s: 2
    devices (4 s) is traced and meets it; 1 device (8 s), its neighbour, is traced and misses."""
    order: list[str] = []
    result = confirm_inference(_result({1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}, 4.5), _tracer(1.0, order), budget=3)
    assert order == ["p2", "p1"]
    assert result.confirmed and result.answer.devices == 2
    assert result.missed_below.devices == 1 and result.missed_below.traced_s == 8.0
    assert "the next smaller count, 1 devices, misses it" in render_sizing(result)


def test_a_neighbour_that_meets_the_target_is_the_answer_and_its_own_neighbour_is_traced():
    """Traced at half the estimate, target 2.5 s: 4 devices (2 s estimated) traces 1 s and
    meets it; 2 devices traces 2 s and meets it too, so it is the answer; 1 device traces 4 s
    and misses."""
    order: list[str] = []
    result = confirm_inference(_result({1: 8.0, 2: 4.0, 4: 2.0}, 2.5), _tracer(0.5, order), budget=3)
    assert order == ["p4", "p2", "p1"]
    assert result.answer.devices == 2 and result.answer_plan == "p2"
    assert result.missed_below.devices == 1 and result.missed_below.traced_s == 4.0


def test_an_answer_on_the_smallest_count_has_no_neighbour_to_miss():
    order: list[str] = []
    result = confirm_inference(_result({1: 8.0, 2: 4.0}, 9.0), _tracer(1.0, order), budget=3)
    assert order == ["p1"] and result.answer.devices == 1 and result.missed_below is None


def test_plans_the_kernel_estimate_cannot_calibrate_are_not_ranked_by_the_ideal_one(tmp_path):
    """Every calibration of the tiny model's one-device plans recorded as refused by the tracer
    (as ``KernelCosts`` caches a failed calibration): sizing ranks none of them (no ideal
    stand-in, which is 3-4x low on a GPU) and says so in its report."""
    from planning.plan_estimate import Calibration, KernelCosts
    from planning.plan_search import calibration_keys, enumerate_plans
    from planning.sizing import size_inference

    system = load_system("8xh100")
    kernels = KernelCosts(tmp_path)
    plans = enumerate_plans("tiny", TINY_SHAPE, 1).plans
    for key in calibration_keys(plans, kernels):
        kernels._write(Calibration(key, system.chip.name, None, None, error="the split needs a 5"), system.chip.name)
    result = size_inference("tiny", TINY_SHAPE, "8xh100", 1e9, 1, kernels=kernels)
    (point,) = result.curve
    assert point.seconds is None and point.uncalibrated == point.plans == len(plans) > 0
    assert result.answer is None and len(result.uncalibrated) == len(plans)
    assert result.uncalibrated[0][1] == "calibration not traced: the split needs a 5"
    text = render_sizing(result)
    assert f"NOT RANKED: {len(plans)} plan(s) could not be calibrated" in text
    assert f"none fits  ({len(plans)} not calibrated, not ranked)" in text
