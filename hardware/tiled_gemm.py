"""A GEMM on a tiled chip of Tensix kind, predicted term by term (the ``[tiled_model]`` table).

The chip runs the vendor's default program for DRAM-resident operands; its time is made of:

* **Best of candidate blockings** (``blocking = "best"``; "vendor" runs the vendor's program as
  the published tables did). Each core's output block is taken as the vendor's program deals
  it, or padded up to a multiple of 2, 4 or 8 tiles (:data:`BLOCK_PADS`), each with the vendor's
  K block or the deepest that fits (:data:`MAX_K_BLOCK`); the fastest of these programs is the
  prediction (a compiler pads a block of few divisors rather than run it in one-tile-wide
  sub-blocks, and takes K blocks deep enough that partial sums are rarely reloaded).
* **Tile granule.** Operands are stored and computed in ``tile_edge``-square tiles: M, K and N are
  rounded up to whole tiles (Mt, Kt, Nt).
* **Program and wave quantisation.** The output's ``Mt x Nt`` tiles are dealt to the core grid:
  a 2D program gives each core a ``ceil(Mt / rows) x ceil(Nt / cols)`` block; a 1D program (one
  output dimension fits one core's block, or the output is narrow) gives each core all of one
  dimension and ``ceil(. / cores)`` of the other. The slowest core sets the time, so a ragged
  edge costs a whole block (:func:`output_blocks`).
* **SRAM blocking with operand reuse and multicast.** A core keeps double-buffered K blocks of
  both operands and its output block in SRAM; when they do not fit, the output block is cut
  into sub-blocks (closest to square first) and the K block shrinks, each sub-block streaming K
  again (:func:`sram_blocking`). Operand blocks are read from DRAM by sender cores and
  multicast: in a 2D program the left column's cores send in0 along their rows and the top row's
  send in1 down their columns, so each byte read feeds a whole row or column; in a 1D program
  one core sends the shared operand to all.
* **DRAM efficiency by transfer size.** A sender's reads of one K block move at
  ``sender_read_efficiency`` of its NoC interface; the DRAM bandwidth bounds all senders together.
* **Math fidelity.** A tile product takes ``fidelity_cycles[fidelity]`` engine cycles, or longer
  when the unpacker cannot stream its operands that fast: an ``h x w`` output sub-block reads
  ``h + w`` tiles for ``h * w`` products, at ``unpack_bytes_per_noc_byte[dtype]`` times the NoC
  interface width per cycle; plus ``tile_overhead_cycles``.
* **Partial-sum reload.** When K is cut into several K blocks, each output tile's partial sums
  are packed to SRAM after a K block and unpacked again before the next one:
  ``partial_reload_cycles`` per output tile per K block after the first (fewer, larger K blocks
  pay it less often).
* The chip's DRAM bandwidth bounds the whole op (operands read once, output written once).
* **Dispatch** per op: ``dispatch_trace_s`` replayed from a trace, ``dispatch_s`` live.

Pure functions of the chip description; every constant's source is in the chip file.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.kernel_mapping import KernelTiling, Mapping
from hardware.ops import Op, OpType, check_epilogue, gemm_dims
from hardware.spec import ChipSpec, TiledModel

#: Output sub-block shapes ``(h, w)`` in the order the vendor's program tries them; the first
#: that divides the block and holds at most ``max_subblock_tiles`` tiles is taken.
SUBBLOCK_ORDER = ((4, 2), (2, 4), (8, 1), (1, 8), (7, 1), (1, 7), (3, 2), (2, 3), (6, 1), (1, 6), (5, 1), (1, 5),
                  (2, 2), (4, 1), (1, 4), (3, 1), (1, 3), (2, 1), (1, 2), (1, 1))
#: The square per-core blocks (tiles) the default program tries first, largest first, to decide
#: between a 1D and a 2D program; and the K block it tries them with.
SQUARE_BLOCKS = (16, 8, 4, 2)
PROBE_K_BLOCK = 2
#: The multiples (tiles) a core's output block may be padded to; the fastest program is taken
#: (1: the vendor's block as it is). Padding replaces a block of few divisors, such as a prime
#: count of tiles, whose sub-blocks would be one tile wide.
BLOCK_PADS = (1, 2, 4, 8)
#: The deepest K block (tiles) the candidate programs try beside the vendor's: the largest
#: divisor of Kt up to this, shrunk through its divisors until the blocks fit SRAM.
MAX_K_BLOCK = 16


@dataclass(frozen=True)
class OutputBlocks:
    """How ``m_tiles x n_tiles`` output tiles land on ``cores`` cores in ``block_m x block_n``
    blocks: ``count`` blocks in ``waves`` rounds."""

    m_tiles: int
    n_tiles: int
    block_m: int
    block_n: int
    count: int
    waves: int
    cores: int

    @property
    def grid_share(self) -> float:
        """Useful output tiles over the tiles the cores' block slots could hold (1 = no loss)."""
        return self.m_tiles * self.n_tiles / (self.waves * self.cores * self.block_m * self.block_n)


@dataclass(frozen=True)
class TiledProgram:
    """The program a GEMM runs: ``kind`` ("2d", "1d_in0": in0 multicast to all, "1d_in1"), each
    core's output block, the sub-block it computes at a time (``out_block``), the K block, the
    engine sub-block ``subblock`` and the cores used."""

    kind: str
    blocks: OutputBlocks
    out_block_m: int
    out_block_n: int
    k_block: int
    subblock: tuple[int, int]

    @property
    def out_blocks_per_core(self) -> int:
        return -(-self.blocks.block_m // self.out_block_m) * -(-self.blocks.block_n // self.out_block_n)


@dataclass(frozen=True)
class TiledGemmEstimate:
    """One GEMM on a tiled chip: its program, each named term (seconds) and the bound beside it."""

    m_tiles: int
    k_tiles: int
    n_tiles: int
    program: TiledProgram
    fidelity: str
    cycles_per_tile_product: float
    compute_s: float
    sender_read_s: float
    dram_s: float
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


def output_blocks(m_tiles: int, n_tiles: int, block_m: int, block_n: int, cores: int) -> OutputBlocks:
    """``block_m x block_n`` blocks over the output, dealt to ``cores`` cores in waves."""
    count = -(-m_tiles // block_m) * -(-n_tiles // block_n)
    return OutputBlocks(m_tiles, n_tiles, block_m, block_n, count, -(-count // cores), cores)


def sram_footprint(block_m: int, block_n: int, k_block: int, tile_bytes: float, stages: int) -> float:
    """Bytes one core holds: ``stages`` copies of each operand's K block, and its output block."""
    return stages * (block_m + block_n) * k_block * tile_bytes + block_m * block_n * tile_bytes


def _factors(count: int) -> list[int]:
    return [count, 1] + [d for d in range(count // 2, 1, -1) if count % d == 0]


def sram_blocking(block_m: int, block_n: int, k_block: int, fits, *, shrink_k: bool) -> tuple[int, int, int]:
    """``(out_block_m, out_block_n, k_block)``: the whole block when ``fits(m, n, k)``, else the
    largest sub-block (closest to square among equal areas) that divides it and fits, trying K
    blocks from ``k_block`` down through its divisors when ``shrink_k``; ``(1, 1, 1)`` at worst."""
    if fits(block_m, block_n, k_block):
        return block_m, block_n, k_block
    by_area: dict[int, tuple[int, int]] = {}
    for m in _factors(block_m):
        for n in _factors(block_n):
            kept = by_area.get(m * n)
            if kept is None or max(m, n) / min(m, n) <= max(kept) / min(kept):
                by_area[m * n] = (m, n)
    k_choices = [k for k in range(k_block, 0, -1) if k_block % k == 0] if shrink_k else [k_block]
    for k in k_choices:
        for area in sorted(by_area, reverse=True):
            m, n = by_area[area]
            if fits(m, n, k):
                return m, n, k
    return 1, 1, 1


def engine_subblock(block_m: int, block_n: int, max_tiles: int) -> tuple[int, int]:
    """The output sub-block the engine accumulates in its destination registers."""
    for h, w in SUBBLOCK_ORDER:
        if h * w <= max_tiles and block_m % h == 0 and block_n % w == 0:
            return h, w
    return 1, 1


def default_program(chip: ChipSpec, m_tiles: int, k_tiles: int, n_tiles: int, tile_bytes: float,
                    pad: int = 1, deep_k: bool = False) -> TiledProgram:
    """The vendor's default program for DRAM-resident operands on ``chip``'s grid; ``pad`` > 1
    rounds each core's output block up to a multiple of ``pad`` tiles (padding, as a compiler does
    when a block has no good divisors, e.g. a prime count of tiles); ``deep_k`` starts from the
    deepest K block up to :data:`MAX_K_BLOCK` tiles instead of the vendor's."""
    model = _model(chip)
    rows, cols = chip.tile_grid_rows, chip.tile_grid_cols
    cores = rows * cols
    budget = chip.sram_bytes_per_tile - model.sram_reserved_bytes
    stages = chip.sram_buffering_stages

    def fits(m: int, n: int, k: int) -> bool:
        return sram_footprint(m, n, k, tile_bytes, stages) <= budget

    if not fits(1, 1, 1):
        raise ValueError(f"no tiling fits {chip.name}: one output tile and a K tile of each operand "
                         f"({sram_footprint(1, 1, 1, tile_bytes, stages):.0f} B) exceed a core's SRAM "
                         f"less its reserve ({budget:.0f} B)")

    square = next((s for s in SQUARE_BLOCKS if fits(s, s, PROBE_K_BLOCK)), 1)
    blocks_m, blocks_n = -(-m_tiles // square), -(-n_tiles // square)
    one_range = not (blocks_m == blocks_n == 1) and blocks_m <= rows and blocks_n <= cols
    narrow = max(m_tiles, n_tiles) > model.narrow_ratio * min(m_tiles, n_tiles) or min(m_tiles, n_tiles) == 1
    k_1d = 2 if k_tiles % 2 == 0 else 1
    if (narrow and n_tiles > m_tiles) or (one_range and blocks_m == 1):
        kind, blocks = "1d_in0", output_blocks(m_tiles, n_tiles, m_tiles, -(-n_tiles // cores), cores)
    elif narrow or (one_range and blocks_n == 1):
        kind, blocks = "1d_in1", output_blocks(m_tiles, n_tiles, -(-m_tiles // cores), n_tiles, cores)
    else:
        kind, blocks = "2d", output_blocks(m_tiles, n_tiles, -(-m_tiles // rows), -(-n_tiles // cols), cores)
    if pad > 1:
        blocks = output_blocks(m_tiles, n_tiles, -(-blocks.block_m // pad) * pad, -(-blocks.block_n // pad) * pad,
                               cores)
    k_block = (k_tiles // cols if k_tiles % cols == 0 else 1) if kind == "2d" else k_1d
    if deep_k:
        k_block = max(d for d in range(1, min(k_tiles, MAX_K_BLOCK) + 1) if k_tiles % d == 0)
    out_m, out_n, k_block = sram_blocking(blocks.block_m, blocks.block_n, k_block, fits,
                                          shrink_k=kind == "2d" or deep_k)
    return TiledProgram(kind, blocks, out_m, out_n, k_block, engine_subblock(out_m, out_n, model.max_subblock_tiles))


def cycles_per_tile_product(model: TiledModel, fidelity: str, dtype: str, subblock: tuple[int, int]) -> float:
    """Engine cycles of one tile product: the fidelity's, or the unpacker's when it is slower."""
    h, w = subblock
    operand_bytes = (h + w) / (h * w) * model.tile_bytes(dtype)
    unpack = operand_bytes / (dict(model.unpack_bytes_per_noc_byte)[dtype] * model.noc_bytes_per_cycle)
    return max(dict(model.fidelity_cycles)[fidelity], unpack) + model.tile_overhead_cycles


def _model(chip: ChipSpec) -> TiledModel:
    if chip.tiled_model is None:
        raise ValueError(f"chip {chip.name!r} has no [tiled_model] table")
    return chip.tiled_model


def _sender_and_dram_bytes(chip: ChipSpec, program: TiledProgram, tile_bytes: float) -> tuple[float, float]:
    """Bytes the busiest sender reads, and the chip reads from DRAM, per K block."""
    blocks, k = program.blocks, program.k_block
    a, b = program.out_block_m * k * tile_bytes, program.out_block_n * k * tile_bytes
    used_m = min(-(-blocks.m_tiles // blocks.block_m), chip.tile_grid_rows if program.kind == "2d" else blocks.cores)
    used_n = min(-(-blocks.n_tiles // blocks.block_n), chip.tile_grid_cols if program.kind == "2d" else blocks.cores)
    if program.kind == "2d":
        return max(a, b), used_m * a + used_n * b
    if program.kind == "1d_in0":
        return a + b, a + used_n * b
    return a + b, used_m * a + b


def tiled_gemm(chip: ChipSpec, m: int, k: int, n: int, dtype: str = "bf16", *,
               fidelity: str | None = None, trace: bool = True) -> TiledGemmEstimate:
    """The predicted time of one ``(m, k) x (k, n)`` GEMM of ``dtype`` on ``chip`` (which must have
    a ``[tiled_model]``), under its model's ``blocking`` (the vendor's program, or the fastest
    candidate);
    ``fidelity`` defaults to the dtype's; ``trace``: dispatched from a trace."""
    model = _model(chip)
    fidelity = model.fidelity_for(dtype, fidelity)
    tile_bytes = model.tile_bytes(dtype)
    mt, kt, nt = (tiles(x, model.tile_edge) for x in (m, k, n))
    candidates = [(1, False)]
    if model.blocking == "best":
        candidates = [(pad, deep) for pad in BLOCK_PADS for deep in (False, True)]
    return min((_estimate(chip, m, k, n, dtype, fidelity, default_program(chip, mt, kt, nt, tile_bytes, pad, deep), trace)
                for pad, deep in candidates), key=lambda estimate: estimate.seconds)


def _estimate(chip: ChipSpec, m: int, k: int, n: int, dtype: str, fidelity: str, program: TiledProgram,
              trace: bool) -> TiledGemmEstimate:
    """One GEMM's time under ``program``."""
    model = _model(chip)
    tile_bytes = model.tile_bytes(dtype)
    mt, kt, nt = (tiles(x, model.tile_edge) for x in (m, k, n))
    cycles = cycles_per_tile_product(model, fidelity, dtype, program.subblock)
    port = model.noc_bytes_per_cycle * model.clock_hz * model.sender_read_efficiency
    sender_bytes, dram_bytes = _sender_and_dram_bytes(chip, program, tile_bytes)
    k_blocks = kt // program.k_block
    reload = model.partial_reload_cycles * (k_blocks - 1) / k_blocks
    compute = program.out_block_m * program.out_block_n * (program.k_block * cycles + reload) / model.clock_hz
    sender = sender_bytes / port
    dram = dram_bytes / chip.dram_bandwidth_bytes_per_s
    write = program.out_block_m * program.out_block_n * tile_bytes / port
    steps = program.out_blocks_per_core * k_blocks * program.blocks.waves
    dispatch = model.dispatch_trace_s if trace else model.dispatch_s
    moved = (m * k + k * n + m * n) * tile_bytes / model.tile_edge ** 2
    memory_bound = moved / chip.dram_bandwidth_bytes_per_s
    bound = max(2 * m * k * n / engine_peak_flops(chip, fidelity), memory_bound)
    device = steps * max(compute, sender, dram) + program.out_blocks_per_core * program.blocks.waves * write
    seconds = max(device, memory_bound) + dispatch
    return TiledGemmEstimate(
        m_tiles=mt, k_tiles=kt, n_tiles=nt, program=program, fidelity=fidelity, cycles_per_tile_product=cycles,
        compute_s=steps * compute, sender_read_s=steps * sender, dram_s=steps * dram,
        output_write_s=program.out_blocks_per_core * program.blocks.waves * write, dispatch_s=dispatch,
        seconds=seconds, bound_s=bound,
    )


def engine_peak_flops(chip: ChipSpec, fidelity: str) -> float:
    """The chip's GEMM peak at ``fidelity`` (FLOP/s): every core's engine every cycle."""
    model = _model(chip)
    return chip.tile_count * model.clock_hz * model.flops_per_cycle(fidelity)


#: The dtype a GEMM of so many bytes per element runs as on a tiled chip.
DTYPE_OF_BYTES = {4: "fp32", 2: "bf16", 1: "bfp8"}


def tiled_gemm_mapping(op: Op, chip: ChipSpec, *, epilogue: Op | None = None, trace: bool = True) -> Mapping:
    """GEMM ``op`` on ``chip`` as :func:`tiled_gemm` predicts it, as a :class:`Mapping`. A batched
    GEMM runs its instances one after another in one dispatch; an epilogue (GELU, SiLU) is applied
    by the packer as the output tiles leave the engine, at no extra time."""
    if op.op_type is not OpType.GEMM:
        raise ValueError(f"op {op.name}: tiled_gemm_mapping takes GEMM ops, got {op.op_type.value}")
    dtype = DTYPE_OF_BYTES.get(op.bytes_per_element)
    if dtype is None:
        raise ValueError(f"op {op.name}: no dtype of {op.bytes_per_element} bytes per element on {chip.name}")
    name = op.name
    if epilogue is not None:
        check_epilogue(op, epilogue)
        name = f"{op.name}+{epilogue.name}"
    m, k, n = gemm_dims(op)
    one = tiled_gemm(chip, m, k, n, dtype, trace=trace)
    device = one.seconds - one.dispatch_s
    latency = op.batch * device + one.dispatch_s
    terms = {"compute": one.compute_s, "dram": max(one.dram_s, one.sender_read_s), "dispatch": one.dispatch_s}
    peak = engine_peak_flops(chip, one.fidelity)
    program = one.program
    edge = _model(chip).tile_edge
    return Mapping(
        op_name=name, op_type=OpType.GEMM.value, mapper="tiled_gemm", latency_s=latency,
        compute_s=op.batch * one.compute_s, dram_s=op.batch * one.dram_s, noc_s=op.batch * one.sender_read_s,
        utilization=op.flops / latency / peak if latency > 0 else 0.0, flops=op.flops,
        dram_bytes=op.batch * (m * k + k * n + m * n) * op.bytes_per_element,
        tiling=KernelTiling(kernel=f"tiled_{program.kind}", tile_m=program.out_block_m * edge,
                            tile_n=program.out_block_n * edge, waves=program.blocks.waves, head_dim=0),
        bound=max(terms, key=lambda name: terms[name]),
    )

