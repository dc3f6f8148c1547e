"""Fitting a GPU's ``[kernel_model]`` constants on microbenchmark points (``scripts/calibrate_gpu.py``).

Every function here is pure: it takes measured points (:class:`Point`, one timed kernel call of a
sweep, ``benchmarks/gpu_microbench.py``, or a row of a public table) and the chip's datasheet
figures, and returns constants. Whole-model runs never enter: they validate the result
(``tests/test_gpu_validation.py``). The model each fit inverts is :mod:`hardware.kernel_model`'s:

* memory-bound kernel: ``max(launch_floor, kernel_overhead + bytes / (bandwidth * efficiency))``;
  ``kernel_overhead`` is the intercept of the contiguous streams' time against their bytes,
  each class's efficiency the least-squares fit of relative error over its points of at least
  :data:`MIN_FIT_SECONDS` (shorter ones are set by the launch floor and the L2);
* GroupNorm: an apply pass at an efficiency plus a moments pass at ``rows * row bandwidth``;
* GEMM: ``gemm_mma_efficiency`` and ``gemm_k_overhead`` by grid search over the whole GEMM grid
  (and batched GEMMs), minimising the mean absolute log error;
* fused attention: ``flash_kv_overhead`` by grid search, each kernel head dim's efficiency in
  closed form for it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hardware.ops import Op, OpType
from hardware.spec import ChipSpec, KernelModel, flash_kernel_head_dim

__all__ = [
    "MIN_FIT_SECONDS",
    "Point",
    "Residuals",
    "fit_efficiency",
    "fit_fixed_cost",
    "fit_flash",
    "fit_gemm",
    "fit_group_norm",
    "memory_time_s",
    "residuals",
]

#: Points shorter than this are left out of the memory-bound fits (the host's launch interval
#: and the L2's write-back set their time, not the streaming bandwidth); they stay in the residuals.
MIN_FIT_SECONDS = 20e-6
#: Bytes above which a contiguous stream's time is affine in its bytes (far beyond any L2).
STREAM_FIT_BYTES = 16e6


@dataclass(frozen=True)
class Point:
    """One timed kernel call: its class, sweep family, parameters, bytes, FLOPs and seconds."""

    kind: str
    family: str
    params: tuple[tuple[str, int], ...]
    elements: int
    bytes: int
    flops: int
    seconds: float

    def param(self, name: str) -> int:
        return dict(self.params)[name]


@dataclass(frozen=True)
class Residuals:
    """How far a fitted model is from its points: relative errors ``model / measured - 1``."""

    count: int
    mean_abs: float
    worst: float

    def text(self) -> str:
        return f"{self.count} points, mean abs error {self.mean_abs:.1%}, worst {self.worst:+.1%}"


def parse_params(text: str) -> tuple[tuple[str, int], ...]:
    """``"C=256;H=8"`` -> ``(("C", 256), ("H", 8))`` (a microbenchmark CSV's params column; a
    value that is no integer, such as ``shape=2x8x8x128``, only describes the case and is left out)."""
    pairs = []
    for item in filter(None, text.split(";")):
        name, _, value = item.partition("=")
        if value.isdigit():
            pairs.append((name, int(value)))
    return tuple(pairs)


def residuals(points: Iterable[Point], model: Callable[[Point], float]) -> Residuals:
    errors = [model(p) / p.seconds - 1 for p in points]
    if not errors:
        return Residuals(0, 0.0, 0.0)
    return Residuals(len(errors), statistics.fmean(abs(e) for e in errors), max(errors, key=abs))


def memory_time_s(p: Point, bandwidth: float, efficiency: float, overhead_s: float, floor_s: float) -> float:
    """The kernel model's time of a memory-bound point (module docstring)."""
    return max(floor_s, overhead_s + p.bytes / (bandwidth * efficiency))


def fit_fixed_cost(points: Sequence[Point]) -> float:
    """The median intercept of time against bytes over the contiguous streams' families (each an
    affine least-squares fit of its points above :data:`STREAM_FIT_BYTES`): a kernel's fixed cost."""
    intercepts = []
    for family in sorted({p.family for p in points}):
        big = [p for p in points if p.family == family and p.bytes >= STREAM_FIT_BYTES]
        if len(big) < 2:
            continue
        mean_b = statistics.fmean(p.bytes for p in big)
        mean_t = statistics.fmean(p.seconds for p in big)
        slope = sum((p.bytes - mean_b) * (p.seconds - mean_t) for p in big) / sum((p.bytes - mean_b) ** 2 for p in big)
        intercepts.append(mean_t - slope * mean_b)
    if not intercepts:
        raise ValueError("no contiguous stream family has two points above 16 MB")
    return max(0.0, statistics.median(intercepts))


def fit_efficiency(points: Sequence[Point], bandwidth: float, overhead_s: float) -> float:
    """The efficiency ``e`` minimising the squared relative error of ``overhead + bytes / (bandwidth
    * e)`` over the points of at least :data:`MIN_FIT_SECONDS` (closed form in ``1 / e``)."""
    used = [p for p in points if p.seconds >= MIN_FIT_SECONDS]
    if not used:
        raise ValueError(f"no point of {points[0].kind if points else '?'} lasts {MIN_FIT_SECONDS * 1e6:.0f} us")
    a = [p.bytes / (bandwidth * p.seconds) for p in used]
    r = [(p.seconds - overhead_s) / p.seconds for p in used]
    inverse = sum(x * y for x, y in zip(a, r, strict=True)) / sum(x * x for x in a)
    return min(1.0, 1 / inverse)


def fit_group_norm(points: Sequence[Point], bandwidth: float, stream_efficiency: float,
                   overhead_s: float) -> tuple[float, float]:
    """``(apply efficiency, row bandwidth in B/s)`` of GroupNorm: the least squares of relative
    error of ``overhead + bytes / (bandwidth * e) + input bytes / min(rows * w, stream)`` in
    ``(1 / e, 1 / w)`` (points whose moments pass is row-bound, at least MIN_FIT_SECONDS)."""
    used = [p for p in points if p.seconds >= MIN_FIT_SECONDS]
    rows = [(p.bytes / (bandwidth * p.seconds), p.elements * 2 / (p.param("rows") * p.seconds),
             (p.seconds - overhead_s) / p.seconds) for p in used]
    s11 = sum(x * x for x, _, _ in rows)
    s12 = sum(x * y for x, y, _ in rows)
    s22 = sum(y * y for _, y, _ in rows)
    b1 = sum(x * r for x, _, r in rows)
    b2 = sum(y * r for _, y, r in rows)
    det = s11 * s22 - s12 * s12
    if len(rows) < 2 or det <= 0:
        raise ValueError("GroupNorm needs points at two row counts")
    inv_e = (b1 * s22 - b2 * s12) / det
    inv_w = (s11 * b2 - s12 * b1) / det
    row_bandwidth = 1 / inv_w
    if min(p.param("rows") for p in used) * row_bandwidth > bandwidth * stream_efficiency:
        raise ValueError("GroupNorm's moments pass is not row-bound at these points")
    return min(1.0, 1 / inv_e), row_bandwidth


def _gemm_op(p: Point) -> Op:
    m, k, n = p.param("M"), p.param("K"), p.param("N")
    batch = dict(p.params).get("batch", 1)
    return Op(p.family, OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * batch * m * k * n, 2, batch=batch)


def _with(chip: ChipSpec, **changes: object) -> ChipSpec:
    assert chip.kernel_model is not None
    return dataclasses.replace(chip, kernel_model=dataclasses.replace(chip.kernel_model, **changes))


def gemm_time_s(p: Point, chip: ChipSpec, timing_overhead_s: float = 0.0) -> float:
    from hardware.kernel_model import gpu_gemm_mapping

    return gpu_gemm_mapping(_gemm_op(p), chip).latency_s + timing_overhead_s


#: GEMMs shorter than this are left out of the GEMM fit: a linear layer's host dispatch (the
#: cuBLASLt call and its heuristics, 14-25 us on the H100's host) sets their time, not the SMs.
GEMM_FIT_SECONDS = 50e-6
#: The GEMM fit's search grid: mma efficiency and K overhead (elements).
GEMM_MMA_GRID = tuple(round(0.40 + 0.01 * i, 2) for i in range(61))
GEMM_K_GRID = tuple(range(0, 513, 16))


def fit_gemm(points: Sequence[Point], chip: ChipSpec,
             timing_overheads_s: Sequence[float] = (0.0,)) -> tuple[float, int, float]:
    """``(gemm_mma_efficiency, gemm_k_overhead, timing overhead)`` minimising the mean |log error|
    over the ``points`` of at least :data:`GEMM_FIT_SECONDS` (the chip's other constants as given). ``timing_overheads_s``: candidates for
    a fixed cost the measurement adds to each kernel (a host-timed public table), 0 for CUDA events."""
    best: tuple[float, float, int, float] | None = None
    ops = [(_gemm_op(p), p.seconds) for p in points if p.seconds >= GEMM_FIT_SECONDS]
    from hardware.kernel_model import gpu_gemm_mapping

    for mma in GEMM_MMA_GRID:
        for k_over in GEMM_K_GRID:
            trial = _with(chip, gemm_mma_efficiency=mma, gemm_k_overhead_elements=k_over)
            times = [(gpu_gemm_mapping(op, trial).latency_s, seconds) for op, seconds in ops]
            for extra in timing_overheads_s:
                error = statistics.fmean(abs(math.log((t + extra) / s)) for t, s in times)
                if best is None or error < best[0]:
                    best = (error, mma, k_over, extra)
    assert best is not None
    return best[1], best[2], best[3]


#: The flash fit's search grid of ``flash_kv_overhead`` (keys).
FLASH_KV_GRID = tuple(range(0, 401, 8))


def _flash_op(p: Point) -> Op:
    bh, s_q, s_kv, d = p.param("BH"), p.param("Sq"), p.param("Skv"), p.param("D")
    q, kv = (1, bh, s_q, d), (1, bh, s_kv, d)
    return Op("flash_attention", OpType.FLASH_ATTENTION, (q, kv, kv), None, q, 4 * bh * s_q * s_kv * d)


def flash_time_s(p: Point, chip: ChipSpec) -> float:
    from hardware.kernel_model import gpu_flash_attention_mapping

    return gpu_flash_attention_mapping(_flash_op(p), chip).latency_s


def fit_flash(points: Sequence[Point], chip: ChipSpec, model: KernelModel) -> tuple[dict[int, float], int]:
    """``({kernel head dim: efficiency}, flash_kv_overhead)`` over the measured head dims: for each
    candidate kv overhead, each kernel's efficiency in closed form (relative least squares of its
    compute time), the candidate with the smallest mean |log error| kept."""
    best: tuple[float, dict[int, float], int] | None = None
    overhead = model.kernel_overhead_s
    for kv in FLASH_KV_GRID:
        by_kernel: dict[int, list[tuple[float, float]]] = {}
        for p in points:
            kernel = flash_kernel_head_dim(p.param("D"), model.flash_head_dims)
            padded = 4 * p.param("BH") * p.param("Sq") * p.param("Skv") * kernel
            work = padded / chip.gemm_flops_per_s * (p.param("Skv") + kv) / p.param("Skv")
            by_kernel.setdefault(kernel, []).append((work / p.seconds, (p.seconds - overhead) / p.seconds))
        efficiencies = {k: min(1.0, sum(a * a for a, _ in v) / sum(a * r for a, r in v)) for k, v in by_kernel.items()}
        trial_model = dataclasses.replace(model, flash_kv_overhead=kv, flash_efficiency=tuple(
            efficiencies.get(d, 0.5) for d in model.flash_head_dims))
        trial = dataclasses.replace(chip, kernel_model=trial_model)
        error = statistics.fmean(abs(math.log(flash_time_s(p, trial) / p.seconds)) for p in points)
        if best is None or error < best[0]:
            best = (error, efficiencies, kv)
    assert best is not None
    return best[1], best[2]
