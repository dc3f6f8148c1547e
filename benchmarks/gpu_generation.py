"""One whole OpenSora v1.2 generation as its gradio demo runs it, on one CUDA GPU: peak memory
(allocated, reserved, and what the device shows) and the time of each phase.

    python3 benchmarks/gpu_generation.py [--shapes 51_640_360,...] [--steps 2] [--out DIR]
    python3 benchmarks/gpu_generation.py --quick     # tiny models, GPU or CPU; writes nothing (CI)

A check of ``models/opensora/memory.py``'s count and of the published table's peak memory
(docs/gpu.md), never a fit. The demo (``gradio/app.py``, tag v1.2.0) keeps every model on the GPU
for the whole run, and each generation runs the loop, decodes, saves and ends with
``torch.cuda.empty_cache()``. The generation is ``models.opensora.generation``'s (its docstring
says what is held and run; random weights).

For each phase it records the peak allocated and reserved bytes since the generation began and
the device's used bytes (``cudaMemGetInfo``, the CUDA context included) at the phase's end; the
context is the used bytes beyond the reserved ones before any weight is loaded. With the
default allocator configuration it then records the same run on the ``meta`` device and replays
it through ``models.cuda_runtime``, and prints the replayed peak reserve over the measured one
(docs/gpu.md). It writes ``generation_<device>.md`` and ``.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hlo_trace.atomic import atomic_write  # noqa: E402

GIB = 2**30


@dataclass(frozen=True)
class PhaseMemory:
    """Memory at the end of one phase of a generation, in bytes."""

    phase: str
    seconds: float
    peak_allocated: int     # since the generation began (torch.cuda.max_memory_allocated)
    peak_reserved: int      # the caching allocator's peak reserved bytes since then
    device_used: int        # total - free on the device at the phase's end (context included)
    segments: int = 0       # the allocator's segments (cudaMalloc'd blocks) held at the phase's end
    #: the peak of bytes inside held segments that are free but split off a used block (fragmentation)
    inactive_split_peak: int = 0


@dataclass(frozen=True)
class Generation:
    shape: str
    steps: int
    context_bytes: int      # used on the device beyond the allocator's reserve before any weight
    weight_bytes: int       # allocated once the weights are loaded
    phases: tuple[PhaseMemory, ...]

    @property
    def peak_allocated(self) -> int:
        return max(p.peak_allocated for p in self.phases)

    @property
    def peak_reserved(self) -> int:
        return max(p.peak_reserved for p in self.phases)

    @property
    def peak_device(self) -> int:
        """What ``nvidia-smi`` shows at the peak: the context and the allocator's peak reserve."""
        return self.context_bytes + self.peak_reserved


def _device_used(torch) -> int:  # noqa: ANN001
    if not torch.cuda.is_available():
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def generate(torch, models, shape: str, steps: int, device: str, context: int) -> Generation:  # noqa: ANN001
    """One generation of ``shape`` (``models.opensora.generation.generate``); the models are loaded."""
    from models.opensora.generation import generate as run
    from models.opensora.official import flash_attention_2

    on_gpu = device == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    phases: list[PhaseMemory] = []
    start = time.perf_counter()

    def mark(phase: str) -> None:
        nonlocal start
        sync()
        seconds = time.perf_counter() - start
        stats = torch.cuda.memory_stats() if on_gpu else {}
        phases.append(PhaseMemory(phase, seconds,
                                  torch.cuda.max_memory_allocated() if on_gpu else 0,
                                  torch.cuda.max_memory_reserved() if on_gpu else 0, _device_used(torch),
                                  stats.get("segment.all.current", 0), stats.get("inactive_split_bytes.all.peak", 0)))
        start = time.perf_counter()

    weights = torch.cuda.memory_allocated() if on_gpu else 0
    with torch.inference_mode(), flash_attention_2(on_gpu):
        run(models, shape, steps, mark)
    return Generation(shape, steps, context, weights, tuple(phases))


def replayed_reserves(shapes: list[str], steps: int, config_name: str) -> dict[str, int]:
    """Each generation's peak reserve as ``models.cuda_runtime`` predicts it: the same run's
    allocation sequence recorded on the ``meta`` device (``tracing.allocations``) and replayed."""
    from scripts.gpu_predictions import device_memory
    from tracing.allocations import record_generations

    return {shape: peak.reserved for shape, peak in device_memory(record_generations(shapes, steps, config_name)).items()}


def render(generations: list[Generation], header: list[str], replayed: dict[str, int]) -> str:
    from models.opensora.memory import generation_peak

    lines = [*header, "",
             "| shape | steps | loop (s) | decode (s) | weights (GiB) | peak allocated (GiB) | phase | "
             "peak reserved (GiB) | context (GiB) | device peak (GiB) | counted (GiB) | replayed reserve / peak reserved |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for g in generations:
        by_phase = {p.phase: p for p in g.phases}
        top = max(g.phases, key=lambda p: p.peak_allocated)
        # the spatial call's traced peak is not known here: the count's STDiT3 phase alone
        counted = generation_peak(g.shape, 0)
        ratio = f"{replayed[g.shape] / g.peak_reserved:.3f}" if g.shape in replayed and g.peak_reserved else "-"
        lines.append(f"| {g.shape} | {g.steps} | {by_phase['loop'].seconds:.2f} | {by_phase['decode'].seconds:.2f} | "
                     f"{g.weight_bytes / GIB:.2f} | {g.peak_allocated / GIB:.2f} | {top.phase} | "
                     f"{g.peak_reserved / GIB:.2f} | {g.context_bytes / GIB:.2f} | {g.peak_device / GIB:.2f} | "
                     f"{counted.weight_bytes / GIB + counted.stdit_activation_bytes / GIB:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="51_640_360,51_854_480,51_1280_720",
                        help="FRAMES_WIDTH_HEIGHT,... (a generation each, in this order)")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per generation (memory: 2 suffice)")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite existing tables")
    parser.add_argument("--quick", action="store_true", help="tiny models at 51_64_64, GPU or CPU; writes nothing")
    args = parser.parse_args(argv)
    if args.steps < 1:
        print("Error: --steps: expected at least 1", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("gpu_generation: torch is not installed; nothing to measure.")
        return 0
    on_gpu = torch.cuda.is_available()
    if not args.quick and not on_gpu:
        print("gpu_generation: no CUDA device on this machine; nothing to measure.")
        return 0
    device = "cuda" if on_gpu else "cpu"
    context = 0
    if on_gpu:
        torch.empty(1, device=device)
        context = _device_used(torch) - torch.cuda.memory_reserved()
    from models.opensora.generation import DemoModels

    models = DemoModels("tiny" if args.quick else "full", device, torch.bfloat16 if on_gpu else torch.float32)
    shapes = ["51_64_64"] if args.quick else args.shapes.split(",")
    name = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    out, label = Path(args.out), name.replace(" ", "_")
    generations, refused = [], []
    for shape in shapes:
        try:
            generation = generate(torch, models, shape, args.steps, device, context)
        except torch.cuda.OutOfMemoryError:
            refused.append(shape)
            print(f"gpu_generation: {shape}: out of device memory", file=sys.stderr, flush=True)
            continue
        generations.append(generation)
        print(f"gpu_generation: {shape}: peak allocated {generation.peak_allocated / GIB:.2f} GiB, reserved "
              f"{generation.peak_reserved / GIB:.2f} GiB, device {generation.peak_device / GIB:.2f} GiB",
              file=sys.stderr, flush=True)
        if not args.quick:  # after each generation: a run cut short keeps what it measured
            out.mkdir(parents=True, exist_ok=True)
            atomic_write(out / f"generation_{label}.json", json.dumps(
                {"generations": [asdict(g) for g in generations], "out_of_memory": refused}, indent=1) + "\n",
                force=True)
    header = [f"# One OpenSora v1.2 generation as the gradio demo runs it, on one {name} (random weights)", "",
              f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
              f"- PYTORCH_CUDA_ALLOC_CONF: {os.environ.get('PYTORCH_CUDA_ALLOC_CONF') or '(unset: the default)'}",
              "- weights: T5 XXL encoder float32 (held), STDiT3 and the VAE bf16; loop of --steps CFG forwards; "
              "decode; save's normalisation and copy to the host",
              "- device peak = CUDA context + the allocator's peak reserve (what nvidia-smi shows); counted = "
              "models/opensora/memory.py's weights + STDiT3 step"]
    if refused:
        header.append(f"- out of device memory: {', '.join(refused)}")
    replayed = {}
    if (on_gpu or args.quick) and not os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):  # the model: the default configuration
        print("gpu_generation: recording the same run on the meta device to replay its allocations",
              file=sys.stderr, flush=True)
        replayed = replayed_reserves([g.shape for g in generations], args.steps, "tiny" if args.quick else "full")
    text = render(generations, header, replayed)
    print(text)
    if not args.quick:
        atomic_write(out / f"generation_{label}.md", text, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
