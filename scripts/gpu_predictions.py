"""Predicted vs measured vs published: OpenSora v1.2 on one GPU, a whole generation (the 30-step
STDiT3 loop and the VAE decode) at the twelve video shapes of OpenSora's published H100 table.

For each shape it traces (or reuses) one device's stage 0 of the split ``0-0,1-27`` (the
embeddings and one block pair; the split-independence invariant makes one pair x 28 the whole
model: results/split.md) and one call of each VAE decoder (``trace-vae-decode``), analyzes each
dump once with ``analyze-hlo --hw <first GPU> --kernels`` (``--exec torch``, the mode the tool
picks for a traced PyTorch model on a GPU: one kernel per library call) and costs the kernel
lists on each GPU description (``hlo_analyzer.mapping.kernel_list.cost``: the same mapping, so the
figures equal ``analyze-hlo --hw X``'s): the loop is 30 steps of one pair x 28, the decode each
decoder's call times the calls one sample takes. It prints:

* the generation's predicted time beside the one measured on an H100 SXM by this project
  (results/gpu_validation: loop + decode) and the figure OpenSora's README publishes for a whole
  generation on one "80G H100" (text encoder + 30 steps + VAE decode;
  ``results/gpu_validation/published_opensora_v12_h100.csv``, docs/sources.md);
* the published table's twelve video points, time and peak memory, against ``h100-sxm``'s
  predicted time and two peak memories: the tensors a generation holds at its peak
  (``models.opensora.memory.generation_peak``), and the device memory the process holds then, the
  CUDA context plus what PyTorch's caching allocator reserves (``models.cuda_runtime``
  replaying the generation's eager allocation sequence, recorded on the ``meta`` device by
  ``tracing.allocations``: :data:`ALLOCATIONS`);
* the kernels of one step by class at 204_640_360 (else the first shape), with each class's
  first-principles bound.

    python3 scripts/gpu_predictions.py [--out DIR] [--hw h100-sxm,h100-pcie,...] [--shapes ...]
                                       [--write-kernels DIR] [--from-kernels DIR]
                                       [--write-allocations FILE]

``--write-kernels DIR`` also writes the kernel lists that ``tests/test_gpu_validation.py`` costs
without tracing: ``loop_<shape>.json`` (one step, pairs and steps to total) and
``vae_<W>_<H>_<part>.json`` (one decoder call; the same call at every duration of a
resolution). Full-size traces take 5-20 s and up to 5 GiB each; the dumps are kept in DIR
(default results/.cache/gpu) and reused. Progress on stderr, markdown on stdout (docs/gpu.md
quotes it). ``--write-allocations FILE`` records the allocation sequence again (torch; about 40 s
on the ``meta`` device, no memory) before replaying it.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_analyzer.mapping import kernel_list as kernel_list  # noqa: E402
from hlo_trace.atomic import check_target  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402
from hlo_trace.errors import UsageError  # noqa: E402
from models.cuda_runtime import AllocationTrace, read_trace, replay  # noqa: E402
from models.opensora.inputs import opensora_shape, parse_shape  # noqa: E402
from models.opensora.memory import GENERATION_PHASES, GIB, generation_peak  # noqa: E402
from models.opensora.vae_config import decode_plan  # noqa: E402

#: OpenSora v1.2's README (hpcaitech/Open-Sora at v1.2.0, "Gradio Demo"), transcribed with its
#: source in the file's header: generation time and peak memory on one 80 GB H100, 30 sampling
#: steps, aspect ratio 9:16 (``models.opensora.inputs.opensora_shape`` names the shapes).
PUBLISHED_CSV = REPO_ROOT / "results" / "gpu_validation" / "published_opensora_v12_h100.csv"
#: Measured by this project on one H100 SXM5 80GB (results/gpu_validation/NVIDIA_H100_80GB_HBM3.md,
#: "loop (s)": 30 whole STDiT3 forwards of the official path, FlashAttention-2, bf16, B = 2).
#: The two 2 s videos: 30 x the forward of results/gpu_validation/NVIDIA_H100_80GB_HBM3_2s.md (the
#: same script on the same card, 2026-11-26).
MEASURED_H100_SXM_LOOP_S = {"204_640_360": 57.73, "408_640_360": 116.41, "51_1280_720": 61.31, "102_1280_720": 121.10,
                            "51_640_360": 14.89, "51_854_480": 25.70}
#: The same card's VAE decode of one generation, temporal + spatial decoder
#: (results/gpu_validation/vae_decode_NVIDIA_H100_80GB_HBM3.md: benchmarks/gpu_vae_decode.py); the two
#: 2 s videos: the whole decode of one generation timed by benchmarks/gpu_generation.py
#: (results/gpu_validation/generation_30_steps_NVIDIA_H100_80GB_HBM3.json).
MEASURED_H100_SXM_DECODE_S = {"204_640_360": 3.419, "408_640_360": 6.874, "51_1280_720": 4.032, "102_1280_720": 8.068,
                              "51_640_360": 1.147, "51_854_480": 1.673}
#: The allocation sequence of ``benchmarks/gpu_generation.py``'s run of the twelve shapes in this
#: order, two steps each (two steps reserve what thirty do: generation_30_steps_*.json), recorded on
#: the ``meta`` device (``tracing.allocations.record_generations``; ``--write-allocations``). Every
#: generation begins with ``torch.cuda.empty_cache()``, which leaves the allocator as a fresh demo
#: process leaves it once the weights are loaded, so each generation's replay is also the demo's.
ALLOCATIONS = REPO_ROOT / "results" / "gpu_validation" / "allocations_generation_2_steps.json.gz"
ALLOCATION_SHAPES = ("51_640_360", "102_640_360", "204_640_360", "51_854_480", "102_854_480", "51_1280_720",
                     "408_640_360", "204_854_480", "102_1280_720", "408_854_480", "204_1280_720", "408_1280_720")
ALLOCATION_STEPS = 2
#: That run measured on one H100 SXM (validation only): every generation's phases, peaks and context.
MEASURED_GENERATION = REPO_ROOT / "results" / "gpu_validation" / "generation_NVIDIA_H100_80GB_HBM3.json"
#: The CUDA context on one H100 SXM: the device's used bytes beyond the allocator's reserve before any
#: tensor (benchmarks/gpu_generation.py, ``context_bytes`` of results/gpu_validation/generation_*.json:
#: driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130; the same in all three runs). A property of the
#: driver and the libraries loaded, measured before the workload runs.
CUDA_CONTEXT_BYTES = 552_402_944
#: One H200, one whole STDiT3 forward at 204_640_360: 1774 ms (docs/gpu.md, "Measured on an H100
#: (and an H200)"), a loop of 30 such forwards.
MEASURED_H200_FORWARD_S = {"204_640_360": 1.774}
PAIRS = 28
STEPS = 30
SPLIT = "0-0,1-27"
VAE_PARTS = ("temporal", "spatial")
#: The GPU description the published table's card is (an "80G H100": the SXM5 card's figures).
PUBLISHED_CARD = "h100-sxm"
DEFAULT_KERNELS = REPO_ROOT / "results" / "gpu_validation" / "kernels"
#: The shape whose kernels are listed by class (docs/gpu.md), when it is among the shapes.
CLASSES_AT = "204_640_360"


@dataclass(frozen=True)
class PublishedPoint:
    """One cell of the published table: a video shape's generation time and peak memory."""

    resolution: str
    duration: str
    shape: str
    seconds: float
    memory_g: float


def published_points(path: Path = PUBLISHED_CSV) -> list[PublishedPoint]:
    """The published table's video points (its image column is no video: left out)."""
    with path.open() as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        return [PublishedPoint(r["resolution"], r["duration"], opensora_shape(r["resolution"], r["duration"]),
                               float(r["seconds"]), float(r["memory_g"]))
                for r in rows if r["duration"] != "image"]


def loop_kernels_name(shape: str) -> str:
    return f"loop_{shape}.json"


def vae_kernels_name(shape: str, part: str) -> str:
    video = parse_shape(shape)
    return f"vae_{video.width}_{video.height}_{part}.json"


def vae_calls(shape: str, part: str) -> float:
    """Calls of one decoder per sample (the tracer's sidecar records the same: tracing.vae_decode)."""
    plan = decode_plan(shape)
    return plan.chunks if part == "temporal" else plan.spatial_call_equivalents


@dataclass(frozen=True)
class Generation:
    """A generation's predicted time on one GPU description."""

    loop_s: float
    decode_s: float

    @property
    def seconds(self) -> float:
        return self.loop_s + self.decode_s


def predict(loop: kernel_list.KernelList, vae: dict[str, kernel_list.KernelList], shape: str,
            hardware: str) -> Generation:
    """The loop and the decode of one generation of ``shape`` on ``hardware`` from kernel lists."""
    loop_s = kernel_list.cost(loop, hardware).inference_latency_s
    decode_s = sum(vae_calls(shape, part) * kernel_list.cost(vae[part], hardware).inference_latency_s
                   for part in VAE_PARTS)
    return Generation(loop_s, decode_s)


@dataclass(frozen=True)
class DeviceMemory:
    """One generation's peak on the device, from the allocator's replay, in bytes."""

    shape: str
    tensors: int        # the allocated blocks at the peak (``torch.cuda.max_memory_allocated``)
    reserved: int       # the caching allocator's peak reserve (``torch.cuda.max_memory_reserved``)

    @property
    def device(self) -> int:
        """What ``nvidia-smi`` shows at the peak: the CUDA context and the allocator's reserve."""
        return CUDA_CONTEXT_BYTES + self.reserved


def device_memory(trace: AllocationTrace) -> dict[str, DeviceMemory]:
    """Each generation's peak, by shape: the peaks at its last phase's mark (they run from the
    ``<shape> begin`` mark, where the cache is emptied and the peaks reset)."""
    last = GENERATION_PHASES[-1]
    peaks = {}
    for phase in replay(trace):
        shape, _, name = phase.name.partition(" ")
        if name == last:
            peaks[shape] = DeviceMemory(shape, phase.peak_allocated, phase.peak_reserved)
    return peaks


def load_device_memory(path: Path = ALLOCATIONS) -> dict[str, DeviceMemory]:
    return device_memory(read_trace(path))


def plot_memory(path: Path, points: list[PublishedPoint], tensors: dict[str, float],
                memory: dict[str, DeviceMemory], measured: dict[str, float], *, force: bool) -> Path:
    """The published peak memory of each video point beside the predicted tensors, the predicted
    device memory and (where measured) the H100 run's device memory, all in GiB (G read as GiB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hlo_trace.atomic import write_png

    shapes = [p.shape for p in points]
    x = range(len(shapes))
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.bar([i - 0.2 for i in x], [p.memory_g for p in points], 0.4, color="#bbbbbb", label="published (G)")
    ax.plot([i + 0.1 for i in x], [memory[s].device / GIB for s in shapes], "o", color="#1f77b4",
            label="predicted device memory: context + replayed reserve")
    ax.plot([i + 0.1 for i in x], [tensors[s] for s in shapes], "s", color="#ff7f0e", label="predicted tensors")
    seen = [i for i, s in enumerate(shapes) if s in measured]
    ax.plot([i + 0.3 for i in seen], [measured[shapes[i]] for i in seen], "^", color="#2ca02c",
            label="measured on one H100: context + reserve")
    ax.set_xticks(list(x), [f"{p.resolution} {p.duration}" for p in points], rotation=30)
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("OpenSora v1.2 on one H100: published peak memory against the predictions")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written = write_png(fig, path, force=force)
    plt.close(fig)
    return written


def measured_generations(path: Path = MEASURED_GENERATION) -> list[dict]:
    """The H100 run's generations, in its order (``benchmarks/gpu_generation.py``'s JSON)."""
    return json.loads(path.read_text())["generations"]


def measured_device_memory(path: Path = MEASURED_GENERATION) -> dict[str, float]:
    """The H100 run's device memory at each generation's peak (context + peak reserve), GiB."""
    return {g["shape"]: (g["context_bytes"] + max(p["peak_reserved"] for p in g["phases"])) / GIB
            for g in measured_generations(path)}


def spatial_call_peak(vae: dict[str, kernel_list.KernelList]) -> int:
    """One spatial decoder call's peak live bytes (its memory analysis, kept in its kernel list)."""
    peak = vae["spatial"].peak_live_bytes
    if peak is None:
        raise ValueError(f"{vae['spatial'].source}: its kernel list has no peak_live_bytes")
    return peak


def load_kernels(directory: Path, shape: str) -> tuple[kernel_list.KernelList, dict[str, kernel_list.KernelList]]:
    """The loop's and the decoders' kernel lists of ``shape`` written by ``--write-kernels``."""
    return (kernel_list.read(directory / loop_kernels_name(shape)),
            {part: kernel_list.read(directory / vae_kernels_name(shape, part)) for part in VAE_PARTS})


# -- tracing and analysis ------------------------------------------------------------------------------
def _stage_dump(out: Path, shape: str) -> Path:
    dump = out / f"full_{shape}_none_1x1_stage0_pairs0-0.mlir"
    if not dump.exists():
        click.echo(f"tracing {shape} (one device, stage 0 of {SPLIT})", err=True)
        subprocess.run([sys.executable, "-m", "tracing.cli", "--config", "full", "--shape", shape,
                        "--strategy", "none", "--mesh", "1x1", "--stage", "0", "--stage-ids", SPLIT,
                        "-o", str(out)], check=True, cwd=REPO_ROOT)
    return dump


def _vae_dump(out: Path, shape: str, part: str) -> Path:
    dump = out / f"vae_full_{shape}_{part}.mlir"
    if not dump.exists():
        click.echo(f"tracing the {part} VAE decoder for {shape}", err=True)
        subprocess.run([sys.executable, "-m", "tracing.vae_decode", "--part", part, "--shape", shape,
                        "-o", str(out)], check=True, cwd=REPO_ROOT)
    return dump


def _kernels(dump: Path, hardware: str, pairs: int | None = None) -> kernel_list.KernelList:
    """``analyze-hlo DUMP --hw hardware --kernels``: the dump's kernel list (written beside it)."""
    target = dump.with_suffix(".kernels.json")
    click.echo(f"analyzing {dump.name} on {hardware}", err=True)
    command = [sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", hardware, "--kernels", str(target),
               "--force", "-o", str(dump.with_suffix(".report.json")), "--format", "json"]
    if pairs is not None:
        command += ["--pairs", str(pairs)]
    subprocess.run(command, check=True, cwd=REPO_ROOT, capture_output=True, text=True)
    return kernel_list.read(target)


def _ratio(value: float, reference: float | None) -> str | None:
    return f"{value / reference:.2f}x" if reference else None


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=REPO_ROOT / "results" / ".cache" / "gpu", show_default=True,
              help="Where the one-pair dumps are kept and reused.")
@click.option("--hw", "hardware", default="h100-sxm,h100-pcie,a100-sxm,a100-sxm-40gb", show_default=True,
              help="Comma-separated GPU descriptions (the first one finds the kernels).")
@click.option("--shapes", default=None,
              help="Comma-separated video shapes.  [default: the twelve of the published table]")
@click.option("--write-kernels", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Also write the kernel lists that tests/test_gpu_validation.py costs here (the "
                   f"committed ones: {DEFAULT_KERNELS.relative_to(REPO_ROOT)}).")
@click.option("--from-kernels", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Cost the kernel lists in this directory (e.g. the committed ones) instead of tracing.")
@click.option("--write-allocations", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Record the twelve generations' allocation sequence again on the meta device (torch) and "
                   f"write it here before replaying it (the committed one: {ALLOCATIONS.relative_to(REPO_ROOT)}).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the published peak memory against the predictions as a PNG here (the plot "
                   "extra; docs/img/published_memory.png).")
@click.option("--force", is_flag=True, help="Let --write-allocations and --plot overwrite existing files.")
def main(out: Path, hardware: str, shapes: str | None, write_kernels: Path | None,
         from_kernels: Path | None, write_allocations: Path | None, plot_path: Path | None, force: bool) -> None:
    """Print the predicted-vs-published tables and the kernel classes of one step."""
    gpus = [h for h in hardware.split(",") if h]
    if plot_path is not None:
        check_target(plot_path, force=force)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot: needs matplotlib (the plot extra: pip install -e '.[plot]')") from None
    if write_allocations is not None:
        check_target(write_allocations, force=force)   # before a 41 s recording, not after
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("--write-allocations: records on PyTorch's meta device, and torch is not "
                             "installed (the trace extra: pip install -e '.[trace]')") from None
    published = {p.shape: p for p in published_points()}
    shape_list = [s for s in shapes.split(",") if s] if shapes else list(published)
    loops, vaes = {}, {}
    for shape in shape_list:
        if from_kernels is not None:
            loops[shape], vaes[shape] = load_kernels(from_kernels, shape)
            continue
        out.mkdir(parents=True, exist_ok=True)
        loops[shape] = _kernels(_stage_dump(out, shape), gpus[0], PAIRS)
        vaes[shape] = {part: _kernels(_vae_dump(out, shape, part), gpus[0]) for part in VAE_PARTS}
        if write_kernels is not None:
            write_kernels.mkdir(parents=True, exist_ok=True)
            kernel_list.write(loops[shape], write_kernels / loop_kernels_name(shape))
            for part in VAE_PARTS:
                kernel_list.write(vaes[shape][part], write_kernels / vae_kernels_name(shape, part))
    predicted = {(s, h): predict(loops[s], vaes[s], s, h) for s in shape_list for h in gpus}

    click.echo("| shape | published, one 80G H100 (whole generation) | measured here, H100 SXM: loop + "
               "VAE decode = generation | " + " | ".join(f"{h}: loop + decode = generation (/ measured, / published)"
                                                         for h in gpus) + " |")
    click.echo("|---|---|---|" + "---|" * len(gpus))
    for shape in shape_list:
        point = published.get(shape)
        measured = MEASURED_H100_SXM_LOOP_S.get(shape)
        decode = MEASURED_H100_SXM_DECODE_S.get(shape)
        whole = measured + decode if measured and decode else None
        cells = []
        for h in gpus:
            generation = predicted[shape, h]
            ratios = [r for r in (_ratio(generation.seconds, whole), _ratio(generation.seconds, point and point.seconds))
                      if r]
            cells.append(f"{generation.loop_s:.1f} + {generation.decode_s:.2f} = {generation.seconds:.1f} s"
                         + (f" ({', '.join(ratios)})" if ratios else ""))
        here = f"{measured:.1f} + {decode:.2f} = {whole:.1f} s" if whole else "-"
        click.echo(f"| {shape} | {f'{point.seconds} s' if point else '-'} | {here} | " + " | ".join(cells) + " |")

    if PUBLISHED_CARD in gpus and any(s in published for s in shape_list):
        if write_allocations is not None:
            from models.cuda_runtime import write_trace
            from tracing.allocations import record_generations

            trace = record_generations(ALLOCATION_SHAPES, ALLOCATION_STEPS,
                                       progress=lambda line: click.echo(line, err=True))
            write_trace(write_allocations, trace, force=force)
        memory = load_device_memory(write_allocations or ALLOCATIONS)
        click.echo(f"\nOpenSora v1.2's published H100 table, predicted on {PUBLISHED_CARD} (time) and in memory "
                   "by models.opensora.memory.generation_peak (the tensors) and by the caching allocator's replay "
                   "(the device: CUDA context + reserve); the README's G read as GiB:\n")
        click.echo("| resolution | duration | shape | published time | predicted time | / published | "
                   "published peak memory | predicted tensors (phase) | / published | "
                   "predicted device memory | / published |")
        click.echo("|---|---|---|---|---|---|---|---|---|---|---|")
        tensors = {}
        for shape in shape_list:
            point = published.get(shape)
            if point is None:
                continue
            generation = predicted[shape, PUBLISHED_CARD]
            peak = generation_peak(shape, spatial_call_peak(vaes[shape]))
            tensors[shape] = peak.total_bytes / GIB
            device = memory[shape].device / GIB
            click.echo(f"| {point.resolution} | {point.duration} | {shape} | {point.seconds:.0f} s | "
                       f"{generation.seconds:.1f} s | {generation.seconds / point.seconds:.2f} | "
                       f"{point.memory_g:.0f} G | {peak.total_bytes / GIB:.1f} GiB ({peak.phase}) | "
                       f"{peak.total_bytes / GIB / point.memory_g:.2f} | {device:.1f} GiB | "
                       f"{device / point.memory_g:.2f} |")
        if plot_path is not None:
            shown = [published[s] for s in shape_list if s in published]
            click.echo(f"\nwrote {plot_memory(plot_path, shown, tensors, memory, measured_device_memory(), force=force)}",
                       err=True)
    if "h200-sxm" in gpus:
        for shape, forward in MEASURED_H200_FORWARD_S.items():
            if shape in loops:
                loop = kernel_list.cost(loops[shape], "h200-sxm").inference_latency_s
                click.echo(f"\nh200-sxm at {shape}: loop {loop:.1f} s against {STEPS} x {forward * 1e3:.0f} ms "
                           f"= {STEPS * forward:.1f} s measured ({loop / (STEPS * forward):.2f}x)")

    at = CLASSES_AT if CLASSES_AT in loops else shape_list[0]
    first = loops[at]
    from hardware.systems import resolve_system
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import MappingOptions

    system = resolve_system(gpus[0], 1).system
    program = map_kernels(first.kernels, system.chip, system, MappingOptions(execution=first.execution))
    click.echo(f"\nKernels of one step of the traced program (embeddings + one pair) at {at} "
               f"on {gpus[0]}, execution {program.execution}:\n")
    click.echo("| class | kernels | time | first-principles bound | time / bound |")
    click.echo("|---|---|---|---|---|")
    for entry in program.kernel_classes(system.chip):
        click.echo(f"| {entry.name} | {entry.kernels} | {entry.seconds * 1e3:.3f} ms | "
                   f"{entry.bound_seconds * 1e3:.3f} ms | {entry.ratio:.2f} |")


if __name__ == "__main__":
    sys.exit(run_click(main))
