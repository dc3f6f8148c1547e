"""Plan search (reference note 001): the fastest parallel plan that fits, found by
estimating every plan and tracing only the most promising ones.

The FlexFlow/Alpa idea on this simulator. A *plan* is a pipeline case (``plans.cases``): P
stages of C chips each, one strategy with one stage mesh ``nx x ny`` inside every stage, a split
of the block pairs, M PipeFusion patches (and the ring degree of usp); a flat plan is one stage
holding every pair (M = 1). The space (:func:`enumerate_plans`):

* every strategy of ``models.opensora.parallel.STRATEGY_NAMES`` on every factorisation
  ``nx x ny`` of the chips of a stage (one mesh for the strategies that split over both axes
  together: megatron, dp; 1 x 1 for none), and every ring degree of usp dividing ny;
* flat (P = 1) on all the devices, and pipelines of P stages (P dividing the devices, at most the
  pairs) with up to ``splits`` splits of the pairs (the even one first, then the first stage one
  pair lighter, ...) and each patch count M (those the latent's height can be cut in).

A plan the tracer would refuse (its strategy's own checks, ``plans.feasibility``, on the stage
layout) is *infeasible*: listed with its reason, never estimated or traced.

The estimate (:func:`estimate_plan`, no tracing): per block pair, the ideal per-device op list
(``hardware.block_shapes_for`` on the per-device view of the strategy's layout, mapped with
``hardware.map_block`` on the chip) plus the layout's collectives (``models.opensora.theory
.layout_collectives``, each timed by ``hardware.collectives.collective_time_s`` on the system,
over the chips of its group); a stage is its pairs times that (the final layer's collectives
once in the last stage); a pipeline is ``hardware.pipeline.pipefusion_step`` over its stages,
with 1/M of a stage per patch and the boundary activations moved by ``transfer_time_s``, as
``analyze-pipeline`` composes the traced stages. Memory per device: the stage's weights
(split as the layout splits them) plus a peak of live activations (:func:`live_bytes`) plus,
with M > 1, the stale K/V of its spatial attentions. docs/plan_search.md gives the formulas.

The search (:func:`search`): plans whose estimated memory fits the limit (with
``MEMORY_SLACK``) are traced in order of estimated latency, ``jobs`` at a time, until the budget
of traced plans is spent or the bound says no untraced plan can win: the next estimate times
the smallest traced/estimated ratio seen so far, divided by ``BOUND_MARGIN``, is no faster than
the best traced plan. The
answer is always a traced plan that fits; the estimate's error on the traced plans (Spearman
rank correlation, worst ratio) comes with it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hardware import load_system, map_block
from hardware.collectives import collective_time_s
from hardware.pipeline import pipefusion_step, transfer_time_s
from hardware.spec import SystemSpec
from hlo_analyzer.mapping.pipeline import PATCHED_OUTPUT, PipelineTotals
from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from models.opensora.block_ops import block_shapes_for, build_stdit_block_ops
from models.opensora.config import STDiT3Config, get_config
from models.opensora.flops import parameter_breakdown
from models.opensora.inputs import geometry, parse_shape
from models.opensora.parallel import STRATEGY_NAMES, strategy_info
from models.opensora.theory import (
    BlockDims,
    final_layer_collectives,
    layout_collectives,
)
from planning.plan_estimate import GUIDANCE_BATCH, KernelCosts, stage_roles
from plans.calibration import SERVED
from plans.cases import WARMUP_STEPS, PipelineCase, PipelineShape, split_pairs
from plans.config import PipelineConfigError, Submesh, build_config
from plans.feasibility import check_stage
from plans.patches import patch_config, patch_plan

log = logging.getLogger(__name__)

__all__ = ["BOUND_MARGIN", "ESTIMATE_TOLERANCE", "MEMORY_SLACK", "Estimate", "Plan", "PlanOutcome", "SearchResult", "Space",
           "calibration_keys", "enumerate_plans", "estimate_plan", "ideal_estimate", "kernel_estimate", "live_bytes", "pareto_front", "search",
           "spearman", "within_tolerance", "worst_ratio"]

#: A plan is traced when its estimated memory is at most this many times the limit: the
#: estimate of the live activations is coarse (docs/plan_search.md), so a plan estimated a
#: little above the limit may still fit; the traced figure decides.
MEMORY_SLACK = 1.5
#: The bound's allowance for the estimate's error: an untraced plan is assumed to trace at no
#: less than its estimate times the smallest traced/estimated ratio seen so far, divided by
#: this. Tracing stops once even that cannot beat the best traced plan (module doc). 1.5: the
#: ratios of the tiny exhaustive space spread over 4x, but across the patch counts of one
#: strategy, mesh and stage count by at most 1.3x but for one group (1.6x) (docs/plan_search.md).
BOUND_MARGIN = 1.5
#: Bytes per element of the traced programs (bf16).
BYTES_PER_ELEMENT = 2
#: Element-wise results of one block that are live beside the attention scores at the peak:
#: the residual stream x, the normalised and modulated input, q, k, v and the attention output,
#: each one (tokens x h) per device (docs/plan_search.md).
LIVE_ACTIVATIONS = 6
#: Copies of the largest attention score matrix live at once: the scores and their softmax.
LIVE_SCORE_COPIES = 2

#: The ideal layout (``hardware.block_shapes_for``) whose per-device ops each traced strategy
#: runs: (ideal strategy, which mesh it gets). "mesh": the plan's (nx, ny); "y": the Y axis as
#: the strategy's devices with the batch split over X (the sequence-parallel layouts);
#: "one": one device.
_IDEAL_LAYOUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "none": (("single", "one"),),
    "dp": (("dp", "mesh"),),
    "megatron": (("megatron", "mesh"),),
    "two_dimension": (("two_dimension", "mesh"),),
    "megatron_sp": (("two_dimension", "mesh"),),
    "ds_ulysses": (("ds_ulysses", "y"), ("ring_attention", "y")),
    "usp": (("ds_ulysses", "y"), ("ring_attention", "y")),
    "opensora_sp": (("ds_ulysses", "y"), ("ring_attention", "y")),
    "ring_attention": (("ring_attention", "y"), ("ds_ulysses", "y")),
}
#: Strategies whose block weights are split, and over which axis: "all" devices or "y".
_WEIGHT_SPLIT = {"megatron": "all", "two_dimension": "y", "megatron_sp": "y"}


#: The estimate's error the report counts plans within: |estimate / traced - 1|.
ESTIMATE_TOLERANCE = 0.05
#: Seed of the random draw of the plans traced to check the estimate (``validate``).
VALIDATION_SEED = 32

#: Fewest traced plans a Spearman rank correlation is reported over: over two it is +1 or -1
#: whatever the estimate is worth.
MIN_RANKED_PLANS = 3


@dataclass(frozen=True)
class Plan:
    """One point of the space; ``case`` is what the runner traces and the TOML written."""

    case: PipelineCase

    @property
    def label(self) -> str:
        case = self.case
        nx, ny = case.stage_mesh
        text = f"{case.pipeline.stages}x{case.pipeline.chips}:{case.pipeline.strategy}@{nx}x{ny}"
        if case.ring is not None:
            text += f"(ring {case.ring})"
        if case.pipeline.stages > 1:
            text += " pairs " + ",".join(f"{a}-{b}" for a, b in case.stage_ids)
        return text + f" M={case.patches}"


@dataclass(frozen=True)
class Estimate:
    """A plan's estimate: inference latency (``steps`` steps) and memory per device (the stage
    that holds the most); ``compute_s``/``comm_s``: one step of the slowest stage, full latent.
    ``basis`` says how the compute was estimated (the ideal layout, or a scaled fallback)."""

    latency_s: float
    memory_bytes: float
    compute_s: float
    comm_s: float
    basis: str
    #: Per-part seconds of one step of the slowest stage (full latent), by what they cost:
    #: the kernels outside the block pairs (embeddings, final layer), the pairs' compute, the
    #: pairs' collectives, the sends to the next stage; and how many of the kernels' integers
    #: were no exact product of the calibration (``planning.plan_estimate``), of how many.
    parts: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Space:
    """The enumerated space: the plans the tracer accepts, and those it refuses with why."""

    plans: tuple[Plan, ...]
    infeasible: tuple[tuple[str, str], ...]  # (plan label, reason)


@dataclass(frozen=True)
class PlanOutcome:
    """A plan with its estimate and, when traced, the traced figures (or the error)."""

    plan: Plan
    estimate: Estimate
    traced_latency_s: float | None = None
    traced_memory_bytes: float | None = None
    error: str | None = None

    @property
    def traced(self) -> bool:
        return self.traced_latency_s is not None

    @property
    def ratio(self) -> float | None:
        """Estimated / traced latency."""
        if not self.traced or not self.traced_latency_s:
            return None
        return self.estimate.latency_s / self.traced_latency_s


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found. ``outcomes``: every feasible plan in order of estimated
    latency; ``best``: the fastest traced plan that fits (None when none does)."""

    config: str
    shape: str
    hardware: str
    devices: int
    memory_limit_bytes: float
    budget: int
    steps: int
    space: Space
    outcomes: tuple[PlanOutcome, ...]
    best: PlanOutcome | None
    stopped: str  # why the tracing stopped
    pareto: tuple[PlanOutcome, ...] = field(default=())
    #: Plans drawn at random from the rest of the space and traced to check the estimate
    #: (``validate`` of :func:`search`); traced like the others, so they may be the answer.
    validation: tuple[Plan, ...] = field(default=())

    @property
    def traced(self) -> tuple[PlanOutcome, ...]:
        return tuple(o for o in self.outcomes if o.traced)

    @property
    def spearman(self) -> float | None:
        """The estimate's rank correlation with the traced latencies; None over fewer than
        ``MIN_RANKED_PLANS`` traced plans (two plans are always ranked +1 or -1)."""
        traced = self.traced
        if len(traced) < MIN_RANKED_PLANS:
            return None
        return spearman([o.estimate.latency_s for o in traced], [o.traced_latency_s for o in traced])

    @property
    def within(self) -> tuple[int, int]:
        """(traced plans whose estimate is within ``ESTIMATE_TOLERANCE`` of the traced
        latency, traced plans)."""
        return within_tolerance([o.ratio for o in self.traced if o.ratio])

    @property
    def worst_ratio(self) -> float | None:
        """The largest of estimate/traced and traced/estimate over the traced plans."""
        return worst_ratio([o.ratio for o in self.traced if o.ratio])


def within_tolerance(ratios: Sequence[float]) -> tuple[int, int]:
    """(ratios estimate / traced within ``ESTIMATE_TOLERANCE`` of 1, ratios)."""
    return sum(1 for r in ratios if abs(r - 1) <= ESTIMATE_TOLERANCE), len(ratios)


def worst_ratio(ratios: Sequence[float]) -> float | None:
    """The largest of estimate/traced and traced/estimate (None without ratios)."""
    return max(max(r, 1 / r) for r in ratios) if ratios else None


# ---------------------------------------------------------------------------------------------
# The space
# ---------------------------------------------------------------------------------------------


def _factorisations(chips: int) -> list[tuple[int, int]]:
    return [(nx, chips // nx) for nx in range(1, chips + 1) if chips % nx == 0]


def stage_meshes(strategy: str, chips: int) -> list[tuple[int, int]]:
    """The meshes of one stage of ``chips`` chips worth tracing for ``strategy``: one for a
    strategy that splits over both axes together (the programs would be the same), 1 x 1 for
    none, every factorisation otherwise."""
    rule = strategy_info(strategy).mesh_rule
    if rule == "one":
        return [(1, 1)] if chips == 1 else []
    if rule == "all":
        return [(1, chips)]
    return _factorisations(chips)


def pair_splits(depth: int, stages: int, count: int) -> list[tuple[tuple[int, int], ...]]:
    """Up to ``count`` splits of ``depth`` pairs into ``stages`` ranges: the even split, then the
    first stage (which also holds the embeddings) one pair lighter and the last one heavier, two
    pairs, ...; splits with an empty stage are left out."""
    even = split_pairs(depth, stages)
    sizes = [last - first + 1 for first, last in even]
    splits = [even]
    shift = 1
    while len(splits) < count and shift < sizes[0] and stages > 1:
        moved = [sizes[0] - shift, *sizes[1:-1], sizes[-1] + shift]
        ranges, first = [], 0
        for size in moved:
            ranges.append((first, first + size - 1))
            first += size
        splits.append(tuple(ranges))
        shift += 1
    return splits


def _check_feasible(case: PipelineCase) -> None:
    """The tracer's own checks of every stage (config, strategy on the stage layout); raises
    UsageError with the tracer's message."""

    config = build_config(config=case.config, shape=case.shape, strategy=case.pipeline.strategy,
                          mesh=(case.stage_mesh[0], case.stage_mesh[1] * case.pipeline.stages),
                          stage_ids=[list(ids) for ids in case.stage_ids],
                          submeshes=[list(sub) for sub in case.submeshes()], patches=case.patches,
                          ring_degree=case.ring,
                          ulysses_degree=None if case.ring is None
                          else case.stage_mesh[1] // case.ring)
    # the tracer checks the whole latent's layout, and under PipeFusion the patch's it traces
    for checked in dict.fromkeys((config, patch_config(config))):
        for stage in range(checked.num_stages):
            check_stage(checked, stage)


def enumerate_plans(config: str, shape: str, devices: int, *,
                    strategies: Sequence[str] = STRATEGY_NAMES,
                    stage_counts: Sequence[int] | None = None, splits: int = 2,
                    patch_counts: Sequence[int] = (1, 2, 4)) -> Space:
    """Every plan of the module doc on ``devices`` chips. ``stage_counts``: the pipeline depths
    P (1 = flat; default every divisor of the devices up to the model's pairs)."""
    model = get_config(config)
    if stage_counts is None:
        stage_counts = [p for p in range(1, min(devices, model.depth) + 1) if devices % p == 0]
    plans, infeasible = [], []
    for stages in stage_counts:
        if devices % stages or stages > model.depth:
            raise UsageError(f"--stages {stages}: expected a divisor of the {devices} devices "
                             f"that is at most the model's {model.depth} block pairs")
        chips = devices // stages
        for strategy in strategies:
            # none runs a stage on one chip: flat on one chip of the system, or P stages of 1
            stage_chips = 1 if strategy == "none" and stages == 1 else chips
            if strategy == "none" and stage_chips != 1:
                continue
            for mesh in stage_meshes(strategy, stage_chips):
                rings = ([r for r in range(1, mesh[1] + 1) if mesh[1] % r == 0]
                         if strategy == "usp" else [None])
                for ring in rings:
                    for split in pair_splits(model.depth, stages, splits if stages > 1 else 1):
                        for patches in (patch_counts if stages > 1 else (1,)):
                            case = PipelineCase(config, shape,
                                                PipelineShape(stages, stage_chips, strategy),
                                                patches, model.depth, mesh=mesh, split=split,
                                                ring=ring)
                            plan = Plan(case)
                            try:
                                _check_feasible(case)
                            except (UsageError, ValueError) as error:
                                infeasible.append((plan.label, str(error)))
                                continue
                            plans.append(plan)
    return Space(tuple(dict.fromkeys(plans)), tuple(infeasible))


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------


def _ideal_block(model: STDiT3Config, T: int, S: int, strategy: str, mesh: tuple[int, int],
                 system: SystemSpec, kv_scale: float = 1.0) -> tuple[float, str, object]:
    """Seconds of one block pair's ops on one chip of the per-device view, how it was got, and
    the per-device shapes. ``kv_scale``: the spatial attention reads that many times its own
    keys and values (a PipeFusion patch attends over the full sequence: S_full / S_patch)."""
    import dataclasses

    nx, ny = mesh
    for ideal, axes in _IDEAL_LAYOUTS[strategy]:
        if axes == "one":
            ideal_mesh, batch = (1, 1), GUIDANCE_BATCH
        elif axes == "mesh":
            ideal_mesh, batch = mesh, GUIDANCE_BATCH
        else:
            if GUIDANCE_BATCH % nx:
                continue
            ideal_mesh, batch = (1, ny), GUIDANCE_BATCH // nx
        try:
            shapes = block_shapes_for(model, frames=T, spatial_tokens=S, strategy=ideal,
                                      mesh=ideal_mesh, batch=batch, blocks=1,
                                      bytes_per_element=BYTES_PER_ELEMENT)
        except ValueError:
            continue
        basis = f"ideal {ideal} {ideal_mesh[0]}x{ideal_mesh[1]}"
        divide = 1
        break
    else:
        shapes = block_shapes_for(model, frames=T, spatial_tokens=S, strategy="single",
                                  blocks=1, bytes_per_element=BYTES_PER_ELEMENT)
        basis, divide = "one device / n (no even ideal layout)", nx * ny
    if kv_scale != 1.0:
        shapes = dataclasses.replace(shapes, S_KV_spt=round(shapes.S_KV_spt * kv_scale))
    return _pair_seconds(shapes, system.chip) / divide, basis, shapes


@functools.lru_cache(maxsize=4096)
def _pair_seconds(shapes, chip) -> float:
    """One pair of ``shapes`` mapped on ``chip`` (the plans of a space share most of them: a
    split, a patch count or a stage count changes no per-device shape)."""
    return map_block(build_stdit_block_ops(shapes), chip).latency_s


def _group_devices(group: int, mesh: tuple[int, int], first: int) -> list[int]:
    """Chips of one collective group on a stage whose chips start at ``first``: the whole
    stage, a row along y (contiguous), or a column along x (stride ny)."""
    nx, ny = mesh
    if group == nx * ny:
        return list(range(first, first + group))
    if group <= ny:
        return list(range(first, first + group))
    return [first + i * ny for i in range(group)]


def _collectives_s(terms, mesh: tuple[int, int], first: int, system: SystemSpec) -> float:
    return sum(term.count * collective_time_s(term.kind, term.group, term.message_bytes, system,
                                              devices=_group_devices(term.group, mesh, first))
               for term in terms if term.group > 1)


def live_bytes(shapes, tokens_per_device: float, hidden: int) -> float:
    """Peak live activation bytes per device (docs/plan_search.md): ``LIVE_SCORE_COPIES`` of the
    largest attention score matrix of the per-device shapes plus ``LIVE_ACTIVATIONS`` (tokens x
    h) tensors of the residual stream."""
    q = BYTES_PER_ELEMENT
    scores = max(shapes.B_spt * shapes.N_A * shapes.S_Q_spt * shapes.S_KV_spt,
                 shapes.B_tmp * shapes.N_A * shapes.S_Q_tmp * shapes.S_KV_tmp,
                 shapes.B_cro * shapes.N_A * shapes.S_Q_cro * shapes.S_KV_cro)
    return LIVE_SCORE_COPIES * scores * q + LIVE_ACTIVATIONS * tokens_per_device * hidden * q


def _weight_bytes(model: STDiT3Config, strategy: str, mesh: tuple[int, int], pairs: int,
                  first: bool, last: bool) -> float:
    """Weights of a stage per device: its block pairs split as the layout splits them, the
    embeddings (first stage) and the final layer (last stage) whole."""
    counts = parameter_breakdown(model)
    split = {"all": mesh[0] * mesh[1], "y": mesh[1]}.get(_WEIGHT_SPLIT.get(strategy, ""), 1)
    params = pairs * (counts["spatial_block"] + counts["temporal_block"]) / split
    if first:
        params += sum(counts[k] for k in ("x_embedder", "t_embedder", "fps_embedder",
                                          "y_embedder", "t_block"))
    if last:
        params += counts["final_layer"]
    return params * BYTES_PER_ELEMENT


def estimate_plan(plan: Plan, system: SystemSpec, *, steps: int = 30,
                  kernels: KernelCosts | None = None, fallback: bool = True) -> Estimate:
    """The plan's inference latency and memory per device, without tracing the plan.

    With ``kernels`` (the traced-kernel estimate, ``planning.plan_estimate``): the latency from
    the kernels of the plan's stages as a one-pair trace at two small shapes finds them,
    re-costed at the plan's shape on ``system`` and composed as ``analyze-pipeline`` composes
    the traced stages; the memory as below. Without: the ideal estimate (module doc): with
    M > 1 patches a stage is estimated on one patch (the latent cut along its height, its
    spatial attention over the full sequence's K/V), and the full latent costs M patches, as
    ``analyze-pipeline`` composes a stage traced on one patch. A plan whose calibration could
    not be traced, or whose two programs differ, gets the ideal estimate, its basis saying so
    (``fallback`` False: the ValueError is raised instead)."""
    ideal = ideal_estimate(plan, system, steps=steps)
    if kernels is None:
        return ideal
    try:
        return kernel_estimate(plan, system, kernels, steps=steps, memory_bytes=ideal.memory_bytes)
    except ValueError as error:  # the calibration could not be traced, or its two programs differ
        if not fallback:
            raise
        return dataclasses.replace(ideal, basis=f"{ideal.basis} (no traced kernels: {error})")


def kernel_estimate(plan: Plan, system: SystemSpec, kernels: KernelCosts, *, steps: int = 30,
                    memory_bytes: float = 0.0) -> Estimate:
    """The traced-kernel latency of ``plan`` (``estimate_plan``; ``planning.plan_estimate``): each
    stage is its role's kernels outside the pairs plus its pairs, on one patch when M > 1 (the
    calibration is traced on one patch), composed as ``analyze-pipeline`` composes stages."""
    case = plan.case
    stages = case.pipeline.stages
    key = kernels.key(case.config, case.shape, case.pipeline.strategy, case.stage_mesh, case.ring,
                      case.patches)
    costs = kernels.stage(key, case.shape, system)
    chips = _stage_chips(case)
    patches = case.patches
    boundary = kernels.boundary(key, case.shape) if stages > 1 else None
    # per patch (a stage traced on one of M patches) and for the full latent (M patches)
    full_bytes = patch_bytes = 0.0
    if boundary is not None:
        full_bytes = sum(b * patches if name == PATCHED_OUTPUT else b for name, b in boundary.outputs.items())
        patch_bytes = sum(boundary.outputs.values())
    patch_s, full_s, transfer_patch, transfer_full, rows = [], [], [], [], []
    for index, ((first, last), role) in enumerate(zip(case.stage_ids, stage_roles(stages), strict=True)):
        outside, pairs = costs.outside(role), costs.pairs(last - first + 1)
        own = outside.compute_s + outside.comm_s + pairs.compute_s + pairs.comm_s
        patch_s.append(own)
        full_s.append(own * patches)
        sent = 0.0
        if index + 1 < stages:
            sent = transfer_time_s(full_bytes, chips[index], chips[index + 1], system)
            transfer_full.append(sent)
            transfer_patch.append(transfer_time_s(patch_bytes, chips[index], chips[index + 1], system))
        rows.append((full_s[-1], (("outside the pairs", patches * (outside.compute_s + outside.comm_s)),
                                  ("pairs: compute", patches * pairs.compute_s),
                                  ("pairs: collectives", patches * pairs.comm_s),
                                  ("send to the next stage", sent))))
    latent = 0.0 if boundary is None else boundary.latent_bytes * patches
    step = pipefusion_step(patch_s, transfer_patch, full_s, transfer_full, patches=patches, steps=steps,
                           warmup_steps=WARMUP_STEPS,
                           return_patch_s=transfer_time_s(latent / patches, chips[-1], chips[0], system),
                           return_full_s=transfer_time_s(latent, chips[-1], chips[0], system))
    _, parts = max(rows, key=lambda row: row[0])
    named = dict(parts)
    return Estimate(latency_s=step.inference_s, memory_bytes=memory_bytes,
                    compute_s=named["outside the pairs"] + named["pairs: compute"],
                    comm_s=named["pairs: collectives"],
                    basis=f"traced kernels ({key.base_shape}, {key.scaled_shape}; {costs.inexact} of "
                          f"{costs.values} integers inexact)",
                    parts=parts)


def ideal_estimate(plan: Plan, system: SystemSpec, *, steps: int = 30) -> Estimate:
    """The ideal estimate (module doc): the ideal per-device op list of ``hardware.map_block``
    and the layout formulas' collectives; no trace at all."""
    case = plan.case
    model = get_config(case.config)
    full = geometry(model, case.shape)
    strategy, mesh = case.pipeline.strategy, case.stage_mesh
    T, S, kv_scale = full.T, full.S, 1.0
    if case.patches > 1:

        patch = patch_plan(model, case.shape, case.patches)
        S, kv_scale = patch.S_patch, patch.S_full / patch.S_patch
    dims = BlockDims.of(model, T, S, GUIDANCE_BATCH, BYTES_PER_ELEMENT)
    ulysses = None if case.ring is None else mesh[1] // case.ring
    pair_s, basis, shapes = _ideal_block(model, T, S, strategy, mesh, system, kv_scale)
    terms = layout_collectives(strategy, dims, mesh, case.ring, ulysses)
    final_terms = final_layer_collectives(strategy, dims, mesh, model.final_out_features)
    chips_per_stage = mesh[0] * mesh[1]
    tokens = GUIDANCE_BATCH * T * S / chips_per_stage
    stage_patch, stage_comm, memory = [], [], []
    for index, (first_pair, last_pair) in enumerate(case.stage_ids):
        pairs = last_pair - first_pair + 1
        first_chip = index * chips_per_stage
        comm = pairs * _collectives_s(terms, mesh, first_chip, system)
        if index == len(case.stage_ids) - 1:
            comm += _collectives_s(final_terms, mesh, first_chip, system)
        stage_patch.append(pairs * pair_s + comm)
        stage_comm.append(comm)
        stale = 0.0
        if case.patches > 1:  # K and V of every spatial attention over the full sequence
            stale = pairs * 2 * shapes.B_spt * shapes.S_KV_spt * shapes.N_A * shapes.H_A \
                * BYTES_PER_ELEMENT
        memory.append(_weight_bytes(model, strategy, mesh, pairs, index == 0,
                                    index == len(case.stage_ids) - 1)
                      + live_bytes(shapes, tokens, model.hidden_size) + stale)
    stage_full = [case.patches * seconds for seconds in stage_patch]
    latency = _pipeline_latency(case, full, model, stage_full, system, steps)
    slowest = max(range(len(stage_full)), key=lambda i: stage_full[i])
    return Estimate(latency_s=latency, memory_bytes=max(memory),
                    compute_s=case.patches * (stage_patch[slowest] - stage_comm[slowest]),
                    comm_s=case.patches * stage_comm[slowest], basis=basis)


def _pipeline_latency(case: PipelineCase, geo, model: STDiT3Config, stage_full: list[float],
                      system: SystemSpec, steps: int) -> float:
    """Inference seconds of the stages as ``analyze-pipeline`` composes them: 1/M of a stage
    per patch, the hidden states (1/M of them per patch) and the caption and timestep
    embeddings (whole) sent to the next stage, 1/M of the latent sent back to stage 0."""
    q, batch, hidden = BYTES_PER_ELEMENT, GUIDANCE_BATCH, model.hidden_size
    patches = case.patches
    x_bytes = q * batch * geo.N * hidden
    side_bytes = q * (batch * model.model_max_length * hidden + 7 * batch * hidden)
    latent_bytes = q * batch * model.in_channels * geo.T_lat * geo.H_lat * geo.W_lat
    chips = _stage_chips(case)
    transfer_full = [transfer_time_s(x_bytes + side_bytes, chips[k], chips[k + 1], system)
                     for k in range(len(chips) - 1)]
    transfer_patch = [transfer_time_s(x_bytes / patches + side_bytes, chips[k], chips[k + 1],
                                      system) for k in range(len(chips) - 1)]
    step = pipefusion_step(
        [s / patches for s in stage_full], transfer_patch, stage_full, transfer_full,
        patches=patches, steps=steps, warmup_steps=WARMUP_STEPS,
        return_patch_s=transfer_time_s(latent_bytes / patches, chips[-1], chips[0], system),
        return_full_s=transfer_time_s(latent_bytes, chips[-1], chips[0], system))
    return step.inference_s


def _stage_chips(case: PipelineCase) -> list[list[int]]:
    """Global chip ids of every stage (the tracer's submesh ids on the whole mesh)."""

    nx, ny = case.stage_mesh
    whole = (nx, ny * case.pipeline.stages)
    return [[d for row in Submesh(*sub).global_device_ids(whole) for d in row]
            for sub in case.submeshes()]


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("spearman: expected two sequences of the same length, at least 2")

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return result

    ra, rb = ranks(a), ranks(b)
    mean_a, mean_b = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb))
    var_a = sum((x - mean_a) ** 2 for x in ra)
    var_b = sum((y - mean_b) ** 2 for y in rb)
    if var_a == 0 or var_b == 0:
        return float("nan")
    return cov / math.sqrt(var_a * var_b)


def pareto_front(outcomes: Sequence[PlanOutcome]) -> tuple[PlanOutcome, ...]:
    """The traced plans no other traced plan beats on both latency and memory per device, by
    memory ascending."""
    traced = [o for o in outcomes if o.traced]
    front = [o for o in traced if not any(
        (p.traced_latency_s <= o.traced_latency_s and p.traced_memory_bytes <= o.traced_memory_bytes
         and (p.traced_latency_s, p.traced_memory_bytes) != (o.traced_latency_s, o.traced_memory_bytes))
        for p in traced)]
    return tuple(sorted(front, key=lambda o: (o.traced_memory_bytes, o.traced_latency_s)))


#: Traces a batch of plans; returns, per plan, (latency s, memory bytes) or an error string.
Tracer = Callable[[Sequence[Plan]], list[tuple[float, float] | str]]


def search(config: str, shape: str, hardware: str, space: Space, tracer: Tracer, *,
           devices: int, memory_limit_bytes: float | None = None, budget: int = 12,
           jobs: int = 1, steps: int = 30, exhaustive: bool = False,
           kernels: KernelCosts | None = None, validate: int = 0,
           progress: Callable[[str], None] | None = None) -> SearchResult:
    """Estimate every plan of ``space``, trace the most promising (module doc) with
    ``tracer``, ``jobs`` plans per round, at most ``budget`` plans in all. ``exhaustive``:
    trace every plan (no budget, no bound, no memory cut): the reference a search is
    measured against. ``kernels``: estimate from the traced kernels (``estimate_plan``),
    else the ideal estimate. ``validate``: then also trace that many plans drawn at random
    (seed ``VALIDATION_SEED``) from the untraced rest, to measure the estimate beyond the
    plans it ranked first. ``progress``: lines of what it does (calibrating k of n traces,
    estimating) with the time left (the traces of the plans report on the tracer's bar)."""
    import random

    from planning.eta import EtaReporter


    system = load_system(hardware)
    limit = system.chip.dram_capacity_bytes if memory_limit_bytes is None else memory_limit_bytes
    if limit is None:
        raise UsageError(f"--hw {hardware}: the chip has no memory capacity; pass --memory-limit")
    echo = progress or (lambda line: None)
    if kernels is not None:
        kernels.prepare(calibration_keys(space.plans, kernels), system,
                        boundaries=any(p.case.pipeline.stages > 1 for p in space.plans),
                        progress=EtaReporter("calibrating", 0, echo, unit="traces"))
    estimating = EtaReporter("estimating", len(space.plans), echo, unit="plans")
    estimates = {}
    for plan in space.plans:
        estimates[plan] = estimate_plan(plan, system, steps=steps, kernels=kernels)
        estimating(len(estimates))
    order = sorted(space.plans, key=lambda p: (estimates[p].latency_s, p.label))
    candidates = [p for p in order
                  if exhaustive or estimates[p].memory_bytes <= MEMORY_SLACK * limit]
    if exhaustive:
        budget = len(candidates)
    traced: dict[Plan, tuple[float, float] | str] = {}
    tracing = EtaReporter("tracing", min(budget, len(candidates)) + validate, echo,
                          unit="plans at most (the bound may stop sooner)")
    stopped = ("every plan estimated to fit was traced" if candidates else
               f"no plan is estimated to fit in {MEMORY_SLACK} x the memory limit")
    while candidates:
        if len(traced) >= budget:
            stopped = f"budget of {budget} traced plans spent"
            break
        best = _best(traced, limit)
        ratios = [value[0] / estimates[p].latency_s for p, value in traced.items()
                  if not isinstance(value, str) and estimates[p].latency_s > 0]
        if best is not None and ratios and not exhaustive:
            bound = estimates[candidates[0]].latency_s * min(ratios) / BOUND_MARGIN
            if bound >= best[1][0]:
                stopped = ("bound: no untraced plan can beat the best traced one (next estimate "
                           f"x smallest traced/estimated ratio {min(ratios):.3g} / "
                           f"{BOUND_MARGIN} >= best)")
                break
        batch = candidates[:budget - len(traced) if exhaustive else min(jobs, budget - len(traced))]
        candidates = candidates[len(batch):]
        tracing(len(traced))
        for plan, value in zip(batch, tracer(batch), strict=True):
            traced[plan] = value
            log.info("traced %s: %s", plan.label, value)
    drawn: list[Plan] = []
    if validate:
        rest = [p for p in order if p not in traced]
        drawn = random.Random(VALIDATION_SEED).sample(rest, min(validate, len(rest)))
        for start in range(0, len(drawn), jobs):
            batch = drawn[start:start + jobs]
            tracing(len(traced))
            for plan, value in zip(batch, tracer(batch), strict=True):
                traced[plan] = value
                log.info("traced %s (validation): %s", plan.label, value)
    outcomes = []
    for plan in order:
        value = traced.get(plan)
        if value is None:
            outcomes.append(PlanOutcome(plan, estimates[plan]))
        elif isinstance(value, str):
            outcomes.append(PlanOutcome(plan, estimates[plan], error=value))
        else:
            outcomes.append(PlanOutcome(plan, estimates[plan], value[0], value[1]))
    fitting = [o for o in outcomes if o.traced and o.traced_memory_bytes <= limit]
    best_outcome = min(fitting, key=lambda o: (o.traced_latency_s, o.plan.label), default=None)
    return SearchResult(config, shape, hardware, devices, limit, budget, steps, space,
                        tuple(outcomes), best_outcome, stopped, pareto_front(outcomes), tuple(drawn))


def calibration_keys(plans: Sequence[Plan], kernels: KernelCosts) -> list:
    """The calibrations the traced-kernel estimate of ``plans`` needs (``planning.plan_estimate``)."""
    keys = {kernels.key(p.case.config, p.case.shape, p.case.pipeline.strategy, p.case.stage_mesh, p.case.ring,
                        p.case.patches) for p in plans}
    return sorted(keys, key=lambda k: k.name)


def _best(traced: dict, limit: float):
    fitting = [(p, v) for p, v in traced.items() if not isinstance(v, str) and v[1] <= limit]
    return min(fitting, key=lambda item: item[1][0], default=None)


# ---------------------------------------------------------------------------------------------
# Tracing through the runner (the sweep's cache)
# ---------------------------------------------------------------------------------------------


def runner_tracer(work: Path, hardware: str, *, steps: int = 30, jobs: int = 1,
                  progress_stream=None, scheduler: str | None = None, lock=None,
                  one_process: bool = True) -> Tracer:
    """A tracer that runs each plan's case with ``planning.runner`` in ``work`` (cached by
    content: a plan traced before is read back) and reads ``analyze-pipeline``'s totals;
    ``scheduler``: on the workers of that Dask scheduler. Run here, a batch of plans is traced
    inside ``lock()`` (plan-search passes ``planning.train_estimate.trace_lock``: one full-size
    trace at a time on the machine; None: no lock), and their stages are traced first
    by :func:`pretrace_stages` in one :class:`StageServer` for the search (``one_process=False``:
    the runner traces each stage in a process of its own)."""
    import contextlib

    from planning.runner import Paths, Progress, Settings, jobs_within_memory, run_cases

    paths = Paths(work=work, hardware=hardware)
    settings = Settings(stage_ids="", num_stages=0, hardware=hardware, steps=steps,
                        dialect="stablehlo")
    server = StageServer()

    def trace(plans: Sequence[Plan]) -> list[tuple[float, float] | str]:
        cases = [plan.case for plan in plans]
        kwargs = {} if progress_stream is None else {"stream": progress_stream}
        progress = Progress(total=sum(case.pipeline.stages for case in cases), **kwargs)
        with lock() if lock is not None and scheduler is None else contextlib.nullcontext():
            if scheduler is None and one_process:
                pretrace_stages(cases, paths, server, progress)
            run_cases(cases, paths, settings, jobs=jobs_within_memory(jobs), retry_failed=False,
                      progress=progress, scheduler=scheduler)
        results: list[tuple[float, float] | str] = []
        for case in cases:
            failure = paths.failure(case)
            if failure.exists():
                results.append(failure.read_text().strip())
                continue
            report = paths.pipeline_analysis(case, steps)
            totals = PipelineTotals.from_json(report.read_text(), str(report))
            results.append((float(totals.inference_s), float(totals.memory_per_device_bytes)))
        return results

    return trace


class StageServer:
    """One ``python -m tracing.calibrate --serve`` process for a search's confirmations: torch
    is loaded once, and each stage is traced in a child forked from it (about 1.5 s of a
    stage's 5 s in a fresh ``trace-stage`` process is the trace itself: the rest is starting
    python and loading torch). Started on the first batch; ends with this process."""

    def __init__(self) -> None:
        self.process = None
        self.log = None

    def trace(self, requests: list[dict]) -> None:
        """Trace ``requests`` (``plans.calibration``); UsageError when the process fails."""
        import json
        import subprocess
        import tempfile

        from planning.plan_estimate import tracer_environment
        from planning.trace_process import CalibrationServer

        if self.process is None or self.process.poll() is not None:
            self.log = tempfile.TemporaryFile("w+")
            self.process = subprocess.Popen(CalibrationServer().command(), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self.log, text=True,
                                            env=tracer_environment())
        try:
            self.process.stdin.write(json.dumps(requests) + "\n")
            self.process.stdin.flush()
        except OSError as error:
            raise UsageError(f"the stage tracer ended: {error}") from None
        for line in self.process.stdout:  # a trace's child may print: the answer is its own line
            if line.strip() == SERVED:
                return
            if line.startswith("Error:"):
                raise UsageError(line.strip().removeprefix("Error: "))
        raise UsageError(f"the stage tracer ended (exit code {self.process.wait()})")


def pretrace_stages(cases: Sequence[PipelineCase], paths, server: StageServer, progress=None) -> None:
    """Trace the stages of ``cases`` not traced yet, at full size, where ``planning.runner``
    looks for them (``paths.pipelines/dumps``, named by the pipeline file), in ``server``. The
    same tracer on the same pipeline file, byte for byte the dumps of ``trace-stage
    --pipeline``: the runner then finds them and analyzes them as its own. A stage the tracer
    refuses, or all of them when the server fails, is left to the runner, which traces it in
    a process of its own and records the failure as it always has."""
    import shutil

    dumps = (paths.pipelines / "dumps").resolve()
    requests = []
    for case in cases:
        plan = paths.pipeline_file(case)
        plan.parent.mkdir(parents=True, exist_ok=True)
        if not plan.exists() or plan.read_text() != case.toml():
            atomic_write(plan, case.toml(), force=True)
        requests.append({"pipeline": str(plan.resolve()), "stages": list(range(case.pipeline.stages)),
                         "out": str(dumps), "failures": str((paths.work / "pretrace" / case.name).resolve())})
    if progress is not None:
        progress.show(f"tracing the stages of {len(cases)} plan(s) in one process")
    try:
        server.trace(requests)
    except UsageError as error:
        log.warning("tracing the stages in one process failed (%s); each is traced on its own", error)
    for request in requests:
        shutil.rmtree(request["failures"], ignore_errors=True)


def plan_file_text(outcome: PlanOutcome, result: SearchResult) -> str:
    """The best plan as a pipeline TOML that ``trace-stage --pipeline`` and
    ``analyze-pipeline`` read as is, with the search's figures as comments."""
    lines = [f"# plan-search: best traced plan that fits {result.memory_limit_bytes / 1e9:.4g} GB "
             f"per device on {result.hardware} ({result.devices} devices)",
             f"# traced inference {outcome.traced_latency_s:.6g} s ({result.steps} steps), "
             f"memory {outcome.traced_memory_bytes / 1e9:.4g} GB per device; estimate "
             f"{outcome.estimate.latency_s:.6g} s",
             f"# {outcome.plan.label}"]
    return "\n".join(lines) + "\n" + outcome.plan.case.toml()


def check_plan_inputs(config: str, shape: str) -> STDiT3Config:
    """The model and shape, checked (one-line errors) before any work."""

    model = get_config(config)
    parse_shape(shape)
    try:
        geometry(model, shape)
    except (ValueError, PipelineConfigError) as error:
        raise UsageError(f"--shape {shape}: {error}") from None
    return model
