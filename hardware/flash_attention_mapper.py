"""``flashatten_mapper``: flash attention ``softmax(q k^T * scale) v`` tiled through SRAM.

Loop nest (as in the original FlashAttention and the reference toolchain): for each *work group*
(one batch entry, ``heads_per_block`` fused heads and, when ``q_split > 1``, one slice of the
query rows), the **outer** loop walks the key/value blocks of ``ty`` rows and the **inner** loop
the query blocks of ``tx`` rows; scores never leave SRAM, the softmax is computed online
(running max and sum per query row).

Work groups are dealt to ``min(tile_count, groups)`` tiles; every tile is charged the largest
share. Tiles that split one head group's queries (``q_split``) get its K/V blocks from one DRAM
read forwarded over the NoC (``q_split - 1`` hops).

DRAM traffic per work group: K and V once; Q and the output once if all the group's queries fit
one block (``tx`` = slice, so they stay in SRAM across the outer loop), otherwise Q is re-read for
every K/V block and the fp32 partial output plus its two row statistics are written after each
K/V block and read back before the next (``2 * (kv_blocks - 1)`` fp32 round trips), with the
final output written once in ``bytes_per_element``.

Compute: the two GEMMs (``4 * rows * keys * head_dim`` per head, every block edge padded to the
GEMM granule) on the GEMM engine; on the vector unit, ``op.vector_flops`` (the softmax work the op
builder counts per score) plus ``RESCALE_OPS_PER_OUTPUT_ELEMENT`` per output element per extra K/V
block (the online-softmax correction ``o *= exp(m_old - m_new)``). The two units overlap across
blocks, so compute is the larger of the two.

SRAM per tile: ``stages * (K and V block + Q block + fp32 O block) + fp32 score block + fp32 row
statistics``. Candidates: ``tx, ty`` powers of two from the granule and the full extent;
``heads_per_block`` the divisors of the head count (1 only without head fusion; for a count
above 2**20, its divisors up to 1024 and their cofactors: :func:`hardware.tiling.small_divisors`);
``q_split`` the tile factors of :func:`hardware.tiling.tile_factors`. Exhaustive (a few thousand candidates at most);
ties go to the smallest tiling so the result does not depend on the order.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from hardware.gemm_mapper import ACCUMULATOR_BYTES
from hardware.kernel_mapping import FlashAttentionTiling, Mapping, pipeline_chains
from hardware.kernel_model import gpu_flash_attention_mapping
from hardware.ops import Op, OpType, attention_dims
from hardware.spec import ChipSpec
from hardware.tiling import block_candidates, padded_extent, round_up, small_divisors, tile_factors
from hardware.vector_mapper import MappingError

__all__ = ["RESCALE_OPS_PER_OUTPUT_ELEMENT", "STATISTICS_PER_ROW", "flashatten_mapper"]

#: Online softmax: after each K/V block beyond the first, every output element is rescaled by
#: ``exp(m_old - m_new)`` (one multiply; the exponential is per row and negligible).
RESCALE_OPS_PER_OUTPUT_ELEMENT = 1
#: Running max and running sum kept per query row (fp32 each).
STATISTICS_PER_ROW = 2


def _sram_bytes(tx: int, ty: int, head_dim: int, heads: int, q: int, stages: int) -> int:
    streamed = 2 * ty * head_dim * q + tx * head_dim * q + tx * head_dim * ACCUMULATOR_BYTES
    resident = tx * ty * ACCUMULATOR_BYTES + tx * STATISTICS_PER_ROW * ACCUMULATOR_BYTES
    return heads * (stages * streamed + resident)


def _cost(op: Op, chip: ChipSpec, tiling: FlashAttentionTiling) -> Mapping:
    batch, heads, s_q, s_kv, head_dim = attention_dims(op)
    q = op.bytes_per_element
    granule = chip.gemm_granule_elements
    hf, q_split, tx, ty = tiling.heads_per_block, tiling.q_split, tiling.tx, tiling.ty
    head_groups = batch * (heads // hf)
    work = head_groups * q_split
    tiles = tiling.tiles
    groups_per_tile = math.ceil(work / tiles)
    rows = math.ceil(s_q / q_split)
    kv_blocks, q_blocks = math.ceil(s_kv / ty), math.ceil(rows / tx)
    steps = groups_per_tile * kv_blocks * q_blocks

    gemm_flops = 4 * hf * padded_extent(rows, tx, granule) * padded_extent(s_kv, ty, granule) * round_up(head_dim, granule)
    softmax_ops_per_score = op.vector_flops / (batch * heads * s_q * s_kv)
    vector_ops = hf * (rows * s_kv * softmax_ops_per_score + (kv_blocks - 1) * rows * head_dim * RESCALE_OPS_PER_OUTPUT_ELEMENT)
    compute_s = groups_per_tile * max(gemm_flops / chip.gemm_flops_per_s_per_tile, vector_ops / chip.vector_flops_per_s_per_tile)

    kv_bytes = 2 * hf * s_kv * head_dim * q
    if q_blocks == 1:
        q_bytes = hf * rows * head_dim * q
        o_bytes = hf * rows * head_dim * q
    else:
        q_bytes = kv_blocks * hf * rows * head_dim * q
        partial_bytes = hf * rows * (head_dim + STATISTICS_PER_ROW) * ACCUMULATOR_BYTES
        o_bytes = 2 * (kv_blocks - 1) * partial_bytes + hf * rows * head_dim * q
    dram_bytes = head_groups * kv_bytes + work * (q_bytes + o_bytes)
    dram_s = dram_bytes / chip.dram_bandwidth_bytes_per_s
    if chip.noc_topology == "mesh":
        noc_bytes = groups_per_tile * kv_bytes if q_split > 1 else 0.0
        hops = q_split - 1
    else:
        noc_bytes = groups_per_tile * (kv_bytes + q_bytes + o_bytes)
        hops = 1
    noc_s = noc_bytes / chip.noc_bandwidth_bytes_per_s_per_link

    chains = pipeline_chains(
        steps=steps,
        compute_s=compute_s,
        dram_s=dram_s,
        noc_s=noc_s,
        first_load_bytes=tiles * hf * (2 * ty + tx) * head_dim * q,
        last_store_bytes=tiles * hf * tx * head_dim * q,
        transfer_latency_s=chip.dram_latency_s + hops * chip.hop_latency_s,
        chip=chip,
    )
    latency_s = chains.latency_s
    return Mapping(
        op_name=op.name,
        op_type=op.op_type.value,
        mapper="flashatten_mapper",
        latency_s=latency_s,
        compute_s=compute_s,
        dram_s=dram_s,
        noc_s=noc_s,
        utilization=min(1.0, op.flops / latency_s / chip.gemm_flops_per_s),
        flops=op.flops,
        dram_bytes=dram_bytes,
        tiling=tiling,
        bound=chains.bound,
    )


def flashatten_mapper(
    op: Op,
    chip: ChipSpec,
    *,
    tx_ty: tuple[int, int] | None = None,
    fuse_heads: bool = True,
    q_split: int | None = None,
    shuffle_seed: int | None = None,
) -> Mapping:
    """Best flash-attention tiling of ``op`` on ``chip``.

    ``tx_ty`` forces the query and key/value block rows (the reference preset was ``(256, 256)``);
    ``fuse_heads`` lets a block hold several heads; ``q_split`` forces how many tiles share one
    head group's queries (else searched); ``shuffle_seed`` permutes the candidate order
    (tests: the result must not change).

    A chip with a ``kernel_model`` (the bundled GPUs) is costed as one FlashAttention-2 kernel by
    :func:`hardware.kernel_model.gpu_flash_attention_mapping` unless ``tx_ty`` or ``q_split``
    forces the tiled search.
    """
    if op.op_type is not OpType.FLASH_ATTENTION:
        raise ValueError(f"op {op.name}: flashatten_mapper takes FlashAttention ops, got {op.op_type.value}")
    if chip.kernel_model is not None and tx_ty is None and q_split is None:
        return gpu_flash_attention_mapping(op, chip)
    batch, heads, s_q, s_kv, head_dim = attention_dims(op)
    granule = chip.gemm_granule_elements
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None

    def shuffled(items: list[int]) -> list[int]:
        if rng is not None:
            items = list(items)
            rng.shuffle(items)
        return items

    head_options = small_divisors(heads) if fuse_heads else [1]
    split_options = [s for s in tile_factors(chip.tile_count) if s <= max(1, math.ceil(s_q / granule))]
    if q_split is not None:
        split_options = [q_split]
    best: Mapping | None = None
    visited = 0
    for hf in shuffled(head_options):
        for split in shuffled(split_options):
            work = batch * (heads // hf) * split
            tiles = min(chip.tile_count, work)
            rows = math.ceil(s_q / split)
            forced_tx, forced_ty = tx_ty if tx_ty is not None else (None, None)
            for tx in shuffled(block_candidates(rows, granule, forced_tx)):
                for ty in shuffled(block_candidates(s_kv, granule, forced_ty)):
                    if _sram_bytes(tx, ty, head_dim, hf, op.bytes_per_element, chip.sram_buffering_stages) > chip.sram_bytes_per_tile:
                        continue
                    visited += 1
                    mapping = _cost(op, chip, FlashAttentionTiling(tx, ty, hf, split, tiles))
                    if best is None or (mapping.latency_s, mapping.tiling) < (best.latency_s, best.tiling):
                        best = mapping
    if best is None:
        raise MappingError(f"op {op.name}: no flash-attention tiling fits {chip.name}'s SRAM of {chip.sram_bytes_per_tile:.0f} bytes per tile")
    return replace(best, candidates_visited=visited)
