"""Microbenchmark sweeps of every GPU kernel class, on a grid of sizes that is not any model's.

    python3 benchmarks/gpu_microbench.py [--out results/gpu_microbench] [--force]
    python3 benchmarks/gpu_microbench.py --quick     # CI: a few tiny cases, CPU or GPU; writes nothing

The constants of a GPU description (``[kernel_model]`` of ``hardware/data/*.toml``) are fitted on
these points by ``scripts/calibrate_gpu.py``; whole-model runs (the STDiT3 loop, the VAE decodes,
OpenSora's published timings) only validate them. So the grid deliberately avoids STDiT3's sizes:
powers of two, and odd widths chosen to show tile quantisation, never 1152, 72 or 300.

Each case is one eager PyTorch call, the kind of call ``analyze-hlo --exec torch`` names a kernel
class after (``hardware/spec.py`` ``KERNEL_CLASSES``):

* memory-bound classes at 8 sizes from 2**14 to 2**28 elements, each with its access pattern:
  contiguous (``elementwise``, ``gelu``, ``widening_cast``, ``stream``), broadcast along an axis
  (``broadcast``, ``select``), permuted (``copy``), across a transposed layout (``strided``,
  ``transpose_copy``), channels-last conversion (``layout_transpose``), row-wise (``layer_norm``,
  ``softmax``, ``reduction``, ``group_norm``, several row lengths and row counts);
* GEMMs (``F.linear`` with bias, bf16) on a grid of M, K and N, and batched GEMMs (``torch.bmm``);
* fused attention (SDPA restricted to its FlashAttention-2 backend) by head dim and sequence length,
  self- and cross-attention;
* the host's dispatch interval of tiny calls launched back to back (``launch``: a one-element add
  five times, its median the launch floor; a tiny linear layer, LayerNorm, softmax and copy).

Timing: CUDA events around a loop of launches (enough for about 2 ms, at least 3), the median of
three loops; each case rotates through copies of its inputs so that a loop reads at least 256 MB
(twice the L2 of any card here), so no case runs from cache. Each row gives the bytes the call must
move (each input read once, the output written once, each tensor in its own element type) and its
FLOPs. The CSV and a JSON of the device, driver and library versions land in ``--out`` as run N
of that device (``microbench_<device>_<N>.csv``), beside the earlier runs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hlo_trace.atomic import atomic_write  # noqa: E402

#: Element counts of the memory-bound sweeps (4x apart, 32 KB to 512 MB of bf16).
SIZES = tuple(2**e for e in range(14, 29, 2))
#: Bytes one timing loop reads at least (inputs rotate through copies): twice a 50-60 MB L2, and more.
ROTATION_BYTES = 256 * 2**20
#: Most copies of a case's inputs (a 64 KB case rotates through 4096: 256 MB).
MAX_COPIES = 4096
#: Seconds one timing loop aims at, and the loops per case (their median is the case's time).
LOOP_SECONDS, LOOPS = 2e-3, 3
#: The CSV's columns.
COLUMNS = ("kind", "family", "params", "elements", "bytes", "flops", "seconds", "launches")


@dataclass(frozen=True)
class Case:
    """One kernel call: its class, the family of the sweep it belongs to, its parameters, what it
    must move and compute, and a factory that allocates one copy of its inputs and returns the call."""

    kind: str
    family: str
    params: str
    elements: int
    bytes: int
    flops: int
    make: Callable[[], Callable[[], object]]


def _pow2_split(n: int, parts: int) -> list[int]:
    """``parts`` powers of two whose product is ``n`` (a power of two), as equal as possible."""
    e = int(math.log2(n))
    base, extra = divmod(e, parts)
    return [2 ** (base + (1 if i < extra else 0)) for i in range(parts)]


def memory_cases(torch, sizes: tuple[int, ...]) -> Iterator[Case]:  # noqa: ANN001, PLR0915 - one flat list reads best
    """The memory-bound sweeps: every class at every size of ``sizes``."""
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf16, f32 = torch.bfloat16, torch.float32

    def rand(*shape, dtype=bf16):  # noqa: ANN001, ANN002, ANN202
        return torch.randn(*shape, device=dev, dtype=f32).to(dtype)

    for n in sizes:
        yield Case("stream", "contiguous clone", "", n, 4 * n, 0,
                   lambda n=n: (lambda x=rand(n): x.clone()))
        yield Case("elementwise", "add bf16", "", n, 6 * n, n,
                   lambda n=n: (lambda a=rand(n), b=rand(n): a + b))
        yield Case("elementwise", "mul f32", "", n, 12 * n, n,
                   lambda n=n: (lambda a=rand(n, dtype=f32), b=rand(n, dtype=f32): a * b))
        yield Case("gelu", "tanh gelu bf16", "", n, 4 * n, 8 * n,
                   lambda n=n: (lambda x=rand(n): F.gelu(x, approximate="tanh")))
        yield Case("widening_cast", "bf16 to f32", "", n, 6 * n, 0,
                   lambda n=n: (lambda x=rand(n): x.float()))
        a, b, c = 2, *_pow2_split(n // 256, 2)
        yield Case("copy", "permute(0,2,1,3) inner 128", f"shape={a}x{b}x{c}x128", n, 4 * n, 0,
                   lambda a=a, b=b, c=c: (lambda x=rand(a, b, c, 128): x.permute(0, 2, 1, 3).contiguous()))
        ch, rows = _pow2_split(n // 2, 2)
        yield Case("transpose_copy", "(2,C,N) -> (2,N,C)", f"C={ch};N={rows}", n, 4 * n, 0,
                   lambda ch=ch, rows=rows: (lambda x=rand(2, ch, rows): x.transpose(1, 2).contiguous()))
        yield Case("strided", "(2,N,C) + (2,C,N).T", f"C={ch};N={rows}", n, 6 * n, n,
                   lambda ch=ch, rows=rows: (lambda a=rand(2, rows, ch), b=rand(2, ch, rows): a + b.transpose(1, 2)))
        r = max(1, n // 2048)
        yield Case("broadcast", "(2,R,1024) * (2,1,1024)", f"R={r}", n, 4 * n + 4096, n,
                   lambda r=r: (lambda x=rand(2, r, 1024), v=rand(2, 1, 1024): x * v))
        yield Case("broadcast", "(R,1024) + (1024,) bias", f"R={2 * r}", n, 4 * n + 2048, n,
                   lambda r=r: (lambda x=rand(2 * r, 1024), v=rand(1024): x + v))
        yield Case("select", "where((2,R,1) mask, a, b)", f"R={r}", n, 6 * n + 2 * r, n,
                   lambda r=r: (lambda m=torch.rand(2, r, 1, device=dev) > 0.5, a=rand(2, r, 1024),
                                b=rand(2, r, 1024): torch.where(m, a, b)))
        yield Case("select", "where((2,1,1024) mask, a, b)", f"R={r}", n, 6 * n + 2048, n,
                   lambda r=r: (lambda m=torch.rand(2, 1, 1024, device=dev) > 0.5, a=rand(2, r, 1024),
                                b=rand(2, r, 1024): torch.where(m, a, b)))
        for length in (16, 64, 256, 1024):
            yield Case("reduction", f"mean over rows of {length} f32", f"L={length}", n, 4 * n + 4 * (n // length), n,
                       lambda length=length, n=n: (lambda x=rand(n // length, length, dtype=f32): x.mean(-1)))
        for width in (1024, 4096):
            if n >= 8 * width:
                yield Case("layer_norm", f"LayerNorm bf16 width {width}", f"C={width}", n, 4 * n + 4 * width, 8 * n,
                           lambda width=width, n=n: (lambda x=rand(n // width, width), w=rand(width), b=rand(width):
                                                     F.layer_norm(x, (width,), w, b)))
        for length in (16, 64, 256, 1024):
            yield Case("softmax", f"softmax f32 rows of {length}", f"L={length}", n, 8 * n, 5 * n,
                       lambda length=length, n=n: (lambda x=rand(n // length, length, dtype=f32): torch.softmax(x, -1)))
        for samples in (1, 4):
            hw = n // (samples * 256)
            if hw >= 16:
                hh, ww = _pow2_split(hw, 2)
                yield Case("group_norm", f"GroupNorm(32) bf16 N={samples} C=256", f"N={samples};C=256;H={hh};W={ww};rows={samples * 32}",
                           n, 4 * n + 1024, 8 * n,
                           lambda samples=samples, hh=hh, ww=ww: (lambda x=rand(samples, 256, hh, ww), w=rand(256), b=rand(256):
                                                                  F.group_norm(x, 32, w, b)))
        hw = n // 256
        if hw >= 16:
            hh, ww = _pow2_split(hw, 2)
            yield Case("layout_transpose", "NCHW -> NHWC, C=256", f"C=256;H={hh};W={ww}", n, 4 * n, 0,
                       lambda hh=hh, ww=ww: (lambda x=rand(1, 256, hh, ww): x.contiguous(memory_format=torch.channels_last)))


#: GEMM grid: F.linear of an (M, K) input by an (N, K) weight with bias. N spans odd widths
#: (tile quantisation) and wide ones; none is a width of STDiT3.
GEMM_M = (256, 1024, 4096, 16384, 65536)
GEMM_K = (256, 1024, 4096)
GEMM_N = (96, 320, 1000, 4096, 12288)
#: Batched GEMMs: (batch, m, k, n).
BMM = tuple((batch, m, k, n) for batch in (512, 8192, 32768)
            for (m, k, n) in ((16, 64, 16), (48, 40, 48), (100, 80, 100), (128, 128, 128), (256, 64, 256)))
#: Fused attention: head dims and self-attention lengths; cross-attention key counts.
FLASH_HEAD_DIMS = (32, 64, 80, 96, 128, 256)
FLASH_SEQ = (256, 1024, 4096, 16384)
FLASH_CROSS_KV = (64, 200, 600)


def gemm_cases(torch, m_values=GEMM_M, k_values=GEMM_K, n_values=GEMM_N, bmm=BMM) -> Iterator[Case]:  # noqa: ANN001
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = torch.bfloat16

    def rand(*shape):  # noqa: ANN002, ANN202
        return torch.randn(*shape, device=dev, dtype=bf16)

    for m in m_values:
        for k in k_values:
            for n in n_values:
                yield Case("gemm", "linear bf16 + bias", f"M={m};K={k};N={n}", m * n, 2 * (m * k + k * n + m * n + n),
                           2 * m * k * n, lambda m=m, k=k, n=n: (lambda x=rand(m, k), w=rand(n, k), b=rand(n): F.linear(x, w, b)))
    for batch, m, k, n in bmm:
        yield Case("bmm", "bmm bf16", f"batch={batch};M={m};K={k};N={n}", batch * m * n,
                   2 * batch * (m * k + k * n + m * n), 2 * batch * m * k * n,
                   lambda batch=batch, m=m, k=k, n=n: (lambda a=rand(batch, m, k), b=rand(batch, k, n): torch.bmm(a, b)))


def flash_cases(torch, head_dims=FLASH_HEAD_DIMS, seqs=FLASH_SEQ, cross_kv=FLASH_CROSS_KV) -> Iterator[Case]:  # noqa: ANN001
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = torch.bfloat16

    def attention(bh: int, s_q: int, s_kv: int, d: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            q = torch.randn(1, bh, s_q, d, device=dev, dtype=bf16)
            k = torch.randn(1, bh, s_kv, d, device=dev, dtype=bf16)
            v = torch.randn(1, bh, s_kv, d, device=dev, dtype=bf16)
            if dev != "cuda":
                return lambda: F.scaled_dot_product_attention(q, k, v)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def call() -> object:
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v)
            return call
        return make

    def case(family: str, bh: int, s_q: int, s_kv: int, d: int) -> Case:
        return Case("flash_attention", family, f"BH={bh};Sq={s_q};Skv={s_kv};D={d}", bh * s_q * d,
                    2 * bh * (2 * s_q + 2 * s_kv) * d, 4 * bh * s_q * s_kv * d, attention(bh, s_q, s_kv, d))

    for d in head_dims:
        for s in seqs:
            bh = max(1, min(4096, math.ceil(5e9 / (s * s * d))))
            yield case("self-attention", bh, s, s, d)
    for d in (64, 128):
        for s_kv in cross_kv:
            yield case("cross-attention", 64, 4096, s_kv, d)


#: Convolutions profiled kernel by kernel: (channels, height = width), one sample, 3x3, bias.
CONV = tuple((c, hw) for c in (64, 256) for hw in (64, 128, 256))
#: Profiled calls per convolution.
CONV_CALLS = 5


def conv_rows(torch, grid=CONV) -> list[dict[str, object]]:  # noqa: ANN001
    """cuDNN's layout transposes around a 3x3 convolution on an NCHW input, read off the profiler:
    one ``layout_transpose`` row a shape (every nchwToNhwc / nhwcToNchw kernel of a call together:
    the input, the weight and the output, each read and written once) and one ``conv`` row (the
    convolution kernels alone, FLOPs of the im2col GEMM)."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for channels, hw in grid:
        x = torch.randn(1, channels, hw, hw, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(channels, channels, 3, 3, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(channels, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            F.conv2d(x, w, b, padding=1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CONV_CALLS):
                F.conv2d(x, w, b, padding=1)
            torch.cuda.synchronize()
        transpose_us = conv_us = 0.0
        for event in prof.key_averages():
            us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
            name = event.key.lower()
            if "nchwtonhwc" in name or "nhwctonchw" in name:
                transpose_us += us
            elif "conv" in name or "xmma" in name or "sm90" in name or "implicit" in name:
                conv_us += us
        elements = 2 * channels * hw * hw + channels * channels * 9
        params = f"C={channels};H={hw};W={hw}"
        rows.append(dict(kind="layout_transpose", family="cuDNN nchwToNhwc/nhwcToNchw around conv3x3", params=params,
                         elements=elements, bytes=4 * elements, flops=0,
                         seconds=f"{transpose_us * 1e-6 / CONV_CALLS:.9g}", launches=CONV_CALLS))
        rows.append(dict(kind="conv", family="cuDNN conv3x3 bf16 kernels", params=params, elements=channels * hw * hw,
                         bytes=2 * elements, flops=2 * hw * hw * channels * channels * 9,
                         seconds=f"{conv_us * 1e-6 / CONV_CALLS:.9g}", launches=CONV_CALLS))
    return rows


#: Repeats of the tiny add whose median is the launch interval (the host's pace varies run to run).
LAUNCH_REPEATS = 5


def launch_cases(torch) -> list[Case]:  # noqa: ANN001
    """Tiny calls launched back to back: the host's dispatch interval of one eager call (a one-element
    add, repeated; and, for the record, a tiny linear layer, LayerNorm, softmax and permuted copy)."""
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def t(*shape):  # noqa: ANN002, ANN202
        return torch.ones(*shape, device=dev)

    cases = [Case("launch", "add of one element", f"repeat={i}", 1, 6, 1,
                  lambda: (lambda a=t(1), b=t(1): a + b)) for i in range(LAUNCH_REPEATS)]
    cases += [Case("launch", "linear 16x16 + bias", "", 256, 0, 0, lambda: (lambda x=t(16, 16), w=t(16, 16), b=t(16): F.linear(x, w, b))),
              Case("launch", "LayerNorm 16x16", "", 256, 0, 0, lambda: (lambda x=t(16, 16): F.layer_norm(x, (16,)))),
              Case("launch", "softmax 16x16", "", 256, 0, 0, lambda: (lambda x=t(16, 16): torch.softmax(x, -1))),
              Case("launch", "permuted copy 4x4x4x4", "", 256, 0, 0,
                   lambda: (lambda x=t(4, 4, 4, 4): x.permute(0, 2, 1, 3).contiguous()))]
    return cases


def time_case(torch, case: Case, rotate: bool = True) -> tuple[float, int]:  # noqa: ANN001
    """``(median seconds a launch, launches a loop)`` of ``case``, its inputs rotated (module
    docstring); ``rotate=False`` (``--quick``): one copy, one launch a loop."""
    if not rotate:
        call = case.make()
        begin = time.perf_counter()
        call()
        return time.perf_counter() - begin, 1
    copies = 1 if case.kind == "launch" else max(1, min(MAX_COPIES, math.ceil(ROTATION_BYTES / max(case.bytes, 1))))
    calls = [case.make() for _ in range(copies)]
    cuda = torch.cuda.is_available()

    def loop(launches: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(launches):
                calls[i % copies]()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        begin = time.perf_counter()
        for i in range(launches):
            calls[i % copies]()
        return time.perf_counter() - begin

    loop(min(copies, 3))  # warm-up: library handles, kernel selection
    first = loop(1)
    launches = 1000 if case.kind == "launch" else max(3, min(200, math.ceil(LOOP_SECONDS / max(first, 1e-7))))
    launches = max(launches, copies)  # every copy read once a loop
    seconds = statistics.median(loop(launches) / launches for _ in range(LOOPS))
    return seconds, launches


def environment(torch) -> dict[str, str]:  # noqa: ANN001
    """Device, driver and library versions of this run."""
    info = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version()), "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), sms=str(props.multi_processor_count),
                    memory_bytes=str(props.total_memory), l2_bytes=str(getattr(props, "L2_cache_size", "")))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False)
            info["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    else:
        info["device"] = "cpu"
    return info


def run(torch, cases: list[Case], progress, rotate: bool = True) -> list[dict[str, object]]:  # noqa: ANN001
    rows = []
    for i, case in enumerate(cases, 1):
        try:
            seconds, launches = time_case(torch, case, rotate)
        except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape, memory: say so, go on
            progress(f"[{i}/{len(cases)}] {case.kind} {case.params}: skipped ({str(exc).splitlines()[0][:120]})")
            continue
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(dict(kind=case.kind, family=case.family, params=case.params, elements=case.elements,
                         bytes=case.bytes, flops=case.flops, seconds=f"{seconds:.9g}", launches=launches))
        rate = f"{case.bytes / seconds / 1e9:8.1f} GB/s" + (f" {case.flops / seconds / 1e12:7.1f} TFLOP/s" if case.flops else "")
        progress(f"[{i}/{len(cases)}] {case.kind:16s} {case.family:34s} {case.params:38s} n={case.elements:>11d} "
                 f"{seconds * 1e6:10.2f} us {rate}")
    return rows


def to_csv(rows: list[dict[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_microbench"), help="folder of the CSV and JSON")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file of the same name")
    parser.add_argument("--only", default="", help="comma-separated kinds to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="a few tiny cases, CPU or GPU; writes nothing (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_microbench: torch is not installed; nothing to measure.")
        return 0
    torch.set_grad_enabled(False)
    if args.quick:
        cases = [*memory_cases(torch, (2**14,)), *gemm_cases(torch, (64,), (64,), (96,), ((4, 16, 64, 16),)),
                 *flash_cases(torch, (32,), (64,), (16,)), *launch_cases(torch)]
        rows = run(torch, cases, lambda line: None, rotate=False)
        print(f"--quick on {'cuda' if torch.cuda.is_available() else 'cpu'}: {len(rows)} tiny cases timed; no measurement")
        return 0
    if not torch.cuda.is_available():
        print("gpu_microbench: no CUDA device on this machine; nothing to measure.")
        return 0
    cases = [*launch_cases(torch), *memory_cases(torch, SIZES), *gemm_cases(torch), *flash_cases(torch)]
    if args.only:
        kinds = set(args.only.split(","))
        cases = [c for c in cases if c.kind in kinds]
    info = environment(torch)
    print(json.dumps(info), flush=True)
    begin = time.perf_counter()
    rows = run(torch, cases, lambda line: print(line, flush=True))
    if not args.only or "layout_transpose" in args.only:
        try:
            rows += conv_rows(torch)
        except Exception as exc:  # noqa: BLE001 - the profiler missing on a machine: the sweep still lands
            print(f"conv profile skipped: {exc}")
    info["sweep_seconds"] = f"{time.perf_counter() - begin:.1f}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"microbench_{info['device'].replace(' ', '_')}"
    run_number = 1 + len(list(out.glob(f"{stem}_*.csv")))  # each run beside the earlier ones
    atomic_write(out / f"{stem}_{run_number}.csv", to_csv(rows), force=args.force)
    atomic_write(out / f"{stem}_{run_number}.json", json.dumps(info, indent=1) + "\n", force=args.force)
    print(f"{len(rows)} cases in {info['sweep_seconds']} s -> {out}/{stem}_{run_number}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
