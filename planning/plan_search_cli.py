"""``plan-search``: the fastest parallel plan that fits, estimated over the whole space and traced
only where it matters (``planning.plan_search``; docs/plan_search.md)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from hardware import load_system
from hlo_trace import cache
from hlo_trace.atomic import atomic_write, check_targets, write_png
from hlo_trace.cli import (
    MAX_COUNT,
    MAX_QUANTITY,
    Count,
    OneLineCommand,
    PositiveFinite,
    end_process,
    native_imports,
    run_click,
)
from hlo_trace.errors import UsageError
from hlo_trace.numbers import brief, parse_int
from models.opensora.parallel import STRATEGY_NAMES
from planning import sizing, sizing_cli, train_search
from planning.module_search_cli import ROLES, ModelOptions, run_module_search
from plans.config import default_shape

#: The exit code of a search that found no answer (no traced plan fits the memory limit, or no
#: device count meets the target): its report says so; 1 stays an internal error, 2 bad input.
NO_ANSWER = 3

#: Bytes per GB as the report prints memory (decimal, as the study's tables).
GIGA = 1e9
#: --mode train's default tracing processes at most (one a core; each a one-pair program).
TRAIN_JOBS = 2
#: Untraced plans the text lists, by estimate.
UNTRACED_SHOWN = 10


def _int_list(text: str, option: str, *, minimum: int = 1) -> list[int]:
    try:
        values = [parse_int(part.strip(), minimum=minimum, maximum=MAX_COUNT)
                  for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"{option} {brief(text)}: expected comma-separated integers from "
                         f"{minimum} to {MAX_COUNT} in ASCII digits, e.g. 1,2,4")
    return list(dict.fromkeys(values))


def _zero_list(text: str) -> list[int]:
    """``--zero``: ZeRO stages 0-3, comma-separated."""
    values = _int_list(text, "--zero", minimum=0)
    if any(value > 3 for value in values):
        raise UsageError(f"--zero {brief(text)}: expected comma-separated ZeRO stages from 0 to 3, e.g. 0,2")
    return values


def render_report(result) -> str:
    """The search's report as text: the answer, the Pareto front, every traced plan's estimate
    beside its traced figures with the estimate's error, and how the space was cut."""
    from planning.plan_search import ESTIMATE_TOLERANCE, MIN_RANKED_PLANS

    limit = result.memory_limit_bytes / GIGA
    lines = [f"plan-search: {result.config} at {result.shape} on {result.hardware} "
             f"({result.devices} devices), memory limit {limit:.4g} GB per device, "
             f"{result.steps} sampling steps",
             f"space: {len(result.space.plans)} plans the tracer accepts, "
             f"{len(result.space.infeasible)} refused; estimated all, traced "
             f"{len(result.traced)} (budget {result.budget}); stopped: {result.stopped}"]
    lines += refused_lines(result.space.infeasible) + [""]
    best = result.best
    if best is None:
        lines.append("best plan: none of the traced plans fits the memory limit")
    else:
        lines.append(f"best plan (traced): {best.plan.label}: {best.traced_latency_s:.6g} s, "
                     f"{best.traced_memory_bytes / GIGA:.4g} GB per device")
    lines += ["", "Pareto front of the traced plans (latency against memory per device):"]
    for outcome in result.pareto:
        lines.append(f"  {outcome.traced_memory_bytes / GIGA:10.4g} GB  "
                     f"{outcome.traced_latency_s:12.6g} s  {outcome.plan.label}")
    lines += ["", "traced plans, estimate beside traced (latency s; memory GB per device):",
              f"  {'plan':58s} {'estimate s':>12s} {'traced s':>12s} {'est/traced':>10s} "
              f"{'est GB':>9s} {'traced GB':>9s}  fits"]
    for outcome in result.outcomes:
        if outcome.error is not None:
            lines.append(f"  {outcome.plan.label:58s} {outcome.estimate.latency_s:12.6g} "
                         f"failed: {outcome.error}")
        elif outcome.traced:
            fits = "yes" if outcome.traced_memory_bytes <= result.memory_limit_bytes else "no"
            drawn = "*" if outcome.plan in result.validation else " "
            lines.append(f" {drawn}{outcome.plan.label:58s} {outcome.estimate.latency_s:12.6g} "
                         f"{outcome.traced_latency_s:12.6g} {outcome.ratio:10.3f} "
                         f"{outcome.estimate.memory_bytes / GIGA:9.4g} "
                         f"{outcome.traced_memory_bytes / GIGA:9.4g}  {fits}")
    rho, worst = result.spearman, result.worst_ratio
    within, ratios = result.within
    lines.append("estimate on the traced plans: Spearman rank correlation "
                 + (f"n/a (fewer than {MIN_RANKED_PLANS} traced plans)" if rho is None
                    else f"{rho:.3f}")
                 + ", worst ratio " + ("n/a" if worst is None else f"{worst:.3f}")
                 + " (max of estimate/traced and traced/estimate)")
    lines.append(f"estimate within {ESTIMATE_TOLERANCE:.0%} of the traced latency: {within} of {ratios} "
                 f"traced plans ({len(result.validation)} of them drawn at random to check it, "
                 "marked *); estimate basis: " + (result.outcomes[0].estimate.basis.split(" (")[0]
                                                   if result.outcomes else "n/a"))
    untraced = [o for o in result.outcomes if not o.traced and o.error is None]
    if untraced:
        shown = min(UNTRACED_SHOWN, len(untraced))
        lines += ["", f"untraced plans, best {shown} of {len(untraced)} by estimate (never an answer):"]
    else:
        lines += ["", "untraced plans: none (every plan the tracer accepts was traced)"]
    for outcome in untraced[:UNTRACED_SHOWN]:
        lines.append(f"  {outcome.plan.label:58s} {outcome.estimate.latency_s:12.6g} s "
                     f"{outcome.estimate.memory_bytes / GIGA:9.4g} GB")
    return "\n".join(lines) + "\n"



#: Reasons the text lists, most frequent first; the rest are counted (``--json`` has them all).
REFUSAL_REASONS_SHOWN = 12
#: Plans named per reason.
REFUSED_PLANS_SHOWN = 3


def refused_lines(infeasible: Sequence[tuple[str, str]]) -> list[str]:
    """Why the tracer refused plans: each reason once, with how many plans it refused and the
    first of them."""
    by_reason: dict[str, list[str]] = {}
    for label, reason in infeasible:
        by_reason.setdefault(reason, []).append(label)
    if not by_reason:
        return []
    ranked = sorted(by_reason.items(), key=lambda item: -len(item[1]))  # stable: first seen first
    lines = ["refused by the tracer, by reason (plans):"]
    for reason, labels in ranked[:REFUSAL_REASONS_SHOWN]:
        named = ", ".join(labels[:REFUSED_PLANS_SHOWN]) + (", ..." if len(labels) > REFUSED_PLANS_SHOWN else "")
        lines.append(f"  {len(labels)} x {reason} ({named})")
    if len(ranked) > REFUSAL_REASONS_SHOWN:
        rest = ranked[REFUSAL_REASONS_SHOWN:]
        lines.append(f"  ... {len(rest)} other reasons for {sum(len(labels) for _, labels in rest)} "
                     "plans (--json lists every refused plan with its reason)")
    return lines


def result_document(result) -> dict:
    """The search's result as JSON-able data (``--json``)."""
    from planning.plan_search import ESTIMATE_TOLERANCE

    def outcome(o) -> dict:
        return {"plan": o.plan.label, "case": o.plan.case.name,
                "estimate": {"latency_s": o.estimate.latency_s,
                             "memory_bytes": o.estimate.memory_bytes,
                             "compute_s": o.estimate.compute_s, "comm_s": o.estimate.comm_s,
                             "basis": o.estimate.basis, "parts": dict(o.estimate.parts)},
                "residual": None if o.ratio is None else o.ratio - 1,
                "validation": o.plan in result.validation,
                "traced": None if not o.traced else {"latency_s": o.traced_latency_s,
                                                     "memory_bytes": o.traced_memory_bytes},
                "error": o.error}

    return {"config": result.config, "shape": result.shape, "hardware": result.hardware,
            "devices": result.devices, "memory_limit_bytes": result.memory_limit_bytes,
            "budget": result.budget, "steps": result.steps, "stopped": result.stopped,
            "best": None if result.best is None else outcome(result.best),
            "pareto": [o.plan.label for o in result.pareto],
            "spearman": result.spearman, "worst_ratio": result.worst_ratio,
            "within_tolerance": {"tolerance": ESTIMATE_TOLERANCE, "plans": result.within[0], "of": result.within[1]},
            "plans": [outcome(o) for o in result.outcomes],
            "infeasible": [{"plan": label, "reason": reason}
                           for label, reason in result.space.infeasible]}


def require_plot_extra() -> None:
    """One line, before any work, when ``--plot`` is given without the plot extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'hlo-trace[plot]'") from None


def plot_front(result, path: str, *, force: bool) -> None:
    """A PNG of every traced plan's latency against its memory per device (log latency), the
    Pareto front joined, the best plan marked and the memory limit drawn (the plot extra)."""

    require_plot_extra()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    traced = [o for o in result.traced]
    fig, axis = plt.subplots(figsize=(7.5, 4.8))
    axis.scatter([o.traced_memory_bytes / GIGA for o in traced],
                 [o.traced_latency_s for o in traced], s=14, color="0.6", label="traced plans")
    front = list(result.pareto)
    axis.plot([o.traced_memory_bytes / GIGA for o in front],
              [o.traced_latency_s for o in front], "o-", color="C0", label="Pareto front")
    if result.best is not None:
        axis.scatter([result.best.traced_memory_bytes / GIGA], [result.best.traced_latency_s],
                     marker="*", s=160, color="C3", zorder=3,
                     label=f"best that fits: {result.best.plan.label}")
    largest = max((o.traced_memory_bytes for o in traced), default=0.0)
    if result.memory_limit_bytes <= 4 * largest:
        axis.axvline(result.memory_limit_bytes / GIGA, color="C3", linestyle="--",
                     label=f"memory limit {result.memory_limit_bytes / GIGA:.3g} GB")
    axis.set_yscale("log")
    axis.set_xlabel("memory per device, GB (traced)")
    axis.set_ylabel(f"inference latency, s ({result.steps} steps, traced; log)")
    axis.set_title(f"plan-search: {result.config} {result.shape} on {result.hardware} "
                   f"({result.devices} devices)", fontsize=9)
    axis.legend(fontsize=7)
    fig.tight_layout()
    write_png(fig, path, force=force)
    plt.close(fig)


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "model_config", default="full", show_default=True,
              help="Model config: full, tiny or a model TOML file.")
@click.option("--shape", default=None,
              help="Video shape FRAMES_WIDTH_HEIGHT (--model: FRAMESxHEIGHTxWIDTH, or a user "
                   "model's T).  [default: 204_640_360 for full, else the small test shape]")
@click.option("--hw", "hardware", default="tx8-16", show_default=True, metavar="NAME|FILE",
              help="Hardware system (a system name or file: its chips hold the plans).")
@click.option("--devices", type=Count(), default=None,
              help="Devices the plans use.  [default: the system's chips]")
@click.option("--memory-limit", "memory_limit_gb", type=PositiveFinite(maximum=MAX_QUANTITY),
              default=None, help="Memory per device in GB.  [default: the chip's capacity]")
@click.option("--budget", type=Count(), default=12,
              show_default=True, help="Most plans traced.")
@click.option("--strategies", default=None,
              help="Comma-separated strategies.  [default: every strategy of the table]")
@click.option("--stages", "stage_counts", default=None,
              help="Pipeline stage counts P, comma-separated (1 = flat).  [default: every "
                   "divisor of the devices up to the model's block pairs]")
@click.option("--splits", type=Count(), default=2, show_default=True,
              help="Splits of the block pairs per stage count (the even one first).")
@click.option("--patches", "patch_counts", default="1,2,4", show_default=True,
              help="PipeFusion patch counts M of the pipelines, comma-separated.")
@click.option("--steps", type=Count(), default=30, show_default=True,
              help="Sampling steps of one inference.")
@click.option("-j", "--jobs", type=Count(), default=None,
              help="Plans traced at once (clamped to the memory available, ~4 GiB a trace); "
                   "--mode train: tracing processes of the calibrations and the plans' pairs.  "
                   f"[default: 1; --mode train: the cores, at most {TRAIN_JOBS}]")
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
              help="Trace on the workers of this Dask distributed scheduler (the cluster "
                   "extra; --work-dir must be on a filesystem every worker sees at the same "
                   "path).  [default: a local process pool of --jobs]")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Cache of dumps, calibrations and analyses (shared with other runs: keyed by "
                   "content).  [default: plan-search/ in the cache directory]")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False),
              help="The user's cache directory of this run: the default --work-dir and the trace "
                   "lock live there (as $HLO_TRACE_CACHE; $HLO_TRACE_LOCK names the lock file).  "
                   "[default: $HLO_TRACE_CACHE, else $XDG_CACHE_HOME/hlo-trace, else "
                   "~/.cache/hlo-trace]")
@click.option("-o", "--plan-out", default="best_plan.toml", show_default=True,
              type=click.Path(dir_okay=False),
              help="Where the best plan is written, as a pipeline TOML (--model: a trace-module plan).")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the whole result as JSON to this file.")
@click.option("--plot", "plot_out", default=None, type=click.Path(dir_okay=False),
              help="Also draw the traced plans' latency against memory per device, the Pareto "
                   "front and the best plan, as a PNG to this file (the plot extra).")
@click.option("--exhaustive", is_flag=True,
              help="Trace every plan (no budget, no bound): the reference to measure a search "
                   "against; slow.")
@click.option("--estimate", "estimate_kind", type=click.Choice(["kernels", "ideal"]), default="kernels",
              show_default=True,
              help="How plans are estimated: kernels = the kernels of a one-pair trace at two small "
                   "shapes re-costed at the plan's shape (planning.plan_estimate; the calibration "
                   "traces are cached in --work-dir); ideal = the ideal op list, no trace.")
@click.option("--validate", type=click.IntRange(0, MAX_COUNT), default=10, show_default=True,
              help="Also trace this many plans drawn at random from the untraced rest, to "
                   "measure the estimate beyond the plans it ranked first (0: none).")
@click.option("--mode", type=click.Choice(["infer", "train"]), default="infer", show_default=True,
              help="infer: inference plans (traced); train: training plans (data parallel, ZeRO "
                   "0-3, sequence and tensor parallel, pipeline stages and micro-batches, full "
                   "recompute), estimated, the best confirmed by a one-pair trace.")
@click.option("--batch", "train_batch", type=Count(), default=None,
              help="--mode train: the global batch of one step.  [default: the devices]")
@click.option("--micro-batches", "micro_batch_counts", default="1,2,4,8", show_default=True,
              help="--mode train: micro-batch counts of the pipelines, comma-separated.")
@click.option("--zero", "zero_stages", default="0,1,2,3", show_default=True,
              help="--mode train: ZeRO stages of the plans, comma-separated.")
@click.option("--derived-calibrations/--per-key-calibrations", "derive_recompute", default=True, show_default=True,
              help="--mode train: derive the micro-batch, the ZeRO stage and recompute from fewer traces "
                   "(docs/plan_search.md), or trace every key's own at the two calibration shapes "
                   "(the reference the derived ones are measured against).")
@click.option("--check-stages", type=click.IntRange(0, MAX_COUNT), default=0, show_default=True,
              help="--mode train: also trace every pipeline stage of this many of the traced plans "
                   "whole (all its pairs, one micro-batch, the optimizer and ZeRO collectives; the "
                   "ones drawn at random first) and compare them with the estimate "
                   "(planning/train_check.py).")
@click.option("--target-latency", type=PositiveFinite(maximum=MAX_QUANTITY), default=None,
              help="Sizing: the smallest device count (up to --max-devices) whose best inference "
                   "plan meets this latency in seconds, and the curve.")
@click.option("--target-step-time", type=PositiveFinite(maximum=MAX_QUANTITY), default=None,
              help="Sizing with --mode train: the same for the training step, in seconds.")
@click.option("--max-devices", type=Count(), default=None,
              help="Sizing: the largest device count tried.  [default: the system's chips]")
@click.option("--confirm/--no-confirm", default=True, show_default=True,
              help="--mode train and sizing: trace the answer to confirm it.")
@click.option("--model", "module_model", default=None, metavar="NAME|pkg.module:factory",
              help="Search the layouts of a trace-module model instead of STDiT3: a video DiT of the "
                   "zoo (hunyuan_video, wan21_14b, wan21_1.3b, cogvideox_5b) at --shape "
                   "FRAMESxHEIGHTxWIDTH, or a factory with --input and a role map "
                   "(planning.module_search; docs/plan_search.md).")
@click.option("--input", "module_inputs", multiple=True,
              help="--model pkg.module:factory: a forward argument NAME=SHAPE:DTYPE, T in the "
                   "dimension --shape sets (e.g. x=2xTx64:float32); repeat for several.")
@click.option("--kwargs", "module_kwargs", default=None, type=click.Path(dir_okay=False),
              help="--model pkg.module:factory: TOML file of the factory's keyword arguments.")
@click.option("--column", "role_column", default=None, help="--model role map: " + ROLES["column"] + ".")
@click.option("--row", "role_row", default=None, help="--model role map: " + ROLES["row"] + ".")
@click.option("--qkv", "role_qkv", default=None, help="--model role map: " + ROLES["qkv"] + ".")
@click.option("--attn-out", "role_attn_out", default=None, help="--model role map: " + ROLES["attn_out"] + ".")
@click.option("--all-degrees", is_flag=True,
              help="--model: also the layouts that use fewer than --devices devices.")
@click.option("--trace-each-stage", is_flag=True,
              help="Trace each stage of a traced plan in a process of its own (trace-stage), as "
                   "before the one tracing process that loads torch once for every plan (the same "
                   "dumps, slower: the baseline of benchmarks/plan_search.py --part infer).")
@click.option("--force", is_flag=True, help="Overwrite existing --plan-out / --json files.")
@click.option("-v", "--verbose", is_flag=True, help="Log details to stderr.")
def plan_search_command(model_config: str, shape: str | None, hardware: str, devices: int | None,
                        memory_limit_gb: float | None, budget: int, strategies: str | None,
                        stage_counts: str | None, splits: int, patch_counts: str, steps: int,
                        jobs: int, scheduler: str | None, work_dir: str | None, cache_dir: str | None,
                        plan_out: str,
                        json_out: str | None, plot_out: str | None,
                        exhaustive: bool, estimate_kind: str, validate: int, mode: str,
                        train_batch: int | None, micro_batch_counts: str, zero_stages: str, derive_recompute: bool,
                        check_stages: int, target_latency: float | None, target_step_time: float | None,
                        max_devices: int | None, confirm: bool, module_model: str | None,
                        module_inputs: tuple[str, ...], module_kwargs: str | None, role_column: str | None,
                        role_row: str | None, role_qkv: str | None, role_attn_out: str | None,
                        all_degrees: bool, trace_each_stage: bool, force: bool, verbose: bool) -> int:
    """Search the parallel plans of a model at a shape on a hardware system: estimate every
    plan (strategy, mesh, usp degrees, pipeline stages and splits, PipeFusion patches) without
    tracing, trace the most promising within the budget, and report the best traced plan that
    fits, the latency-memory Pareto front and the estimate's error on the traced plans.  The
    best plan is written as a pipeline TOML that trace-stage --pipeline and analyze-pipeline
    read as is.  Progress goes to stderr."""
    with native_imports():  # jaxlib's bindings: Ctrl-C while they load ends the process at once
        from hlo_analyzer.mlir import load_native_libraries
        from planning.plan_search import (
            check_plan_inputs,
            enumerate_plans,
            plan_file_text,
            runner_tracer,
            search,
        )

        load_native_libraries()

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    work_dir = _work_dir(work_dir, cache_dir)
    if jobs is None:  # a training search's traces are one-pair programs: one process a core
        jobs = min(TRAIN_JOBS, os.cpu_count() or 1) if mode == "train" else 1
    if module_model is not None:
        roles = (("column", role_column), ("row", role_row), ("qkv", role_qkv), ("attn_out", role_attn_out))
        return _module_search(ModelOptions(module_model, shape, module_inputs, module_kwargs, roles, strategies,
                                           all_degrees), hardware, devices, budget=budget,
                              memory_limit_gb=memory_limit_gb, work_dir=work_dir, json_out=json_out, force=force,
                              plan_out=plan_out)
    shape = shape or default_shape(model_config)
    check_plan_inputs(model_config, shape)
    system = load_system(hardware)
    devices = devices or system.chip_count
    if devices > system.chip_count:
        raise UsageError(f"--devices {devices}: {system.name} has {system.chip_count} chip(s); "
                         "expected a system with enough chips (e.g. --hw tx8-16, --hw 8xh100)")
    chosen = STRATEGY_NAMES if strategies is None else tuple(
        s.strip() for s in strategies.split(",") if s.strip())
    unknown = [s for s in chosen if s not in STRATEGY_NAMES]
    if unknown or not chosen:
        raise UsageError(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; "
                         f"expected some of {', '.join(STRATEGY_NAMES)}")
    stages = None if stage_counts is None else _int_list(stage_counts, "--stages")
    patches = _int_list(patch_counts, "--patches")
    if check_stages and (mode != "train" or estimate_kind != "kernels" or target_step_time is not None):
        raise UsageError("--check-stages: checks a training search's kernel estimate; pass --mode train "
                         "(with --estimate kernels and no --target-step-time)")
    if mode == "train" or target_latency is not None or target_step_time is not None:
        _refuse_unwritten_outputs(mode, target_step_time, plot_out)
        return train_or_sizing(model_config, shape, hardware, devices, mode=mode, batch=train_batch,
                               micro_batches=_int_list(micro_batch_counts, "--micro-batches"),
                               zero=_zero_list(zero_stages),
                               stages=stages, target_latency=target_latency,
                               target_step_time=target_step_time, max_devices=max_devices,
                               memory_limit_gb=memory_limit_gb, steps=steps, confirm=confirm,
                               work_dir=work_dir, json_out=json_out, plot_out=plot_out,
                               force=force, budget=budget, estimate_kind=estimate_kind, validate=validate,
                               jobs=jobs, derive_recompute=derive_recompute, check_stages=check_stages)
    check_targets({"-o": plan_out, "--json": json_out, "--plot": plot_out}, force=force,
                  inputs={"--config file": model_config if model_config.endswith(".toml") else None,
                          "--hw file": hardware if hardware.endswith(".toml") else None})
    if plot_out:
        require_plot_extra()
    if scheduler is not None:
        from planning.runner import check_scheduler

        check_scheduler(scheduler)
    space = enumerate_plans(model_config, shape, devices, strategies=chosen,
                            stage_counts=stages, splits=splits, patch_counts=patches)
    if not space.plans:
        raise UsageError(f"no plan of {model_config} at {shape} on {devices} devices is "
                         f"accepted by the tracer ({len(space.infeasible)} refused, e.g. "
                         f"{space.infeasible[0][1] if space.infeasible else 'none'})")
    click.echo(f"estimating {len(space.plans)} plans ({len(space.infeasible)} refused by the "
               "tracer) ...", err=True)
    from planning.train_estimate import trace_lock

    tracer = runner_tracer(Path(work_dir), hardware, steps=steps, jobs=jobs, scheduler=scheduler,
                           lock=trace_lock, one_process=not trace_each_stage)
    kernels = None
    if estimate_kind == "kernels":
        from planning.plan_estimate import KernelCosts

        kernels = KernelCosts(Path(work_dir), jobs=jobs)
    result = search(model_config, shape, hardware, space, tracer, devices=devices,
                    memory_limit_bytes=None if memory_limit_gb is None else memory_limit_gb * GIGA,
                    budget=budget, jobs=jobs, steps=steps, exhaustive=exhaustive, kernels=kernels,
                    validate=0 if exhaustive else validate,
                    progress=lambda line: click.echo(f"  {line}", err=True))
    click.echo(render_report(result), nl=False)
    if json_out:
        atomic_write(json_out, json.dumps(result_document(result), indent=1) + "\n", force=force)
        click.echo(f"wrote {json_out}", err=True)
    if plot_out:
        plot_front(result, plot_out, force=force)
        click.echo(f"wrote {plot_out}", err=True)
    if result.best is None:
        click.echo("No traced plan fits the memory limit: no plan file written (raise --budget "
                   "or --memory-limit).", err=True)
        return NO_ANSWER
    atomic_write(plan_out, plan_file_text(result.best, result), force=force)
    click.echo(f"wrote {plan_out}", err=True)
    return 0


def _module_search(options: ModelOptions, hardware: str, devices: int | None, *, budget: int,
                   memory_limit_gb: float | None, work_dir: str, json_out: str | None, force: bool,
                   plan_out: str) -> int:
    """``--model``: the options of STDiT3's search that it does not read are refused, not ignored;
    ``--budget`` defaults to the module search's."""
    from planning.module_search import DEFAULT_BUDGET

    context = click.get_current_context()
    unread = [name for name in ("model_config", "mode", "target_latency", "target_step_time", "stage_counts",
                                "plot_out", "exhaustive", "train_batch", "scheduler", "splits", "patch_counts",
                                "estimate_kind", "validate", "jobs", "micro_batch_counts", "zero_stages",
                                "derive_recompute", "max_devices", "confirm")
              if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if unread:
        option = next(p.opts[-1] for p in context.command.params if p.name == unread[0])
        raise UsageError(f"{option}: STDiT3's search only; --model searches a trace-module model's layouts")
    if context.get_parameter_source("budget") is click.core.ParameterSource.DEFAULT:
        budget = DEFAULT_BUDGET
    if context.get_parameter_source("steps") is not click.core.ParameterSource.DEFAULT:
        options = dataclasses.replace(options, steps=context.params["steps"])
    return run_module_search(options, hardware, devices, budget=budget, memory_limit_gb=memory_limit_gb,
                             work_dir=work_dir, json_out=json_out, force=force, plan_out=plan_out)


def _refuse_unwritten_outputs(mode: str, target_step_time: float | None,
                              plot_out: str | None) -> None:
    """``--mode train`` and sizing write no pipeline plan (``-o``); a training search (not
    its sizing) draws no plot: refuse the options rather than ignore them."""
    context = click.get_current_context()
    if context.get_parameter_source("plan_out") is not click.core.ParameterSource.DEFAULT:
        what = "--mode train" if mode == "train" else "sizing (--target-latency)"
        raise UsageError(f"-o/--plan-out: {what} writes no pipeline plan file; its answer is in "
                         "the report and in --json FILE")
    if plot_out and mode == "train" and target_step_time is None:
        raise UsageError("--plot: a --mode train search draws no plot (its sizing, "
                         "--target-step-time, does); write its plans with --json FILE")


def train_or_sizing(model_config: str, shape: str, hardware: str, devices: int, *, mode: str,
                    batch: int | None, micro_batches: list[int], stages: list[int] | None,
                    target_latency: float | None, target_step_time: float | None,
                    max_devices: int | None, memory_limit_gb: float | None, steps: int,
                    confirm: bool, work_dir: str, json_out: str | None, plot_out: str | None,
                    force: bool, budget: int = 12, estimate_kind: str = "kernels", validate: int = 0,
                    zero: Sequence[int] = (0, 1, 2, 3), jobs: int = 1, derive_recompute: bool = True,
                    check_stages: int = 0) -> int:
    """``--mode train`` and the sizing options (``planning.train_search``, ``planning.sizing``,
    rendered by ``planning.sizing_cli``)."""
    from dataclasses import asdict


    if target_latency is not None and mode == "train":
        raise UsageError("--target-latency: inference sizing; with --mode train pass --target-step-time")
    if target_step_time is not None and mode != "train":
        raise UsageError("--target-step-time: training sizing; pass --mode train")
    check_targets({"--json": json_out, "--plot": plot_out}, force=force)
    if plot_out:
        require_plot_extra()
    limit = None if memory_limit_gb is None else memory_limit_gb * GIGA
    work = Path(work_dir)
    target = target_latency if target_latency is not None else target_step_time
    if target is not None:
        top = max_devices or devices
        progress = lambda n, count: click.echo(f"  {n} devices: {count} plans", err=True)  # noqa: E731
        if mode == "train":
            result = sizing.size_training(model_config, shape, hardware, target, top,
                                          batch=batch or top, memory_limit_bytes=limit,
                                          micro_batch_counts=micro_batches, progress=progress)
        else:
            kernels = calibrating = None
            if estimate_kind == "kernels":
                from planning.eta import EtaReporter
                from planning.plan_estimate import KernelCosts

                kernels = KernelCosts(work, jobs=jobs)
                calibrating = EtaReporter("calibrating", 0, lambda line: click.echo(f"  {line}", err=True),
                                          unit="traces")
            result = sizing.size_inference(model_config, shape, hardware, target, top,
                                           memory_limit_bytes=limit, steps=steps, progress=progress,
                                           kernels=kernels, calibrating=calibrating)
        confirmed = None
        if confirm and result.answer_plan is not None:
            if mode == "train":
                confirmed = _confirm_training_sizing(result, model_config, shape, hardware, work)
            else:
                result = sizing.confirm_inference(result, _locked_tracer(work, hardware, steps), budget=budget)
        click.echo(sizing_cli.render_sizing(result, confirmed), nl=False)
        if json_out:
            atomic_write(json_out, json.dumps({"mode": result.mode, "target_s": result.target_s,
                                               "answer": None if result.answer is None else asdict(result.answer),
                                               "confirmed": confirmed or result.confirmed,
                                               "traces": [asdict(t) for t in result.traces],
                                               "missed_below": (None if result.missed_below is None
                                                                else asdict(result.missed_below)),
                                               "curve": [asdict(p) for p in result.curve],
                                               "uncalibrated": [list(u) for u in result.uncalibrated]},
                                              indent=1) + "\n",
                         force=force)
        if plot_out:
            sizing_cli.plot_sizing(result, plot_out, force=force)
            click.echo(f"wrote {plot_out}", err=True)
        return 0 if result.answer is not None else NO_ANSWER
    space = train_search.enumerate_train_plans(model_config, shape, devices, batch=batch,
                                               stage_counts=stages, micro_batch_counts=micro_batches,
                                               zero_stages=zero)
    click.echo(f"estimating {len(space.plans)} training plans ({len(space.infeasible)} refused) ...", err=True)
    kernels = None
    if estimate_kind == "kernels":
        from planning.train_estimate import TrainKernels

        kernels = TrainKernels(work, model_config, shape, jobs=jobs, derive=derive_recompute)
    result = train_search.search_train(model_config, shape, hardware, space, devices=devices,
                                       memory_limit_bytes=limit, kernels=kernels,
                                       budget=budget if confirm else 0, validate=validate if confirm else 0,
                                       progress=lambda line: click.echo(f"  {line}", err=True))
    confirmation = None
    if confirm and result.best is not None:
        click.echo(f"tracing one block pair of {result.best.plan.label} to confirm ...", err=True)
        confirmation = sizing_cli.confirm_training_pair(result.best, model_config, shape, hardware, work)
    refused = refused_lines(result.space.infeasible)
    if refused:  # no tracer refused these: the training formulas or the batch did
        refused[0] = "refused (no training formula, or no even split of the batch or the pairs), by reason (plans):"
    click.echo(sizing_cli.render_train_report(result, confirmation, refused), nl=False)
    checks = []
    if check_stages and kernels is not None:
        from planning import train_check

        checks = train_check.check_plans(result, load_system(hardware), kernels, check_stages,
                                         progress=lambda line: click.echo(f"  {line}", err=True))
        click.echo(train_check.render_checks(checks), nl=False)
    if json_out:
        from planning.plan_search import ESTIMATE_TOLERANCE

        within, count = result.within
        document = {"config": result.config, "shape": result.shape, "hardware": result.hardware,
                    "devices": result.devices, "memory_limit_bytes": result.memory_limit_bytes,
                    "budget": result.budget,
                    "best": None if result.best is None else {
                        "plan": asdict(result.best.plan), "label": result.best.plan.label,
                        "estimate": asdict(result.best.estimate), "traced_step_s": result.best.traced_step_s},
                    "confirmation": None if confirmation is None else asdict(confirmation),
                    "spearman": result.spearman, "worst_ratio": result.worst_ratio,
                    "within_tolerance": {"tolerance": ESTIMATE_TOLERANCE, "plans": within, "of": count},
                    "plans": [{"label": o.plan.label, "step_s": o.estimate.step_s,
                               "memory_bytes": o.estimate.memory_bytes, "basis": o.estimate.basis,
                               "traced_step_s": o.traced_step_s,
                               "residual": None if o.ratio is None else o.ratio - 1,
                               "validation": o.plan in result.validation, "error": o.error}
                              for o in result.outcomes]}
        if checks:
            document["stage_checks"] = train_check.check_document(checks)
        atomic_write(json_out, json.dumps(document, indent=1) + "\n", force=force)
    return 0 if result.best is not None else NO_ANSWER


def _confirm_training_sizing(result, model_config: str, shape: str, hardware: str, work: Path) -> str:
    """Trace the training sizing answer's block pair; one line with the traced figure."""
    from planning.train_search import TrainOutcome, estimate_train_plan

    plan = result.answer_plan
    outcome = TrainOutcome(plan, estimate_train_plan(plan, load_system(hardware), model_config, shape))
    pair = sizing_cli.confirm_training_pair(outcome, model_config, shape, hardware, work)
    return (f"traced confirmation: one block pair of its stage steps in {pair.traced_step_s * 1e3:.4g} ms "
            f"(estimate {pair.estimated_step_s * 1e3:.4g} ms, ratio "
            f"{pair.estimated_step_s / pair.traced_step_s:.3f})")


def _work_dir(work_dir: str | None, cache_dir: str | None) -> str:
    """``--work-dir``, by default ``plan-search/`` in the cache directory; ``--cache-dir`` is set
    as ``$HLO_TRACE_CACHE`` for the run (the trace lock and the children read it there)."""
    if cache_dir is not None:
        os.environ[cache.CACHE_ENV] = str(Path(cache_dir).expanduser().resolve())
    return work_dir if work_dir is not None else str(cache.cache_dir() / "plan-search")


def _locked_tracer(work: Path, hardware: str, steps: int):
    """plan-search's tracer on one plan, holding the full-trace lock while it traces."""
    from planning.plan_search import runner_tracer
    from planning.train_estimate import trace_lock

    tracer = runner_tracer(work, hardware, steps=steps, lock=trace_lock)

    def trace(plan):
        return tracer([plan])[0]

    return trace


def main(argv: Sequence[str] | None = None) -> None:
    end_process(run_click(plan_search_command, argv))


if __name__ == "__main__":
    main()
