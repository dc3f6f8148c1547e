"""``plan-search --model``: the fastest parallel layout of a ``trace-module`` model (the video
DiTs of ``models/zoo/videodit``, or a user's ``pkg.module:factory`` with a role map) at a shape
on a system, estimated for every layout and traced for the best few (docs/plan_search.md,
"Any model: --model").

**The space.** A *layout* is a strategy at a degree (``Layout``): for the video DiTs xDiT's
strategies as ``models.zoo.videodit.plans`` writes them (Ulysses, ring, USP, tensor parallel,
CFG parallel, CFG x Ulysses, PipeFusion and PipeFusion x Ulysses), for a user model those
its role map allows (``tp`` with ``--column``/``--row``, ``ulysses`` with ``--qkv``/
``--attn-out``, ``dp`` over the batch). By default the layouts that use every device; the
feasibility rules (``SearchModel.refusal``: heads, FFN width and tokens divisible, a CFG batch)
refuse the others with a reason, before anything is traced.

**The estimate.** Every dimension of one call of these models is a polynomial of degree at
most 2 in one variable ``T`` (the latent frames of a video; a user model's ``T`` input
dimension): tokens are ``c T``, a joint text + video sequence ``c T + L`` and its attention's
scores ``(c T + L)^2``. So each part of a layout (``configs.parts``: one block of each kind,
and one more of each) is traced at three other values of ``T`` (:func:`calibration_values`:
as divisible by the layout's devices as the plan's ``T``, so the same splits and pads happen),
every integer of its kernel list (shapes, FLOPs, bytes of each collective) is interpolated
exactly at the plan's ``T`` (:func:`interpolate`: Lagrange on three points; a value that is
no such polynomial is rounded and counted as inexact), the kernels costed on the system with
``hlo_analyzer.mapping.program.map_kernels`` (what ``analyze-hlo --hw`` runs), and the whole
model is the parts scaled by the layer counts (``configs.scaled``). (``planning.plan_estimate``
rescales STDiT3 as products of powers of two variables from two shapes; a joint sequence
``c T + L`` is no such product, hence three points and a polynomial here.)
The calibrations are cached under the work directory by what decides them, so another frame
count at the same resolution (or another system) re-costs them without tracing.

**PipeFusion.** A PipeFusion layout's parts are one tick of the pipeline
(``SearchModel.layout_inputs``: the stages' patches and the K/V buffers over the whole video,
``c T`` tokens: still degree 2), and its loop is ``module_models.pipefusion_loop_s`` (what
``scripts/videodit.py`` predicts): the warm-up step is its *warm-up layout*'s call
(``Layout.warmup``: one device, or Ulysses over a stage's group), calibrated and traced beside
it; the memory the heaviest stage's weights and K/V buffers and the larger transient of a tick
and of the warm-up step (the stage's blocks on the whole latent; :func:`whole_model`).

**The traced check.** The best ``budget`` layouts by estimate are traced at full size (each
part at the plan's ``T``), analyzed on the system and scaled the same way: the method
``tests/test_videodit_blocks.py`` checked against whole reduced models. The answer is the
fastest *traced* layout that fits the chip's memory; the estimate/traced ratio of each traced
layout is reported. Every trace runs in one process (``tracing.module_batch``) under the
user's trace lock.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from hardware.systems import resolve_system
from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from hlo_trace.isolate import child_environment
from models.zoo.videodit.configs import scaled
from planning.module_models import (
    Layout,
    SearchModel,
    UserModel,
    device_memory,
    pipefusion_loop_s,
    pipefusion_memory,
    stage_counts,
)
from planning.trace_process import ModuleTraces

__all__ = ["CALIBRATION_POINTS", "Estimate", "ModuleSearchResult", "Outcome", "PartFigures", "Tracer",
           "calibration_values", "check_roles", "interpolate", "interpolate_value", "search_model"]

#: Points of the calibration polynomial: degree 2 (an attention's scores over ``c T + L`` tokens).
CALIBRATION_POINTS = 3
#: The smallest calibration value of ``T`` (a dimension of 1 may lower to another kernel).
MIN_CALIBRATION_VALUE = 2
#: Layouts traced at full size by default: the best by estimate and the next ones.
DEFAULT_BUDGET = 3
#: Seconds between two looks at the traces written so far (progress).
PROGRESS_POLL_S = 2.0


# -- the calibration polynomial ----------------------------------------------------------------------
def calibration_values(target: int, modulus: int, count: int = CALIBRATION_POINTS) -> tuple[int, ...]:
    """``count`` values of the variable other than ``target``, each congruent to it modulo
    ``modulus`` (the layout's devices: every split and pad of ``c t`` by a divisor of the
    devices is then the plan's), at least :data:`MIN_CALIBRATION_VALUE`, smallest first."""
    value = target % modulus or modulus
    found: list[int] = []
    while len(found) < count:
        if value >= MIN_CALIBRATION_VALUE and value != target:
            found.append(value)
        value += modulus
    return tuple(found)


def interpolate_value(points: Sequence[int], values: Sequence[int], target: int) -> tuple[int, bool]:
    """The polynomial of degree ``len(points) - 1`` through ``(points, values)`` at ``target``
    (Lagrange, exact in fractions), rounded to an integer; and whether it was one."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(zip(points, values, strict=True)):
        term = Fraction(yi)
        for j, xj in enumerate(points):
            if j != i:
                term *= Fraction(target - xj, xi - xj)
        total += term
    return round(total), total.denominator == 1


class _Interpolator:
    """Interpolates the integers of aligned structures (kernel documents at the calibration
    values); counts the inexact ones."""

    def __init__(self, points: Sequence[int], target: int) -> None:
        self.points, self.target = tuple(points), target
        self.inexact = self.values = 0

    def __call__(self, items: Sequence[Any]) -> Any:
        first = items[0]
        if isinstance(first, bool) or first is None or isinstance(first, float):
            return first
        if isinstance(first, str):
            self.inexact += any(item != first for item in items)
            return first
        if isinstance(first, int):
            value, exact = interpolate_value(self.points, items, self.target)
            self.values += 1
            self.inexact += not exact
            return max(value, 0)
        if isinstance(first, (list, tuple)):
            if any(not isinstance(item, (list, tuple)) or len(item) != len(first) for item in items):
                raise ValueError("the calibration programs differ in a kernel's fields")
            return type(first)(self(column) for column in zip(*items))
        if isinstance(first, dict):
            if any(not isinstance(item, dict) or item.keys() != first.keys() for item in items):
                raise ValueError("the calibration programs differ in a record's fields")
            result = {key: self([item[key] for item in items]) for key in first}
            if first.get("op_type") == "Vector" and isinstance(first.get("output_shape"), (list, tuple)) \
                    and len(first["output_shape"]) == 2:
                result["output_shape"] = self._rows_and_width(result["output_shape"],
                                                              [item["output_shape"] for item in items])
            return result
        raise TypeError(f"cannot interpolate {type(first).__name__}")

    def _rows_and_width(self, interpolated: Any, shapes: Sequence[Sequence[int]]) -> Any:
        """A vector kernel's (rows, width): the width is ``ceil(out / rows)``
        (``hlo_analyzer.mapping.works``), no polynomial where the rows do not divide the output.
        Where its interpolation comes out empty from positive widths (at 1 to 4 latent frames
        a joint sequence's 7,456 to 14,656 rows give widths 5,934 to 6,037, extrapolated to 0
        at 33), the width is the interpolated ``rows x width`` over the rows, counted inexact."""
        rows, width = interpolated
        if width > 0 or any(w < 1 for _, w in shapes):
            return interpolated
        total, _ = interpolate_value(self.points, [r * w for r, w in shapes], self.target)
        self.inexact += 1
        return type(interpolated)((rows, max(1, math.ceil(total / max(rows, 1)))))


def interpolate(documents: Sequence[Any], points: Sequence[int], target: int) -> tuple[Any, int, int]:
    """Aligned documents at ``points`` -> the document at ``target``, inexact and all values."""
    walker = _Interpolator(points, target)
    return walker(documents), walker.inexact, walker.values


# -- figures of a part ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartFigures:
    """One part's program on the system: one call's seconds (kernels, and collectives among
    them) and one device's memory (weights; inputs and scalars; peak of live activations with
    the attentions fused; PipeFusion's K/V buffers)."""

    step_s: float
    comm_s: float
    weight_bytes: int
    other_bytes: int
    peak_live_bytes: int
    #: PipeFusion's K/V buffers (resident, beside the weights)
    stale_kv_bytes: int = 0


@dataclass(frozen=True)
class Estimate:
    """A layout's whole model (the parts scaled): the sampling loop's seconds and one device's
    memory (``transient_bytes`` of it one call's: ``module_models.DeviceMemory``); ``inexact``:
    integers of the calibrations that were no polynomial of degree 2."""

    loop_s: float
    comm_s: float
    memory_bytes: float
    inexact: int = 0
    values: int = 0
    transient_bytes: float = 0.0


def whole_model(figures: Mapping[str, PartFigures], counts: Mapping[str, int], steps: int,
                inexact: int = 0, values: int = 0, *, layout: Layout | None = None,
                warmup: Estimate | None = None) -> Estimate:
    """The parts scaled by the layer counts (``configs.scaled``; the peak: the largest part's).
    Under PipeFusion (``layout.stages`` > 1) the parts are a tick's: the loop is
    ``module_models.pipefusion_loop_s`` with the ``warmup`` layout's step, the memory
    ``module_models.pipefusion_memory``: the heaviest stage's weights and K/V buffers, and the
    larger transient of a tick and of the ``warmup`` layout's call."""
    stages = 1 if layout is None else layout.stages
    memory = device_memory({part: f.weight_bytes + f.stale_kv_bytes for part, f in figures.items()},
                           counts if stages == 1 else stage_counts(counts, stages), figures["base"].other_bytes,
                           {part: f.peak_live_bytes for part, f in figures.items()})

    def additive(get: Callable[[PartFigures], float]) -> float:
        return scaled({part: get(f) for part, f in figures.items()}, counts)

    if stages == 1:
        return Estimate(steps * additive(lambda f: f.step_s), steps * additive(lambda f: f.comm_s),
                        memory.total_bytes, inexact, values, memory.transient_bytes)
    if warmup is None:
        raise ValueError(f"{layout.label}: PipeFusion's loop needs its warm-up step")
    memory = pipefusion_memory(memory, warmup.transient_bytes)

    def loop(get: Callable[[PartFigures], float], warm_s: float) -> float:
        return pipefusion_loop_s({part: get(f) for part, f in figures.items()}, warm_s / steps, counts,
                                 stages, steps)

    return Estimate(loop(lambda f: f.step_s, warmup.loop_s), loop(lambda f: f.comm_s, warmup.comm_s),
                    memory.total_bytes, inexact + warmup.inexact, values + warmup.values, memory.transient_bytes)


# -- the search -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    layout: Layout
    estimate: Estimate | None
    traced: Estimate | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.estimate is None or self.traced is None or not self.traced.loop_s:
            return None
        return self.estimate.loop_s / self.traced.loop_s


@dataclass(frozen=True)
class ModuleSearchResult:
    model: str
    shape: str
    hardware: str
    devices: int
    steps: int
    memory_limit_bytes: float
    budget: int
    outcomes: tuple[Outcome, ...]
    refused: tuple[tuple[str, str], ...]
    traces: int
    seconds: float
    lock_wait_s: float = 0.0

    @property
    def traced(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.traced is not None]

    @property
    def best(self) -> Outcome | None:
        fitting = [o for o in self.traced if o.traced.memory_bytes <= self.memory_limit_bytes]
        return min(fitting, key=lambda o: o.traced.loop_s, default=None)

    @property
    def worst_ratio(self) -> float | None:
        ratios = [o.ratio for o in self.traced if o.ratio is not None]
        return max((max(r, 1 / r) for r in ratios), default=None)


class Tracer:
    """The traces and analyses of a search, cached under ``work``: ``trace(requests)`` runs
    the missing ones in one ``tracing.module_batch`` process under the trace lock; ``figures``
    analyzes a dump on the system (cached beside it, per system)."""

    def __init__(self, work: Path, hardware: str, *, lock: bool = True,
                 progress: Callable[[str], None] = lambda line: None) -> None:
        self.work, self.hardware, self.lock, self.progress = Path(work), hardware, lock, progress
        self.traced = 0
        #: seconds spent waiting for the trace lock (other runs' traces)
        self.lock_wait_s = 0.0

    def trace(self, requests: Sequence[dict[str, Any]], what: str) -> None:
        unique = {(r["out"], r["name"]): r for r in requests}  # a warm-up layout's may repeat
        missing = [r for r in unique.values() if not _done(r)]
        if not missing:
            return
        self.progress(f"tracing {what}: {len(missing)} trace{'s' if len(missing) > 1 else ''} ...")
        self.work.mkdir(parents=True, exist_ok=True)
        listing = self.work / f"requests.{id(self)}.json"
        atomic_write(listing, json.dumps(missing), force=True)
        from planning.train_estimate import trace_lock

        waiting = time.perf_counter()
        try:
            with trace_lock() if self.lock else contextlib.nullcontext():
                self.lock_wait_s += time.perf_counter() - waiting
                code, stderr = self._run(ModuleTraces(listing).command(), missing)
        finally:
            listing.unlink(missing_ok=True)
        if code:
            last = [line for line in stderr.splitlines() if line.startswith("Error:")] or \
                stderr.strip().splitlines()[-1:] or [f"exit code {code}"]
            raise UsageError(f"tracing failed: {last[-1].removeprefix('Error: ')}")
        self.traced += len(missing)

    def _run(self, command: list[str], requests: Sequence[dict[str, Any]]) -> tuple[int, str]:
        """Run the tracing process, saying how many of ``requests`` are done as they finish."""
        import tempfile

        with tempfile.TemporaryFile("w+") as log:  # a pipe would fill with the traces' progress
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True,
                                       env=child_environment(_python_path()))
            try:
                shown = 0
                while process.poll() is None:
                    time.sleep(PROGRESS_POLL_S)
                    done = sum(map(_done, requests))
                    if done != shown:
                        shown = done
                        self.progress(f"  traced {done}/{len(requests)}")
            finally:
                if process.poll() is None:
                    process.kill()
            log.seek(0)
            return process.wait(), log.read()

    def kernels(self, dump: Path, devices: int) -> dict[str, Any]:
        """The dump's kernels on the system (a ``sources_document``), its traced step and memory."""
        target = dump.with_name(f"{dump.stem}.{Path(self.hardware).stem}.kernels.json")
        if target.exists():
            return json.loads(target.read_text())
        from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump
        from hlo_analyzer.mapping.kernel_list import sources_document

        analysis = analyze_dump(str(dump), self.hardware, AnalysisOptions(steps=1, attention_memory="fused"))
        mapping, usage = analysis.mapping, analysis.memory.usage
        document = {"kernels": sources_document(mapping.program.sources, analysis.options.execution),
                    "step_s": mapping.program.latency_s,
                    "comm_s": _comm_seconds(mapping.program),
                    "memory": [usage.weight_bytes, usage.input_bytes + usage.scalar_bytes, usage.peak_live_bytes,
                               usage.stale_kv_bytes],
                    "devices": devices}
        atomic_write(target, json.dumps(document) + "\n", force=True)
        return document


def _python_path() -> dict[str, str]:
    import os

    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}


def _done(request: dict[str, Any]) -> bool:
    out, name = Path(request["out"]), request["name"]
    if (out / f"{name}.failed.txt").exists():
        return True
    if request.get("modules"):
        return (out / f"{name}.modules.json").exists()
    return (out / f"{name}.mlir").exists() and (out / f"{name}.json").exists()


def _failure(request: dict[str, Any]) -> str | None:
    path = Path(request["out"]) / f"{request['name']}.failed.txt"
    return path.read_text().strip() if path.exists() else None


def _comm_seconds(program: Any) -> float:
    from hlo_analyzer.mapping.results import NETWORK_KIND

    return sum(op.latency_s for op in program.ops if op.kind == NETWORK_KIND)


def _request(model: SearchModel, layout: Layout, part: str, t: int, out: Path) -> dict[str, Any]:
    return {"factory": model.factory, "kwargs": model.kwargs(part, layout), "inputs": model.layout_inputs(part, layout, t),
            "plan": model.plan(layout), "dtype": model.dtype, "name": f"{layout.tag}_{part}_T{t}", "out": str(out)}


def _out(work: Path, model: SearchModel, layout: Layout) -> Path:
    """Where a layout's dumps live: keyed by the model, its keyword arguments and the inputs'
    shape apart from the variable (the same calibrations serve every value of it)."""
    import hashlib

    key = json.dumps([model.factory, model.kwargs("base", layout), model.inputs(0), model.plan(layout), model.dtype],
                     sort_keys=True, default=str)
    return work / "module-search" / f"{model.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def calibration_requests(model: SearchModel, layout: Layout, work: Path) -> list[dict[str, Any]]:
    """The layout's calibration traces (those of its warm-up layout after them: PipeFusion)."""
    out = _out(work, model, layout)
    own = [_request(model, layout, part, t, out) for part in model.parts()
           for t in calibration_values(model.variable, layout.devices)]
    return own + ([] if layout.warmup is None else calibration_requests(model, layout.warmup, work))


def full_requests(model: SearchModel, layout: Layout, work: Path) -> list[dict[str, Any]]:
    """The layout's full-size parts (its warm-up layout's after them: PipeFusion)."""
    out = _out(work, model, layout)
    own = [_request(model, layout, part, model.variable, out) for part in model.parts()]
    return own + ([] if layout.warmup is None else full_requests(model, layout.warmup, work))


def estimate_layout(model: SearchModel, layout: Layout, tracer: Tracer, system: Any) -> Estimate:
    """The layout's estimate from its calibration traces (module docstring)."""
    from hlo_analyzer.mapping.kernel_list import sources_from_document
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import MappingOptions

    requests = calibration_requests(model, layout, tracer.work)
    failed = next((f for f in map(_failure, requests) if f), None)
    if failed:
        raise UsageError(failed)
    points = calibration_values(model.variable, layout.devices)
    own = _out(tracer.work, model, layout)
    figures, inexact, values = {}, 0, 0
    for part in model.parts():
        docs = [tracer.kernels(Path(r["out"]) / f"{r['name']}.mlir", layout.devices)
                for r in requests if Path(r["out"]) == own and r["name"].startswith(f"{layout.tag}_{part}_T")]
        document, bad, count = interpolate([d["kernels"] for d in docs], points, model.variable)
        memory, bad_m, count_m = interpolate([d["memory"] for d in docs], points, model.variable)
        inexact, values = inexact + bad + bad_m, values + count + count_m
        sources, execution = sources_from_document(document)
        program = map_kernels(sources, system.chip, system, MappingOptions(execution=execution))
        figures[part] = PartFigures(program.latency_s, _comm_seconds(program), *memory)
    warmup = None if layout.warmup is None else estimate_layout(
        model, layout.warmup, tracer, resolve_system(tracer.hardware, layout.warmup.devices).system)
    return whole_model(figures, model.counts(), model.steps, inexact, values, layout=layout, warmup=warmup)


def traced_layout(model: SearchModel, layout: Layout, tracer: Tracer) -> Estimate:
    """The layout's full-size parts, analyzed and scaled by the layer counts."""
    requests = full_requests(model, layout, tracer.work)
    tracer.trace(requests, f"the full-size parts of {layout.label}")
    failed = next((f for f in map(_failure, requests) if f), None)
    if failed:
        raise UsageError(failed)
    figures = {}
    for part, request in zip(model.parts(), requests, strict=False):  # the layout's own parts first
        doc = tracer.kernels(Path(request["out"]) / f"{request['name']}.mlir", layout.devices)
        figures[part] = PartFigures(doc["step_s"], doc["comm_s"], *doc["memory"])
    warmup = None if layout.warmup is None else traced_layout(model, layout.warmup, tracer)
    return whole_model(figures, model.counts(), model.steps, layout=layout, warmup=warmup)


def search_model(model: SearchModel, shape: str, hardware: str, layouts: Sequence[Layout],
                 refused: Sequence[tuple[str, str]], tracer: Tracer, *, devices: int,
                 memory_limit_bytes: float | None = None, budget: int = DEFAULT_BUDGET,
                 clock: Callable[[], float] | None = None) -> ModuleSearchResult:
    """Estimate every layout, trace the ``budget`` best by estimate that fit (and the next ones
    while none of the traced fits), and answer the fastest traced one that fits."""
    clock = clock or time.perf_counter
    started = clock()
    limit = memory_limit_bytes or resolve_system(hardware, devices).system.chip.dram_capacity_bytes
    requests = [r for layout in layouts for r in calibration_requests(model, layout, tracer.work)]
    warmups = {layout.warmup for layout in layouts if layout.warmup is not None} - set(layouts)
    extra = f" and {len(warmups)} PipeFusion warm-up layout{'s' * (len(warmups) > 1)}" if warmups else ""
    tracer.trace(requests, f"the calibration parts ({len(layouts)} layouts{extra} x {len(model.parts())} parts x "
                 f"{CALIBRATION_POINTS} values of T)")
    outcomes = []
    for index, layout in enumerate(layouts, 1):
        tracer.progress(f"estimating {layout.label} ({index}/{len(layouts)})")
        system = resolve_system(hardware, layout.devices).system
        try:
            outcomes.append(Outcome(layout, estimate_layout(model, layout, tracer, system)))
        except (UsageError, ValueError) as error:
            outcomes.append(Outcome(layout, None, error=str(error)))
    ranked = sorted((o for o in outcomes if o.estimate is not None), key=lambda o: o.estimate.loop_s)
    chosen = [o for o in ranked if o.estimate.memory_bytes <= limit][:budget] or ranked[:budget]
    final = {o.layout: o for o in outcomes}
    tracer.trace([r for o in chosen for r in full_requests(model, o.layout, tracer.work)],
                 f"the full-size parts of the best {len(chosen)} layouts by estimate")
    for outcome in chosen:
        try:
            final[outcome.layout] = Outcome(outcome.layout, outcome.estimate,
                                            traced_layout(model, outcome.layout, tracer))
        except UsageError as error:
            final[outcome.layout] = Outcome(outcome.layout, outcome.estimate, error=str(error))
    order = sorted(final.values(), key=lambda o: (o.estimate is None, o.estimate.loop_s if o.estimate else 0))
    return ModuleSearchResult(model.name, shape, hardware, devices, model.steps, limit, budget,
                              tuple(order), tuple(refused), tracer.traced, clock() - started,
                              tracer.lock_wait_s)


def check_roles(model: UserModel, tracer: Tracer) -> None:
    """Every name of the role map names a layer of the model (one line naming the first that
    does not); the model's factory builds."""
    out = tracer.work / "module-search" / "names"
    key = json.dumps([model.factory, model.factory_kwargs], sort_keys=True, default=str)
    import hashlib

    request = {"modules": True, "factory": model.factory, "kwargs": model.factory_kwargs,
               "name": hashlib.sha256(key.encode()).hexdigest()[:12], "out": str(out)}
    tracer.trace([request], "the model's layer names")
    failed = _failure(request)
    if failed:
        raise UsageError(failed)
    names = json.loads((out / f"{request['name']}.modules.json").read_text())["modules"]
    for role, wanted in model.roles.items():
        for name in wanted:
            if not any(n == name or n.endswith(f".{name}") for n in names):
                sample = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})[:12])
                raise UsageError(f"--{role.replace('_', '-')} {name}: no layer of {model.factory} is "
                                 f"named {name} (its layers' names: {sample}, ...)")
