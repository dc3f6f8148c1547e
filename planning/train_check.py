"""An independent check of the training estimate: each pipeline stage of a plan traced whole.

The training estimate (``planning.train_estimate``) and the training search's "traced" figure
both take one block pair's step and multiply it by the stage's pairs: they agree on the pair's
kernels and say nothing of a stage of n pairs. This check traces every stage of a plan as the
plan runs it (``trace-stage --mode train --stage-ids`` of the plan's even split, ``--stage s``:
all its pairs, the first stage's embeddings, the last stage's final layer and loss, one
micro-batch, forward, backward with the recompute, AdamW and the ZeRO collectives, on the
stage's mesh at the plan's shape, micro-batch, ring degree, ZeRO stage and recompute), analyses
it as the estimate's calibrations are analysed (``train_estimate.analyze_pair``: once per
micro-batch, once per step) and compares, stage by stage:

* per micro-batch: the traced stage's ``micro`` group with the estimate's ``n * micro``;
* per step: ``m * micro + update`` of the traced stage with the estimate's ``m n micro + n
  update`` (``train_estimate.compose_step`` of one stage without boundary: gradient
  accumulation over the plan's m micro-batches, no pipeline).

What the estimate leaves out is in the traced figure (the embeddings, the final layer and the
loss), so the first and last stages measure that too. The 1F1B composition of the stages (fill
and drain, boundary sends) stays a model: neither side here has it.

Traces and analyses are cached under the work directory (``train_stage_checks/``); each plan's
stages are traced under one hold of the trace lock (``TrainKernels.lock``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware.spec import SystemSpec
from hlo_trace.atomic import atomic_write
from models.opensora.config import get_config
from planning.plan_estimate import GroupCost, run_calibration_traces
from planning.plan_search import ESTIMATE_TOLERANCE
from planning.train_estimate import (
    CACHE_VERSION,
    DUMPS_DIR,
    TrainKernels,
    analyze_pair,
    compose_step,
    cost_groups,
    step_groups,
    trace_lock,
)
from planning.train_search import TrainPlan, TrainSearchResult, pair_key
from plans.calibration import FAILURE_FILE, dump_names

__all__ = ["StageCheck", "check_plan", "check_plans", "check_document", "even_split", "render_checks",
           "stage_request", "stage_sums"]

#: The checks' traces and analyses, beside ``TrainKernels``' ``train_calibrations``.
WORK_DIR = "train_stage_checks"


@dataclass(frozen=True)
class StageCheck:
    """One stage of a plan: the estimate's and the traced stage's seconds per device, per
    micro-batch and per step (``m`` micro-batches and the once-per-step part); ``ends``: what
    the traced stage holds beyond its pairs; ``error``: why it has no traced figure."""

    plan: str
    stage: int
    pairs: int
    ends: str
    estimated_micro_s: float
    estimated_step_s: float
    traced_micro_s: float | None = None
    traced_step_s: float | None = None
    #: The stage's pairs as the search's traced figure has them: n x the one-pair program traced
    #: at the plan's shape, per micro-batch (None when that trace failed).
    pair_trace_micro_s: float | None = None
    error: str | None = None

    @property
    def micro_ratio(self) -> float | None:
        return self.estimated_micro_s / self.traced_micro_s if self.traced_micro_s else None

    @property
    def step_ratio(self) -> float | None:
        return self.estimated_step_s / self.traced_step_s if self.traced_step_s else None

    @property
    def over_pair_trace(self) -> float | None:
        """The traced stage over n x the traced pair, per micro-batch: what a stage of n pairs
        adds to n one-pair programs (the ends, and anything the pairs do otherwise together)."""
        return self.traced_micro_s / self.pair_trace_micro_s if self.traced_micro_s and self.pair_trace_micro_s \
            else None

    @property
    def within(self) -> bool:
        ratios = (self.micro_ratio, self.step_ratio)
        return all(r is not None and abs(r - 1) <= ESTIMATE_TOLERANCE for r in ratios)


def even_split(depth: int, stages: int) -> str:
    """``--stage-ids`` of ``depth`` pairs cut into ``stages`` equal stages, e.g. 0-13,14-27."""
    pairs = depth // stages
    return ",".join(f"{s * pairs}-{(s + 1) * pairs - 1}" for s in range(stages))


def stage_request(plan: TrainPlan, config: str, shape: str, out: Path) -> dict[str, Any]:
    """``tracing.calibrate``'s request for every stage of the plan: its pair's request (mesh,
    ring, ZeRO, recompute, micro-batch) with the plan's split of the pairs."""
    request = pair_key(plan, config).request(shape, out)
    return {**request, "stage_ids": even_split(get_config(config).depth, plan.stages),
            "stages": list(range(plan.stages))}


def stage_sums(groups: dict[str, GroupCost], *, pairs: int, micro_batches: int) -> tuple[float, float]:
    """Per micro-batch and per step seconds of ``pairs`` pairs of ``groups`` (``micro``,
    ``update``) over ``micro_batches``: one stage of ``compose_step``, no pipeline, no sends."""
    step = compose_step(groups, pairs=pairs, stages=1, micro_batches=micro_batches, boundary_s=0.0)
    return pairs * (groups["micro"].compute_s + groups["micro"].comm_s), step.step_s


def _ends(stage: int, stages: int) -> str:
    ends = (["embeddings"] if stage == 0 else []) + (["final layer, loss"] if stage == stages - 1 else [])
    return " + ".join(ends)


def _analysis(dump: Path, path: Path, system: SystemSpec) -> dict[str, Any]:
    """The stage's kernel groups on ``system``'s chip (cached in ``path``)."""
    if path.exists():
        document = json.loads(path.read_text())
        if document.get("version") == CACHE_VERSION:
            return document["groups"]
    groups = analyze_pair(str(dump), system).groups
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"version": CACHE_VERSION, "groups": groups}) + "\n", force=True)
    return groups


def check_plan(plan: TrainPlan, system: SystemSpec, config: str, shape: str,
               kernels: TrainKernels) -> list[StageCheck]:
    """Every stage of ``plan`` traced whole (module doc) beside the estimate from ``kernels``'
    calibrations; a stage without a traced figure says why."""
    pairs = get_config(config).depth // plan.stages
    try:
        pair, _ = kernels.estimate(pair_key(plan, config), system)
    except ValueError as error:
        return [StageCheck(plan.label, s, pairs, _ends(s, plan.stages), 0.0, 0.0, error=str(error))
                for s in range(plan.stages)]
    micro, step = stage_sums(pair, pairs=pairs, micro_batches=plan.micro_batches)
    full = kernels.full(pair_key(plan, config), system)
    pair_trace = None if isinstance(full, str) else stage_sums(full[0], pairs=pairs, micro_batches=1)[0]
    work = kernels.work.parent / WORK_DIR
    name = f"{pair_key(plan, config).name(shape)}_P{plan.stages}"
    out = work / DUMPS_DIR / name
    request = stage_request(plan, config, shape, out)
    with trace_lock(kernels.lock):  # one hold for the plan's stages
        run_calibration_traces([request], work, jobs=1)
    failure = out / FAILURE_FILE
    checks = []
    for stage, dump in enumerate(dump_names(request)):
        check = StageCheck(plan.label, stage, pairs, _ends(stage, plan.stages), micro, step,
                           pair_trace_micro_s=pair_trace)
        if failure.exists():
            checks.append(dataclasses.replace(check, error=failure.read_text().strip()))
            continue
        groups = _analysis(out / dump, work / system.chip.name / name / f"{Path(dump).stem}.json", system)
        traced_micro, traced_step = stage_sums(step_groups(cost_groups(groups, system)), pairs=1,
                                               micro_batches=plan.micro_batches)
        checks.append(dataclasses.replace(check, traced_micro_s=traced_micro, traced_step_s=traced_step))
    return checks


def check_plans(result: TrainSearchResult, system: SystemSpec, kernels: TrainKernels, count: int,
                progress: Callable[[str], None] | None = None) -> list[StageCheck]:
    """The stage check of the first ``count`` of the search's traced plans: the ones drawn at
    random (the validation) first, then the fastest."""
    traced = [o.plan for o in result.outcomes if o.traced]
    ordered = [p for p in result.validation if p in traced] + [p for p in traced if p not in result.validation]
    checks: list[StageCheck] = []
    for index, plan in enumerate(ordered[:count]):
        if progress is not None:
            progress(f"stage check {index + 1} of {min(count, len(ordered))}: {plan.label} "
                     f"({plan.stages} stages traced whole)")
        checks += check_plan(plan, system, result.config, result.shape, kernels)
    return checks


def render_checks(checks: Sequence[StageCheck]) -> str:
    """The stage check as a table: per stage, the estimate, the traced stage and their ratio,
    per micro-batch and per step (ms)."""
    if not checks:
        return ""
    lines = ["", "stage check: every stage of the plan traced whole (its pairs, one micro-batch, the optimizer "
                 "and ZeRO collectives) beside the estimate's pair x pairs; estimate / traced, per device:",
             f"  {'plan':<46} {'stage':>5} {'pairs':>5}  {'micro est ms':>12} {'traced':>9} {'ratio':>6}"
             f"  {'step est ms':>11} {'traced':>9} {'ratio':>6}  {'stage/pairs':>11}  holds also"]
    for c in checks:
        if c.error is not None:
            lines.append(f"  {c.plan:<46} {c.stage:>5} {c.pairs:>5}  not traced: {c.error}")
            continue
        assert c.traced_micro_s is not None and c.traced_step_s is not None
        lines.append(f"  {c.plan:<46} {c.stage:>5} {c.pairs:>5}  {c.estimated_micro_s * 1e3:>12.2f} "
                     f"{c.traced_micro_s * 1e3:>9.2f} {c.micro_ratio:>6.3f}  {c.estimated_step_s * 1e3:>11.2f} "
                     f"{c.traced_step_s * 1e3:>9.2f} {c.step_ratio:>6.3f}  {_ratio_text(c.over_pair_trace):>11}  "
                     f"{c.ends or '-'}")
    good = sum(c.within for c in checks)
    ratios = [r for c in checks for r in (c.micro_ratio, c.step_ratio) if r is not None]
    span = f"; ratios {min(ratios):.4f}-{max(ratios):.4f}" if ratios else ""
    lines.append("  stage/pairs: the traced stage's micro-batch over n x the one pair traced at the plan's shape "
                 "(the search's traced figure)")
    lines.append(f"  {good} of {len(checks)} stages within {ESTIMATE_TOLERANCE:.0%} per micro-batch and per step{span}; "
                 "the 1F1B composition of the stages is a model, not checked here")
    return "\n".join(lines) + "\n"


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


def check_document(checks: Sequence[StageCheck]) -> list[dict[str, Any]]:
    """The stage checks as JSON rows (``--json``'s ``stage_checks``)."""
    return [{**dataclasses.asdict(c), "micro_ratio": c.micro_ratio, "step_ratio": c.step_ratio,
             "over_pair_trace": c.over_pair_trace, "within": c.within}
            for c in checks]
