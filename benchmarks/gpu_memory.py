"""Peak GPU memory of OpenSora v1.2's phases, measured, beside models/opensora/memory.py's count.

    python3 benchmarks/gpu_memory.py [--shapes 51_1280_720,408_1280_720] [--out results/gpu_validation]
    python3 benchmarks/gpu_memory.py --quick     # CI: says whether CUDA exists; measures nothing

A check of the memory model (docs/gpu.md, "OpenSora's published table"), never a fit. On one CUDA
GPU, bf16, random weights, for each shape:

* **STDiT3 step**: the whole model built as the official code runs it (``models.opensora.official``'s
  library kernels: FlashAttention-2, LayerNorm, linear layers), one forward of the CFG batch of 2
  under ``torch.inference_mode``; the peak allocated above what the weights and inputs hold
  (``torch.cuda.max_memory_allocated``) and the peak the caching allocator reserved;
* **VAE decode calls**: one temporal call (5 latent frames) and one spatial call (4 frames) of the
  project's decoders (``models/opensora/vae.py``), each's peak above its input.

It prints a table of measured and counted bytes (the count: ``stdit_step_activation_bytes``) and
writes it to ``--out`` as ``memory_<device>.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hlo_trace.atomic import atomic_write  # noqa: E402

GIB = 2**30
DEFAULT_SHAPES = "51_1280_720,204_640_360,408_1280_720"


def _peak_above(torch, call) -> tuple[int, int]:  # noqa: ANN001
    """``(peak allocated above the memory allocated before the call, peak reserved)`` of ``call``."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.inference_mode():
        result = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    reserved = torch.cuda.max_memory_reserved()
    del result
    return peak, reserved


def measure_stdit(torch, shape: str) -> dict[str, float]:  # noqa: ANN001
    from models.opensora.config import get_config
    from models.opensora.inputs import make_inputs
    from models.opensora.memory import stdit_step_activation_bytes
    from models.opensora.official import flash_attention_2, official_kernels
    from models.opensora.stdit3 import STDiT3

    config = get_config("full")
    model = STDiT3(config).to("cuda", torch.bfloat16).eval()
    official_kernels(model, config)
    inputs = make_inputs(config, shape, dtype=torch.bfloat16, device="cuda")
    weights = torch.cuda.memory_allocated()
    with flash_attention_2(True):
        peak, reserved = _peak_above(torch, lambda: model(**inputs, official=True))
    return {"weights_and_inputs": weights, "peak": peak, "reserved": reserved,
            "counted": stdit_step_activation_bytes(shape)}


def measure_vae(torch, shape: str) -> dict[str, float]:  # noqa: ANN001
    from models.opensora.vae import SpatialDecoder, TemporalDecoder
    from models.opensora.vae_config import FULL_VAE, decode_plan

    plan = decode_plan(shape, FULL_VAE)
    temporal = TemporalDecoder(FULL_VAE).to("cuda", torch.bfloat16).eval()
    spatial = SpatialDecoder(FULL_VAE).to("cuda", torch.bfloat16).eval()
    z = torch.randn(1, FULL_VAE.latent_channels, FULL_VAE.micro_z_frames, plan.latent_height, plan.latent_width,
                    device="cuda", dtype=torch.bfloat16)
    frames = torch.randn(FULL_VAE.micro_batch, FULL_VAE.latent_channels, plan.latent_height, plan.latent_width,
                         device="cuda", dtype=torch.bfloat16)
    t_peak, t_reserved = _peak_above(torch, lambda: temporal(z))
    s_peak, s_reserved = _peak_above(torch, lambda: spatial(frames))
    return {"temporal_peak": t_peak, "spatial_peak": s_peak, "reserved": max(t_reserved, s_reserved)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="FRAMES_WIDTH_HEIGHT,...")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite an existing table")
    parser.add_argument("--quick", action="store_true", help="CI: check the script loads; measures nothing")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_memory: torch is not installed; nothing to measure.")
        return 0
    if args.quick or not torch.cuda.is_available():
        print("gpu_memory: no CUDA device on this machine; nothing to measure." if not torch.cuda.is_available()
              else "gpu_memory --quick: CUDA present; nothing measured")
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    name = torch.cuda.get_device_name(0)
    lines = [f"# Peak memory of OpenSora v1.2's phases on one {name} (bf16, random weights)", "",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
             "- STDiT3: one forward of the CFG batch of 2, the official library kernels; peak allocated above "
             "the weights and inputs, and the allocator's peak reserved (weights included)",
             "- VAE: one temporal call (5 latent frames) and one spatial call (4 frames), peak above the input", "",
             "| shape | STDiT3 weights + inputs (GiB) | step peak measured (GiB) | counted (GiB) | counted / measured "
             "| reserved (GiB) | VAE temporal call (GiB) | VAE spatial call (GiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in args.shapes.split(","):
        s = measure_stdit(torch, shape)
        torch.cuda.empty_cache()  # the model is gone with measure_stdit's frame
        v = measure_vae(torch, shape)
        torch.cuda.empty_cache()
        row = (f"| {shape} | {s['weights_and_inputs'] / GIB:.2f} | {s['peak'] / GIB:.2f} | {s['counted'] / GIB:.2f} | "
               f"{s['counted'] / s['peak']:.2f} | {s['reserved'] / GIB:.2f} | {v['temporal_peak'] / GIB:.2f} | "
               f"{v['spatial_peak'] / GIB:.2f} |")
        print(row, flush=True)
        lines.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"memory_{name.replace(' ', '_')}.md", "\n".join(lines) + "\n", force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
