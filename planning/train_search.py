"""Training plan search (``plan-search --mode train``): the fastest training
step that fits, estimated over every plan from the training formulas, the best confirmed by a
trace of one block pair's step.

A *training plan* (:class:`TrainPlan`) on ``devices`` chips:

* P pipeline stages of C = devices / P chips, each holding depth / P block pairs (1F1B with m
  micro-batches: ``micro_batches``);
* inside a stage one layout of ``models.opensora.parallel`` on a mesh ``nx x ny`` (nx * ny = C):
  ``dp`` (data parallel over all C: the batch split C ways), ``megatron`` (tensor parallel over
  all C), ``megatron_sp`` (tensor parallel with sequence parallelism over y, data parallel over
  x), ``ds_ulysses``, ``ring_attention``, ``usp`` (sequence parallel over y, data parallel over
  x; usp with its ring degree);
* ZeRO stage 0-3 over the data axes, full recompute or none.

The global batch (``--batch``, default: the devices) is cut into m micro-batches; a plan whose
micro-batch the layout cannot split evenly, or for which ``models.opensora.training_theory``
has no formula (ZeRO for megatron / megatron_sp / ds_ulysses / ring_attention, recompute for
megatron_sp and with ZeRO-3), or whose stage's pair the tracer's own checks refuse at the shape
(``planning.train_estimate.check_traceable``: no split of the sequence over y, ...) is listed
as refused with the reason.

The estimate (:func:`estimate_train_plan`), per device, one step:

* memory: P, G, OS of the stage's pairs (``training_buffer_bytes``) and Act: what a pair's
  forward keeps for the backward (``layout_training_activations`` on the micro-batch) times the
  stage's pairs times the micro-batches in flight on the first stage, min(P, m) under 1F1B; with
  full recompute each pair keeps its checkpointed inputs and one pair's full activations are
  live while it is recomputed. Block pairs only (the embeddings and the final layer are left
  out: 0.3% of the parameters);
* time: per micro-batch and pair, the forward's ops on one chip (``hardware.map_block`` of the
  layout's per-device shapes) times 3 (forward + backward, the traced GEMM work is 3x the
  forward's: docs/training.md; 4 with recompute) plus the pair's activation collectives
  (``layout_training_collectives``, forward and backward, each timed by
  ``hardware.collectives.collective_time_s`` over its concurrent groups on the stage's chips: on
  a multi-node system hierarchically); per step the gradient and parameter collectives once
  (gradient accumulation) and the 1F1B schedule: ``(m + P - 1)`` micro-batch slots of the
  slowest stage, each with its boundary transfers forward and back.

Confirmation (:func:`confirm`): ``trace-stage --mode train`` of one block pair of the plan's
stage (``--stage-ids 0-0,1-1,2-{depth-1} --stage 1``) and ``analyze-hlo --hw``: the traced P,
G, OS, Act and step seconds of the pair beside the estimate's per-pair figures.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hardware import load_system, map_block
from hardware.collectives import collective_time_s
from hardware.pipeline import transfer_time_s
from hardware.spec import SystemSpec
from hlo_trace.errors import UsageError
from models.opensora.block_ops import block_shapes_for, build_stdit_block_ops
from models.opensora.config import STDiT3Config, get_config
from models.opensora.inputs import geometry
from models.opensora.theory import BlockDims
from models.opensora.training_theory import (
    TrainingTheoryError,
    layout_training_activations,
    layout_training_collectives,
    training_buffer_bytes,
)
from planning.plan_estimate import GroupCost
from planning.train_estimate import (
    PairKey,
    TrainKernels,
    TrainStep,
    check_traceable,
    compose_step,
    data_parallel,
)

__all__ = ["TRAIN_STRATEGIES", "TrainEstimate", "TrainOutcome", "TrainPlan", "TrainSearchResult",
           "TrainSpace", "boundary_s", "enumerate_train_plans", "estimate_train_plan", "kernel_train_estimate",
           "pair_key", "search_train", "traced_train_step"]

#: The layouts with training formulas (``models.opensora.training_theory``).
TRAIN_STRATEGIES = ("dp", "megatron", "megatron_sp", "ds_ulysses", "ring_attention", "usp")
#: Bytes per element of the traced programs (bf16).
BYTES_PER_ELEMENT = 2
#: Backward + forward time over the forward's: the backward's two GEMMs per forward GEMM (the
#: traced step's GEMM work is 3.000x the forward's, docs/training.md); 4 with full recompute.
STEP_OVER_FORWARD = 3
RECOMPUTE_STEP_OVER_FORWARD = 4
#: The per-device view each layout's forward runs (``hardware.block_shapes_for``): (ideal
#: strategy, which mesh): "mesh" the plan's, "y" the Y axis with the batch split over X.
_IDEAL = {"dp": ("dp", "mesh"), "megatron": ("megatron", "mesh"),
          "megatron_sp": ("two_dimension", "mesh"), "ds_ulysses": ("ds_ulysses", "y"),
          "usp": ("ds_ulysses", "y"), "ring_attention": ("ring_attention", "y")}


@dataclass(frozen=True)
class TrainPlan:
    """One training plan (module doc). ``batch``: the global batch of one step."""

    strategy: str
    mesh: tuple[int, int]
    zero: int
    recompute: bool
    stages: int
    micro_batches: int
    batch: int
    ring: int | None = None

    @property
    def stage_chips(self) -> int:
        return self.mesh[0] * self.mesh[1]

    @property
    def micro_batch(self) -> int:
        return self.batch // self.micro_batches

    @property
    def data_parallel(self) -> int:
        """Devices of a stage that split the batch (the data-parallel degree)."""
        return data_parallel(self.strategy, self.mesh)

    @property
    def label(self) -> str:
        nx, ny = self.mesh
        text = f"{self.stages}x{self.stage_chips}:{self.strategy}@{nx}x{ny}"
        if self.ring is not None:
            text += f"(ring {self.ring})"
        text += f" zero{self.zero}" + (" recompute" if self.recompute else "")
        return text + f" m={self.micro_batches} b={self.batch}"


@dataclass(frozen=True)
class TrainEstimate:
    """Per device, one step: time and memory by class (bytes; the stage that holds the most)."""

    step_s: float
    compute_s: float
    activation_comm_s: float
    gradient_comm_s: float
    bubble_s: float
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    #: One block pair, one micro-batch, as a one-pair trace of the plan's stage measures it.
    pair_step_s: float
    pair_memory: tuple[tuple[str, float], ...]
    #: How the step was estimated: the ideal per-device forward, or the traced kernels of the
    #: pair's training step re-costed at the plan's shape (``planning.train_estimate``).
    basis: str = "ideal"
    #: The step's once-per-step part (optimizer, gradient sums; the kernel estimate's).
    update_s: float = 0.0

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


@dataclass(frozen=True)
class TrainSpace:
    plans: tuple[TrainPlan, ...]
    infeasible: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TrainOutcome:
    """A plan with its estimate and, when traced, the traced step (its stage's one-pair trace
    at the plan's shape composed as the estimate is, ``planning.train_estimate``), the traced
    pair's memory classes, or the tracer's error."""

    plan: TrainPlan
    estimate: TrainEstimate
    traced_step_s: float | None = None
    traced_pair_memory: tuple[tuple[str, float], ...] = ()
    error: str | None = None

    @property
    def traced(self) -> bool:
        return self.traced_step_s is not None

    @property
    def ratio(self) -> float | None:
        """Estimated / traced step."""
        return self.estimate.step_s / self.traced_step_s if self.traced_step_s else None


@dataclass(frozen=True)
class TrainSearchResult:
    """Every feasible plan by estimated step time; ``best``: the fastest that fits."""

    config: str
    shape: str
    hardware: str
    devices: int
    memory_limit_bytes: float
    space: TrainSpace
    outcomes: tuple[TrainOutcome, ...]
    best: TrainOutcome | None
    #: Plans drawn at random from the fitting rest and traced to check the estimate.
    validation: tuple[TrainPlan, ...] = ()
    budget: int = 0

    @property
    def fitting(self) -> tuple[TrainOutcome, ...]:
        return tuple(o for o in self.outcomes if o.estimate.memory_bytes <= self.memory_limit_bytes)

    @property
    def traced(self) -> tuple[TrainOutcome, ...]:
        return tuple(o for o in self.outcomes if o.traced)

    @property
    def spearman(self) -> float | None:
        """The estimated steps' rank correlation with the traced ones (None under
        ``MIN_RANKED_PLANS`` traced plans)."""
        from planning.plan_search import MIN_RANKED_PLANS, spearman

        traced = self.traced
        if len(traced) < MIN_RANKED_PLANS:
            return None
        return spearman([o.estimate.step_s for o in traced], [o.traced_step_s for o in traced])

    @property
    def within(self) -> tuple[int, int]:
        from planning.plan_search import within_tolerance

        return within_tolerance([o.ratio for o in self.traced if o.ratio])

    @property
    def worst_ratio(self) -> float | None:
        from planning.plan_search import worst_ratio

        return worst_ratio([o.ratio for o in self.traced if o.ratio])


# ---------------------------------------------------------------------------------------------
# The space
# ---------------------------------------------------------------------------------------------


def _divisors(count: int) -> list[int]:
    return [d for d in range(1, count + 1) if count % d == 0]


def _check(plan: TrainPlan, model: STDiT3Config, dims: BlockDims, config: str, shape: str) -> None:
    """Raise TrainingTheoryError / ValueError when the plan has no formula or no even split,
    UsageError when the tracer refuses its stage's pair at the shape."""
    if plan.micro_batch * plan.micro_batches != plan.batch:
        raise ValueError(f"the batch {plan.batch} does not split into {plan.micro_batches} micro-batches")
    if plan.micro_batch % plan.data_parallel:
        raise ValueError(f"a micro-batch of {plan.micro_batch} does not split over the "
                         f"{plan.data_parallel} data-parallel devices")
    if model.depth % plan.stages:
        raise ValueError(f"{model.depth} block pairs do not split into {plan.stages} equal stages")
    layout_training_collectives(plan.strategy, model, dims, plan.mesh, plan.zero, plan.recompute)
    layout_training_activations(plan.strategy, model, dims, plan.mesh, plan.recompute, plan.ring)
    training_buffer_bytes(plan.strategy, model, plan.mesh, plan.zero, BYTES_PER_ELEMENT)
    check_traceable(pair_key(plan, config), shape)


def enumerate_train_plans(config: str, shape: str, devices: int, *, batch: int | None = None,
                          strategies: Sequence[str] = TRAIN_STRATEGIES,
                          zero_stages: Sequence[int] = (0, 1, 2, 3),
                          recompute: Sequence[bool] = (False, True),
                          stage_counts: Sequence[int] | None = None,
                          micro_batch_counts: Sequence[int] = (1, 2, 4, 8)) -> TrainSpace:
    """Every training plan of the module doc on ``devices`` chips."""
    model = get_config(config)
    geo = geometry(model, shape)
    batch = devices if batch is None else batch
    if stage_counts is None:
        stage_counts = [p for p in _divisors(devices) if p <= model.depth]
    plans, infeasible = [], []
    for stages in stage_counts:
        if devices % stages:
            raise UsageError(f"--stages {stages}: expected a divisor of the {devices} devices")
        chips = devices // stages
        for strategy in strategies:
            meshes = [(1, chips)] if strategy in ("dp", "megatron") else \
                [(nx, chips // nx) for nx in _divisors(chips)]
            for mesh in meshes:
                rings = [r for r in _divisors(mesh[1])] if strategy == "usp" else [None]
                for ring in rings:
                    for zero in zero_stages:
                        for again in recompute:
                            for m in micro_batch_counts if stages > 1 else (1,):
                                plan = TrainPlan(strategy, mesh, zero, again, stages, m, batch, ring)
                                if batch % m:
                                    continue
                                dims = BlockDims.of(model, geo.T, geo.S, plan.micro_batch, BYTES_PER_ELEMENT)
                                try:
                                    _check(plan, model, dims, config, shape)
                                except (TrainingTheoryError, ValueError, UsageError) as error:
                                    infeasible.append((plan.label, str(error)))
                                    continue
                                plans.append(plan)
    return TrainSpace(tuple(plans), tuple(infeasible))


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _forward_pair_s(config: str, frames: int, tokens: int, strategy: str, mesh: tuple[int, int],
                    batch: int, chip) -> float:
    """One block pair's forward on one chip of the layout's per-device view (raises ValueError
    when the view does not split evenly)."""
    model = get_config(config)
    ideal, axes = _IDEAL[strategy]
    ideal_mesh, per_batch = (mesh, batch) if axes == "mesh" else ((1, mesh[1]), batch // mesh[0])
    shapes = block_shapes_for(model, frames=frames, spatial_tokens=tokens, strategy=ideal,
                              mesh=ideal_mesh, batch=per_batch, blocks=1,
                              bytes_per_element=BYTES_PER_ELEMENT)
    return map_block(build_stdit_block_ops(shapes), chip).latency_s


def stage_groups(group: int, mesh: tuple[int, int], first: int) -> list[list[int]]:
    """Every concurrent group of ``group`` chips of a collective on a stage whose chips
    ``first .. first + nx*ny - 1`` hold the mesh row-major: the whole stage, the rows (along y),
    the columns (along x), or contiguous pieces of the rows (the sub-groups of usp's y)."""
    nx, ny = mesh
    if group == nx * ny:
        return [list(range(first, first + group))]
    if group == ny:
        return [[first + r * ny + j for j in range(ny)] for r in range(nx)]
    if group == nx:
        return [[first + r * ny + c for r in range(nx)] for c in range(ny)]
    if ny % group == 0:
        return [[first + r * ny + c0 + j for j in range(group)] for r in range(nx)
                for c0 in range(0, ny, group)]
    return [list(range(first + s, first + s + group)) for s in range(0, nx * ny, group)]


def _terms_s(terms, mesh: tuple[int, int], first: int, system: SystemSpec) -> float:
    seconds = 0.0
    for term in terms:
        if term.group < 2:
            continue
        seconds += term.count * _collective_s(term.kind, term.group, term.message_bytes, mesh, first, system)
    return seconds


@functools.lru_cache(maxsize=65536)
def _collective_s(kind: str, group: int, message_bytes: float, mesh: tuple[int, int], first: int,
                  system: SystemSpec) -> float:
    """One collective over its concurrent groups of the stage (the plans of a space ask for the
    same ones many times)."""
    groups = stage_groups(group, mesh, first)
    return collective_time_s(kind, group, message_bytes, system, devices=groups[0], concurrent_groups=groups)


def boundary_s(plan: TrainPlan, system: SystemSpec, model: STDiT3Config, geo) -> float:
    """Seconds a micro-batch spends crossing one stage boundary: the hidden states forward and
    their gradient back (0 for one stage)."""
    if plan.stages == 1:
        return 0.0
    chips = plan.stage_chips
    x_bytes = BYTES_PER_ELEMENT * plan.micro_batch * geo.N * model.hidden_size
    return 2 * transfer_time_s(x_bytes, list(range(chips)), list(range(chips, 2 * chips)), system)


def pair_key(plan: TrainPlan, config: str) -> PairKey:
    """The traced pair of the plan's stage (``planning.train_estimate``)."""
    return PairKey(config, plan.strategy, plan.mesh, plan.ring, plan.zero, plan.recompute, plan.micro_batch)


def _compose(plan: TrainPlan, groups: dict[str, GroupCost], system: SystemSpec, config: str, shape: str) -> TrainStep:
    model = get_config(config)
    return compose_step(groups, pairs=model.depth // plan.stages, stages=plan.stages,
                        micro_batches=plan.micro_batches,
                        boundary_s=boundary_s(plan, system, model, geometry(model, shape)))


def kernel_train_estimate(plan: TrainPlan, system: SystemSpec, config: str, shape: str,
                          kernels: TrainKernels, ideal: TrainEstimate | None = None) -> TrainEstimate:
    """The plan's step from its stage's traced pair at the two calibration shapes, re-costed at
    the plan's shape and composed (``planning.train_estimate``); the memory is the formulas'
    (``ideal``: ``estimate_train_plan``'s, made when not given). Falls back to the ideal step,
    its basis saying why, when the calibration failed or its two programs differ."""
    if ideal is None:
        ideal = estimate_train_plan(plan, system, config, shape)
    try:
        groups, basis = kernels.estimate(pair_key(plan, config), system)
    except ValueError as error:
        return dataclasses.replace(ideal, basis=f"ideal (no traced kernels: {error})")
    step = _compose(plan, groups, system, config, shape)
    pair = sum(g.compute_s + g.comm_s for g in groups.values())
    return dataclasses.replace(
        ideal, step_s=step.step_s, compute_s=step.compute_s,
        activation_comm_s=step.step_s - step.update_s - step.compute_s,
        gradient_comm_s=step.update_s, bubble_s=step.bubble_s, pair_step_s=pair, basis=basis,
        update_s=step.update_s)


def traced_train_step(plan: TrainPlan, system: SystemSpec, config: str, shape: str,
                      kernels: TrainKernels) -> tuple[float, tuple[tuple[str, float], ...]] | str:
    """The plan's traced step: its stage's pair traced at the plan's shape, composed as the
    estimate is; with the traced pair's memory classes. The tracer's line when it failed."""
    value = kernels.full(pair_key(plan, config), system)
    if isinstance(value, str):
        return value
    groups, memory = value
    return _compose(plan, groups, system, config, shape).step_s, tuple((k, float(v)) for k, v in memory.items())


def estimate_train_plan(plan: TrainPlan, system: SystemSpec, config: str, shape: str) -> TrainEstimate:
    """The plan's step time and memory per device (module doc)."""
    model = get_config(config)
    geo = geometry(model, shape)
    dims = BlockDims.of(model, geo.T, geo.S, plan.micro_batch, BYTES_PER_ELEMENT)
    pairs = model.depth // plan.stages
    forward = _forward_pair_s(config, geo.T, geo.S, plan.strategy, plan.mesh, plan.micro_batch, system.chip)
    factor = RECOMPUTE_STEP_OVER_FORWARD if plan.recompute else STEP_OVER_FORWARD
    terms = layout_training_collectives(plan.strategy, model, dims, plan.mesh, plan.zero, plan.recompute)
    activation_terms = [t for t in terms if t.traffic == "activation"]
    gradient_terms = [t for t in terms if t.traffic != "activation"]
    chips = plan.stage_chips
    slot, grads = [], []
    for stage in range(plan.stages):
        first = stage * chips
        slot.append(pairs * (factor * forward + _terms_s(activation_terms, plan.mesh, first, system)))
        grads.append(pairs * _terms_s(gradient_terms, plan.mesh, first, system))
    boundary = boundary_s(plan, system, model, geo)
    slots = plan.micro_batches + plan.stages - 1
    compute = plan.micro_batches * pairs * factor * forward
    step = slots * (max(slot) + boundary) + max(grads)
    buffers = training_buffer_bytes(plan.strategy, model, plan.mesh, plan.zero, BYTES_PER_ELEMENT, pairs=pairs)
    pair_act = sum(t.bytes for t in layout_training_activations(plan.strategy, model, dims, plan.mesh,
                                                                plan.recompute, plan.ring))
    in_flight = min(plan.stages, plan.micro_batches)
    if plan.recompute:
        full = sum(t.bytes for t in layout_training_activations(plan.strategy, model, dims, plan.mesh,
                                                                False, plan.ring))
        activation = in_flight * pairs * pair_act + full
    else:
        activation = in_flight * pairs * pair_act
    one_pair = training_buffer_bytes(plan.strategy, model, plan.mesh, plan.zero, BYTES_PER_ELEMENT)
    pair_step = factor * forward + _terms_s(terms, plan.mesh, 0, system)
    return TrainEstimate(
        step_s=step, compute_s=compute,
        activation_comm_s=slots * (max(slot) + boundary) - compute,
        gradient_comm_s=max(grads), bubble_s=(plan.stages - 1) * (max(slot) + boundary),
        param_bytes=buffers["param"], grad_bytes=buffers["grad"],
        optimizer_bytes=buffers["optimizer_state"], activation_bytes=activation,
        pair_step_s=pair_step,
        pair_memory=(("param", one_pair["param"]), ("grad", one_pair["grad"]),
                     ("optimizer_state", one_pair["optimizer_state"]), ("activation", pair_act)))


def search_train(config: str, shape: str, hardware: str, space: TrainSpace, *, devices: int,
                 memory_limit_bytes: float | None = None, kernels: TrainKernels | None = None,
                 budget: int = 0, validate: int = 0,
                 progress: Callable[[str], None] | None = None) -> TrainSearchResult:
    """Estimate every plan of ``space`` (memory from the formulas; the step of the plans that
    fit from ``kernels``' traced pairs when given, else the ideal estimate), then trace the
    ``budget`` fastest that fit and ``validate`` more drawn at random from the fitting rest
    (seed ``VALIDATION_SEED``; needs ``kernels``). The best: the fastest traced plan that fits,
    or without traces the fastest estimated."""
    import random

    from planning.plan_search import VALIDATION_SEED

    system = load_system(hardware)
    limit = system.chip.dram_capacity_bytes if memory_limit_bytes is None else memory_limit_bytes
    if limit is None:
        raise UsageError(f"--hw {hardware}: the chip has no memory capacity; pass --memory-limit")
    outcomes = []
    infeasible = list(space.infeasible)
    for plan in space.plans:
        try:
            outcomes.append(TrainOutcome(plan, estimate_train_plan(plan, system, config, shape)))
        except ValueError as error:
            infeasible.append((plan.label, str(error)))
    if kernels is not None:  # the plans that fit get the traced-kernel step
        fit = [o for o in outcomes if o.estimate.memory_bytes <= limit]
        _trace_reporting(kernels, [pair_key(o.plan, config) for o in fit], system, "calibrating", progress)
        estimating = _reporter("estimating", len(fit), "plans", progress)
        better = {}
        for index, o in enumerate(fit):
            better[o.plan] = kernel_train_estimate(o.plan, system, config, shape, kernels, o.estimate)
            estimating(index + 1)
        outcomes = [TrainOutcome(o.plan, better.get(o.plan, o.estimate)) for o in outcomes]
    outcomes.sort(key=lambda o: (o.estimate.step_s, o.plan.label))
    fitting = [o for o in outcomes if o.estimate.memory_bytes <= limit]
    chosen: list[TrainPlan] = [o.plan for o in fitting[:budget]] if kernels is not None else []
    drawn: list[TrainPlan] = []
    if kernels is not None and validate:
        rest = [o.plan for o in fitting[budget:]]
        drawn = random.Random(VALIDATION_SEED).sample(rest, min(validate, len(rest)))
    traced = {}
    if chosen or drawn:
        assert kernels is not None
        _trace_reporting(kernels, [pair_key(p, config) for p in chosen + drawn], system,
                         "tracing the plans' pairs at the plan's shape:", progress, full=True)
    for plan in chosen + drawn:
        traced[plan] = traced_train_step(plan, system, config, shape, kernels)
    done = []
    for o in outcomes:
        value = traced.get(o.plan)
        if value is None:
            done.append(o)
        elif isinstance(value, str):
            done.append(dataclasses.replace(o, error=value))
        else:
            done.append(dataclasses.replace(o, traced_step_s=value[0], traced_pair_memory=value[1]))
    fits = [o for o in done if o.estimate.memory_bytes <= limit]
    traced_fits = [o for o in fits if o.traced]
    best = (min(traced_fits, key=lambda o: (o.traced_step_s, o.plan.label)) if traced_fits
            else (fits[0] if fits else None))
    space = TrainSpace(tuple(o.plan for o in done), tuple(infeasible))
    return TrainSearchResult(config, shape, hardware, devices, limit, space, tuple(done), best,
                             tuple(drawn), budget)


def _reporter(what: str, total: int, unit: str, progress: Callable[[str], None] | None) -> Callable[..., None]:
    """``progress``'s lines with the time left (``planning.eta``); a no-op without ``progress``."""
    from planning.eta import EtaReporter

    return (lambda *_: None) if progress is None else EtaReporter(what, total, progress, unit=unit)


def _trace_reporting(kernels: TrainKernels, keys: Sequence[PairKey], system: SystemSpec, what: str,
                     progress: Callable[[str], None] | None, *, full: bool = False) -> None:
    """``kernels.prepare`` (every trace in one run of ``kernels.jobs`` processes, under one
    hold of the trace lock) with ``what k of n traces`` and the time left."""
    report = _reporter(what, len(kernels.requests(keys, system, full=full)), "traces", progress)
    with kernels.held():
        kernels.prepare(keys, system, full=full, progress=report)


def throughput_label(outcome: TrainOutcome) -> str:
    """Samples per second of the plan's step."""
    return f"{outcome.plan.batch / outcome.estimate.step_s:.3g} samples/s"
