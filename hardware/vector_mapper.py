"""``vector_mapper``: element-wise and row-reduction ops split along the sequence across tiles.

The op's output rows (all leading dims: batch x sequence) are dealt to
``tiles = min(tile_count, rows)`` tiles in equal contiguous slices of ``ceil(rows / tiles)`` rows
(every tile is charged the largest slice). A tile streams its slice through SRAM ``chunk_rows``
rows at a time, multi-buffered (:mod:`hardware.kernel_mapping`). The vector unit does
``flops / rows`` operations per row; every activation row is read from DRAM once and every
output row written once; the weight (scale/shift/gate vectors) is read once and forwarded to the
other tiles over the NoC. A vector op therefore runs at
``min(vector throughput, DRAM bandwidth / bytes per operation)``: on TX8 a bf16 op with a few
operations per element is DRAM bound by a wide margin (1 TOPS vector vs 100 GB/s DRAM).

The chunk size is searched over powers of two up to the slice (and the slice itself) under the
SRAM limit; ties go to the smaller chunk, so the result does not depend on the search order.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hardware.kernel_mapping import Mapping, VectorTiling, pipeline_chains
from hardware.kernel_model import gpu_vector_mapping
from hardware.ops import Op, OpType
from hardware.spec import ChipSpec

__all__ = ["MappingError", "vector_mapper"]


class MappingError(ValueError):
    """No tiling of the op fits the hardware (e.g. one row, or a forced block, exceeds SRAM)."""


def _chunk_candidates(rows_per_tile: int) -> list[int]:
    sizes = {rows_per_tile}
    size = 1
    while size < rows_per_tile:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def _vector_cost(op: Op, chip: ChipSpec, rows: int, tiles: int, chunk_rows: int) -> Mapping:
    q = op.bytes_per_element
    row_length = op.output_shape[-1]
    rows_per_tile = math.ceil(rows / tiles)
    chunks = math.ceil(rows_per_tile / chunk_rows)
    in_bytes_per_row = op.input_elements / rows * q
    out_bytes_per_row = row_length * q
    weight_bytes = op.weight_elements * q
    ops_per_row = op.flops / rows

    compute_s = ops_per_row * rows_per_tile / chip.vector_flops_per_s_per_tile
    dram_bytes = tiles * rows_per_tile * (in_bytes_per_row + out_bytes_per_row) + weight_bytes
    dram_s = dram_bytes / chip.dram_bandwidth_bytes_per_s
    # The weight is read once and forwarded tile to tile along a chain of all used tiles.
    forwards_weight = tiles > 1 and weight_bytes > 0
    noc_s = weight_bytes / chip.noc_bandwidth_bytes_per_s_per_link if forwards_weight else 0.0
    chains = pipeline_chains(
        steps=chunks,
        compute_s=compute_s,
        dram_s=dram_s,
        noc_s=noc_s,
        first_load_bytes=tiles * chunk_rows * in_bytes_per_row + weight_bytes,
        last_store_bytes=tiles * chunk_rows * out_bytes_per_row,
        transfer_latency_s=chip.dram_latency_s,
        chip=chip,
    )
    latency_s = chains.latency_s
    return Mapping(
        op_name=op.name,
        op_type=op.op_type.value,
        mapper="vector_mapper",
        latency_s=latency_s,
        compute_s=compute_s,
        dram_s=dram_s,
        noc_s=noc_s,
        utilization=min(1.0, op.flops / latency_s / (chip.vector_flops_per_s_per_tile * chip.tile_count)),
        flops=op.flops,
        dram_bytes=dram_bytes,
        tiling=VectorTiling(tiles=tiles, rows_per_tile=rows_per_tile, chunk_rows=chunk_rows),
        bound=chains.bound,
    )


def vector_mapper(op: Op, chip: ChipSpec, *, chunk_rows: int | None = None) -> Mapping:
    """Map a Vector op on ``chip``; ``chunk_rows`` forces the rows per SRAM chunk (else searched).

    A chip with a ``kernel_model`` (the bundled GPUs) is costed as one memory-bound kernel by
    :func:`hardware.kernel_model.gpu_vector_mapping` unless ``chunk_rows`` is given.
    """
    if op.op_type is not OpType.VECTOR:
        raise ValueError(f"op {op.name}: vector_mapper takes Vector ops, got {op.op_type.value}")
    if op.flops <= 0:
        raise ValueError(f"op {op.name}: a vector op needs a positive operation count")
    if chip.kernel_model is not None and chunk_rows is None:
        return gpu_vector_mapping(op, chip)
    rows = math.prod(op.output_shape[:-1])
    tiles = min(chip.tile_count, rows)
    rows_per_tile = math.ceil(rows / tiles)
    q = op.bytes_per_element
    row_bytes = (op.input_elements / rows + op.output_shape[-1]) * q
    weight_bytes = op.weight_elements * q

    def fits(chunk: int) -> bool:
        return chip.sram_buffering_stages * chunk * row_bytes + weight_bytes <= chip.sram_bytes_per_tile

    candidates = [min(chunk_rows, rows_per_tile)] if chunk_rows is not None else _chunk_candidates(rows_per_tile)
    best: Mapping | None = None
    visited = 0
    for chunk in candidates:
        if chunk < 1 or not fits(chunk):
            continue
        visited += 1
        mapping = _vector_cost(op, chip, rows, tiles, chunk)
        if best is None or (mapping.latency_s, mapping.tiling) < (best.latency_s, best.tiling):
            best = mapping
    if best is None:
        raise MappingError(
            f"op {op.name}: no chunk of rows fits {chip.name}'s {chip.sram_bytes_per_tile:.0f}-byte SRAM "
            f"(a row needs {chip.sram_buffering_stages * row_bytes:.0f} bytes buffered)"
        )
    return replace(best, candidates_visited=visited)
