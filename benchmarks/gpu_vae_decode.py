"""The VAE decode of an OpenSora v1.2 generation, timed on a CUDA GPU, call by call and kernel by kernel.

    python3 benchmarks/gpu_vae_decode.py [--shapes 204_640_360,...] [--out results/gpu_validation]
    python3 benchmarks/gpu_vae_decode.py --quick   # what CI runs: the tiny decoders, CPU or GPU

OpenSora v1.2's published generation times (README, "Gradio Demo") cover a whole generation: the
sampling loop, then the VAE decode of the latent video: the temporal decoder on chunks of 5
latent frames, then the SDXL VAE's decoder 4 frames a call (``models.opensora.vae_config``).
This script runs the project's own decoders (``models.opensora.vae``, the modules the tracer
traces: ``trace-vae-decode``) eagerly in bf16 with random weights (the time does not depend on
them), and for each shape prints

* the median time of one temporal call and one spatial call, and the decode of one sample
  (chunks x temporal + frames / 4 x spatial) -- the baseline: diffusers' ``AutoencoderKL``
  decoder with the same config on the same card, where diffusers is installed (the project's
  spatial decoder computes the same function: tests/test_vae.py);
* one profiled call of each decoder: its CUDA kernels by class (convolution, the layout
  transposes cuDNN adds around it, GroupNorm, SiLU, element-wise, upsampling, attention), with
  each class's time, to set the chip file's in-model efficiencies (hardware/data/h100-sxm.toml).

Writes ``vae_decode_<device>.md``, ``vae_kernels_<shape>_<device>.csv`` (CUDA kernels) and
``vae_ops_<shape>_<device>.csv`` (ATen ops with their input shapes) into --out. Without
CUDA it says so in one line and exits 0 (``--quick`` runs on the CPU).
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hlo_trace.atomic import atomic_write  # noqa: E402

#: Timed calls per measurement (their median is reported), after one warm-up call.
RUNS = 5
#: CUDA kernel name fragments -> class (first match wins; lower case).
KERNEL_CLASSES = (
    ("nchwtonhwc", "layout_transpose"), ("nhwctonchw", "layout_transpose"),
    ("group_norm", "group_norm"), ("groupnorm", "group_norm"), ("rowwisemoments", "group_norm"),
    ("computefusedparams", "group_norm"),
    ("upsample", "upsample"), ("silu", "silu"),
    ("conv", "convolution"), ("xmma", "convolution"), ("implicit", "convolution"),
    ("cutlass", "gemm"), ("gemm", "gemm"), ("sm90", "gemm"), ("flash", "attention"),
    ("fmha", "attention"), ("softmax", "softmax"), ("constant_pad", "pad"), ("pad", "pad"),
    ("copy", "copy"), ("cat", "copy"),
)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    return next((cls for fragment, cls in KERNEL_CLASSES if fragment in lowered), "elementwise")


def median_seconds(torch, call: Callable[[], object], device: str, runs: int = RUNS) -> float:  # noqa: ANN001
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        call()
        synchronize()
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            call()
            synchronize()
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def profile_call(torch, call: Callable[[], object]):  # noqa: ANN001
    """One profiled call: its CUDA kernels as (name, launches, seconds), and its ATen ops as
    (name, input shapes, calls, CUDA seconds of the kernels they launched)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                  record_shapes=True) as prof:
        call()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total * 1e-6
    ops = [(entry.key, str(entry.input_shapes), entry.count, entry.self_device_time_total * 1e-6)
           for entry in prof.key_averages(group_by_input_shape=True)
           if entry.self_device_time_total > 0]
    return [(name, int(count), seconds) for name, (count, seconds) in kernels.items()], ops


def diffusers_decoder(torch, config, device: str, dtype):  # noqa: ANN001
    """diffusers' AutoencoderKL with the SDXL VAE's decoder config, or None without diffusers."""
    try:
        from diffusers import AutoencoderKL
    except ImportError:
        return None
    count = len(config.spatial_block_channels)
    vae = AutoencoderKL(in_channels=config.image_channels, out_channels=config.image_channels,
                        latent_channels=config.latent_channels,
                        layers_per_block=config.spatial_layers_per_block,
                        norm_num_groups=config.spatial_groups,
                        block_out_channels=config.spatial_block_channels,
                        down_block_types=("DownEncoderBlock2D",) * count,
                        up_block_types=("UpDecoderBlock2D",) * count)
    return vae.to(device, dtype).eval()


def main(argv: Sequence[str] | None = None) -> int:
    from models.opensora.inputs import REFERENCE_SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(REFERENCE_SHAPES),
                        help="FRAMES_WIDTH_HEIGHT,... (default: the four reference shapes)")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite existing tables")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny decoders at 51_64_64, GPU or CPU; writes nothing (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_vae_decode: torch is not installed; nothing to measure.")
        return 0
    from models.opensora.vae import SpatialDecoder, TemporalDecoder
    from models.opensora.vae_config import FULL_VAE, TINY_VAE, decode_plan

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.quick and device != "cuda":
        print("gpu_vae_decode: no CUDA device on this machine; nothing to measure.")
        return 0
    config = TINY_VAE if args.quick else FULL_VAE
    shapes = ["51_64_64"] if args.quick else args.shapes.split(",")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    temporal = TemporalDecoder(config).to(device, dtype).eval()
    spatial = SpatialDecoder(config).to(device, dtype).eval()
    reference = None if args.quick else diffusers_decoder(torch, config, device, dtype)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    lines = [f"# VAE decode of one sample (OpenSora v1.2: temporal decoder, then SDXL VAE decoder), {dtype}", "",
             f"- device: {name}", f"- torch: {torch.__version__}, CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()}",
             f"- each call: median of {RUNS} after one warm-up; decode = chunks x temporal + frames / 4 x spatial",
             "", "| shape | chunks | frames | temporal call (ms) | spatial call (ms) | diffusers spatial call (ms) "
             "| decode (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    kernel_rows: dict[str, list[tuple[str, str, int, float]]] = {}
    op_rows: dict[str, list[tuple[str, str, str, int, float]]] = {}
    for shape in shapes:
        plan = decode_plan(shape, config)
        z = torch.randn(1, config.latent_channels, config.micro_z_frames, plan.latent_height,
                        plan.latent_width, device=device, dtype=dtype)
        frames = torch.randn(config.micro_batch, config.latent_channels, plan.latent_height,
                             plan.latent_width, device=device, dtype=dtype)
        t_call = median_seconds(torch, lambda: temporal(z), device)
        s_call = median_seconds(torch, lambda: spatial(frames), device)
        d_call = (median_seconds(torch, lambda: reference.decode(frames / config.scaling_factor), device)
                  if reference is not None else float("nan"))
        decode = plan.chunks * t_call + plan.spatial_call_equivalents * s_call
        print(f"gpu_vae_decode: {shape}: temporal {t_call * 1e3:.2f} ms, spatial {s_call * 1e3:.2f} ms "
              f"(diffusers {d_call * 1e3:.2f} ms), decode {decode:.3f} s", file=sys.stderr, flush=True)
        lines.append(f"| {shape} | {plan.chunks} | {plan.frames} | {t_call * 1e3:.2f} | {s_call * 1e3:.2f} | "
                     f"{d_call * 1e3:.2f} | {decode:.3f} |")
        if device == "cuda":
            kernel_rows[shape], op_rows[shape] = [], []
            for part, module, inputs in (("temporal", temporal, z), ("spatial", spatial, frames)):
                kernels, ops = profile_call(torch, lambda m=module, x=inputs: m(x))
                kernel_rows[shape] += [(part, *row) for row in kernels]
                op_rows[shape] += [(part, *row) for row in ops]
    for shape, rows in kernel_rows.items():
        lines += ["", f"## Kernels of one call by class, {shape}", "",
                  "| part | class | kernels | time (ms) |", "|---|---|---:|---:|"]
        totals: dict[tuple[str, str], list[float]] = {}
        for part, kernel, count, seconds in rows:
            entry = totals.setdefault((part, kernel_class(kernel)), [0, 0.0])
            entry[0] += count
            entry[1] += seconds
        for (part, cls), (count, seconds) in sorted(totals.items(), key=lambda item: (item[0][0], -item[1][1])):
            lines.append(f"| {part} | {cls} | {int(count)} | {seconds * 1e3:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.quick:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = name.replace(" ", "_")
    atomic_write(out / f"vae_decode_{label}.md", text, force=args.force)
    for shape, rows in kernel_rows.items():
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["part", "class", "kernel", "launches", "seconds"])
        for part, kernel, count, seconds in sorted(rows, key=lambda row: (row[0], -row[3])):
            writer.writerow([part, kernel_class(kernel), kernel, count, f"{seconds:.9f}"])
        atomic_write(out / f"vae_kernels_{shape}_{label}.csv", buffer.getvalue(), force=args.force)
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["part", "op", "input_shapes", "calls", "cuda_seconds"])
        for part, op, shapes_text, count, seconds in sorted(op_rows[shape], key=lambda row: (row[0], -row[4])):
            writer.writerow([part, op, shapes_text, count, f"{seconds:.9f}"])
        atomic_write(out / f"vae_ops_{shape}_{label}.csv", buffer.getvalue(), force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
