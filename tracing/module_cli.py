"""``trace-module``: trace any ``torch.nn.Module`` under SPMD on a virtual CPU mesh and write the
per-device program after SPMD partitioning as MLIR, with a JSON sidecar (the dump format of
``trace-stage``). docs/trace_module.md.

Runs as ``trace-module ...`` or ``python3 -m tracing.module_cli ...``. Everything the command
line and the files say is checked before torch is imported; the trace runs in a forked child
(one trace per process: torch-xla fixes its device count when its runtime starts).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import click

from hlo_trace.cli import OneLineCommand, native_imports
from hlo_trace.errors import UsageError
from hlo_trace.isolate import call_in_child
from models.opensora.library_calls import call_regions
from plans.module_plan import (
    MODEL_DTYPES,
    SHORTHANDS,
    InputSpec,
    ModulePlan,
    PlanError,
    dump_stem,
    load_kwargs,
    load_plan,
    parse_factory,
    parse_input,
)

STEPS = ("build", "shard", "trace", "compile", "convert", "write")


@click.command(cls=OneLineCommand,
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("model")
@click.option("--kwargs", "kwargs_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file whose top-level keys are the factory's keyword arguments.")
@click.option("--input", "input_specs", multiple=True, required=True,
              help="A forward argument NAME=SHAPE:DTYPE (e.g. ids=2x16:int64, "
                   "images=4x3x32x32:float32); repeat for several, passed by name.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Sharding plan TOML: [mesh], [[parameters]], [[inputs]], [[activations]], "
                   "strategy (docs/trace_module.md).")
@click.option("--strategy", default=None,
              help=f"Shorthand plan for a transformer: {', '.join(SHORTHANDS)} (after a plan "
                   "file's own rules).")
@click.option("--mesh", default=None,
              help="Device mesh, sizes joined by x (axes x, y, ...): 2x2, 1x4; wins over the plan's.")
@click.option("--mode", type=click.Choice(["infer", "train"]), default="infer", show_default=True,
              help="infer: the forward; train: forward, MSE against a target of the first "
                   "output's shape, backward and AdamW as one program.")
@click.option("--dtype", type=click.Choice(list(MODEL_DTYPES)), default="float32",
              show_default=True, help="Element type of the model's floating weights.")
@click.option("--dialect", type=click.Choice(["stablehlo", "mhlo"]), default="stablehlo",
              show_default=True, help="MLIR dialect of the dump.")
@click.option("--name", default=None,
              help="Dump name without suffix.  [default: <model>_<plan>_<mesh>[_train]]")
@click.option("-o", "--out", "out_dir", default="dumps", show_default=True, type=click.Path(),
              help="Output directory, created (with its parents) if missing.")
@click.option("--force", is_flag=True, help="Overwrite an existing dump.")
@click.option("-v", "--verbose", is_flag=True, help="Log details to stderr.")
def main(model: str, kwargs_file: str | None, input_specs: tuple[str, ...],
         plan_file: str | None, strategy: str | None, mesh: str | None, mode: str, dtype: str,
         dialect: str, name: str | None, out_dir: str, force: bool, verbose: bool) -> None:
    """Trace MODEL (an import path pkg.module:factory, e.g. models.zoo.gpt2:gpt2) with
    torch-xla SPMD on virtual CPU devices and write the per-device program after SPMD
    partitioning as OUT/NAME.mlir with a JSON sidecar OUT/NAME.json."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from tracing.cli import check_output, require_trace_extra

    parse_factory(model)
    kwargs = load_kwargs(kwargs_file)
    inputs = [parse_input(text) for text in input_specs]
    names = [spec.name for spec in inputs]
    if len(set(names)) != len(names):
        raise PlanError(f"--input {sorted(n for n in names if names.count(n) > 1)[0]} is given twice")
    if mode == "train" and "target" in names:
        raise PlanError("--mode train: the input name 'target' is the loss's (the step adds it)")
    plan = load_plan(plan_file, shorthand=strategy, mesh=mesh)
    stem = name if name is not None else dump_stem(model, plan, mode, plan_file)
    if not stem or "/" in stem or stem.startswith("."):
        raise PlanError(f"--name {stem!r}: expected a file name without directory")
    out = Path(out_dir)
    mlir_path = out / f"{stem}.mlir"
    check_output(out, [mlir_path, mlir_path.with_suffix(".json")], force)
    require_trace_extra()
    written = call_in_child(_trace_in_child, model, kwargs, inputs, plan, plan_file, mode, dtype,
                            dialect, mlir_path, force, origin=stem, what="tracing it",
                            live_stderr=True)
    click.echo("wrote " + " ".join(written), err=True)


def _trace_in_child(model: str, kwargs: dict[str, Any], inputs: list[InputSpec], plan: ModulePlan,
                    plan_file: str | None, mode: str, dtype: str, dialect: str, mlir_path: Path,
                    force: bool) -> list[str]:
    """The trace, in the command's child process: the written paths."""
    import shutil

    from tracing import capture
    from tracing.cli import write_dump

    started = time.perf_counter()
    stem = mlir_path.stem

    def progress(step: str) -> None:
        click.echo(f"[{stem}] {step}", err=True)

    with native_imports():
        from hlo_analyzer.mlir import hlo_text_to_mlir_text, load_native_libraries

        load_native_libraries()
    session = capture.prepare_process(plan.devices, keep_every_op=mode != "train")
    try:
        with native_imports():
            import torch  # noqa: F401 - loaded here, where an interrupt cannot leave it half-made

            capture.enable_spmd()
        from tracing.module_checks import check_shards_something, redundancy_causes
        from tracing.module_tracer import build_model, check_plan, global_hlo, trace_module

        progress("build")
        build_started = time.perf_counter()
        module = build_model(model, kwargs, dtype)
        check_plan(plan, module, inputs, mode=mode)
        check_shards_something(plan, module, inputs)
        causes = redundancy_causes(plan, module)
        build_s = time.perf_counter() - build_started
        traced = trace_module(module, plan, inputs, mode=mode, dtype=dtype, progress=progress)
        traced.seconds["build"] = build_s
        one_device_hlo = global_hlo(traced.outputs) if plan.devices > 1 else None
        progress("compile")
        compile_started = time.perf_counter()
        hlo_text = capture.capture_partitioned_hlo(session, traced.outputs)
        traced.seconds["compile"] = time.perf_counter() - compile_started
    finally:
        capture.release(session)
    progress("convert")
    convert_started = time.perf_counter()
    mlir_text = hlo_text_to_mlir_text(hlo_text, dialect, origin=stem)
    traced.seconds["convert"] = time.perf_counter() - convert_started
    redundancy = _redundancy(plan, hlo_text, one_device_hlo, causes, stem)
    progress("write")
    shorthand_or_file = Path(plan_file).stem if plan_file is not None else plan.shorthand
    sidecar = {
        "name": stem,
        "program": "per-device program after SPMD partitioning (torch-xla GSPMD), unfused",
        "dialect": dialect,
        "model": {"factory": model, "kwargs": kwargs, "parameters": traced.parameters},
        "mode": mode,
        "plan": plan.to_dict(),
        "mesh": {"shape": list(plan.mesh_shape), "axes": list(plan.axes),
                 "global_device_ids": _device_rows(plan)},
        "devices": plan.devices,
        "dtype": dtype,
        "strategy": {"name": shorthand_or_file, "summary": SHORTHANDS.get(plan.shorthand or "", "")},
        "inputs": {spec.name: spec.to_dict() for spec in inputs},
        "outputs": traced.output_shapes,
        "versions": capture.tool_versions(),
        "seconds": {step: round(value, 3) for step, value in traced.seconds.items()},
        "seconds_total": round(time.perf_counter() - started, 3),
        "peak_rss_bytes": capture.peak_rss_bytes(),
        "mlir_bytes": len(mlir_text.encode()),
        # the functions the model marks as one library kernel (none unless it marks some)
        "library_calls": [region.to_dict() for region in call_regions()],
    }
    if redundancy is not None:
        sidecar["redundancy"] = redundancy
    if traced.training is not None:
        sidecar["training"] = traced.training
        sidecar["inputs"]["target"] = _target_entry(traced.training)
    written = write_dump(mlir_path, mlir_text, sidecar, force)
    if session.compiling:  # the compile goes on writing there until the child ends
        shutil.rmtree(session.dump_dir, ignore_errors=True)
    return [str(path) for path in written]


def _redundancy(plan: ModulePlan, hlo_text: str, one_device_hlo: str | None,
                causes: list[str], stem: str) -> dict[str, Any] | None:
    """The sidecar's ``redundancy`` (devices x per-device GEMM FLOPs against the one-device
    count, ``tracing.module_checks``); its warning on stderr when the work is repeated."""
    from tracing.module_checks import gemm_flops, redundancy_warning

    if one_device_hlo is None:
        return None
    try:
        per_device = gemm_flops(hlo_text, stem)
        one_device = gemm_flops(one_device_hlo, f"{stem} (one device)")
    except UsageError as error:  # a program the analyzer cannot count: the dump still stands
        click.echo(f"Warning: {stem}: the redundancy factor is not measured ({error})", err=True)
        return None
    warning = redundancy_warning(plan, per_device, one_device, causes)
    if warning is not None:
        click.echo(f"Warning: {stem}: {warning}", err=True)
    return {"per_device_gemm_flops": per_device, "one_device_gemm_flops": one_device,
            "factor": plan.devices * per_device / one_device if one_device else None,
            "causes": causes, "warning": warning}


def _target_entry(training: dict[str, Any]) -> dict[str, Any]:
    target = next(b for b in training["arguments"] if b["name"] == "target")
    return {"shape": target["shape"], "dtype": target["dtype"]}


def _device_rows(plan: ModulePlan) -> list[list[int]]:
    """The mesh's device ids as rows (the last axis along a row)."""
    width = plan.mesh_shape[-1]
    return [list(range(start, start + width)) for start in range(0, plan.devices, width)]


if __name__ == "__main__":
    main()
