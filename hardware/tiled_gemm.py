"""A GEMM on a tiled chip of Tensix kind, predicted term by term (the ``[tiled_model]`` table).

The vendor's default ("out of box") program for two DRAM-resident operands, and the terms its
time is made of:

* **Tile granule.** Every operand is stored and computed in ``tile_edge``-square tiles: M, K and
  N are rounded up to whole tiles.
* **Wave quantisation.** The output's ``Mt x Nt`` tiles are cut into one block per core of the
  ``rows x cols`` grid (``ceil(Mt / rows) x ceil(Nt / cols)`` tiles); a block larger than SRAM
  holds is halved along its longer side, and blocks beyond the core count run in further waves.
  The slowest core sets the time, so a ragged edge costs a whole block.
* **SRAM blocking with operand reuse.** A core streams K in blocks of ``kb`` tiles (the largest
  divisor of Kt up to ``max_k_block_tiles`` whose double-buffered operand blocks and output block
  fit its SRAM). The left column of cores reads each in0 block from DRAM once and multicasts it
  along its row; the top row does the same for in1 down its column: each byte read feeds a whole
  row (column) of cores.
* **DRAM efficiency by transfer size.** A sender core's reads of one K block take that block's
  bytes over ``sender_read_efficiency`` of its NoC interface; the chip's DRAM bandwidth bounds
  all senders together; small K blocks pay the per-block handshake below on few bytes, so the
  chip reaches its DRAM bandwidth only with large blocks.
* **K-block handshake** (``k_block_sync_s``): the semaphores each multicast step costs.
* **Math fidelity.** One tile product takes ``fidelity_cycles[fidelity]`` engine cycles (LoFi 16,
  HiFi2 32, ...), or longer when the unpacker cannot stream the operands that fast: a sub-block
  of width w reads (1 + w) tiles for w products, at ``operand_bytes_per_noc_byte`` times the
  NoC interface width per cycle; plus ``tile_overhead_cycles``.
* **Dispatch** per op: ``dispatch_trace_s`` replayed from a trace, ``dispatch_s`` live.

Pure functions of the chip description; the constants' sources are in the chip file.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.spec import ChipSpec, TiledModel


@dataclass(frozen=True)
class OutputBlocks:
    """How the output tiles land on the core grid: ``block_m x block_n`` tiles per core,
    ``count`` blocks, in ``waves`` rounds over ``cores`` cores."""

    block_m: int
    block_n: int
    count: int
    waves: int
    cores: int

    @property
    def grid_share(self) -> float:
        """Share of the cores' block slots that do useful output tiles (1 = no quantisation loss)."""
        return self.count / (self.waves * self.cores)


@dataclass(frozen=True)
class TiledGemmEstimate:
    """One GEMM on a tiled chip: each named term (seconds) and the bound beside it."""

    m_tiles: int
    k_tiles: int
    n_tiles: int
    blocks: OutputBlocks
    k_block: int
    fidelity: str
    cycles_per_tile_product: float
    compute_s: float
    sender_read_s: float
    dram_s: float
    k_block_sync_s: float
    output_write_s: float
    dispatch_s: float
    seconds: float
    bound_s: float

    @property
    def bound_share(self) -> float:
        """The bound over the prediction (1 = the op runs at its bound)."""
        return self.bound_s / self.seconds


def tiles(extent: int, edge: int) -> int:
    """Whole tiles an extent occupies (the tile granule)."""
    return -(-extent // edge)


def output_blocks(m_tiles: int, n_tiles: int, rows: int, cols: int) -> OutputBlocks:
    """The default block of each core: the output rows over the grid rows, columns over columns."""
    block_m = -(-m_tiles // rows)
    block_n = -(-n_tiles // cols)
    return _blocks(m_tiles, n_tiles, block_m, block_n, rows * cols)


def _blocks(m_tiles: int, n_tiles: int, block_m: int, block_n: int, cores: int) -> OutputBlocks:
    count = -(-m_tiles // block_m) * -(-n_tiles // block_n)
    return OutputBlocks(block_m, block_n, count, -(-count // cores), cores)


def sram_footprint(block_m: int, block_n: int, k_block: int, tile_bytes: float, stages: int) -> float:
    """Bytes one core holds: ``stages`` copies of each operand's K block, and its output block."""
    return stages * (block_m + block_n) * k_block * tile_bytes + block_m * block_n * tile_bytes


def sram_blocking(blocks: OutputBlocks, m_tiles: int, n_tiles: int, k_tiles: int, tile_bytes: float,
                  sram_bytes: float, stages: int, max_k_block: int) -> tuple[OutputBlocks, int]:
    """The blocks and K block that fit a core's SRAM: the largest divisor of ``k_tiles`` up to
    ``max_k_block``; when not even one K tile fits, the block is halved along its longer side
    (more blocks, perhaps more waves). ValueError when a single output tile does not fit."""
    while True:
        for k_block in range(min(max_k_block, k_tiles), 0, -1):
            if k_tiles % k_block == 0 and sram_footprint(
                    blocks.block_m, blocks.block_n, k_block, tile_bytes, stages) <= sram_bytes:
                return blocks, k_block
        if blocks.block_m == blocks.block_n == 1:
            raise ValueError(f"one output tile and its operands ({sram_footprint(1, 1, 1, tile_bytes, stages):.0f} B) "
                             f"exceed a core's SRAM ({sram_bytes:.0f} B)")
        if blocks.block_m >= blocks.block_n:
            blocks = _blocks(m_tiles, n_tiles, -(-blocks.block_m // 2), blocks.block_n, blocks.cores)
        else:
            blocks = _blocks(m_tiles, n_tiles, blocks.block_m, -(-blocks.block_n // 2), blocks.cores)


def cycles_per_tile_product(model: TiledModel, fidelity: str, tile_bytes: float) -> float:
    """Engine cycles of one tile product: the fidelity's, or the unpacker's when it is slower."""
    width = model.subblock_width_tiles
    operand_bytes = (1 + width) / width * tile_bytes
    unpack = operand_bytes / (model.operand_bytes_per_noc_byte * model.noc_bytes_per_cycle)
    return max(dict(model.fidelity_cycles)[fidelity], unpack) + model.tile_overhead_cycles


def tiled_gemm(chip: ChipSpec, m: int, k: int, n: int, dtype: str = "bf16", *,
               fidelity: str | None = None, trace: bool = True) -> TiledGemmEstimate:
    """The predicted time of one ``(m, k) x (k, n)`` GEMM of ``dtype`` on ``chip`` (which must have
    a ``[tiled_model]``); ``fidelity`` defaults to the dtype's; ``trace``: dispatched from a trace."""
    model = chip.tiled_model
    if model is None:
        raise ValueError(f"chip {chip.name!r} has no [tiled_model] table")
    fidelity = model.fidelity_for(dtype, fidelity)
    tile_bytes = model.tile_bytes(dtype)
    mt, kt, nt = (tiles(x, model.tile_edge) for x in (m, k, n))
    first = output_blocks(mt, nt, chip.tile_grid_rows, chip.tile_grid_cols)
    blocks, kb = sram_blocking(first, mt, nt, kt, tile_bytes, chip.sram_bytes_per_tile,
                               chip.sram_buffering_stages, model.max_k_block_tiles)
    k_steps = kt // kb
    cycles = cycles_per_tile_product(model, fidelity, tile_bytes)
    port = model.noc_bytes_per_cycle * model.clock_hz * model.sender_read_efficiency
    used_rows = min(chip.tile_grid_rows, -(-mt // blocks.block_m))
    used_cols = min(chip.tile_grid_cols, -(-nt // blocks.block_n))
    compute = blocks.block_m * blocks.block_n * kb * cycles / model.clock_hz
    sender = max(blocks.block_m, blocks.block_n) * kb * tile_bytes / port
    dram = (used_rows * blocks.block_m + used_cols * blocks.block_n) * kb * tile_bytes / chip.dram_bandwidth_bytes_per_s
    write = blocks.block_m * blocks.block_n * tile_bytes / port
    dispatch = model.dispatch_trace_s if trace else model.dispatch_s
    step = max(compute, sender, dram) + model.k_block_sync_s
    seconds = blocks.waves * (k_steps * step + write) + dispatch
    peak = engine_peak_flops(chip, fidelity)
    moved = (m * k + k * n + m * n) * tile_bytes / model.tile_edge ** 2
    bound = max(2 * m * k * n / peak, moved / chip.dram_bandwidth_bytes_per_s)
    waves_steps = blocks.waves * k_steps
    return TiledGemmEstimate(
        m_tiles=mt, k_tiles=kt, n_tiles=nt, blocks=blocks, k_block=kb, fidelity=fidelity,
        cycles_per_tile_product=cycles, compute_s=waves_steps * compute, sender_read_s=waves_steps * sender,
        dram_s=waves_steps * dram, k_block_sync_s=waves_steps * model.k_block_sync_s,
        output_write_s=blocks.waves * write, dispatch_s=dispatch, seconds=seconds, bound_s=bound,
    )


def engine_peak_flops(chip: ChipSpec, fidelity: str) -> float:
    """The chip's GEMM peak at ``fidelity`` (FLOP/s): every core's engine every cycle."""
    model = chip.tiled_model
    if model is None:
        raise ValueError(f"chip {chip.name!r} has no [tiled_model] table")
    m, k, n = model.engine_shape
    lofi = min(dict(model.fidelity_cycles).values())
    return chip.tile_count * 2 * m * k * n * model.clock_hz * lofi / dict(model.fidelity_cycles)[fidelity]


__all__ = ["OutputBlocks", "TiledGemmEstimate", "cycles_per_tile_product", "engine_peak_flops", "output_blocks",
           "sram_blocking", "sram_footprint", "tiled_gemm", "tiles"]
