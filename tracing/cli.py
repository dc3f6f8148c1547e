"""``trace-stage``: trace one pipeline stage of STDiT3 under a parallel strategy and write the
per-device program after SPMD partitioning as MLIR (plus a JSON sidecar).

Runs as ``trace-stage ...`` or ``python3 -m tracing.cli ...``.  torch-xla reads its device count
and XLA's dump flags when its runtime starts, so everything is validated and the environment is
set before torch_xla is imported: one trace per process.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hlo_trace.atomic import atomic_write, check_target
from hlo_trace.cli import Count, OneLineCommand, native_imports
from hlo_trace.errors import UsageError
from hlo_trace.isolate import call_in_child, child_environment, start_in_child
from models.opensora.library_calls import call_regions
from plans.config import (
    INFERENCE_PATHS,
    MAX_DEVICES,
    MAX_SIZE,
    PipelineConfig,
    build_config,
    check_trace_size,
    load_config_file,
)
from plans.patches import PatchPlan, patch_config, patch_plan
from plans.train_options import TrainOptions

if TYPE_CHECKING:
    from tracing.capture import CaptureSession
    from tracing.tracer import TracedStage
    from tracing.training import TrainStep

log = logging.getLogger("tracing")

STEPS = ("build", "shard", "trace", "compile", "convert", "write")


def _progress(stage: int, dump: str, peaks: dict[str, int] | None = None):
    """The progress callback: a line per step on stderr; with ``peaks``, also the process's
    peak RSS so far at the end of each step, by step (read when the next one starts)."""
    started: list[str] = []

    def report(step: str) -> None:
        if peaks is not None and started:
            from tracing.capture import peak_rss_bytes

            peaks[started[-1]] = peak_rss_bytes()
        started.append(step)
        click.echo(f"[stage {stage}] {step}: {dump}", err=True)

    return report


@dataclass(frozen=True)
class CapturedStage:
    """A traced stage's partitioned program, as XLA wrote it (HLO text), and what its dump needs
    besides: what :func:`capture_stage` hands to :func:`write_captured` (in the CLI, from the
    trace's child process to the conversion's: it pickles)."""

    name: str
    stage: int
    hlo_text: str
    mlir_path: Path
    #: The sidecar's fields but those of the conversion (dialect, sizes, the last steps).
    sidecar: dict
    seconds: dict[str, float]
    #: The peak RSS by the end of each step so far (bytes), and at the end of the capture.
    peaks: dict[str, int]
    peak_rss_bytes: int
    #: ``time.perf_counter()`` when the trace started: CLOCK_MONOTONIC on Linux, one clock for
    #: every process of the machine, so the conversion's process counts the total from it.
    started: float


def run_trace(config: PipelineConfig, stage: int, out_dir: Path, dialect: str, force: bool,
              shape_cache: Path | None, train: TrainOptions | None = None,
              ) -> tuple[list[Path], CaptureSession]:
    """Trace, compile, convert and write one stage in this process (:func:`capture_stage`, then
    :func:`write_captured`); returns the written paths and the capture session, whose compile
    may still run in the background (see tracing.capture): end the process with
    ``capture.end_process(session)``."""
    captured, session = capture_stage(config, stage, out_dir, force, shape_cache, train)
    return write_captured(captured, dialect, force), session


def capture_stage(config: PipelineConfig, stage: int, out_dir: Path, force: bool,
                  shape_cache: Path | None, train: TrainOptions | None = None,
                  ) -> tuple[CapturedStage, CaptureSession]:
    """Trace and compile one stage (one training step of it with ``train``, see
    tracing.training) up to its partitioned program; the outputs are checked first. Returns it
    with the capture session, whose compile may still run in the background."""
    with native_imports():
        from tracing import capture
        from tracing.stages import boundary_shapes, stage_spec
        from tracing.strategies import get_strategy
        from tracing.tracer import make_layout

    started = time.perf_counter()
    stage_spec(config, stage)  # stage index check before anything heavy
    get_strategy(config.strategy, make_layout(config, stage))  # strategy + mesh checks
    name = config.dump_name(stage) + (f"_{train.label()}" if train is not None else "")
    if train is not None:
        train.validate()
        if config.patches > 1:
            raise UsageError("--mode train traces a whole stage: --patches must be 1")
    mlir_path, json_path = out_dir / f"{name}.mlir", out_dir / f"{name}.json"
    check_output(out_dir, [mlir_path, json_path], force)
    if shape_cache is not None:  # rewritten when it lacks this stage's shapes: check it first
        check_target(shape_cache, force=True)
    require_trace_extra()
    with native_imports():
        import torch  # noqa: F401 - loaded here, where an interrupt cannot leave it half-made
    peaks: dict[str, int] = {}
    progress = _progress(stage, name, peaks)

    traced_config, stale_shapes, plan = config, None, None
    if config.patches > 1:
        from tracing.pipefusion import stale_buffer_shapes

        plan = patch_plan(config.model, config.shape, config.patches)
        traced_config = patch_config(config)
        stale_shapes = stale_buffer_shapes(config.model, plan, stage_spec(config, stage),
                                           config.batch)
    shapes = boundary_shapes(traced_config, shape_cache)
    submesh = config.submesh(stage)
    session = capture.prepare_process(submesh.size, keep_every_op=train is None)
    try:
        with native_imports():  # torch_xla's runtime
            capture.enable_spmd()
        from tracing.tracer import compile_stage, lay_out_placeholders, trace_stage

        if train is not None:
            from tracing.training import trace_train_step

            step = trace_train_step(traced_config, stage, shapes, train, progress=progress)
            traced = step.traced
            lay_out_placeholders(traced.split_placeholders)  # those first used after the forward
            sidecar = _stage_sidecar(config, stage, name, traced, shapes, stale_shapes, plan, step)
            progress("compile")
            started_compile = time.perf_counter()
            hlo_text = capture.capture_partitioned_hlo(session, step.output_tensors())
            traced.seconds["compile"] = time.perf_counter() - started_compile
        else:
            traced = trace_stage(traced_config, stage, shapes, progress=progress,
                                 stale_kv=stale_shapes)
            sidecar = _stage_sidecar(config, stage, name, traced, shapes, stale_shapes, plan, None)
            hlo_text = compile_stage(session, traced, progress)
    finally:
        capture.release(session)
    peaks["compile"] = capture.peak_rss_bytes()
    captured = CapturedStage(name=name, stage=stage, hlo_text=hlo_text, mlir_path=mlir_path,
                             sidecar=sidecar, seconds=dict(traced.seconds), peaks=peaks,
                             peak_rss_bytes=capture.peak_rss_bytes(), started=started)
    return captured, session


def _stage_sidecar(config: PipelineConfig, stage: int, name: str, traced: TracedStage,
                   shapes: dict, stale_shapes: dict | None, plan: PatchPlan | None,
                   step: TrainStep | None) -> dict:
    """The sidecar's fields known once the stage is traced (:class:`CapturedStage`), as JSON
    will write them. Made before the compile: once the partitioned program is out, the rest of
    XLA's compile runs beside this process until it ends (tracing.capture), and Python work
    done then shares the cores with it (0.6 s of a one-pair training trace's 1.7 s)."""
    from tracing import capture

    submesh = config.submesh(stage)
    sidecar = {
        "name": name,
        "program": "per-device program after SPMD partitioning (torch-xla GSPMD), unfused",
        "pipeline": config.to_dict(),
        "stage": stage,
        "blocks": [traced.stage.first_block, traced.stage.last_block],
        "has_embeddings": traced.stage.has_embeddings,
        "has_final_layer": traced.stage.has_final_layer,
        "mesh": {"shape": list(submesh.shape), "axes": ["x", "y"],
                 "global_device_ids": submesh.global_device_ids(config.mesh_shape)},
        "devices": submesh.size,
        "dtype": config.dtype,
        "strategy": {"name": config.strategy, "summary": traced.strategy.summary,
                     "token_order": traced.strategy.token_order},
        "inputs": shapes[stage]["inputs"] | {
            name: {"shape": list(shape), "dtype": config.dtype}
            for name, shape in (stale_shapes or {}).items()},
        "outputs": shapes[stage]["outputs"],
        "versions": capture.tool_versions(),
        "library_calls": [region.to_dict() for region in call_regions()],
    }
    if plan is not None:
        sidecar["pipefusion"] = plan.to_dict()
    if step is not None:
        sidecar["training"] = step.sidecar(config.dtype)
        sidecar["inputs"] |= {  # the noise or the output gradients are stage inputs too
            buffer["name"]: {"shape": buffer["shape"], "dtype": buffer["dtype"]}
            for buffer in sidecar["training"]["arguments"] if buffer["class"] == "input"}
    # As JSON will write it: plain types only. A torch or numpy type left in it (torch's
    # version string is a torch.torch_version.TorchVersion) would import torch in the process
    # that unpickles it (1.5 s of CPU and 0.6 GiB).
    return json.loads(json.dumps(sidecar))


def write_captured(captured: CapturedStage, dialect: str, force: bool) -> list[Path]:
    """Convert a captured stage to MLIR in ``dialect`` and write it with its sidecar; the
    written paths. Needs no torch: the CLI runs it in a process of its own, once the trace's
    process has handed the stage over and is ending (and with it the rest of XLA's compile, see
    tracing.capture)."""
    with native_imports():  # jaxlib's bindings: Ctrl-C while they load ends the process at once
        from hlo_analyzer.mlir import hlo_text_to_mlir_text, load_native_libraries
        from tracing import capture

        load_native_libraries()
    peaks = dict(captured.peaks)
    progress = _progress(captured.stage, captured.name, peaks)
    seconds = dict(captured.seconds)
    progress("convert")
    convert_started = time.perf_counter()
    # The locations made portable in the HLO text (8 MiB), before it becomes the dump: the dump
    # (99 MiB for the full-size stage) then holds none to rewrite (write_dump still looks).
    mlir_text = hlo_text_to_mlir_text(portable_locations(captured.hlo_text), dialect,
                                      origin=captured.name)
    seconds["convert"] = time.perf_counter() - convert_started
    progress("write")
    sidecar = captured.sidecar | {
        "dialect": dialect,
        "seconds": {step: round(value, 3) for step, value in seconds.items()},
        "seconds_total": round(time.perf_counter() - captured.started, 3),
        "peak_rss_bytes": max(captured.peak_rss_bytes, capture.peak_rss_bytes()),
        "peak_rss_bytes_after": peaks,
        "mlir_bytes": utf8_length(mlir_text),
    }
    return write_dump(captured.mlir_path, mlir_text, sidecar, force)


#: The repository the tracer runs from: source locations under it are written relative to it.
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The repository's top-level directories that hold Python sources (the first part of a
#: relative location).
SOURCE_DIRS = ("models", "tracing", "hlo_analyzer", "hardware", "hlo_trace", "scripts",
               "benchmarks", "tests")
#: An absolute file name in a source location: MLIR's ``"FILE":line:col`` (alone, in a name or
#: call-site location, or fused) and HLO's ``source_file="FILE"`` (XLA writes both from torch's
#: stack frames).
_LOCATION_FILE = re.compile(r'(source_file=)?"(/[^"\n]*)"(?(1)|(?=:\d+:\d+))')
#: Where such a name may start (a literal: searched fast), and HLO's key in front of it.
_ABSOLUTE_NAME = re.compile('"/')
_SOURCE_FILE = "source_file="


def portable_path(path: str, repo_root: Path = REPO_ROOT) -> str:
    """A source file of a location as a dump writes it: relative to the repository
    (``models/opensora/stdit3.py``: to this checkout, or to another whose file this checkout
    also has), to the installed packages (``site-packages/torch/nn/functional.py``) or to the
    standard library (``python3.11/contextlib.py``); else its name alone. A dump is shared
    between machines: no path of the machine that traced it."""
    root = f"{repo_root}/"
    if path.startswith(root):
        return path[len(root):]
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return "site-packages/" + path.split(marker, 1)[1]
    parts = path.split("/")
    for index, part in enumerate(parts):  # a checkout elsewhere: its part this one has too
        if part in SOURCE_DIRS and (repo_root / "/".join(parts[index:])).exists():
            return "/".join(parts[index:])
    standard = re.search(r"/lib/(python3\.\d+)/(.*)", path)
    if standard:
        return f"{standard.group(1)}/{standard.group(2)}"
    return parts[-1]


def portable_locations(text: str, repo_root: Path = REPO_ROOT) -> str:
    """``text`` (MLIR or HLO) with the file of every source location made ``portable_path``;
    the program itself is unchanged (only location strings are rewritten).

    Every location holds a quoted absolute name (``"/``): the pattern is tried where one starts
    (or where ``source_file=`` precedes it), found by a literal search, instead of at every
    character of the text (5.8 s on the full-size stage's 104 MB dump, whose random-filled
    constants are 95% of it; 0.1 s this way). A text without any is returned as it is."""
    portable: dict[str, str] = {}
    pieces, copied = [], 0
    for candidate in _ABSOLUTE_NAME.finditer(text):
        start = candidate.start()
        if start < copied:  # the closing quote of the location just rewritten
            continue
        if start >= len(_SOURCE_FILE) and text.startswith(_SOURCE_FILE, start - len(_SOURCE_FILE)):
            start -= len(_SOURCE_FILE)
        match = _LOCATION_FILE.match(text, start)
        if match is None:
            continue
        path = match.group(2)
        if path not in portable:
            portable[path] = portable_path(path, repo_root)
        pieces += [text[copied:match.start()], f'{match.group(1) or ""}"{portable[path]}"']
        copied = match.end()
    return "".join([*pieces, text[copied:]]) if pieces else text


def write_dump(mlir_path: Path, mlir_text: str, sidecar: dict, force: bool) -> list[Path]:
    """Write a dump and its JSON sidecar (``mlir_path`` with ``.json``) atomically; a dump is
    never left without its sidecar, nor with a path of this machine in its locations
    (``portable_locations``). Returns the two paths."""

    mlir_text = portable_locations(mlir_text)
    if "mlir_bytes" in sidecar:  # (an ASCII text is its own UTF-8: not encoded just to count)
        sidecar = {**sidecar, "mlir_bytes": utf8_length(mlir_text)}
    json_path = mlir_path.with_suffix(".json")
    written = [atomic_write(mlir_path, mlir_text, force=force)]
    try:
        written.append(atomic_write(json_path, json.dumps(sidecar, indent=2, sort_keys=True) + "\n",
                                    force=force))
    except BaseException:
        mlir_path.unlink(missing_ok=True)  # never leave a dump without its sidecar
        raise
    return written


def utf8_length(text: str) -> int:
    """The length of ``text`` in UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode())


def require_trace_extra() -> None:
    """One line instead of a ModuleNotFoundError when the heavy trace extra is not installed."""
    missing = [name for name in ("torch", "torch_xla") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"tracing needs {' and '.join(missing)}, which are not installed: "
                         'pip install -e ".[trace]" (torch 2.9.0 + torch_xla 2.9.0, about 7 GB)')


def check_output(out_dir: Path, targets: list[Path], force: bool) -> None:
    """Create the output directory (parents too) and refuse to overwrite without ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: output path exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{out_dir}: cannot create the output directory ({error.strerror})") from None
    if not os.access(out_dir, os.W_OK):
        raise UsageError(f"{out_dir}: output directory is not writable")
    for target in targets:
        if target.exists() and not force:
            raise UsageError(f"{target}: already exists; pass --force to overwrite it")


def _strategy_help() -> str:
    from tracing.strategies import strategy_names

    return ", ".join(strategy_names())


@click.command(cls=OneLineCommand,
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--stage", "stage", type=Count(0), default=0, show_default=True,
              help="Index of the pipeline stage to trace (0 holds the embeddings, the last one the final layer).")
@click.option("--strategy", default="megatron", show_default=True,
              help=f"Parallel strategy: {_strategy_help()}.")
@click.option("--shape", default=None,
              help="Video shape FRAMES_WIDTH_HEIGHT.  [default: 204_640_360 for --config full, 28_64_64 otherwise]")
@click.option("--mesh", default="2x8", show_default=True,
              help="Device mesh XxY (axes x, y); each stage runs on the whole mesh unless a pipeline file gives submeshes.")
@click.option("--stage-ids", default=None,
              help="Block pairs of each stage, inclusive, e.g. 0-13,14-27.  [default: one stage with all blocks]")
@click.option("--config", "model_config", default="full", show_default=True,
              help="Model config: full, tiny, or a model TOML file of STDiT3Config fields.")
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False), default=None,
              help="Pipeline TOML file (config, shape, strategy, mesh_shape, stage_ids, submeshes, dtype, batch); options given on the command line win.")
@click.option("--devices", type=Count(1, MAX_DEVICES), default=None,
              help="Number of virtual CPU devices; must equal X*Y of --mesh.  [default: X*Y]")
@click.option("--dtype", default="bfloat16", show_default=True,
              help="Element type of weights and activations: bfloat16, float32 or float16.")
@click.option("--batch", type=Count(1, MAX_SIZE), default=2, show_default=True,
              help="Batch size (2: classifier-free guidance).")
@click.option("--patches", type=Count(), default=1, show_default=True,
              help="PipeFusion patch count M: trace the stage on one of M patches along the latent "
                   "height, its spatial attentions reading full-sequence stale K/V (docs/pipeline.md).")
@click.option("--all-stages", is_flag=True,
              help="Trace every stage of the pipeline, one process each (same options but --stage).")
@click.option("--ring-degree", type=Count(1, MAX_DEVICES), default=None,
              help="usp: ring degree over mesh axis y (ring x ulysses = y; default 2 when y is even).")
@click.option("--ulysses-degree", type=Count(1, MAX_DEVICES), default=None,
              help="usp: Ulysses (all-to-all) degree over mesh axis y (default y / ring degree).")
@click.option("--path", "inference_path", type=click.Choice(list(INFERENCE_PATHS)), default=INFERENCE_PATHS[0],
              show_default=True,
              help="Inference path: official = OpenSora v1.2's text-to-video code path (an all-ones "
                   "temporal mask with the timestep-0 modulation: LayerNorm, modulation and gates "
                   "computed twice and selected per frame; docs/gpu.md); clean = without it (the "
                   "same result, fewer element-wise ops; the dump name ends in _clean).")
@click.option("--dialect", type=click.Choice(["stablehlo", "mhlo"]), default="stablehlo",
              show_default=True, help="MLIR dialect of the dump.")
@click.option("-o", "--out", "out_dir", default="dumps", show_default=True,
              type=click.Path(), help="Output directory, created (with its parents) if missing.")
@click.option("--shape-cache", default=None, type=click.Path(dir_okay=False),
              help="JSON cache of stage input/output shapes.  [default: OUT/stage_shapes.json]")
@click.option("--force", is_flag=True, help="Overwrite an existing dump.")
@click.option("--check", is_flag=True,
              help="Instead of dumping: run the stage through XLA and eagerly on CPU and compare outputs (use with --config tiny).")
@click.option("--mode", type=click.Choice(["infer", "train"]), default="infer", show_default=True,
              help="infer: the stage's forward; train: one training step (forward, diffusion "
                   "loss, backward, AdamW) as one program (docs/training.md).")
@click.option("--zero", type=Count(0, 3), default=0, show_default=True,
              help="--mode train: ZeRO stage over the mesh axes that replicate each weight "
                   "(1: optimizer states sharded, 2: + gradients, 3: + parameters, FSDP).")
@click.option("--recompute", type=click.Choice(["none", "full"]), default="none",
              show_default=True, help="--mode train: activation checkpointing per block.")
@click.option("-v", "--verbose", is_flag=True, help="Log details (cache hits, sizes) to stderr.")
def main(stage: int, strategy: str, shape: str | None, mesh: str, stage_ids: str | None,
         model_config: str, pipeline_file: str | None, devices: int | None, dtype: str, batch: int,
         patches: int, all_stages: bool, ring_degree: int | None, ulysses_degree: int | None,
         inference_path: str, dialect: str,
         out_dir: str, shape_cache: str | None, force: bool, check: bool, mode: str, zero: int,
         recompute: str, verbose: bool) -> None:
    """Trace one pipeline stage of OpenSora STDiT3 with torch-xla SPMD on virtual CPU devices
    and write the per-device program after SPMD partitioning as MLIR, with a JSON sidecar
    (OUT/<model>_<shape>_<strategy>_<mesh>_stage<k>_pairs<first>-<last>.mlir and .json; OUT is
    created if missing)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        options = dict(config=model_config, shape=shape, strategy=strategy, mesh=mesh,
                       stage_ids=stage_ids, dtype=dtype, batch=batch, patches=patches,
                       ring_degree=ring_degree, ulysses_degree=ulysses_degree,
                       inference_path=inference_path)
        if pipeline_file is not None:
            ctx = click.get_current_context()
            explicit = {key: value for key, value in options.items()
                        if ctx.get_parameter_source(_PARAM_OF[key]) == click.core.ParameterSource.COMMANDLINE}
            config = load_config_file(pipeline_file, **explicit)
        else:
            config = build_config(**options)
        if devices is not None and devices != config.num_devices:
            raise UsageError(f"--devices {devices} does not match mesh {config.mesh_label} "
                             f"({config.num_devices} devices)")
        check_trace_size(config)  # before torch allocates anything
        out = Path(out_dir)
        train = None
        if mode == "train":
            train = TrainOptions(zero=zero, recompute=recompute)
        elif zero or recompute != "none":
            raise UsageError("--zero and --recompute apply to --mode train only")
        if all_stages:
            sys.exit(_trace_all_stages(config))
        # The trace (or check) runs in a forked child: torch and XLA abort their process when
        # an allocation fails (std::bad_alloc); the child's death is one line here, its
        # progress is shown as it comes. The child leaves by os._exit: a compile XLA left
        # running in the background is not waited for.
        name = config.dump_name(stage) if stage < config.num_stages else f"stage {stage}"
        if check:
            require_trace_extra()
            summary, passed = call_in_child(_check_in_child, config, stage, train, origin=name,
                                            what="checking it", live_stderr=True)
            click.echo(summary, err=True)
            if not passed:
                sys.exit(1)
            return
        cache = Path(shape_cache) if shape_cache else out / "stage_shapes.json"
        written = trace_to_dump(config, stage, out, dialect, force, cache, train, origin=name)
    except UsageError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(2)
    click.echo("wrote " + " ".join(written), err=True)


def trace_to_dump(config: PipelineConfig, stage: int, out: Path, dialect: str, force: bool,
                  cache: Path, train: TrainOptions | None, *, origin: str,
                  what: str = "tracing it", live_stderr: bool = True) -> list[str]:
    """Trace one stage and write its dump, in two forked children; the written paths. The trace
    (torch, torch-xla: :func:`capture_stage`) ends as soon as XLA has written the partitioned
    program, and the rest of XLA's compile, which cannot be cancelled, ends with it instead of
    taking a core and memory from the conversion. The conversion (:func:`write_captured`) is
    forked first from this process, which never loads torch: it loads jaxlib's bindings while the
    trace runs, then waits for the captured stage, which the trace's child writes into a pipe
    before it ends. Either one's death (a native abort, memory) is one line here; a failed trace
    stops the conversion."""
    read_end, write_end = os.pipe()
    converter = start_in_child(_write_in_child, read_end, dialect, force, origin=origin,
                               what="converting it", live_stderr=live_stderr)
    os.close(read_end)
    try:
        call_in_child(_trace_in_child, config, stage, out, force, cache, train, write_end,
                      origin=origin, what=what, live_stderr=live_stderr)
    except BaseException:
        converter.cancel()
        raise
    finally:
        os.close(write_end)
    return converter.result()


def _trace_in_child(config: PipelineConfig, stage: int, out: Path, force: bool, cache: Path,
                    train: TrainOptions | None, send: int) -> None:
    """``capture_stage`` in the trace's child process; the captured stage goes to the
    conversion's child through the pipe ``send``, as soon as it is there (the conversion starts
    while this process ends)."""
    import shutil

    from tracing.tracer import block_unused_imports

    block_unused_imports()
    captured, session = capture_stage(config, stage, out, force, cache, train)
    if session.compiling:  # the compile goes on writing there until the child ends
        shutil.rmtree(session.dump_dir, ignore_errors=True)
    with os.fdopen(send, "wb") as pipe:
        try:
            pickle.dump(captured, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        except BrokenPipeError:
            pass  # the conversion ended before reading it: its result says why


def _write_in_child(read_end: int, dialect: str, force: bool) -> list[str]:
    """In the conversion's child process: jaxlib's bindings loaded at once, then
    ``write_captured`` of the stage read from ``read_end``; the written paths."""
    with native_imports():
        from hlo_analyzer.mlir import default_context, load_native_libraries

        load_native_libraries()
    default_context()  # made while the trace runs (50 ms), not after
    with os.fdopen(read_end, "rb") as pipe:
        captured = pickle.load(pipe)
    return [str(path) for path in write_captured(captured, dialect, force)]


def _check_in_child(config: PipelineConfig, stage: int,
                    train: TrainOptions | None) -> tuple[str, bool]:
    """``run_check`` in the check's child process: its summary and whether it passed."""
    from tracing.check import run_check

    report = run_check(config, stage, progress=_progress(stage, f"check {config.strategy}"),
                       train=train)
    return report.summary(), report.passed


def _trace_all_stages(config: PipelineConfig) -> int:
    """Run this command once per stage (a process each: the device count is fixed per process)."""
    import subprocess

    arguments = [arg for arg in sys.argv[1:] if arg != "--all-stages"]
    if "--stage" in arguments:
        index = arguments.index("--stage")
        del arguments[index:index + 2]
    for stage in range(config.num_stages):
        # each stage ends with this process (a SIGTERM here never leaves a stage tracing)
        code = subprocess.call([sys.executable, "-m", "tracing.cli", *arguments,
                                "--stage", str(stage)], env=child_environment())
        if code != 0:
            return code
    return 0


_PARAM_OF = {"config": "model_config", "shape": "shape", "strategy": "strategy", "mesh": "mesh",
             "stage_ids": "stage_ids", "dtype": "dtype", "batch": "batch", "patches": "patches",
             "ring_degree": "ring_degree", "ulysses_degree": "ulysses_degree",
             "inference_path": "inference_path"}


if __name__ == "__main__":
    main()
