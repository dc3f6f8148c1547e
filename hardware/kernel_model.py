"""GPU kernel model: achieved efficiency of library kernels instead of datasheet peak.

A chip file with a ``[kernel_model]`` table (the bundled GPUs) is costed kernel by kernel, the way
an eager framework runs it: one library kernel per op, each paying ``kernel_overhead`` (launch,
ramp-up and tail of a kernel on the GPU timeline). Every constant is a field of
:class:`hardware.spec.KernelModel`, read from the chip's TOML file, where each value cites its source.

GEMM ``(M, K) x (K, N)``, ``batch`` instances of it (cuBLAS/CUTLASS-style output tiles)
    One kernel, however many instances (a batched GEMM is one ``bmm`` launch, its CTAs indexed by
    instance and output tile). For each output tile ``tm x tn`` of ``gemm_cta_tiles`` the kernel
    has ``tiles = batch * ceil(M/tm) * ceil(N/tn)`` CTAs, one per SM at a time, so it runs
    ``waves = ceil(tiles / SMs)`` waves (*wave quantization*); each CTA computes a full
    ``tm x tn`` tile (*tile quantization*: a skinny N of 72 costs a 128-wide tile) over
    ``K + gemm_k_overhead`` K steps (the prologue that fills the pipeline and the epilogue that
    stores the tile cost as much as ``gemm_k_overhead`` extra K elements: the *small-K penalty*),
    at ``gemm_mma_efficiency`` of the SM's tensor peak, and no faster than the SM's L2 port
    (``noc_link_bandwidth`` of the chip) feeds its A and B blocks (a small tile reuses each byte
    less)::

        k_steps = round_up(K, granule) + k_overhead
        per CTA = max(2 * tm * tn * k_steps / (SM peak * mma_eff), (tm + tn) * k_steps * bytes / L2 port)
        compute = waves * per CTA

    The tile with the smallest compute time is taken, the larger tile on a tie (a library
    heuristic picks well on these shapes). Memory: A, B and C of every instance each cross HBM
    once at the sustained bandwidth ``dram_bandwidth * hbm_efficiency`` (L2 serves the reuse
    between tiles). A fused epilogue (GELU) adds its vector work on the CUDA cores, overlapped.
    Latency = ``kernel_overhead + max(compute, memory)``: one overhead for the whole batch, and
    a batch of small GEMMs fills the SMs that one of them would leave idle.

Every kernel, whatever its kind, takes at least ``launch_floor``: an eager framework dispatches
one call at a time from the host, so back-to-back tiny kernels run at the host's pace.

Memory-bound (Vector) ops
    ``kernel_overhead + max(bytes / (dram_bandwidth * efficiency), ops / vector peak)``,
    bytes = every input and the weight read once, the output written once; the efficiency is
    ``vector_efficiency[class]`` when the op is named after a kernel class (a LayerNorm, softmax,
    GELU, broadcast ... kernel: ``--exec torch`` names its kernels so; every GPU file lists every
    class), refined by ``row_efficiency[class]`` at the op's row length where the class has a row
    curve, else ``hbm_efficiency`` (an XLA fusion: a contiguous stream). A GroupNorm adds the pass that computes each (sample, group)
    row's moments, one thread block a row: ``input bytes / min(rows * group_norm_row_bandwidth,
    sustained bandwidth)``.

Flash attention (FlashAttention-2 kernels)
    The library instantiates kernels for a fixed set of head dims (``flash_head_dims``); a head
    dim runs in the smallest kernel at least as wide (STDiT3's 72 runs in the 96 kernel), which
    computes at the padded width. Its matrix work runs at ``flash_efficiency`` (per kernel head
    dim) of the chip's tensor peak; memory is q, k, v read and the output written once::

        latency = kernel_overhead + max(4 * B * heads * S_Q * S_KV * kernel_head_dim / (peak * eff),
                                        bytes / sustained bandwidth)
"""

from __future__ import annotations

import dataclasses
import math

from hardware.kernel_mapping import KernelTiling, Mapping
from hardware.ops import Op, OpType, attention_dims, check_epilogue, gemm_dims
from hardware.spec import ChipSpec, KernelModel
from hardware.tiling import round_up

#: The kernel class whose time has a per-row moments pass (``KernelModel.group_norm_row_bandwidth_bytes_per_s``).
GROUP_NORM_CLASS = "group_norm"

__all__ = [
    "GROUP_NORM_CLASS",
    "gemm_tile_time_s",
    "gpu_flash_attention_mapping",
    "gpu_gemm_mapping",
    "gpu_vector_mapping",
    "kernel_latency_s",
]


def _model(chip: ChipSpec) -> KernelModel:
    if chip.kernel_model is None:
        raise ValueError(f"chip {chip.name} has no [kernel_model] table")
    return chip.kernel_model


def _sustained_bandwidth(chip: ChipSpec, kernel_class: str = "", row_length: int = 0) -> float:
    return chip.dram_bandwidth_bytes_per_s * _model(chip).hbm_efficiency_for(kernel_class, row_length or None)


def kernel_latency_s(chip: ChipSpec, work_s: float) -> float:
    """One kernel's time in an eager stream: its fixed cost plus its work, and never shorter than
    the host's dispatch interval (``launch_floor``)."""
    model = _model(chip)
    return max(model.launch_floor_s, model.kernel_overhead_s + work_s)


def _mapping(op: Op, name: str, mapper: str, chip: ChipSpec, *, compute_s: float, dram_bytes: float,
             peak: float, tiling: KernelTiling, kernel_class: str = "") -> Mapping:
    dram_s = dram_bytes / _sustained_bandwidth(chip, kernel_class, op.row_length)
    latency_s = kernel_latency_s(chip, max(compute_s, dram_s))
    if compute_s >= dram_s:
        bound = "compute"
    else:
        bound = "dram"
    return Mapping(
        op_name=name,
        op_type=op.op_type.value,
        mapper=mapper,
        latency_s=latency_s,
        compute_s=compute_s,
        dram_s=dram_s,
        noc_s=0.0,
        utilization=min(1.0, op.flops / latency_s / peak),
        flops=op.flops,
        dram_bytes=dram_bytes,
        tiling=tiling,
        bound=bound,
    )


def gemm_tile_time_s(m: int, k: int, n: int, tile: tuple[int, int], chip: ChipSpec,
                     bytes_per_element: int = 2, batch: int = 1) -> tuple[float, int]:
    """``(compute seconds, waves)`` of ``batch`` GEMMs run as one kernel with output tile ``tile``
    (module docstring)."""
    model = _model(chip)
    tm, tn = tile
    tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
    waves = math.ceil(tiles / chip.tile_count)
    k_steps = round_up(k, chip.gemm_granule_elements) + model.gemm_k_overhead_elements
    mma_s = 2 * tm * tn * k_steps / (chip.gemm_flops_per_s_per_tile * model.gemm_mma_efficiency)
    feed_s = (tm + tn) * k_steps * bytes_per_element / chip.noc_bandwidth_bytes_per_s_per_link
    return waves * max(mma_s, feed_s), waves


def gpu_gemm_mapping(op: Op, chip: ChipSpec, *, epilogue: Op | None = None) -> Mapping:
    """One cuBLAS-style GEMM kernel for all ``op.batch`` instances (module docstring);
    ``epilogue`` a fused element-wise op."""
    m, k, n = gemm_dims(op)
    q = op.bytes_per_element
    best: tuple[float, int, tuple[int, int]] | None = None
    for tile in _model(chip).gemm_cta_tiles:
        seconds, waves = gemm_tile_time_s(m, k, n, tile, chip, q, op.batch)
        if best is None or (seconds, -tile[0] * tile[1], tile) < (best[0], -best[2][0] * best[2][1], best[2]):
            best = (seconds, waves, tile)
    assert best is not None  # gemm_cta_tiles is never empty
    compute_s, waves, (tm, tn) = best
    name = op.name
    if epilogue is not None:
        check_epilogue(op, epilogue)
        compute_s = max(compute_s, epilogue.flops / chip.vector_flops_per_s)
        name = f"{op.name}+{epilogue.name}"
    dram_bytes = op.batch * (m * k + k * n + m * n) * q
    tiling = KernelTiling(kernel="gemm", tile_m=tm, tile_n=tn, waves=waves, head_dim=0)
    return _mapping(op, name, "gpu_gemm_kernel", chip, compute_s=compute_s, dram_bytes=dram_bytes,
                    peak=chip.gemm_flops_per_s, tiling=tiling)


def gpu_vector_mapping(op: Op, chip: ChipSpec) -> Mapping:
    """One element-wise or row-reduction kernel at the sustained HBM bandwidth."""
    if op.op_type is not OpType.VECTOR:
        raise ValueError(f"op {op.name}: gpu_vector_mapping takes Vector ops, got {op.op_type.value}")
    dram_bytes = (op.input_elements + op.weight_elements + op.output_elements) * op.bytes_per_element
    compute_s = op.flops / chip.vector_flops_per_s
    tiling = KernelTiling(kernel="vector", tile_m=0, tile_n=0, waves=0, head_dim=0)
    mapping = _mapping(op, op.name, "gpu_vector_kernel", chip, compute_s=compute_s, dram_bytes=dram_bytes,
                       peak=chip.vector_flops_per_s, tiling=tiling, kernel_class=op.name)
    row_bandwidth = _model(chip).group_norm_row_bandwidth_bytes_per_s
    if op.name != GROUP_NORM_CLASS or row_bandwidth <= 0:
        return mapping
    rows = op.output_shape[0]  # (sample, group) rows: hlo_analyzer.mapping.torch_kernels
    moments_s = op.input_elements * op.bytes_per_element / min(rows * row_bandwidth, _sustained_bandwidth(chip))
    latency_s = mapping.latency_s + moments_s
    return dataclasses.replace(mapping, latency_s=latency_s, dram_s=mapping.dram_s + moments_s,
                               utilization=min(1.0, op.flops / latency_s / chip.vector_flops_per_s))


def gpu_flash_attention_mapping(op: Op, chip: ChipSpec) -> Mapping:
    """One FlashAttention-2 forward kernel at the efficiency of its (padded) head-dim kernel."""
    batch, heads, s_q, s_kv, head_dim = attention_dims(op)
    kernel_dim, efficiency = _model(chip).flash_efficiency_for(head_dim, s_kv)
    padded_flops = 4 * batch * heads * s_q * s_kv * kernel_dim
    compute_s = padded_flops / (chip.gemm_flops_per_s * efficiency)
    dram_bytes = batch * heads * (2 * s_q + 2 * s_kv) * head_dim * op.bytes_per_element
    tiling = KernelTiling(kernel="flash_attention", tile_m=0, tile_n=0, waves=0, head_dim=kernel_dim)
    return _mapping(op, op.name, "gpu_flash_attention_kernel", chip, compute_s=compute_s,
                    dram_bytes=dram_bytes, peak=chip.gemm_flops_per_s, tiling=tiling)
