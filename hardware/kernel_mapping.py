"""Mapping results and the pipelined-execution cost model shared by all mappers.

Execution model (one chip). A mapper cuts an op into ``steps`` equal blocks per tile. Each tile
loads block i+1 while it computes block i (``sram_buffering_stages - 1`` loads may be in flight).
The latency is the longest of four *chains*, each a resource that must do all its work in
sequence plus the parts that cannot overlap it:

* compute chain  = fill + compute_s + drain
  (the first load must arrive before any compute; the last store follows the last compute)
* DRAM chain     = transfer_latency + dram_s + compute_step + dram_latency
  (every byte crosses the chip's one DRAM interface; the last block still has to compute
  between its load and its store)
* NoC chain      = transfer_latency + noc_s + compute_step + drain
* latency chain  = steps * transfer_latency / (stages - 1) + compute_step + drain
  (with S-1 loads in flight a step cannot be shorter than 1/(S-1) of a load's latency)

with ``fill = transfer_latency + first_load_bytes / dram_bandwidth`` and
``drain = dram_latency + last_store_bytes / dram_bandwidth``; ``transfer_latency`` is the DRAM
latency plus the NoC hops a forwarded block crosses. The chain that is longest names the
``bound`` of the mapping. The model is deliberately a bound model (no cycle simulation): every
term has a closed form, so a test can derive the latency by hand and a search can bound it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.spec import ChipSpec

__all__ = ["ChainTimes", "FlashAttentionTiling", "GemmTiling", "KernelTiling", "Mapping", "Tiling", "VectorTiling",
           "chain_seconds", "pipeline_chains"]


@dataclass(frozen=True, order=True)
class GemmTiling:
    """Placement ``pm x pn x pk`` tiles (M, N, K split across tiles) and per-tile blocks ``tm, tk, tn``;
    a batched GEMM's instances split over ``pb`` such groups of tiles (1 for a single GEMM).

    ``loop_order`` ``"mnk"``: for each M block, for each N block, accumulate over K (an A block
    stays in SRAM across the N loop when K fits one block); ``"nmk"``: the same with M and N swapped.
    A tile runs its instances one after another, each with this loop.
    """

    pm: int
    pn: int
    pk: int
    tm: int
    tk: int
    tn: int
    loop_order: str
    pb: int = 1

    @property
    def tiles(self) -> int:
        return self.pb * self.pm * self.pn * self.pk


@dataclass(frozen=True, order=True)
class VectorTiling:
    """``tiles`` tiles each take ``rows_per_tile`` rows, processed ``chunk_rows`` at a time."""

    tiles: int
    rows_per_tile: int
    chunk_rows: int


@dataclass(frozen=True, order=True)
class FlashAttentionTiling:
    """Blocks of ``tx`` query rows and ``ty`` key/value rows over ``heads_per_block`` fused heads.

    ``q_split`` tiles share one (batch, head group) by splitting its query rows (the K/V blocks are
    read once from DRAM and forwarded over the NoC to those tiles).
    """

    tx: int
    ty: int
    heads_per_block: int
    q_split: int
    tiles: int


@dataclass(frozen=True, order=True)
class KernelTiling:
    """How the GPU kernel model (:mod:`hardware.kernel_model`) ran an op as one library kernel.

    ``kernel``: ``gemm``, ``vector`` or ``flash_attention``. GEMM: the output tile
    ``tile_m x tile_n`` of one CTA and the ``waves`` of CTAs over the SMs. Flash attention:
    ``head_dim`` of the kernel instance that ran it (the op's head dim rounded up to an
    instantiated one). Unused fields are 0.
    """

    kernel: str
    tile_m: int
    tile_n: int
    waves: int
    head_dim: int


Tiling = GemmTiling | VectorTiling | FlashAttentionTiling | KernelTiling


@dataclass(frozen=True)
class Mapping:
    """Result of mapping one op onto one chip.

    ``utilization`` is achieved FLOP/s over the chip's peak for the op's own unit (GEMM peak for
    GEMM and FlashAttention ops, counting their matrix FLOPs; vector peak for Vector ops).
    ``compute_s``, ``dram_s`` and ``noc_s`` are the busy times of each resource (they overlap);
    ``latency_s`` is the critical chain (see the module docstring); ``bound`` names it.
    """

    op_name: str
    op_type: str
    mapper: str
    latency_s: float
    compute_s: float
    dram_s: float
    noc_s: float
    utilization: float
    flops: int
    dram_bytes: float
    tiling: Tiling
    bound: str
    candidates_visited: int = 0

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.latency_s if self.latency_s > 0 else 0.0


@dataclass(frozen=True)
class ChainTimes:
    compute_chain_s: float
    dram_chain_s: float
    noc_chain_s: float
    latency_chain_s: float

    @property
    def latency_s(self) -> float:
        return max(self.compute_chain_s, self.dram_chain_s, self.noc_chain_s, self.latency_chain_s)

    @property
    def bound(self) -> str:
        chains = {
            "compute": self.compute_chain_s,
            "dram": self.dram_chain_s,
            "noc": self.noc_chain_s,
            "latency": self.latency_chain_s,
        }
        return max(chains, key=lambda name: chains[name])


def pipeline_chains(
    *,
    steps: int,
    compute_s: float,
    dram_s: float,
    noc_s: float,
    first_load_bytes: float,
    last_store_bytes: float,
    transfer_latency_s: float,
    chip: ChipSpec,
) -> ChainTimes:
    """The four chains of the module docstring for ``steps`` equal pipelined steps on ``chip``
    (its DRAM latency and bandwidth, and how many SRAM buffers overlap transfers)."""
    return ChainTimes(*chain_seconds(steps, compute_s, dram_s, noc_s, first_load_bytes,
                                     last_store_bytes, transfer_latency_s, chip))


def chain_seconds(steps: int, compute_s: float, dram_s: float, noc_s: float, first_load_bytes: float,
                  last_store_bytes: float, transfer_latency_s: float,
                  chip: ChipSpec) -> tuple[float, float, float, float]:
    """:func:`pipeline_chains` as a plain tuple (compute, DRAM, NoC, latency chain), for a search
    that costs thousands of candidates and makes a :class:`ChainTimes` of the winner only."""
    dram_latency_s = chip.dram_latency_s
    dram_bandwidth_bytes_per_s = chip.dram_bandwidth_bytes_per_s
    buffering_stages = chip.sram_buffering_stages
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    compute_step_s = compute_s / steps
    fill_s = transfer_latency_s + first_load_bytes / dram_bandwidth_bytes_per_s
    drain_s = dram_latency_s + last_store_bytes / dram_bandwidth_bytes_per_s
    return (fill_s + compute_s + drain_s,
            transfer_latency_s + dram_s + compute_step_s + dram_latency_s,
            transfer_latency_s + noc_s + compute_step_s + drain_s,
            steps * transfer_latency_s / (buffering_stages - 1) + compute_step_s + drain_s)
