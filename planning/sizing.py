"""Sizing (``plan-search --target-latency S --max-devices N``, and
``--target-step-time S`` with ``--mode train``): the smallest device count whose best plan meets
the target, and the curve of the best estimate against the device count.

For every device count ``n`` from 1 to ``--max-devices`` that the model can use (the counts the
plan spaces accept), the plans of ``n`` devices are enumerated and estimated on the first ``n``
chips of the ``--hw`` system (a multi-node system holds them node by node: ``n`` beyond one node
crosses the NICs) with the estimates that ``plan-search`` ranks by:
``planning.plan_search.estimate_plan`` for inference (with ``kernels``, the traced-kernel estimate of
``planning.plan_estimate``: the calibrations of every count's plans are traced first, a few hundred
small traces up to 64 devices, cached across shapes and systems; without, the ideal estimate,
2.0-4x off for pipelines), ``planning.train_search.estimate_train_plan`` for training. The best
plan of ``n`` is the fastest whose estimated memory per device fits. With the traced-kernel
estimate, a plan whose calibration cannot be traced (or whose two calibration programs differ)
is not ranked at all, rather than ranked by the ideal estimate (3-4x lower on a GPU): the report
counts such plans per count and names the first reason. The answer is the smallest
``n`` whose best meets the target; ``confirm`` traces it (plan-search's tracer, or the training
pair trace) so that the answer rests on a traced figure.

Inference answers are traced until one holds (:func:`confirm_inference`): the estimate's best
plan of the answer's count is traced; when its traced latency misses the target, every estimate
is scaled by the smallest traced / estimated ratio of the traces so far (as plan-search's bound
takes the smallest) and the smallest untried count whose scaled estimate meets the target is
traced next, up to a budget of traced plans. Once a traced plan meets the target, the best
estimated plan of the next smaller count is traced too: when it misses, the answer stands and
the miss is shown; when it meets the target as well, it is the answer and its own smaller
neighbour is traced, and so on down. The answer is then the smallest traced count that meets the
target (None if none did within the budget), with every trace listed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hardware import load_system
from hardware.spec import SystemSpec
from hlo_trace.errors import UsageError

__all__ = ["SizingPoint", "SizingResult", "SizingTrace", "confirm_inference", "size_inference",
           "size_training"]


@dataclass(frozen=True)
class SizingPoint:
    """The best plan on ``devices`` devices: its label, estimated seconds (inference latency or
    training step) and memory per device; None when no plan fits."""

    devices: int
    plans: int
    best_label: str | None
    seconds: float | None
    memory_bytes: float | None
    #: Plans of ``devices`` left out of the ranking: the traced-kernel estimate could not
    #: calibrate them (``SizingResult.uncalibrated`` says why).
    uncalibrated: int = 0


@dataclass(frozen=True)
class SizingTrace:
    """One traced confirmation: the best estimated plan of ``devices`` devices, traced."""

    devices: int
    label: str
    estimate_s: float
    traced_s: float | None
    traced_memory_bytes: float | None
    error: str | None = None


@dataclass(frozen=True)
class SizingResult:
    mode: str
    config: str
    shape: str
    hardware: str
    target_s: float
    memory_limit_bytes: float
    curve: tuple[SizingPoint, ...]
    answer: SizingPoint | None
    #: The answer's best plan object (a ``Plan`` or a ``TrainPlan``), for the confirmation.
    answer_plan: object | None = None
    #: The best plan object of every count (for the confirmation's next tries).
    plans: tuple[tuple[int, object], ...] = ()
    #: The traced confirmations, in the order they ran (inference; :func:`confirm_inference`).
    traces: tuple[SizingTrace, ...] = ()
    #: Whether ``answer`` rests on a trace that met the target.
    confirmed: bool = False
    #: The best estimated plan of the next smaller count than the confirmed answer, traced and
    #: missing the target (None: no smaller count has a plan that fits, or no confirmed answer).
    missed_below: SizingTrace | None = None
    #: (plan label, reason) of every plan the traced-kernel estimate could not calibrate (not
    #: ranked; ``SizingPoint.uncalibrated``).
    uncalibrated: tuple[tuple[str, str], ...] = ()


def _answer(curve: Sequence[SizingPoint], target_s: float) -> SizingPoint | None:
    return next((p for p in curve if p.seconds is not None and p.seconds <= target_s), None)


def _limit(system: SystemSpec, memory_limit_bytes: float | None, hardware: str) -> float:
    limit = system.chip.dram_capacity_bytes if memory_limit_bytes is None else memory_limit_bytes
    if limit is None:
        raise UsageError(f"--hw {hardware}: the chip has no memory capacity; pass --memory-limit")
    return limit


def _check_devices(system: SystemSpec, max_devices: int, hardware: str) -> None:
    if max_devices > system.chip_count:
        raise UsageError(f"--max-devices {max_devices}: {system.name} has {system.chip_count} chips; "
                         "pass a system with enough (e.g. --hw tx8-64, --hw 8x8xh100)")


def _sizing_inputs(hardware: str, max_devices: int, memory_limit_bytes: float | None,
                   device_counts: Sequence[int] | None):
    """The system, the memory limit per device and the device counts to try (checked)."""

    system = load_system(hardware)
    _check_devices(system, max_devices, hardware)
    limit = _limit(system, memory_limit_bytes, hardware)
    counts = list(device_counts) if device_counts is not None else list(range(1, max_devices + 1))
    return system, limit, counts


def size_inference(config: str, shape: str, hardware: str, target_s: float, max_devices: int, *,
                   memory_limit_bytes: float | None = None, steps: int = 30,
                   device_counts: Sequence[int] | None = None,
                   progress: Callable[[int, int], None] | None = None, kernels=None,
                   calibrating: Callable[[int, int], None] | None = None) -> SizingResult:
    """The inference sizing of the module doc; ``kernels`` (a ``planning.plan_estimate
    .KernelCosts``): ranked with the traced-kernel estimate, its calibrations of every count
    traced first (``calibrating(done, total)`` as they are written)."""
    from planning.plan_search import calibration_keys, enumerate_plans, estimate_plan

    system, limit, counts = _sizing_inputs(hardware, max_devices, memory_limit_bytes, device_counts)
    spaces = {n: enumerate_plans(config, shape, n) for n in counts}
    if kernels is not None:
        plans = [plan for space in spaces.values() for plan in space.plans]
        kernels.prepare(calibration_keys(plans, kernels), system,
                        boundaries=any(plan.case.pipeline.stages > 1 for plan in plans), progress=calibrating)
    curve, plans_of, uncalibrated = [], {}, []
    for n in counts:
        space = spaces[n]
        best, refused = None, len(uncalibrated)
        for plan in space.plans:
            try:
                estimate = estimate_plan(plan, system, steps=steps, kernels=kernels, fallback=False)
            except ValueError as error:  # not calibrated: no ideal stand-in (module doc)
                uncalibrated.append((plan.label, str(error)))
                continue
            if estimate.memory_bytes <= limit and (best is None or estimate.latency_s < best[1].latency_s):
                best = (plan, estimate)
        curve.append(SizingPoint(n, len(space.plans), None if best is None else best[0].label,
                                 None if best is None else best[1].latency_s,
                                 None if best is None else best[1].memory_bytes,
                                 len(uncalibrated) - refused))
        plans_of[n] = None if best is None else best[0]
        if progress is not None:
            progress(n, len(space.plans))
    answer = _answer(curve, target_s)
    return SizingResult("infer", config, shape, hardware, target_s, limit, tuple(curve), answer,
                        None if answer is None else plans_of[answer.devices],
                        tuple((n, plan) for n, plan in plans_of.items() if plan is not None),
                        uncalibrated=tuple(uncalibrated))


def size_training(config: str, shape: str, hardware: str, target_s: float, max_devices: int, *,
                  batch: int, memory_limit_bytes: float | None = None,
                  device_counts: Sequence[int] | None = None,
                  micro_batch_counts: Sequence[int] = (1, 2, 4, 8),
                  progress: Callable[[int, int], None] | None = None) -> SizingResult:
    """The training sizing of the module doc (the global ``batch`` fixed across counts)."""
    from planning.train_search import enumerate_train_plans, search_train

    system, limit, counts = _sizing_inputs(hardware, max_devices, memory_limit_bytes, device_counts)
    curve, plans_of = [], {}
    for n in counts:
        space = enumerate_train_plans(config, shape, n, batch=batch, micro_batch_counts=micro_batch_counts)
        result = search_train(config, shape, hardware, space, devices=n, memory_limit_bytes=limit)
        best = result.best
        curve.append(SizingPoint(n, len(result.outcomes), None if best is None else best.plan.label,
                                 None if best is None else best.estimate.step_s,
                                 None if best is None else best.estimate.memory_bytes))
        plans_of[n] = None if best is None else best.plan
        if progress is not None:
            progress(n, len(result.outcomes))
    answer = _answer(curve, target_s)
    return SizingResult("train", config, shape, hardware, target_s, limit, tuple(curve), answer,
                        None if answer is None else plans_of[answer.devices])


#: Traces one plan; returns (latency s, memory bytes) or an error string (plan-search's tracer).
PlanTracer = Callable[[object], "tuple[float, float] | str"]


def confirm_inference(result: SizingResult, trace: PlanTracer, *, budget: int = 3) -> SizingResult:
    """Trace the answer, and further counts by the scaled estimate until a traced plan meets
    the target or ``budget`` plans were traced; then the smaller neighbours of the answer until
    one misses (module doc)."""
    import dataclasses

    plans = dict(result.plans)
    by_count = {p.devices: p for p in result.curve if p.seconds is not None and p.devices in plans}
    traces: list[SizingTrace] = []

    def run(point: SizingPoint) -> SizingTrace:
        value = trace(plans[point.devices])
        traced = (SizingTrace(point.devices, point.best_label, point.seconds, None, None, value)
                  if isinstance(value, str) else
                  SizingTrace(point.devices, point.best_label, point.seconds, value[0], value[1]))
        traces.append(traced)
        return traced

    def meets(traced: SizingTrace) -> bool:
        return (traced.traced_s is not None and traced.traced_s <= result.target_s
                and traced.traced_memory_bytes <= result.memory_limit_bytes)

    scale = 1.0
    answer = None
    while len(traces) < budget:
        tried = {t.devices for t in traces}
        candidates = [n for n in sorted(by_count) if n not in tried
                      and by_count[n].seconds * scale <= result.target_s]
        if not candidates:
            break
        if meets(run(by_count[candidates[0]])):
            answer = by_count[candidates[0]]
            break
        done = [t.traced_s / t.estimate_s for t in traces if t.traced_s is not None]
        scale = min(done) if done else scale
    if answer is None:
        return dataclasses.replace(result, answer=None, answer_plan=None, traces=tuple(traces),
                                   confirmed=False)
    missed = None
    while missed is None:
        smaller = [n for n in by_count if n < answer.devices]
        if not smaller:
            break
        below = by_count[max(smaller)]
        known = next((t for t in traces if t.devices == below.devices), None)
        traced = known if known is not None else run(below)
        if meets(traced):
            answer = below
        else:
            missed = traced
    return dataclasses.replace(result, answer=answer, answer_plan=plans[answer.devices], traces=tuple(traces),
                               confirmed=True, missed_below=missed)
