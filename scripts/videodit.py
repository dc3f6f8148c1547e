"""Predicted sampling loops of today's video DiTs on GPUs: HunyuanVideo, Wan 2.1 14B and
CogVideoX-5B at their standard resolutions under xDiT's strategies (docs/videodit.md).

Each model is traced by parts (``models.zoo.videodit.configs``: one block of each kind, and
one more of each kind) at full resolution and in bfloat16, under the strategy's plan
(``models.zoo.videodit.plans``); each part's dump is analyzed with ``analyze-hlo --hw SYSTEM``
(``--exec torch``: one kernel per library call of the official code, flash attention one
kernel; the system's collectives on its links; ``--attention-memory fused``: the memory with
flash-attention's tiling, ``hlo_analyzer.attention_memory``). The whole model is the parts scaled by the layer counts
(``configs.scaled``); a step is one call of the transformer (both CFG branches), the loop
``steps`` of them. Nothing here is fitted: the GPU descriptions' constants are the
microbenchmark ones (docs/gpu.md), and the published timings of these runs are held out.

    python3 scripts/videodit.py [--work DIR] [--out results/videodit] [--only MODEL] [--force]
    python3 scripts/videodit.py --render-only     # the page again from the CSV
    python3 scripts/videodit.py --search          # plan-search --model of each model on 8xh100
    python3 scripts/videodit.py --search-systems  # and on 8xa100, tx8-16, 4x8xh100 (after --search)

Writes ``OUT/latency.csv`` (one row per prediction; ``decode_s`` the VAE decode of one video on
one device, where the VAE is written: each shape of call of the official decode loop (tile and
latent frames, ``companions.Decoder``) traced at full size, times its calls, and the assembly of
their frames (``vae_assembly.py``) traced once; empty elsewhere) and the page ``OUT/latency.md``
rendered from it. The dumps and the reports are kept in
``--work`` and reused: a rerun analyzes again without tracing. Every full-size trace runs under
``flock`` on the user's trace lock (``python -m hlo_trace.cache --lock``) at ``nice -n 19``
with its virtual memory capped. Progress on stderr.
"""

from __future__ import annotations

import csv
import io
import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_analyzer.mapping.json_report import JsonReport  # noqa: E402
from hlo_trace.atomic import atomic_write  # noqa: E402
from hlo_trace.cache import trace_lock_path  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402
from models.zoo.videodit.companions import ASSEMBLY_FACTORY, COMPANIONS, Companions, DecodeCall  # noqa: E402
from models.zoo.videodit.configs import (  # noqa: E402
    BASE,
    COGVIDEOX_5B,
    HUNYUAN_VIDEO,
    MODELS,
    WAN21_14B,
    VideoDiT,
    part_kwargs,
    parts,
    scaled,
)
from models.zoo.videodit.plans import STRATEGIES, factory_kwargs, plan_toml  # noqa: E402
from planning.module_models import (  # noqa: E402
    DTYPE,
    SINGLE,
    DeviceMemory,
    Layout,
    ZooModel,
    device_memory,
    enumerate_layouts,
    pipefusion_loop_s,
    pipefusion_memory,
    stage_counts,
    tick_inputs,
)

COLUMNS = ("model", "frames", "height", "width", "steps", "hw", "devices", "strategy", "degrees",
           "loop_s", "decode_s", "memory_gb")
GB = 1e9  # memory_gb in the unit of the descriptions' capacities (an "80 GB" H100: 80e9 bytes)
#: The cap on a trace's virtual memory (KiB): a full-size block trace holds a few GiB. Every
#: full-size trace takes the user's trace lock (never two at once: hlo_trace.cache).
TRACE_VMEM_KIB = 24 * 1024 * 1024
DEFAULT_WORK = REPO_ROOT / "results" / ".cache" / "videodit"
DEFAULT_OUT = REPO_ROOT / "results" / "videodit"


@dataclass(frozen=True)
class Case:
    """One prediction: a model at a video shape under a layout on a system."""

    config: VideoDiT
    frames: int
    height: int
    width: int
    layout: Layout
    hw: str


@dataclass(frozen=True)
class Traced:
    """What one dump measures on any hardware (one device's program)."""

    gemm_flops: int
    total_flops: int
    comm_bytes: Mapping[str, float]   # bytes sent per device by collective kind
    comm_counts: Mapping[str, int]
    weight_bytes: int
    input_bytes: int
    scalar_bytes: int
    peak_live_bytes: int              # with the attentions fused (flash-attention's tiling)
    stale_kv_bytes: int = 0           # PipeFusion's K/V buffers


@dataclass(frozen=True)
class Prediction:
    case: Case
    step_s: float
    memory: DeviceMemory
    capacity_bytes: float
    #: the VAE decode of one video as the official code runs it; None where it is not traced
    decode_s: float | None = None

    @property
    def loop_s(self) -> float:
        return self.case.config.steps * self.step_s

    @property
    def memory_bytes(self) -> float:
        return self.memory.total_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes


# -- the cases of the issue --------------------------------------------------------------------------
def cases() -> list[Case]:
    """HunyuanVideo 129 x 720 x 1280 on 1-8 H100 and A100 (Ulysses), and on one A100 40GB;
    Wan 2.1 14B at 480p and
    720p, 81 frames, on 1 and 8 H100 and H200 (Ulysses, and CFG parallel x Ulysses);
    CogVideoX-5B 49 x 480 x 720 on 1-8 A100 (Ulysses over every degree that divides its 48
    heads); PipeFusion on 2, 4 and 8 devices (M = P patches): HunyuanVideo and Wan 2.1 14B
    (480p) on H100, CogVideoX-5B on A100."""
    def ulysses(n: int) -> Layout:
        return Layout(SINGLE) if n == 1 else Layout("ulysses", n)

    found = [Case(HUNYUAN_VIDEO, 129, 720, 1280, ulysses(n), hw)
             for hw in ("8xh100", "8xa100") for n in (1, 2, 4, 8)]
    # one device of 40 GB: the model and its activations do not fit (the page says so)
    found.append(Case(HUNYUAN_VIDEO, 129, 720, 1280, Layout(SINGLE), "8xa100-40gb"))
    found += [Case(WAN21_14B, 81, h, w, layout, hw) for h, w in ((480, 832), (720, 1280))
              for hw in ("8xh100", "8xh200")
              for layout in (Layout(SINGLE), Layout("ulysses", 8), Layout("cfg_ulysses", 4))]
    found += [Case(COGVIDEOX_5B, 49, 480, 720, ulysses(n), "8xa100") for n in (1, 2, 3, 4, 6, 8)]
    # PipeFusion (P stages, M = P patches) on 2, 4 and 8 devices
    found += [Case(config, frames, h, w, Layout("pipefusion", p), hw) for p in (2, 4, 8)
              for config, frames, h, w, hw in GRID]
    # every other strategy of xDiT the model runs, on 2, 4 and 8 devices (those above once)
    found += [Case(config, frames, h, w, layout, hw) for config, frames, h, w, hw in GRID
              for devices in (2, 4, 8) for layout in grid_layouts(config, frames, h, w, devices)]
    unique = {(c.config.name, c.frames, c.height, c.width, c.layout, c.hw): c for c in found}
    return list(unique.values())


#: Each model's first shape and system: the grid of strategies x 2, 4, 8 devices runs there.
GRID = ((HUNYUAN_VIDEO, 129, 720, 1280, "8xh100"), (WAN21_14B, 81, 480, 832, "8xh100"),
        (COGVIDEOX_5B, 49, 480, 720, "8xa100"))


def grid_layouts(config: VideoDiT, frames: int, height: int, width: int, devices: int) -> list[Layout]:
    """The layouts of xDiT's strategies but PipeFusion (``plans.STRATEGIES``) that use all
    ``devices``, as ``plan-search --model`` enumerates them (CFG x Ulysses of 1 is CFG)."""
    model = ZooModel(config, frames, height, width)
    strategies = [s for s in STRATEGIES if model.cannot_run(s) is None]
    layouts, _ = enumerate_layouts(model, devices, strategies)
    return [layout for layout in layouts if not (layout.strategy == "cfg_ulysses" and layout.degree == 1)]


# -- tracing and analysis ----------------------------------------------------------------------------
def dump_name(config: VideoDiT, frames: int, height: int, width: int, layout: Layout, part: str) -> str:
    return f"{config.name}_{frames}x{height}x{width}_{layout.tag}_{part}"


def _toml(values: Mapping[str, object]) -> str:
    return "".join(f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}\n"
                   for key, value in values.items())


def trace_command(factory: str, kwargs: Mapping[str, object], inputs: Sequence[str], layout: Layout,
                  model: str, name: str, out: Path, dtype: str) -> list[str]:
    """trace-module's command line for one dump (the plan and keyword files written to ``out``)."""
    layered = dict(kwargs)
    args = [sys.executable, "-m", "tracing.module_cli", factory, "--dtype", dtype, "--name", name,
            "-o", str(out), "--force"]
    if layout.strategy == SINGLE:
        args += ["--strategy", "dp", "--mesh", "1x1"]
    else:
        plan = out / f"{name}.plan.toml"
        plan.write_text(plan_toml(model, layout.strategy, layout.degree))
        args += ["--plan", str(plan)]
        layered.update(factory_kwargs(layout.strategy, layout.degree))
        if model == "wan21":  # cross-attention to the text: no joint sequence to order
            layered.pop("chunks")
    keywords = out / f"{name}.kwargs.toml"
    keywords.write_text(_toml(layered))
    args += ["--kwargs", str(keywords)]
    for spec in inputs:
        args += ["--input", spec]
    return args


def trace(command: list[str], dump: Path, *, full_size: bool) -> Path:
    """Run a trace unless its dump exists; a full-size one under the machine's trace lock, at
    the lowest priority, its virtual memory capped."""
    if dump.exists() and dump.with_suffix(".json").exists():
        return dump
    click.echo(f"tracing {dump.name}", err=True)
    if full_size:
        lock = trace_lock_path()
        lock.parent.mkdir(parents=True, exist_ok=True)
        command = ["bash", "-c", f"ulimit -v {TRACE_VMEM_KIB} && exec flock {shlex.quote(str(lock))} "
                   f"nice -n 19 {shlex.join(command)}"]
    _run(command, f"tracing {dump.name}")
    return dump


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise click.ClickException(f"{what} failed (exit {done.returncode}): {last}")


def report(dump: Path, hw: str) -> JsonReport:
    """``analyze-hlo DUMP --hw hw --attention-memory fused --format json``, kept beside the dump
    and reused; read back typed (its memory and mapping sections required)."""
    target = dump.with_name(f"{dump.stem}.{hw}.report.json")
    if not target.exists():
        click.echo(f"analyzing {dump.name} on {hw}", err=True)
        _run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", hw, "--attention-memory", "fused",
              "--format", "json", "-o", str(target), "--force"], f"analyzing {dump.name} on {hw}")
    return JsonReport.read(target, required=("memory", "mapping"))


def step_seconds(analysis: JsonReport) -> float:
    """One run of the dump's program on the report's system: kernels and collectives."""
    assert analysis.mapping is not None  # required by report()
    return analysis.mapping.totals.inference_latency_s


def traced(analysis: JsonReport) -> Traced:
    """The dump's counts and its memory with the attentions fused, from its report."""
    assert analysis.memory is not None  # required by report()
    memory, comm = analysis.memory.usage, analysis.comm_by_kind
    return Traced(gemm_flops=analysis.totals.gemm_flops, total_flops=analysis.totals.total_flops,
                  comm_bytes={kind: entry.bytes_per_device for kind, entry in comm.items()},
                  comm_counts={kind: entry.count for kind, entry in comm.items()},
                  weight_bytes=memory.weight_bytes, input_bytes=memory.input_bytes,
                  scalar_bytes=memory.scalar_bytes, peak_live_bytes=memory.peak_live_bytes,
                  stale_kv_bytes=memory.stale_kv_bytes)


def memory(parts_traced: Mapping[str, Traced], counts: Mapping[str, float]) -> DeviceMemory:
    """One device's memory of the whole model (``planning.module_models.device_memory``): its
    weights (and K/V buffers) scaled from the parts, the inputs and scalars of one call, and
    the largest peak of live activations among the parts."""
    base = parts_traced[BASE]
    return device_memory({part: t.weight_bytes + t.stale_kv_bytes for part, t in parts_traced.items()}, counts,
                         base.input_bytes + base.scalar_bytes,
                         {part: t.peak_live_bytes for part, t in parts_traced.items()})


def capacity(hw: str, devices: int) -> float:
    from hardware.systems import resolve_system

    return resolve_system(hw, devices).system.chip.dram_capacity_bytes


def row_fits(row: Mapping[str, str]) -> bool:
    """Whether a CSV row's memory per device fits its chip (the page's and the plot's rule)."""
    return float(row["memory_gb"]) * GB <= capacity(row["hw"], int(row["devices"]))


def predict(case: Case, work: Path) -> Prediction:
    config, layout = case.config, case.layout
    work.mkdir(parents=True, exist_ok=True)
    inputs = config.inputs(case.frames, case.height, case.width, DTYPE)
    seconds, measured = {}, {}
    for part in parts(config.blocks):
        name = dump_name(config, case.frames, case.height, case.width, layout, part)
        kwargs = part_kwargs(config.kwargs, config.blocks, part)
        part_inputs = inputs if layout.strategy != "pipefusion" else tick_inputs(
            config, kwargs, inputs, layout.degree, config.video_tokens(case.frames, case.height, case.width))
        command = trace_command(config.factory, kwargs, part_inputs, layout, config.model, name,
                                work, DTYPE)
        dump = trace(command, work / f"{name}.mlir", full_size=True)
        analysis = report(dump, case.hw)
        seconds[part] = step_seconds(analysis)
        measured[part] = traced(analysis)
    if layout.strategy == "pipefusion":
        return pipefusion_prediction(case, work, seconds, measured)
    counts = config.counts()
    return Prediction(case, scaled(seconds, counts), memory(measured, counts),
                      capacity(case.hw, layout.devices), decode_seconds(case, work))


# -- PipeFusion (docs/videodit.md) ------------------------------------------------------------------
def pipefusion_prediction(case: Case, work: Path, seconds: Mapping[str, float],
                          measured: Mapping[str, Traced]) -> Prediction:
    """P stages, M = P patches, 1 warm-up step (``planning.module_models.pipefusion_loop_s``
    and ``pipefusion_memory``, what ``plan-search --model`` predicts too): the tick (the
    heaviest stage on one patch, its hand-off included) from the traced parts; the warm-up's
    full-latent stage the warm-up layout's step / P (its hand-offs not charged) and its
    transient memory (the stage's blocks on the whole latent)."""
    stages, config = case.layout.stages, case.config
    warmup = predict(Case(config, case.frames, case.height, case.width, case.layout.warmup, case.hw), work)
    loop_s = pipefusion_loop_s(seconds, warmup.step_s, config.counts(), stages, config.steps)
    tick = memory(measured, stage_counts(config.counts(), stages))
    return Prediction(case, loop_s / config.steps, pipefusion_memory(tick, warmup.memory.transient_bytes),
                      capacity(case.hw, case.layout.devices), warmup.decode_s)


def decode_seconds(case: Case, work: Path) -> float | None:
    """The VAE decode of one video on one device of the case's system: each shape of call of the
    official decode loop (tile and latent frames, ``companions.Companions.decode_calls``) traced
    at full size, its predicted time times the calls of that shape, and the assembly of the
    calls' frames into the video (joins, blends of the tiles' overlaps, crops:
    ``companions.Companions.assembly``) traced once, summed. None where the model's decoder is
    not written."""
    companion: Companions = COMPANIONS[case.config.name]
    if companion.decoder is None:
        return None
    calls = companion.decode_calls(case.frames, case.height, case.width)
    prefix = f"{case.config.name}_{case.frames}x{case.height}x{case.width}_vae"
    seconds = 0.0
    for call in calls:
        name = f"{prefix}_decode_call" + (f"_{call.shape}" if len(calls) > 1 else "")
        seconds += call.count * _vae_seconds(companion.decoder.factory, call, name, case.hw, work,
                                             companion.decoder.dtype)
    assembly = companion.assembly(case.frames, case.height, case.width)
    return seconds + _vae_seconds(ASSEMBLY_FACTORY, assembly, f"{prefix}_assembly", case.hw, work,
                                  companion.decoder.dtype)


def _vae_seconds(factory: str, call: DecodeCall, name: str, hw: str, work: Path, dtype: str) -> float:
    """One program of a VAE decode traced (once, kept in ``work``) and predicted on ``hw``."""
    command = trace_command(factory, call.kwargs, call.inputs, Layout(SINGLE), "vae", name, work, dtype)
    return step_seconds(report(trace(command, work / f"{name}.mlir", full_size=True), hw))


# -- the CSV and the page ------------------------------------------------------------------------------
def csv_text(predictions: Sequence[Prediction]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for p in predictions:
        c = p.case
        writer.writerow([c.config.name, c.frames, c.height, c.width, c.config.steps, c.hw, c.layout.devices,
                         c.layout.strategy, c.layout.degrees, f"{p.loop_s:.1f}",
                         "" if p.decode_s is None else f"{p.decode_s:.1f}",
                         f"{p.memory_bytes / GB:.1f}"])
    return buffer.getvalue()


def page(rows: Sequence[Mapping[str, str]]) -> str:
    """The report page (markdown) of the CSV's rows: the loops, the memory per device, which rows
    do not fit, and what is outside the loop."""
    from hardware.systems import resolve_system

    lines = ["# Today's video DiTs: predicted sampling loops on GPUs", "",
             "![the loops of each model's strategies on 1-8 devices](strategies.png)", "",
             "Predictions of `scripts/videodit.py` (docs/videodit.md): each model traced by parts "
             "(one block of each kind, and one more of each) at full resolution in bfloat16, analyzed on the "
             "system (`analyze-hlo --hw`, `--exec torch`: the official code's kernels, flash attention "
             "one kernel) and scaled by the layer counts. Nothing is fitted on these models: the GPU "
             "constants are the microbenchmark ones, and the published timings of these runs are held "
             "out for checking. `loop_s`: the transformer's steps (both CFG branches), text encoders and "
             "VAE decode not included. `decode_s`: the VAE decode of one video on one device, where the "
             "VAE is written (all three): each shape of call of the official decode loop "
             "(spatial tile and latent frames) traced at full size in the dtype the official code runs "
             "it in, its predicted time times the calls of that shape the loop makes, plus the assembly "
             "of the calls' frames into the video (joins, the tiles' blends and crops) traced once (a "
             "prediction, like the loop; empty where the VAE is not traced). `memory_gb`: one "
             "device's weights, inputs and peak live activations with flash-attention's tiling "
             "(the analyzer's memory model: an unfused program's liveness, an upper bound), in GB "
             "(1e9 bytes), against the chip's capacity.", "",
             "PipeFusion rows (P stages, M = P patches): the loop is one unpipelined warm-up step and "
             "the other steps overlapped; the memory per device is the stage's weights and K/V buffers "
             "and the larger transient (inputs and peak of live activations) of a tick (one patch) and "
             "of the warm-up step, where the stage runs its blocks on the whole latent "
             "(`planning.module_models.pipefusion_memory`, as `plan-search --model` counts it).", "",
             "| model | video (frames x height x width) | steps | system | devices | strategy | "
             "loop (s) | per step (s) | VAE decode (s) | memory per device (GB) | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        devices = int(row["devices"])
        chip = resolve_system(row["hw"], devices).system.chip
        fits = "yes" if row_fits(row) else f"**no** (capacity {chip.dram_capacity_bytes / GB:.0f} GB)"
        strategy = row["strategy"] + (f" ({row['degrees']})" if row["degrees"] else "")
        decode = f"{float(row['decode_s']):.1f}" if row["decode_s"] else "not traced"
        lines.append(f"| {row['model']} | {row['frames']} x {row['height']} x {row['width']} | {row['steps']} | "
                     f"{row['hw']} ({chip.name}) | {devices} | {strategy} | {float(row['loop_s']):.1f} | "
                     f"{float(row['loop_s']) / int(row['steps']):.2f} | {decode} | {row['memory_gb']} | {fits} |")
    return "\n".join(lines + ["", *outside_the_loop(), ""])


def outside_the_loop() -> list[str]:
    """The page's table of what runs outside the loop: each model's text encoders (once per
    prompt) and VAE (its decoder once per video), with their sizes and the latents the VAE
    decodes at the model's standard shapes."""
    lines = ["## Outside the loop", "",
             "Not in `loop_s`: the text encoders, run once per prompt before the loop, and the VAE, "
             "whose decoder turns the final latent into frames after it (parameter counts: "
             "docs/sources.md). Latent: (channels, frames, height, width) at the model's standard "
             "shapes, from the VAE's compression (frames, height, width). The VAE decode is traced where "
             "its decoder is written (" + ", ".join(n for n, c in COMPANIONS.items() if c.decoder) +
             ": `decode_s` above).", "",
             "| model | role | network | parameters | bf16 (GB) | latent |",
             "|---|---|---|---|---|---|"]
    for name, companion in COMPANIONS.items():
        stride = " x ".join(map(str, companion.model.vae_stride))
        latents = "; ".join(f"{f} x {h} x {w} -> {' x '.join(map(str, companion.latent_shape(f, h, w)))}"
                            for f, h, w in companion.shapes)
        for part in (*companion.text_encoders, companion.vae):
            latent = f"compression {stride}: {latents}" if part.role == "VAE" else ""
            lines.append(f"| {name} | {part.role} | {part.name} | {part.parameters / 1e9:.3f} B | "
                         f"{part.bf16_bytes / GB:.2f} | {latent} |")
    return lines


def plot_strategies(rows: Sequence[Mapping[str, str]], path: Path, *, force: bool) -> Path:
    """The grid's loops (``GRID``: each model's first shape and system) against the devices, one
    line per strategy, log-log: which strategy scales, and where the memory does not fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hlo_trace.atomic import write_png

    order = [*STRATEGIES, "pipefusion"]  # one colour per strategy in every panel
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(GRID), figsize=(5 * len(GRID), 4.2))
    for ax, (config, frames, height, width, hw) in zip(axes, GRID, strict=True):
        mine = [r for r in rows if r["model"] == config.name and r["hw"] == hw
                and (r["frames"], r["height"], r["width"]) == (str(frames), str(height), str(width))]
        single = [r for r in mine if r["strategy"] == SINGLE]
        for strategy in [s for s in order if any(r["strategy"] == s for r in mine)]:
            line = sorted(single + [r for r in mine if r["strategy"] == strategy], key=lambda r: int(r["devices"]))
            devices = [int(r["devices"]) for r in line]
            color = colors[order.index(strategy) % len(colors)]
            ax.plot(devices, [float(r["loop_s"]) for r in line], "o-", color=color, label=strategy)
            over = [r for r in line if not row_fits(r)]
            ax.plot([int(r["devices"]) for r in over], [float(r["loop_s"]) for r in over], "x",
                    color=color, markersize=12)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel(f"devices ({hw})")
        ax.set_ylabel(f"{config.steps}-step loop (s)")
        ax.set_title(f"{config.name} {frames} x {height} x {width}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Predicted sampling loops under xDiT's strategies (x: over the chip's memory)", fontsize=11)
    fig.tight_layout()
    written = write_png(fig, path, force=force)
    plt.close(fig)
    return written


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


# -- the plan search of each model (plan-search --model) ---------------------------------------------------
#: The search of each model at one standard shape (the first of its rows above).
SEARCHES = (("hunyuan_video", "129x720x1280"), ("wan21_14b", "81x480x832"), ("cogvideox_5b", "49x480x720"),
            ("wan21_1.3b", "81x480x832"))
SEARCH_HW = "8xh100"
#: Each model's search on other systems (``--search-systems``): (system, devices; None: all of
#: them), each in the work directory of the model's 8xh100 search (its traces reused, re-costed):
#: a GPU of another generation, TX8 on as many chips, one node and two nodes of a cluster.
SYSTEMS = (("8xa100", None), ("tx8-16", 8), ("4x8xh100", 8), ("4x8xh100", 16))


def search_command(model: str, shape: str, hw: str, work: Path, json_out: Path | None = None,
                   devices: int | None = None) -> list[str]:
    command = [sys.executable, "-m", "planning.plan_search_cli", "--model", model, "--shape", shape, "--hw", hw,
               "--work-dir", str(work), "-o", str(work / "best_plan.toml"), "--force"]
    command += [] if devices is None else ["--devices", str(devices)]
    return command + ([] if json_out is None else ["--json", str(json_out)])


def search_page(model: str, shape: str, hw: str, report_text: str, wall_s: float,
                loads: tuple[str, str]) -> str:
    """``results/videodit/search_<model>.md``: the command, its wall time on this machine with the
    load average before and after (other work shares the machine), and the search's report."""
    command = f"plan-search --model {model} --shape {shape} --hw {hw} --json search_{model}.json"
    return "\n".join([
        f"# plan-search --model {model} at {shape} on {hw}", "",
        "The best layout of the transformer's sampling loop (docs/plan_search.md, \"Any model\"), "
        "run with an empty work directory (as `scripts/videodit.py --search` runs it):", "",
        "```text", command, "```", "",
        f"Wall time {wall_s:.0f} s on the 2-core development machine (load average before: {loads[0]}; "
        f"after: {loads[1]}: other work shared the machine and its trace lock; the report says how "
        "long the search waited for that lock). Every figure below is a prediction: the GPU constants "
        "are the microbenchmark ones, nothing is fitted on these models.", "",
        "```text", report_text.rstrip("\n"), "```", "",
        *LAYOUT_NOTES, ""])


#: What the search pages say of the layouts whose model is not plain (docs/videodit.md).
LAYOUT_NOTES = (
    "Ring and USP: each ring step of the zoo's ring attention (`layers.AttentionCore._ring`) is "
    "one fused flash-attention call (`layers.attend_block`: output and log-sum-exp), the steps "
    "merged element-wise by their log-sum-exp, as xDiT's ring attention runs it.", "",
    "PipeFusion (`pipefusion` P x 1, `pipefusion_ulysses` 2 stages of Ulysses n; M = P patches): "
    "traced as one tick of the pipeline (every stage's patch, the K/V buffers of the whole video); "
    "the loop is one warm-up step (the whole latent through the stages: the one-device or Ulysses-n "
    "layout's step, calibrated and traced beside it) and the other steps overlapped, of the heaviest "
    "stage's ticks (`planning.module_models.pipefusion_loop_s`, as `latency.csv`'s PipeFusion rows); "
    "the memory per device (`planning.module_models.pipefusion_memory`) holds the stage's weights and "
    "K/V buffers and the larger transient (inputs and peak of live activations) of a tick and of the "
    "warm-up step, where the stage runs its blocks on the whole latent.")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass(frozen=True)
class Searched:
    """One run of plan-search: its report (stdout), wall seconds, the load average before and
    after, and the last ``Error:`` line where it failed (exit other than 0 or 3)."""

    report: str
    wall_s: float
    loads: tuple[str, str]
    error: str | None = None


def _searched(command: list[str]) -> Searched:
    """Run one search, its progress passed on to stderr."""
    import tempfile
    import time

    before, started, last_error = _load(), time.perf_counter(), None
    with tempfile.TemporaryFile("w+") as report:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=report, stderr=subprocess.PIPE, text=True)
        assert process.stderr is not None
        for line in process.stderr:
            click.echo(line, err=True, nl=False)
            last_error = line.strip() if line.startswith("Error") else last_error
        code = process.wait()
        report.seek(0)
        text = report.read()
    wall = time.perf_counter() - started
    error = None if code in (0, 3) else (last_error or f"exit code {code}").removeprefix("Error: ")
    return Searched(text, wall, (before, _load()), error)


def run_search(model: str, shape: str, hw: str, work: Path, out: Path, *, force: bool) -> None:
    import shutil

    json_out, page_out = out / f"search_{model}.json", out / f"search_{model}.md"
    scratch = work / f"search_{model}"
    shutil.rmtree(scratch, ignore_errors=True)  # cold: the wall time of a first search
    scratch.mkdir(parents=True)
    done = _searched(search_command(model, shape, hw, scratch, json_out))
    if done.error:
        raise click.ClickException(f"plan-search --model {model}: {done.error}")
    atomic_write(page_out, search_page(model, shape, hw, done.report, done.wall_s, done.loads), force=force)
    click.echo(f"wrote {page_out} ({done.wall_s:.0f} s)", err=True)


def system_option(hw: str, devices: int | None) -> str:
    return f"--hw {hw}" + ("" if devices is None else f" --devices {devices}")


def run_systems(model: str, shape: str, work: Path, out: Path, *, force: bool) -> None:
    """``OUT/search_<model>_systems.md`` and ``.json``: the model's search on each of
    ``SYSTEMS`` in the work directory of its 8xh100 search (run that first: ``--search``); a
    search that fails says why on the page."""
    scratch = work / f"search_{model}"
    if not scratch.is_dir():
        raise click.ClickException(f"{scratch}: no {SEARCH_HW} search of {model} to reuse; run --search first")
    sections, documents = [], []
    for hw, devices in SYSTEMS:
        option = system_option(hw, devices)
        json_out = scratch / f"systems_{hw}_{devices or 'all'}.json"
        json_out.unlink(missing_ok=True)
        done = _searched(search_command(model, shape, hw, scratch, json_out, devices))
        document = json.loads(json_out.read_text()) if done.error is None else None
        documents.append({"hw": hw, "devices": devices, "wall_s": done.wall_s, "error": done.error,
                          "search": document})
        sections += [f"## {option}", "", "```text", f"plan-search --model {model} --shape {shape} {option}", "```",
                     "", f"Wall time {done.wall_s:.0f} s (warm work directory; load average before: "
                     f"{done.loads[0]}; after: {done.loads[1]})."
                     + (f" **The search failed**: {done.error}" if done.error else ""), ""]
        sections += [] if done.error else ["```text", done.report.rstrip("\n"), "```", ""]
        click.echo(f"searched {model} on {option} ({done.wall_s:.0f} s)", err=True)
    atomic_write(out / f"search_{model}_systems.json", json.dumps({"model": model, "shape": shape,
                                                                    "systems": documents}, indent=1) + "\n",
                 force=force)
    page_out = out / f"search_{model}_systems.md"
    atomic_write(page_out, systems_page(model, shape, documents, sections), force=force)
    click.echo(f"wrote {page_out}", err=True)


def systems_page(model: str, shape: str, documents: Sequence[Mapping[str, Any]], sections: Sequence[str]) -> str:
    """The page of a model's searches on ``SYSTEMS``: what was run, a table of the answers (the
    best traced layout, its loop and memory per device; why there is none), each search's report."""
    lines = [f"# plan-search --model {model} on other systems", "",
             "```text", f"python3 scripts/videodit.py --search-systems --only {model} --force   # after its --search", "```", "",
             f"{model} at {shape.replace('x', ' x ')} searched on "
             + ", ".join(system_option(hw, n).removeprefix("--hw ") for hw, n in SYSTEMS)
             + f", each after the {SEARCH_HW} search of search_{model}.md in the same work directory: its "
             "calibration and full-size traces of the 8-device layouts are reused (a trace does not depend on "
             "the system), only re-costed on the new system; the 16-device layouts are traced anew. "
             "Predictions: the GPU constants are the microbenchmark ones, the TX8 ones docs/tiled.md's; "
             "nothing fitted on this model. A layout that was refused, failed or does not fit the chip's "
             "memory says why in its search's report.", "",
             "| system | devices | best layout (traced) | loop (s) | memory per device (GB) | memory limit (GB) "
             "| estimate / traced, worst | wall time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for entry in documents:
        lines.append(systems_row(entry))
    return "\n".join([*lines, "", *LAYOUT_NOTES, "", *sections])


def systems_row(entry: Mapping[str, Any]) -> str:
    """One row of a systems page's table, from one search's ``--json`` document."""
    search = entry["search"]
    head = f"| {entry['hw']} | {entry['devices'] or (search or {}).get('devices', 'all')} | "
    tail = f" | {entry['wall_s']:.0f} |"
    if search is None:
        return head + f"failed: {entry['error']} | | | | " + tail
    limit, best, worst = search["memory_limit_bytes"] / GB, search["best"], search["worst_ratio"]
    ratio = "n/a" if worst is None else f"{worst:.4f}"
    if best is None:
        return head + f"none fits (see below) | | | {limit:.2f} | {ratio}" + tail
    return (head + f"{best['layout']} | {best['traced']['loop_s']:.1f} | {best['traced']['memory_bytes'] / GB:.2f} "
            f"| {limit:.2f} | {ratio}" + tail)


@click.command()
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK,
              show_default=True, help="Where the dumps and reports are kept and reused.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Where latency.csv and latency.md are written.")
@click.option("--only", type=click.Choice(sorted(MODELS)), default=None,
              help="One model's rows only (printed; the CSV is written only for all of them); with --search "
                   "or --search-systems, that model's searches only.")
@click.option("--render-only", is_flag=True, help="Render latency.md from the existing latency.csv.")
@click.option("--search", is_flag=True,
              help=f"Instead: plan-search --model for each model at one shape on {SEARCH_HW} (cold), "
                   "writing search_<model>.md and .json.")
@click.option("--search-systems", is_flag=True,
              help="After --search (or with it): each model's search on "
                   + ", ".join(system_option(hw, n) for hw, n in SYSTEMS)
                   + f" in its {SEARCH_HW} search's work directory, writing search_<model>_systems.md and .json.")
@click.option("--force", is_flag=True, help="Overwrite latency.csv and latency.md (and the search pages).")
def main(work: Path, out: Path, only: str | None, render_only: bool, search: bool, search_systems: bool,
         force: bool) -> None:
    """Predict the loops of the video DiTs and write the CSV and its page."""
    if search or search_systems:
        for model, shape in SEARCHES:
            if only is not None and only != model:
                continue
            if search:
                run_search(model, shape, SEARCH_HW, work, out, force=force)
            if search_systems:
                run_systems(model, shape, work, out, force=force)
        return
    table = out / "latency.csv"
    if not render_only:
        chosen = [c for c in cases() if only is None or c.config.name == only]
        predictions = []
        for case in chosen:
            prediction = predict(case, work)
            predictions.append(prediction)
            click.echo(f"{case.config.name} {case.frames}x{case.height}x{case.width} {case.hw} "
                       f"{case.layout.tag}: loop {prediction.loop_s:.1f} s, "
                       f"{prediction.memory_bytes / GB:.1f} GB per device"
                       + ("" if prediction.fits else " (does not fit)"), err=True)
        text = csv_text(predictions)
        if only is not None:
            click.echo(text, nl=False)
            return
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(table, text, force=force)
    rows = read_rows(table)
    atomic_write(out / "latency.md", page(rows), force=force or render_only)
    click.echo(f"wrote {out / 'latency.md'}", err=True)
    try:
        click.echo(f"wrote {plot_strategies(rows, out / 'strategies.png', force=force or render_only)}", err=True)
    except ImportError:
        click.echo("strategies.png not written: matplotlib is not installed (pip install -e '.[plot]')", err=True)


if __name__ == "__main__":
    sys.exit(run_click(main))
