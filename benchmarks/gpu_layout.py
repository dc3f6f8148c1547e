"""The residual stream's layout in eager PyTorch: the whole model's blocks on the x its patch
embedding leaves (channel-major) against a contiguous copy of it, on a CUDA GPU.

    python3 benchmarks/gpu_layout.py [--shapes 204_640_360,...] [--out results/gpu_validation]

OpenSora's patch embedding returns ``x.flatten(2).transpose(1, 2)``, a channel-major view, and
``x = x + ...`` keeps that layout through every block, so each LayerNorm of x and the
cross-attention's q linear copy it first and each residual add reads it across its rows
(docs/gpu.md, "PyTorch's strides"). For each shape this builds the full STDiT3 (bf16, the official
path, the library kernels of ``models.opensora.official``, FlashAttention-2), embeds one
step's inputs, and times all pairs on that x and on ``x.contiguous()`` (median of 3 after a
warm-up); then it profiles pair 0 on the channel-major x and lists the ATen ops with the most GPU
time, whose copies and strided adds give ``transpose_copy`` and ``strided`` in
``hardware/data/h100-sxm.toml``. It prints and writes ``layout_<device>.md``.

Without CUDA it says so in one line and exits 0.

    python3 benchmarks/gpu_layout.py --quick   # what CI runs: the tiny config on the CPU, no profile
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hlo_trace.atomic import atomic_write  # noqa: E402

#: Timed runs of all pairs (their median is reported), after one warm-up.
RUNS = 3
#: ATen ops listed from the profile of pair 0.
TOP_OPS = 12


def _median_seconds(run: Callable[[], object], synchronize: Callable[[], None], runs: int) -> float:
    seconds = []
    for index in range(runs + 1):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        if index:  # the first is a warm-up
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure(torch, shape: str, config_name: str, device: str, runs: int = RUNS, profile: bool = True) -> list[str]:  # noqa: ANN001
    """Markdown lines for one shape: both timings, and the profile of pair 0 when asked."""
    from models.opensora.config import get_config
    from models.opensora.inputs import make_inputs
    from models.opensora.official import flash_attention_2, official_kernels
    from models.opensora.stdit3 import STDiT3

    config = get_config(config_name)
    on_gpu = device == "cuda"
    model = STDiT3(config).to(device, torch.bfloat16).eval()
    official_kernels(model, config)
    inputs = make_inputs(config, shape, dtype=torch.bfloat16, device=device)
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    lines = []
    with torch.no_grad(), flash_attention_2(on_gpu):
        state = model.embed(inputs["z"], inputs["y"], inputs["t"], inputs["fps"], official=True)
        contiguous = dataclasses.replace(state, x=state.x.contiguous())
        last = config.depth - 1
        strided_s = _median_seconds(lambda: model.run_blocks(state, 0, last), synchronize, runs)
        contiguous_s = _median_seconds(lambda: model.run_blocks(contiguous, 0, last), synchronize, runs)
        lines.append(f"| {shape} | {tuple(state.x.stride())} | {strided_s * 1e3:.1f} | {contiguous_s * 1e3:.1f} | "
                     f"{strided_s / contiguous_s - 1:+.1%} |")
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
                model.run_blocks(state, 0, 0)
                synchronize()
            events = sorted((e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")),
                            key=lambda e: -e.self_device_time_total)[:TOP_OPS]
            lines += ["", f"Pair 0 of {shape} on the channel-major x, the ATen ops with the most GPU time:", "",
                      "| op | input shapes | calls | GPU ms each |", "|---|---|---:|---:|"]
            lines += [f"| {e.key} | {e.input_shapes} | {e.count} | {e.self_device_time_total / e.count / 1e3:.3f} |"
                      for e in events]
            lines.append("")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from models.opensora.inputs import REFERENCE_SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(REFERENCE_SHAPES))
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite an existing table")
    parser.add_argument("--quick", action="store_true", help="the tiny config on the CPU, one run, no profile (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_layout: torch is not installed; nothing to measure.")
        return 0
    header = ["| shape | x strides | all pairs on that x (ms) | on a contiguous copy (ms) | layout's cost |",
              "|---|---|---:|---:|---:|"]
    if args.quick:
        from plans.config import default_shape

        print("\n".join(["# gpu_layout --quick: the tiny config on the CPU (no measurement)", "", *header,
                         *measure(torch, default_shape("tiny"), "tiny", "cpu", runs=1, profile=False)]))
        return 0
    if not torch.cuda.is_available():
        print("gpu_layout: no CUDA device on this machine; nothing to measure.")
        return 0
    name = torch.cuda.get_device_name(0)
    lines = [f"# The residual stream's layout: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}", "",
             *header]
    profiles = []
    for shape in args.shapes.split(","):
        rows = measure(torch, shape, "full", "cuda", profile=shape == args.shapes.split(",")[0])
        lines.append(rows[0])
        profiles += rows[1:]
        torch.cuda.empty_cache()
    text = "\n".join([*lines, *profiles]) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"layout_{name.replace(' ', '_')}.md", text, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
