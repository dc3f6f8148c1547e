"""Each kernel class of ``analyze-hlo --exec torch``, timed alone on a CUDA GPU at STDiT3's sizes.

    python3 benchmarks/gpu_kernels.py [--hw h100-sxm] [--shape 204_640_360] [--out results/gpu_validation]

One eager PyTorch call per case, on the tensors one block of the full OpenSora v1.2 config
handles at ``--shape`` (bf16, the CFG batch of 2): GEMMs of the linear layers and of the
temporal attention's plain product, the fused attentions, LayerNorm, tanh-GELU, the float32
softmax, the copy of a temporal rearrange and the element-wise kernels (same-shape, broadcast,
casts, float32 arithmetic, selections, row means). For each it prints the median time of
``RUNS`` launches (CUDA events), the bytes it must move (each input read once, the output written
once, each tensor in its own type) and its FLOPs, and the fraction of the chip description's
datasheet bandwidth or peak that achieves: the measured efficiencies a hardware file's
``[kernel_model]`` cites (docs/sources.md). Every input is larger than the L2 cache, except where
a case says otherwise, so repeated launches do not run from cache.

Without CUDA it says so in one line and exits 0.

    python3 benchmarks/gpu_kernels.py --quick   # what CI runs: every case on tiny tensors, CPU or GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hardware import load_chip  # noqa: E402
from hlo_trace.atomic import atomic_write  # noqa: E402

#: Timed launches per case (their median is reported), after WARMUP untimed ones.
RUNS, WARMUP = 20, 3


@dataclass(frozen=True)
class Case:
    """One kernel: its class (as ``analyze-hlo --exec torch`` names it), what it is, the bytes it
    must move and the FLOPs it must do, and the call that launches it."""

    kind: str
    name: str
    bytes: int
    flops: int
    call: Callable[[], object]


@dataclass(frozen=True)
class Timing:
    kind: str
    name: str
    seconds: float
    bytes: int
    flops: int

    def bandwidth_fraction(self, bandwidth: float) -> float:
        return self.bytes / self.seconds / bandwidth

    def peak_fraction(self, peak: float) -> float:
        return self.flops / self.seconds / peak


def cases(torch, shape: str, config_name: str, device: str) -> list[Case]:  # noqa: ANN001, PLR0915 - a flat list of cases reads best
    """The kernels of one STDiT3 block pair at ``shape``, each on fresh tensors of its sizes."""
    import torch.nn.functional as F

    from models.opensora.config import get_config
    from models.opensora.inputs import geometry

    config = get_config(config_name)
    geo = geometry(config, shape)
    bf16, f32 = torch.bfloat16, torch.float32
    b, t, s, h = 2, geo.T, geo.S, config.hidden_size
    heads = config.num_heads
    hd = h // heads
    n = b * t * s
    mlp = int(h * config.mlp_ratio)
    keys = config.model_max_length

    def rand(*dims: int, dtype=bf16):  # noqa: ANN001, ANN202
        return torch.randn(*dims, device=device, dtype=dtype)

    out: list[Case] = []

    def gemm(name: str, m: int, k: int, nn: int, bias: bool = True) -> None:
        x, w = rand(m, k), rand(nn, k)
        bias_t = rand(nn) if bias else None
        out.append(Case("gemm", f"{name} {m}x{k}x{nn}", 2 * (m * k + k * nn + m * nn), 2 * m * k * nn,
                        lambda: F.linear(x, w, bias_t)))

    gemm("qkv", n, h, 3 * h)
    gemm("proj", n, h, h)
    gemm("fc1", n, h, mlp)
    gemm("fc2", n, mlp, h)
    gemm("cross kv (caption)", b * keys, h, 2 * h)
    # the temporal attention's plain product: B*S*heads instances of (T x hd) @ (hd x T)
    q, k = rand(b * s * heads, t, hd), rand(b * s * heads, hd, t)
    out.append(Case("gemm", f"temporal q@k^T bmm {b * s * heads}x({t}x{hd}x{t})", 2 * (q.numel() + k.numel() + b * s * heads * t * t),
                    2 * b * s * heads * t * t * hd, lambda: torch.bmm(q, k)))
    # attentions: the spatial self-attention, the caption cross-attention per sample, each in
    # FlashAttention-2 (the kernels of the flash-attn package the official code calls) and, on a
    # GPU, in the backends SDPA may pick itself (for comparison only)
    qs, ks, vs = (rand(b * t, heads, s, hd) for _ in range(3))
    qc, kc, vc = rand(b, heads, t * s, hd), rand(b, heads, keys, hd), rand(b, heads, keys, hd)
    for backend in sdpa_backends(torch, device):
        label = "flash_attention" if backend in ("FLASH_ATTENTION", None) else f"flash_attention ({backend})"
        out.append(Case(label, f"spatial self-attention {b * t}x{heads}x{s}x{hd}", 2 * 4 * qs.numel(),
                        4 * b * t * heads * s * s * hd, _in_backend(torch, backend, F.scaled_dot_product_attention, qs, ks, vs)))
        out.append(Case(label, f"cross-attention {b}x{heads}x{t * s}x{keys}x{hd}", 2 * (2 * qc.numel() + 2 * kc.numel()),
                        4 * b * heads * t * s * keys * hd, _in_backend(torch, backend, F.scaled_dot_product_attention, qc, kc, vc)))
    x = rand(b, t * s, h)
    out.append(Case("layer_norm", f"layer_norm {n}x{h} bf16", 2 * 2 * n * h, 0, lambda: F.layer_norm(x, (h,), eps=1e-6)))
    x_mlp = rand(n, mlp)
    out.append(Case("gelu", f"tanh-gelu {n}x{mlp} bf16", 2 * 2 * n * mlp, 0, lambda: F.gelu(x_mlp, approximate="tanh")))
    scores = rand(b * s * heads, t, t, dtype=f32)
    out.append(Case("softmax", f"softmax {b * s * heads}x{t}x{t} f32", 2 * 4 * scores.numel(), 0,
                    lambda: scores.softmax(-1)))
    x4 = rand(b, t, s, h)
    out.append(Case("copy", f"temporal rearrange copy {b}x{t}x{s}x{h} bf16", 2 * 2 * x4.numel(), 0,
                    lambda: x4.permute(0, 2, 1, 3).contiguous()))
    y = rand(b, t * s, h)
    vec = rand(b, 1, h)
    out.append(Case("elementwise", f"add {n}x{h} bf16", 3 * 2 * n * h, 0, lambda: x + y))
    out.append(Case("elementwise", f"mul by (B,1,h) {n}x{h} bf16", 2 * 2 * n * h, 0, lambda: x * vec))
    out.append(Case("elementwise", f"cast bf16->f32 {n}x{h}", 6 * n * h, 0, lambda: x.float()))
    x32 = rand(b, t * s, h, dtype=f32)
    out.append(Case("elementwise", f"cast f32->bf16 {n}x{h}", 6 * n * h, 0, lambda: x32.to(bf16)))
    y32 = rand(b, t * s, h, dtype=f32)
    out.append(Case("elementwise", f"mul f32 {n}x{h}", 3 * 4 * n * h, 0, lambda: x32 * y32))
    out.append(Case("elementwise", f"pow 2 f32 {n}x{h}", 2 * 4 * n * h, 0, lambda: x32.pow(2)))
    mask = torch.ones(b, t, 1, 1, device=device, dtype=torch.bool)
    x4b = rand(b, t, s, h)
    out.append(Case("elementwise", f"where by (B,T) mask {n}x{h} bf16", 3 * 2 * n * h, 0,
                    lambda: torch.where(mask, x4, x4b)))
    rows = rand(n * heads, hd, dtype=f32)
    out.append(Case("elementwise", f"mean over {hd} f32 {n * heads}x{hd}", 4 * rows.numel() + 4 * n * heads, 0,
                    lambda: rows.mean(-1, keepdim=True)))
    return out


#: SDPA backends timed on a GPU: FlashAttention-2 first (the one the kernel model is calibrated
#: on), then those SDPA may choose by itself on Hopper.
GPU_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def sdpa_backends(torch, device: str) -> tuple[str | None, ...]:  # noqa: ANN001
    """The SDPA backends to time: on the CPU SDPA's own choice (None) alone."""
    return GPU_BACKENDS if device == "cuda" else (None,)


def _in_backend(torch, backend: str | None, fn: Callable[..., object], *args: object) -> Callable[[], object]:  # noqa: ANN001
    """``fn(*args)`` with SDPA restricted to ``backend`` (None: SDPA's own choice)."""
    if backend is None:
        return lambda: fn(*args)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call() -> object:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return fn(*args)
    return call


def time_case(torch, case: Case, device: str, runs: int = RUNS) -> float:  # noqa: ANN001
    """Median seconds of one launch of ``case`` (CUDA events on a GPU, the host clock on the CPU)."""
    import time

    for _ in range(WARMUP):
        case.call()
    seconds = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            case.call()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) * 1e-3)
        else:
            begin = time.perf_counter()
            case.call()
            seconds.append(time.perf_counter() - begin)
    return statistics.median(seconds)


def render(timings: Sequence[Timing], bandwidth: float, peak: float, header: Sequence[str]) -> str:
    lines = ["# Kernel classes alone: STDiT3 sizes, eager PyTorch", "", *(f"- {line}" for line in header), "",
             "| class | kernel | time (us) | GB moved | TFLOP | of bandwidth | of peak |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for t in timings:
        frac_peak = f"{t.peak_fraction(peak):.3f}" if t.flops else ""
        lines.append(f"| {t.kind} | {t.name} | {t.seconds * 1e6:.1f} | {t.bytes / 1e9:.3f} | {t.flops / 1e12:.3f} | "
                     f"{t.bandwidth_fraction(bandwidth):.3f} | {frac_peak} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="h100-sxm", help="chip whose datasheet bandwidth and peak the fractions use")
    parser.add_argument("--shape", default="204_640_360")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite an existing table")
    parser.add_argument("--quick", action="store_true", help="every case on the tiny config, GPU or CPU; writes nothing (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_kernels: torch is not installed; nothing to measure.")
        return 0
    chip = load_chip(args.hw)
    bandwidth, peak = chip.dram_bandwidth_bytes_per_s, chip.gemm_flops_per_s
    if args.quick:
        from plans.config import default_shape

        device = "cuda" if torch.cuda.is_available() else "cpu"
        timings = [Timing(c.kind, c.name, time_case(torch, c, device, runs=1), c.bytes, c.flops)
                   for c in cases(torch, default_shape("tiny"), "tiny", device)]
        print(render(timings, bandwidth, peak, [f"--quick: the tiny config on {device}; no measurement"]))
        return 0
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device on this machine; nothing to measure.")
        return 0
    with torch.no_grad():
        timings = []
        for case in cases(torch, args.shape, "full", "cuda"):
            timings.append(Timing(case.kind, case.name, time_case(torch, case, "cuda"), case.bytes, case.flops))
            torch.cuda.empty_cache()
    header = [f"device: {torch.cuda.get_device_name(0)}", f"torch: {torch.__version__}, CUDA {torch.version.cuda}",
              f"shape: {args.shape}; fractions of {args.hw}'s {bandwidth / 1e12:.2f} TB/s and {peak / 1e12:.0f} TFLOP/s (bf16)",
              f"median of {RUNS} launches after {WARMUP} warm-ups (CUDA events)"]
    text = render(timings, bandwidth, peak, header)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"kernels_{args.shape}_{torch.cuda.get_device_name(0).replace(' ', '_')}.md", text, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
