"""The spatial VAE decode of an OpenSora v1.2 generation, timed on a CUDA GPU.

    python3 benchmarks/gpu_vae_decode.py [--shapes 204_640_360,...] [--out results/gpu_validation]

OpenSora v1.2's published generation times (README, "Gradio Demo") cover a whole generation: the
sampling loop the tool predicts, then the VAE decode of the latent video. Its VAE
(``OpenSoraVAE_V1_2``) decodes the latent temporally, then every frame spatially with the SDXL VAE
decoder (diffusers ``AutoencoderKL``), ``micro_batch_size = 4`` frames a call, in bf16. This script
times that spatial decode (random weights: the time does not depend on them) for each reference
shape at batch 1, so the loop's share of the published figure can be read off (docs/gpu.md). The
temporal VAE (a small 3-D convolution stack on the 4-channel latent) is not timed here.

Without CUDA or without diffusers it says so in one line and exits 0.

    python3 benchmarks/gpu_vae_decode.py --quick   # what CI runs: a 2-frame decode of a tiny decoder
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hlo_trace.atomic import atomic_write  # noqa: E402

#: OpenSora v1.2's spatial VAE: the SDXL VAE (``hpcai-tech/OpenSora-VAE-v1.2`` wraps
#: ``PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers``' ``vae``), whose decoder config this is.
SDXL_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
                block_out_channels=(128, 256, 512, 512),
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
#: Frames a spatial decode call takes (``micro_batch_size`` of the v1.2 inference config).
MICRO_BATCH = 4
#: The spatial VAE's downsampling factor.
SPATIAL_FACTOR = 8
#: Timed decodes per shape (their median is reported).
RUNS = 3


def decode_seconds(torch, vae, frames: int, height: int, width: int, device: str, runs: int = RUNS) -> float:  # noqa: ANN001
    """Median seconds to decode ``frames`` latent frames of ``height x width`` pixels, MICRO_BATCH at a time."""
    latent = torch.randn(frames, SDXL_VAE["latent_channels"], height // SPATIAL_FACTOR, width // SPATIAL_FACTOR,
                         device=device, dtype=next(vae.parameters()).dtype)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def decode() -> None:
        for start in range(0, frames, MICRO_BATCH):
            vae.decode(latent[start:start + MICRO_BATCH])

    with torch.no_grad():
        decode()  # warm-up: cuDNN picks its algorithms
        synchronize()
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            decode()
            synchronize()
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main(argv: Sequence[str] | None = None) -> int:
    from models.opensora.inputs import REFERENCE_SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(REFERENCE_SHAPES),
                        help="FRAMES_WIDTH_HEIGHT,... (default: the four reference shapes)")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite an existing table")
    parser.add_argument("--quick", action="store_true", help="a tiny decoder, 2 frames, GPU or CPU; writes nothing (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
        from diffusers import AutoencoderKL
    except ImportError as error:
        print(f"gpu_vae_decode: {error.name} is not installed; nothing to measure.")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        tiny = dict(SDXL_VAE, block_out_channels=(32, 32, 32, 32), norm_num_groups=8)
        vae = AutoencoderKL(**tiny).to(device).eval()
        seconds = decode_seconds(torch, vae, 2, 64, 64, device, runs=1)
        print(f"gpu_vae_decode --quick: tiny decoder, 2 frames of 64x64 on {device}: {seconds * 1e3:.1f} ms")
        return 0
    if device != "cuda":
        print("gpu_vae_decode: no CUDA device on this machine; nothing to measure.")
        return 0
    vae = AutoencoderKL(**SDXL_VAE).to(device, torch.bfloat16).eval()
    lines = ["# Spatial VAE decode of one generation (SDXL VAE decoder, bf16, batch 1, 4 frames a call)", "",
             f"- device: {torch.cuda.get_device_name(0)}", f"- torch: {torch.__version__}, CUDA {torch.version.cuda}",
             f"- median of {RUNS} decodes after one warm-up", "",
             "| shape | frames | decode (s) |", "|---|---:|---:|"]
    for shape in args.shapes.split(","):
        frames, width, height = (int(part) for part in shape.split("_"))
        seconds = decode_seconds(torch, vae, frames, height, width, device)
        print(f"gpu_vae_decode: {shape}: {seconds:.2f} s", file=sys.stderr, flush=True)
        lines.append(f"| {shape} | {frames} | {seconds:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"vae_decode_{torch.cuda.get_device_name(0).replace(' ', '_')}.md", text, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
