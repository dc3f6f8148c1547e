"""``plan-search --model``: the search over a ``trace-module`` model's layouts
(``planning.module_search``) from the command line, and its report as text and JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from hardware import load_system
from hlo_trace.atomic import atomic_write, check_targets
from hlo_trace.errors import UsageError
from planning import module_models, module_search
from planning.module_models import SearchModel
from planning.module_search import Estimate, ModuleSearchResult, Outcome
from plans.module_plan import load_kwargs

#: Bytes per GB as the report prints memory (decimal, as the chips' capacities).
GIGA = 1e9
#: The estimate is checked against the traced layouts to this relative error.
ESTIMATE_TOLERANCE = 0.05
#: The role map's options: role -> what it names.
ROLES = {"column": "layers split by output features under tp (e.g. q,k,v,gate,up)",
         "row": "layers split by input features under tp, their outputs all-reduced (e.g. o,down)",
         "qkv": "attention projections whose outputs Ulysses turns from tokens to heads (e.g. q,k,v)",
         "attn_out": "attention output projections whose input Ulysses turns back to tokens (e.g. o)"}


@dataclass(frozen=True)
class ModelOptions:
    """What the command line says of the model (``--model`` and the options that go with it)."""

    model: str
    shape: str | None
    inputs: tuple[str, ...] = ()
    kwargs_file: str | None = None
    roles: tuple[tuple[str, str | None], ...] = ()
    strategies: str | None = None
    all_degrees: bool = False
    #: sampling steps (None: the official sampler's default; a user model: one call)
    steps: int | None = None


def build_model(options: ModelOptions) -> SearchModel:
    """The search's model (``--steps`` its sampling steps where given)."""
    model = _model(options)
    if options.steps is not None:
        model.steps = options.steps
    return model


def _model(options: ModelOptions) -> SearchModel:
    """A zoo video DiT by name, else a user's factory with its inputs."""
    roles = {role: tuple(n.strip() for n in text.split(",") if n.strip())
             for role, text in options.roles if text is not None}
    if ":" not in options.model:
        given = [f"--{r.replace('_', '-')}" for r in roles] + (["--input"] if options.inputs else [])
        given += ["--kwargs"] if options.kwargs_file else []
        if given:
            raise UsageError(f"{given[0]}: {options.model} is a zoo model whose inputs and layer roles "
                             "are known; pass them only with --model pkg.module:factory")
        return module_models.zoo_model(options.model, options.shape or "")
    if not options.inputs:
        raise UsageError(f"--model {options.model}: a user model needs its inputs, --input "
                         f"NAME=SHAPE:DTYPE with {module_models.VARIABLE} in the dimension that "
                         f"--shape sets (e.g. --input x=2x{module_models.VARIABLE}x64:float32)")
    try:
        variable = int(options.shape or "")
    except ValueError:
        raise UsageError(f"--shape {options.shape}: a user model's shape is the value of "
                         f"{module_models.VARIABLE} in its --input shapes, e.g. --shape 4096") from None
    if variable < 1:
        raise UsageError(f"--shape {options.shape}: expected a positive integer")
    return module_models.UserModel(options.model, load_kwargs(options.kwargs_file), tuple(options.inputs),
                                   variable, roles)


def run_module_search(options: ModelOptions, hardware: str, devices: int | None, *, budget: int,
                      memory_limit_gb: float | None, work_dir: str, json_out: str | None,
                      force: bool, plan_out: str | None = None) -> int:
    """The search, its report on stdout, ``--json``, the best layout's ``trace-module`` plan
    (``plan_out``); exit 0 with an answer, 3 without."""
    started = time.perf_counter()
    model = build_model(options)
    check_targets({"--json": json_out, "-o": plan_out}, force=force)
    system = load_system(hardware)
    devices = devices or system.chip_count
    strategies = None if options.strategies is None else [
        s.strip() for s in options.strategies.split(",") if s.strip()]
    layouts, refused = module_models.enumerate_layouts(model, devices, strategies,
                                                       all_devices=not options.all_degrees)
    progress: Callable[[str], None] = lambda line: click.echo(  # noqa: E731
        f"  [{time.perf_counter() - started:6.0f} s] {line}", err=True)
    tracer = module_search.Tracer(Path(work_dir), hardware, progress=progress)
    if isinstance(model, module_models.UserModel):  # the factory builds, the role map names its layers
        module_search.check_roles(model, tracer)
    if not layouts:
        reason = refused[0][1] if refused else "none"
        raise UsageError(f"no layout of {model.name} uses the {devices} devices of {hardware} "
                         f"({len(refused)} refused, e.g. {reason}); pass --devices N or --all-degrees")
    click.echo(f"plan-search --model {model.name}: {len(layouts)} layouts on {devices} devices of "
               f"{hardware} ({len(refused)} refused)", err=True)
    result = module_search.search_model(
        model, options.shape or "", hardware, layouts, refused, tracer, devices=devices,
        memory_limit_bytes=None if memory_limit_gb is None else memory_limit_gb * GIGA, budget=budget)
    click.echo(render(result), nl=False)
    if json_out:
        atomic_write(json_out, json.dumps(document(result), indent=1) + "\n", force=force)
        click.echo(f"wrote {json_out}", err=True)
    if result.best is None:
        return 3
    if plan_out:
        atomic_write(plan_out, best_plan_text(model, result.best), force=force)
        click.echo(f"wrote {plan_out}", err=True)
    return 0


def best_plan_text(model: SearchModel, best: Outcome) -> str:
    """The best layout as a ``trace-module --plan`` file; the factory's keyword arguments of the
    layout (the joint sequence's order, the ring degree) in its comments."""
    layout = best.layout
    kwargs = {key: value for key, value in model.kwargs("base", layout).items()
              if key not in model.kwargs("base", module_models.Layout(module_models.SINGLE))}
    head = [f"# plan-search --model {model.name}: the best layout, {layout.label} "
            f"(traced loop {best.traced.loop_s:.4g} s)",
            f"# trace-module {model.factory} --plan THIS_FILE --dtype {model.dtype} ..."]
    if kwargs:
        head.append("# with the factory's keyword arguments (--kwargs): "
                    + ", ".join(f"{key} = {value}" for key, value in kwargs.items()))
    if layout.stages > 1:
        head.append("# one PipeFusion tick: its inputs are the stages' patches and K/V buffers "
                    "(models.zoo.videodit.plans.pipefusion_inputs, M = P patches)")
    body = model.plan(layout) or '[mesh]\nshape = [1, 1]\n\nstrategy = "dp"\n'
    return "\n".join(head) + "\n\n" + body


def _figures(estimate: Estimate | None) -> str:
    if estimate is None:
        return f"{'-':>10s} {'-':>8s} {'-':>8s}"
    return f"{estimate.loop_s:10.4g} {estimate.comm_s:8.3g} {estimate.memory_bytes / GIGA:8.4g}"


def render(result: ModuleSearchResult) -> str:
    """The report: the answer, every layout's estimate beside its traced figures, the refusals."""
    lines = [f"plan-search: {result.model} at {result.shape} on {result.hardware} ({result.devices} "
             f"devices), {result.steps} steps, memory limit {result.memory_limit_bytes / GIGA:.4g} GB "
             f"per device; {len(result.outcomes)} layouts estimated, {len(result.traced)} traced at full "
             f"size; {result.traces} traces; {result.seconds:.0f} s (of which {result.lock_wait_s:.0f} s waiting "
             "for the trace lock)", ""]
    best = result.best
    nothing = "none fits the memory limit" if result.traced else "no layout could be traced"
    lines.append("best layout (traced): " + (nothing if best is None else
                 f"{best.layout.label}: loop {best.traced.loop_s:.4g} s, "
                 f"{best.traced.memory_bytes / GIGA:.4g} GB per device"))
    lines += ["", f"  {'layout':28s} {'est loop s':>10s} {'comm s':>8s} {'est GB':>8s}  "
              f"{'traced s':>10s} {'comm s':>8s} {'GB':>8s} {'est/traced':>10s}  fits"]
    for outcome in result.outcomes:
        lines.append(_row(outcome, result.memory_limit_bytes))
    ratios = [o.ratio for o in result.traced if o.ratio is not None]
    within = sum(abs(r - 1) <= ESTIMATE_TOLERANCE for r in ratios)
    worst = result.worst_ratio
    lines += ["", f"estimate within {ESTIMATE_TOLERANCE:.0%} of the traced loop: {within} of {len(ratios)} "
              "traced layouts; worst ratio " + ("n/a" if worst is None else f"{worst:.4f}")
              + " (max of estimate/traced and traced/estimate)"]
    if result.refused:
        lines += ["", "refused (the model cannot run them on these devices):"]
        lines += [f"  {label}: {reason}" for label, reason in result.refused]
    return "\n".join(lines) + "\n"


def _row(outcome: Outcome, limit: float) -> str:
    if outcome.estimate is None:
        return f"  {outcome.layout.label:28s} failed: {outcome.error}"
    text = f"  {outcome.layout.label:28s} {_figures(outcome.estimate)}  "
    if outcome.traced is None:
        over = outcome.estimate.memory_bytes > limit
        tail = f"failed: {outcome.error}" if outcome.error else \
            f"(not traced{f': over the {limit / GIGA:.4g} GB limit' if over else ''})"
        return text + tail
    fits = "yes" if outcome.traced.memory_bytes <= limit else "no"
    return text + f"{_figures(outcome.traced)} {outcome.ratio:10.4f}  {fits}"


def document(result: ModuleSearchResult) -> dict:
    """The result as JSON-able data (``--json``)."""
    def figures(estimate: Estimate | None) -> dict | None:
        if estimate is None:
            return None
        return {"loop_s": estimate.loop_s, "comm_s": estimate.comm_s, "memory_bytes": estimate.memory_bytes,
                "inexact_values": estimate.inexact, "values": estimate.values}

    def outcome(o: Outcome) -> dict:
        return {"layout": o.layout.label, "strategy": o.layout.strategy, "degree": o.layout.degree,
                "mesh": list(o.layout.mesh), "estimate": figures(o.estimate), "traced": figures(o.traced),
                "ratio": o.ratio, "error": o.error}

    best = result.best
    return {"model": result.model, "shape": result.shape, "hardware": result.hardware,
            "devices": result.devices, "steps": result.steps, "memory_limit_bytes": result.memory_limit_bytes,
            "budget": result.budget, "traces": result.traces, "seconds": result.seconds,
            "lock_wait_s": result.lock_wait_s,
            "best": None if best is None else outcome(best), "worst_ratio": result.worst_ratio,
            "tolerance": ESTIMATE_TOLERANCE, "layouts": [outcome(o) for o in result.outcomes],
            "refused": [{"layout": label, "reason": reason} for label, reason in result.refused]}


def role_options() -> Sequence[tuple[str, str]]:
    """The role map's options: (option, help)."""
    return [(f"--{role.replace('_', '-')}", text) for role, text in ROLES.items()]
