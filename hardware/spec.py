"""Hardware descriptions: TOML data files -> frozen dataclasses with units in the field names.

Two kinds of file live in ``hardware/data/`` (and may be given by path):

* ``kind = "chip"``: one accelerator, modelled as a grid of *tiles* (TX8: 16 tiles on a 4x4 NoC;
  a GPU: its streaming multiprocessors) that share one DRAM. -> :class:`ChipSpec`
* ``kind = "system"``: several identical chips joined by a chip-to-chip network of a named
  topology. -> :class:`SystemSpec`

TOML keys are unit-free (``dram_bandwidth``) and their values carry the unit (``"100 GB/s"``,
see :mod:`hardware.units` for the decimal/binary convention); the dataclass fields carry the
unit in their names (``dram_bandwidth_bytes_per_s``) and hold base units. Every problem with a
file (unreadable, missing field, unknown field, unknown unit, negative or zero bandwidth, ...)
raises :class:`hlo_trace.errors.InputFileError` with one line naming the file and the field.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hardware.nccl import NcclTable, load_nccl_table
from hardware.units import Dimension, parse_quantity
from hlo_trace.documents import load_toml
from hlo_trace.errors import InputFileError, shown

__all__ = [
    "COLLECTIVE_ALGORITHMS",
    "NOC_TOPOLOGIES",
    "SYSTEM_TOPOLOGIES",
    "INTER_NODE_SWITCHES",
    "ChipSpec",
    "HardwareSpec",
    "InterNodeNetwork",
    "KernelModel",
    "SystemSpec",
    "as_system",
    "bundled_hardware_names",
    "flash_kernel_head_dim",
    "load_chip",
    "load_hardware",
    "load_system",
    "one_node_system_chip",
]

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"

#: ``mesh``: tiles joined to their 4 neighbours; operands read from DRAM once per sharing group
#: are forwarded tile to tile (multicast), each tile receiving its A and B streams on separate
#: links. ``crossbar``: every tile reads its operands through its own port of a shared cache
#: (a GPU SM and its L2 slice port); no forwarding, so A and B share that one port.
NOC_TOPOLOGIES = ("mesh", "crossbar")
#: Chip-to-chip topologies understood by :func:`hardware.collectives.hop_distance`.
SYSTEM_TOPOLOGIES = ("mesh2d", "torus2d", "ring", "switch")
#: Collective algorithms of :mod:`hardware.collectives` (``collective_algorithm`` of a system):
#: ``ring`` (unidirectional), ``bidirectional_ring`` (half the bytes each way round),
#: ``per_dimension`` (row rings then column rings of a 2-D grid), ``switch`` (every chip has one
#: port of ``link_bandwidth`` each way into a non-blocking switch, e.g. NVSwitch).
COLLECTIVE_ALGORITHMS = ("ring", "bidirectional_ring", "per_dimension", "switch")
#: Switch fabrics between the nodes of a multi-node system (``[inter_node] switch``):
#: ``rail_optimized``: NIC i of every node hangs on rail switch i, so traffic between the same
#: local rank of two nodes crosses one leaf at the NIC's full rate; traffic to another rail is
#: first moved over the node's own network to the chip on the destination's rail (NCCL's PXN).
#: ``fat_tree``: every NIC into a two-level fat tree whose leaf uplinks are ``oversubscription``
#: times fewer than its downlinks: inter-node traffic runs at ``nic_bandwidth / oversubscription``.
INTER_NODE_SWITCHES = ("rail_optimized", "fat_tree")
#: Algorithms each topology allows; the first is the default when a file names none.
_ALGORITHMS_BY_TOPOLOGY = {
    "switch": ("switch",),
    "ring": ("ring", "bidirectional_ring"),
    "mesh2d": ("ring", "bidirectional_ring", "per_dimension"),
    "torus2d": ("ring", "bidirectional_ring", "per_dimension"),
}


#: The classes of PyTorch's eager memory-bound kernels (``analyze-hlo --exec torch`` names each
#: such kernel after one). Every GPU description gives each its own efficiency, with its provenance
#: (``[kernel_model.vector_efficiency]``, ``[kernel_model.provenance]``): there is no fallback.
#: ``layer_norm``, ``softmax``, ``gelu``: the library's kernels; ``elementwise``: a same-shape
#: contiguous element-wise kernel; ``copy``: a permuted copy (an einops rearrange);
#: ``broadcast``: an element-wise kernel reading a tensor broadcast along an axis (TensorIterator's
#: strided path); ``select``: ``torch.where`` with a broadcast mask; ``reduction``: a row
#: reduction (a mean over the head dim); ``widening_cast``: a cast to a wider type; ``strided``: an
#: element-wise kernel whose full-size inputs lie in different layouts (the official STDiT3's
#: residual stream keeps the channel-major layout of its patch embedding); ``transpose_copy``: the
#: copy that makes such a tensor contiguous for a library call that needs contiguous rows;
#: ``group_norm``: nn.GroupNorm's kernel (OpenSora's VAE); ``layout_transpose``: the NCHW <-> NHWC
#: transposes cuDNN runs around a convolution.
MEMORY_KERNEL_CLASSES = ("layer_norm", "softmax", "gelu", "elementwise", "copy", "broadcast", "select", "reduction",
                         "widening_cast", "strided", "transpose_copy", "group_norm", "layout_transpose")
#: Memory-bound classes whose efficiency depends on the row length (``[kernel_model.row_efficiency]``):
#: a row reduction's input elements over its output elements, else the output's last dim.
ROW_KERNEL_CLASSES = ("layer_norm", "softmax", "reduction")


@dataclass(frozen=True)
class KernelModel:
    """Achieved-efficiency constants of one GPU, the ``[kernel_model]`` table of its chip file
    (what they mean: :mod:`hardware.kernel_model`; their sources: the TOML file)."""

    kernel_overhead_s: float
    gemm_cta_tiles: tuple[tuple[int, int], ...]
    gemm_mma_efficiency: float
    gemm_k_overhead_elements: int
    hbm_efficiency: float
    flash_head_dims: tuple[int, ...]
    flash_efficiency: tuple[float, ...]
    #: HBM efficiency of memory-bound kernels by kernel class, one for each of
    #: :data:`MEMORY_KERNEL_CLASSES` (the loader refuses a table that misses one); ``hbm_efficiency``
    #: is that of a kernel of no class (an XLA fusion in the ``fused`` and ``eager`` modes).
    vector_efficiency: tuple[tuple[str, float], ...] = ()
    #: Keys a fused attention kernel's per-query-tile cost amounts to besides its key loop (the
    #: tile's Q load, softmax rescale and output write): a kernel attending to ``s_kv`` keys runs
    #: at ``flash_efficiency * s_kv / (s_kv + flash_kv_overhead)`` (0: no such cost).
    flash_kv_overhead: int = 0
    #: PyTorch's GroupNorm first computes each (sample, group)'s mean and variance in one thread
    #: block (``RowwiseMomentsCUDAKernel``), which streams its row at about this rate; with few
    #: rows (32 groups of one sample) that pass, not the bandwidth, sets the time. The kernel
    #: then applies the norm in an element-wise pass at ``vector_efficiency["group_norm"]``
    #: (0: a GroupNorm is one pass like any other class).
    group_norm_row_bandwidth_bytes_per_s: float = 0.0
    #: The shortest time a kernel takes in an eager stream: the host's dispatch interval of one
    #: PyTorch call (a tiny kernel's launches back to back), 0 for none.
    launch_floor_s: float = 0.0
    #: Efficiency by row length for the :data:`ROW_KERNEL_CLASSES` that list one:
    #: ``(class, ((row length, efficiency), ...))``, interpolated linearly in log(row length)
    #: and held at the ends.
    row_efficiency: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    #: Where each constant comes from, by kernel class (and ``gemm``, ``flash_attention``,
    #: ``kernel_overhead``): a measurement's file, a public table, or a transfer rule.
    provenance: tuple[tuple[str, str], ...] = ()

    def hbm_efficiency_for(self, kernel_class: str, row_length: int | None = None) -> float:
        """The HBM efficiency of a memory-bound kernel of ``kernel_class`` (a name that is no class:
        ``hbm_efficiency``); ``row_length`` refines it where the class has a row curve."""
        curve = dict(self.row_efficiency).get(kernel_class)
        if curve and row_length:
            return interpolate_log(curve, row_length)
        table = dict(self.vector_efficiency)
        if kernel_class in table:
            return table[kernel_class]
        if kernel_class in MEMORY_KERNEL_CLASSES:
            raise ValueError(f"kernel class {kernel_class!r} has no efficiency in this chip's [kernel_model]")
        return self.hbm_efficiency

    def provenance_of(self, name: str) -> str:
        """Where the constants of kernel class ``name`` come from ('' when the file says nothing)."""
        return dict(self.provenance).get(name, "")

    def flash_efficiency_for(self, head_dim: int, s_kv: int | None = None) -> tuple[int, float]:
        """``(kernel head dim, efficiency)`` of the kernel that runs ``head_dim`` over ``s_kv``
        keys (None: the kernel's efficiency over long sequences)."""
        kernel = flash_kernel_head_dim(head_dim, self.flash_head_dims)
        efficiency = self.flash_efficiency[self.flash_head_dims.index(kernel)]
        if s_kv is not None:
            efficiency *= s_kv / (s_kv + self.flash_kv_overhead)
        return kernel, efficiency


def interpolate_log(points: tuple[tuple[int, float], ...], x: float) -> float:
    """The value at ``x`` of the curve through ``points`` (sorted by x), linear in log(x), held
    at both ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            share = math.log(x / x0) / math.log(x1 / x0)
            return y0 + share * (y1 - y0)
    return points[-1][1]


def flash_kernel_head_dim(head_dim: int, kernel_head_dims: tuple[int, ...]) -> int:
    """The smallest instantiated kernel head dim >= ``head_dim`` (ValueError if none)."""
    wider = [d for d in kernel_head_dims if d >= head_dim]
    if not wider:
        raise ValueError(f"head dim {head_dim} exceeds every flash-attention kernel ({', '.join(map(str, kernel_head_dims))})")
    return min(wider)


@dataclass(frozen=True)
class TiledModel:
    """How a tiled chip with a published per-op record (Tenstorrent's Tensix chips) runs a GEMM:
    the ``[tiled_model]`` table of its chip file. What each term means: :mod:`hardware.tiled_gemm`;
    where each value comes from: ``provenance`` and docs/sources.md."""

    #: Edge of the square tile every operand is stored and computed in (elements).
    tile_edge: int
    #: One engine step multiplies ``(m, k) x (k, n)`` (elements): the finest shape it computes.
    engine_shape: tuple[int, int, int]
    clock_hz: float
    #: Bytes one core's NoC port moves per cycle (the interface width).
    noc_bytes_per_cycle: float
    #: Engine cycles one tile product (tile_edge^3 multiply-adds) takes, by math fidelity.
    fidelity_cycles: tuple[tuple[str, int], ...]
    #: The fidelity a dtype runs at unless the user says otherwise (the vendor's default).
    default_fidelity: tuple[tuple[str, str], ...]
    #: Bytes per element of each data format (block floats: mantissas plus the shared exponents).
    bytes_per_element: tuple[tuple[str, float], ...]
    #: SRAM of a core the program cannot use (firmware, kernel binaries, runtime buffers).
    sram_reserved_bytes: float
    #: Most output tiles the engine accumulates at once (its destination registers).
    max_subblock_tiles: int
    #: "vendor": the vendor's default program as it deals the blocks (what the published tables
    #: ran); "best": the fastest of candidate blockings (padded blocks, deeper K blocks), as a
    #: compiler choosing its own blocking runs (:data:`hardware.tiled_gemm.BLOCK_PADS`).
    blocking: str
    #: The default program takes a 1D layout when one output side exceeds this many times the other.
    narrow_ratio: int
    #: Fitted (scripts/calibrate_tiled.py), by dtype: operand bytes the unpacker streams per
    #: cycle, per byte of the NoC interface width.
    unpack_bytes_per_noc_byte: tuple[tuple[str, float], ...]
    #: Fitted: cycles each tile product costs besides the engine's (sub-block bookkeeping).
    tile_overhead_cycles: float
    #: Fitted: cycles per output tile to spill its partial sums to SRAM and reload them at each
    #: K block after the first (the matmul kernel's intermediate buffer).
    partial_reload_cycles: float
    #: Fitted: the share of its NoC interface a sender core's DRAM reads reach.
    sender_read_efficiency: float
    #: Fitted: host-to-device cost of one op, replayed from a trace and dispatched live, seconds.
    dispatch_trace_s: float
    dispatch_s: float
    provenance: tuple[tuple[str, str], ...] = ()
    #: The fidelity every dtype runs at when the user chose one (``analyze-hlo --fidelity``);
    #: None: each dtype's ``default_fidelity``.
    fidelity_override: str | None = None

    def fidelity_for(self, dtype: str, override: str | None = None) -> str:
        """The math fidelity ``dtype`` runs at (``override``, else the user's choice, else the
        dtype's default; ValueError if unknown)."""
        fidelity = override or self.fidelity_override or dict(self.default_fidelity).get(dtype)
        if fidelity is None:
            raise ValueError(f"dtype {dtype!r} has no default fidelity (known: {', '.join(dict(self.default_fidelity))})")
        if fidelity not in dict(self.fidelity_cycles):
            raise ValueError(f"fidelity {fidelity!r} unknown (known: {', '.join(dict(self.fidelity_cycles))})")
        return fidelity

    def flops_per_cycle(self, fidelity: str) -> float:
        """FLOPs one core's engine does per cycle at ``fidelity`` (the finest fidelity does one
        engine step per cycle; a fidelity of c cycles per tile does that share of it)."""
        m, k, n = self.engine_shape
        cycles = dict(self.fidelity_cycles)
        return 2 * m * k * n * min(cycles.values()) / cycles[fidelity]

    def tile_bytes(self, dtype: str) -> float:
        """Bytes of one tile of ``dtype`` (ValueError for a format the chip lacks)."""
        table = dict(self.bytes_per_element)
        if dtype not in table:
            raise ValueError(f"dtype {dtype!r} unknown to this chip (known: {', '.join(table)})")
        return table[dtype] * self.tile_edge * self.tile_edge

    def provenance_of(self, name: str) -> str:
        return dict(self.provenance).get(name, "")


@dataclass(frozen=True)
class ChipSpec:
    """One chip: ``tile_count`` tiles on a ``tile_grid_rows x tile_grid_cols`` NoC, one shared DRAM.

    Peak chip throughput is ``tile_count * gemm_flops_per_s_per_tile``. ``sram_buffering_stages``
    is how many copies of each streamed operand block a tile keeps so that loads overlap compute
    (2 = double buffering). ``gemm_granule_elements`` is the edge the GEMM engine pads every block
    dimension to (a 72-wide block costs as much as an 80-wide one when the granule is 16).
    """

    name: str
    description: str
    source: str
    tile_count: int
    tile_grid_rows: int
    tile_grid_cols: int
    sram_bytes_per_tile: float
    sram_buffering_stages: int
    noc_topology: str
    noc_bandwidth_bytes_per_s_per_link: float
    hop_latency_s: float
    dram_bandwidth_bytes_per_s: float
    dram_latency_s: float
    dram_capacity_bytes: float | None
    gemm_flops_per_s_per_tile: float
    vector_flops_per_s_per_tile: float
    gemm_granule_elements: int
    #: Achieved-efficiency constants (the ``[kernel_model]`` table, GPUs): when set, the mappers
    #: cost each op as one library kernel (:mod:`hardware.kernel_model`); None = tiled model.
    kernel_model: KernelModel | None = None
    #: Whether the chip runs attention as one fused (flash-attention) kernel; optional TOML key
    #: ``fused_attention_kernel``, default true (TX8's toolchain and GPUs' FlashAttention both do).
    fused_attention_kernel: bool = True
    #: The Tensix-style GEMM model (``[tiled_model]`` table): when set, GEMMs are predicted by
    #: :mod:`hardware.tiled_gemm` beside the tiled mapper's bound.
    tiled_model: TiledModel | None = None

    @property
    def gemm_flops_per_s(self) -> float:
        """Peak GEMM throughput of the whole chip."""
        return self.gemm_flops_per_s_per_tile * self.tile_count

    @property
    def vector_flops_per_s(self) -> float:
        """Peak vector (element-wise) throughput of the whole chip."""
        return self.vector_flops_per_s_per_tile * self.tile_count


def with_math_fidelity(chip: ChipSpec, fidelity: str) -> ChipSpec:
    """``chip`` (which must have a ``[tiled_model]``) with every dtype at math ``fidelity`` and its
    GEMM peak at that fidelity's; ValueError for a chip without the model or an unknown fidelity."""
    model = chip.tiled_model
    if model is None:
        raise ValueError(f"{chip.name} has no [tiled_model] table, so no math fidelity to choose")
    if fidelity not in dict(model.fidelity_cycles):
        raise ValueError(f"fidelity {fidelity!r} unknown to {chip.name} (known: {', '.join(dict(model.fidelity_cycles))})")
    return replace(chip, tiled_model=replace(model, fidelity_override=fidelity),
                   gemm_flops_per_s_per_tile=model.clock_hz * model.flops_per_cycle(fidelity))


@dataclass(frozen=True)
class SystemSpec:
    """``chip_count`` identical chips on a chip-to-chip network.

    ``topology`` is one of :data:`SYSTEM_TOPOLOGIES`; ``topology_rows x topology_cols`` places
    device ``i`` of a logical mesh (row-major ids, as in XLA replica groups) on the physical grid
    for ``mesh2d``/``torus2d`` (1 x chip_count for ``ring`` and ``switch``).
    ``link_bandwidth_bytes_per_s`` is per link and direction; ``hop_latency_s`` is the latency a
    message pays per link it crosses (SerDes, link layer, router).
    """

    name: str
    description: str
    source: str
    chip: ChipSpec
    chip_count: int
    topology: str
    topology_rows: int
    topology_cols: int
    link_bandwidth_bytes_per_s: float
    hop_latency_s: float
    #: One of :data:`COLLECTIVE_ALGORITHMS` (the topology's default when the file names none).
    collective_algorithm: str = "ring"
    #: True when chip-to-chip transfers are staged through each chip's DRAM (TX8): every byte
    #: sent is read from the sender's DRAM and written to the receiver's, so a chip's collective
    #: traffic cannot outrun ``chip.dram_bandwidth_bytes_per_s``.
    transfers_through_dram: bool = False
    #: Measured nccl-tests bus bandwidths of one NVSwitch node (``nccl_table``, a path relative
    #: to the system file): when set, all-reduce, all-gather, reduce-scatter and all-to-all take
    #: their time from it (:mod:`hardware.nccl`) instead of ``link_bandwidth`` and ``hop_latency``.
    nccl_table: NcclTable | None = None
    #: Multiplies the table's bus bandwidths (``nccl_busbw_scale``): 1 for the system the table
    #: was measured on, the NVLink bandwidth ratio for a system measured with another's table.
    nccl_busbw_scale: float = 1.0


    #: Nodes joined by NICs (a multi-node system, :class:`InterNodeNetwork`); None: one node.
    #: When set, ``topology``, ``topology_rows x topology_cols``, ``link_bandwidth`` and the NCCL
    #: table describe the network *inside* one node (``inter_node.node``), and device ``d`` is
    #: chip ``d % chips_per_node`` of node ``d // chips_per_node``.
    inter_node: InterNodeNetwork | None = None

    @property
    def chips_per_node(self) -> int:
        """Chips of one node (all of them on a one-node system)."""
        return self.chip_count if self.inter_node is None else self.inter_node.node.chip_count


@dataclass(frozen=True)
class InterNodeNetwork:
    """The network between the ``node_count`` identical nodes of a multi-node system.

    ``node`` is the one-node system (its chips and intra-node network); every node has
    ``nics_per_node`` NICs of ``nic_bandwidth_bytes_per_s`` each way; ``latency_s`` is what one
    inter-node step of a collective pays (NIC, switch, NCCL's per-step network cost);
    ``switch`` one of :data:`INTER_NODE_SWITCHES` with its ``oversubscription`` (1: non-blocking).
    """

    node: SystemSpec
    node_count: int
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float
    latency_s: float
    switch: str
    oversubscription: float = 1.0

    @property
    def chips_per_node(self) -> int:
        return self.node.chip_count

    def node_of(self, device: int) -> int:
        return device // self.node.chip_count

    def local_id(self, device: int) -> int:
        return device % self.node.chip_count

    def nic_bytes_per_s(self, active_chips: int) -> float:
        """Inter-node bandwidth, each way, of one node whose ``active_chips`` chips take part in
        a collective: the NICs those chips own (``nics_per_node / chips_per_node`` each, at least
        one; a rail-optimised node reaches the others' NICs through PXN only for other rails),
        divided by the fat tree's oversubscription."""
        per_chip = self.nics_per_node / self.node.chip_count
        nics = min(self.nics_per_node, max(1, math.ceil(active_chips * per_chip - 1e-9)))
        rate = nics * self.nic_bandwidth_bytes_per_s
        return rate / self.oversubscription if self.switch == "fat_tree" else rate


HardwareSpec = ChipSpec | SystemSpec


# --------------------------------------------------------------------------------------------
# Field tables: TOML key -> (dataclass field, reader, required)
# --------------------------------------------------------------------------------------------

Reader = Callable[[Any], Any]


#: Sanity bounds on every quantity (base units): 1e-15 (a femtosecond, a byte per 11 days)
#: to 1e21 (a zettabyte, a zettaFLOP/s), about six orders of magnitude beyond any real chip on
#: either side, so that NaN, infinity, denormals and values whose products overflow a float
#: are refused at load time instead of printing NaN or inf latencies.
QUANTITY_RANGE = (1e-15, 1e21)
#: Largest tile or chip count accepted: a GPU has ~100 SMs, a wafer-scale chip ~1e6 cores; the
#: mappers enumerate the divisors of the tile count, so it must stay enumerable.
MAX_UNITS = 1 << 20


def _quantity(dimension: Dimension, *, allow_zero: bool = False) -> Reader:
    def read(value: Any) -> float:
        number = parse_quantity(value, dimension)
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number, got {value!r}")
        if number < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        if number == 0 and not allow_zero:
            raise ValueError(f"must be positive, got {value!r}")
        low, high = QUANTITY_RANGE
        if number != 0 and not low <= number <= high:
            raise ValueError(f"{value!r} is outside the plausible range {low:g} to {high:g} "
                             f"{dimension.value}")
        return number

    return read


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")  # noqa: TRY004 - the loader reports ValueError as a field error
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {value!r}")
    if value > MAX_UNITS:
        raise ValueError(f"must be at most {MAX_UNITS}, got {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")  # noqa: TRY004 - the loader reports ValueError as a field error
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")  # noqa: TRY004 - the loader reports ValueError as a field error
    return value


def _by(text: str) -> tuple[int, int] | None:
    """``"4x8"`` -> (4, 8): positive ASCII numbers and a lower-case ``x``; None for anything else."""
    match = re.fullmatch(r"([0-9]+)x([0-9]+)", text)
    if not match or min(int(match.group(1)), int(match.group(2))) < 1:
        return None
    return int(match.group(1)), int(match.group(2))


def _grid(value: Any) -> tuple[int, int]:
    grid = _by(_text(value))
    if grid is None:
        raise ValueError(f"expected '<rows>x<cols>' such as '4x4', got {value!r}")
    return grid


def _one_of(choices: tuple[str, ...]) -> Reader:
    def read(value: Any) -> str:
        text = _text(value)
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return read


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a positive number, got {value!r}")
    return float(value)


def _at_least_two(value: Any) -> int:
    number = _positive_int(value)
    if number < 2:
        raise ValueError(f"must be at least 2 (loads overlap compute only with 2 or more buffers), got {value!r}")
    return number


# The [kernel_model] table of a GPU chip file (the costs that use it: hardware.kernel_model).


#: The blockings a [tiled_model] may name (hardware.tiled_gemm).
BLOCKINGS = ("vendor", "best")


def _blocking(value: Any) -> str:
    if value not in BLOCKINGS:
        raise ValueError(f"expected one of {', '.join(map(repr, BLOCKINGS))}, got {value!r}")
    return value


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"expected a fraction in (0, 1], got {value!r}")
    return float(value)


def _tiles(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"expected a list of 'MxN' tiles such as [\"128x128\"], got {value!r}")
    tiles = []
    for item in value:
        tile = _by(str(item))
        if tile is None:
            raise ValueError(f"expected 'MxN' such as '128x256', got {item!r}")
        tiles.append(tile)
    return tuple(tiles)


def _int_list(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"expected a non-empty list of positive integers, got {value!r}")
    return tuple(sorted(value))


def _fraction_list(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"expected a non-empty list of fractions, got {value!r}")
    return tuple(_fraction(v) for v in value)


def _class_fractions(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a table of kernel class = fraction, got {value!r}")
    missing = [name for name in MEMORY_KERNEL_CLASSES if name not in value]
    if missing:
        raise ValueError(f"every kernel class needs an efficiency; missing: {', '.join(missing)}")
    return tuple(sorted((str(name), _fraction(fraction)) for name, fraction in value.items()))


def _row_curves(value: Any) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a table of kernel class = [[row length, fraction], ...], got {value!r}")
    curves = []
    for name, points in value.items():
        if name not in ROW_KERNEL_CLASSES:
            raise ValueError(f"{name!r} has no row curve (classes that do: {', '.join(ROW_KERNEL_CLASSES)})")
        if not isinstance(points, list) or not points or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise ValueError(f"{name}: expected [[row length, fraction], ...], got {points!r}")
        curve = tuple(sorted((_positive_int(length), _fraction(fraction)) for length, fraction in points))
        if len({length for length, _ in curve}) != len(curve):
            raise ValueError(f"{name}: a row length appears twice")
        curves.append((str(name), curve))
    return tuple(sorted(curves))


def _provenance(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) and v.strip() for v in value.values()):
        raise ValueError(f"expected a table of name = \"where it comes from\", got {value!r}")
    return tuple(sorted((str(name), text) for name, text in value.items()))


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _time(value: Any) -> float:
    seconds = parse_quantity(value, Dimension.TIME)
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


_KERNEL_MODEL_FIELDS: dict[str, tuple[str, Reader]] = {
    "kernel_overhead": ("kernel_overhead_s", _time),
    "gemm_cta_tiles": ("gemm_cta_tiles", _tiles),
    "gemm_mma_efficiency": ("gemm_mma_efficiency", _fraction),
    "gemm_k_overhead": ("gemm_k_overhead_elements", _non_negative_int),
    "hbm_efficiency": ("hbm_efficiency", _fraction),
    "flash_head_dims": ("flash_head_dims", _int_list),
    "flash_efficiency": ("flash_efficiency", _fraction_list),
    "vector_efficiency": ("vector_efficiency", _class_fractions),
    "flash_kv_overhead": ("flash_kv_overhead", _non_negative_int),
    "group_norm_row_bandwidth": ("group_norm_row_bandwidth_bytes_per_s", _quantity(Dimension.BANDWIDTH)),
    "launch_floor": ("launch_floor_s", _time),
    "row_efficiency": ("row_efficiency", _row_curves),
    "provenance": ("provenance", _provenance),
}
#: Fields of the [kernel_model] table that may be left out (the dataclass has their defaults).
_OPTIONAL_KERNEL_MODEL_FIELDS = frozenset({"flash_kv_overhead", "group_norm_row_bandwidth", "launch_floor",
                                           "row_efficiency", "provenance"})


def _subtable_values(path: Path, name: str, table: Any, fields: dict[str, tuple[str, Reader]],
                     optional: frozenset[str]) -> dict[str, Any]:
    """The dataclass values of the ``[name]`` table of chip file ``path`` read by ``fields``
    (``optional`` keys may be left out); InputFileError names the bad key."""
    if not isinstance(table, dict):
        raise InputFileError(f"{path}: field '{name}': expected a table, got {table!r}")
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise InputFileError(f"{path}: field '{name}.{unknown[0]}': unknown field (known: {', '.join(fields)})")
    values: dict[str, Any] = {}
    for key, (attribute, reader) in fields.items():
        if key not in table:
            if key in optional:
                continue
            raise InputFileError(f"{path}: field '{name}.{key}': missing")
        try:
            values[attribute] = reader(table[key])
        except ValueError as error:
            raise InputFileError(f"{path}: field '{name}.{key}': {error}") from None
    return values


def _kernel_model_from_table(path: Path, table: Any) -> KernelModel:
    """The ``[kernel_model]`` table of chip file ``path``; InputFileError names the bad key."""
    values = _subtable_values(path, "kernel_model", table, _KERNEL_MODEL_FIELDS, _OPTIONAL_KERNEL_MODEL_FIELDS)
    if len(values["flash_head_dims"]) != len(values["flash_efficiency"]):
        raise InputFileError(f"{path}: field 'kernel_model.flash_efficiency': needs one value per flash_head_dims entry")
    return KernelModel(**values)


def _str_table(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"expected a table of name = text, got {value!r}")
    return tuple(value.items())


def _int_table(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a table of name = count, got {value!r}")
    return tuple((k, _positive_int(v)) for k, v in value.items())


def _number_table(value: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a table of name = number, got {value!r}")
    return tuple((k, _positive_number(v)) for k, v in value.items())


def _gigahertz(value: Any) -> float:
    return _positive_number(value) * 1e9


def _non_negative_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < QUANTITY_RANGE[1]:
        raise ValueError(f"expected a non-negative number, got {value!r}")
    return float(value)


def _shape3(value: Any) -> tuple[int, int, int]:
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"expected [m, k, n], got {value!r}")
    m, k, n = (_positive_int(v) for v in value)
    return m, k, n


_TILED_MODEL_FIELDS: dict[str, tuple[str, Reader]] = {
    "tile_edge": ("tile_edge", _positive_int),
    "engine_shape": ("engine_shape", _shape3),
    "clock_ghz": ("clock_hz", _gigahertz),
    "noc_bytes_per_cycle": ("noc_bytes_per_cycle", _positive_number),
    "fidelity_cycles": ("fidelity_cycles", _int_table),
    "default_fidelity": ("default_fidelity", _str_table),
    "bytes_per_element": ("bytes_per_element", _number_table),
    "sram_reserved": ("sram_reserved_bytes", _quantity(Dimension.BYTES)),
    "max_subblock_tiles": ("max_subblock_tiles", _positive_int),
    "blocking": ("blocking", _blocking),
    "narrow_ratio": ("narrow_ratio", _positive_int),
    "unpack_bytes_per_noc_byte": ("unpack_bytes_per_noc_byte", _number_table),
    "tile_overhead_cycles": ("tile_overhead_cycles", _non_negative_number),
    "partial_reload_cycles": ("partial_reload_cycles", _non_negative_number),
    "sender_read_efficiency": ("sender_read_efficiency", _fraction),
    "dispatch_trace": ("dispatch_trace_s", _time),
    "dispatch": ("dispatch_s", _time),
    "provenance": ("provenance", _provenance),
}


#: How :func:`tiled_model_constants` shows a quantity: its scale from base units and its unit.
_TILED_MODEL_UNITS = {"clock_ghz": (1e-9, " GHz"), "sram_reserved": (1e-3, " kB"),
                      "dispatch_trace": (1e6, " us"), "dispatch": (1e6, " us")}


def tiled_model_constants(model: TiledModel) -> list[tuple[str, object, str]]:
    """``(TOML key, value, source)`` of every constant of ``model``, in the file's order: a table
    as a dict, a quantity as text in the file's unit, anything else as it is."""
    rows: list[tuple[str, object, str]] = []
    for key, (attribute, _) in _TILED_MODEL_FIELDS.items():
        if key == "provenance":
            continue
        value = getattr(model, attribute)
        if key in _TILED_MODEL_UNITS:
            scale, unit = _TILED_MODEL_UNITS[key]
            value = f"{value * scale:.4g}{unit}"
        elif isinstance(value, tuple) and value and isinstance(value[0], tuple):
            value = dict(value)
        rows.append((key, value, model.provenance_of(key)))
    return rows


def _tiled_model_from_table(path: Path, table: Any) -> TiledModel:
    """The ``[tiled_model]`` table of chip file ``path``; InputFileError names the bad key."""
    return TiledModel(**_subtable_values(path, "tiled_model", table, _TILED_MODEL_FIELDS, frozenset({"provenance"})))


_CHIP_FIELDS: dict[str, tuple[str, Reader, bool]] = {
    "name": ("name", _text, True),
    "description": ("description", _text, False),
    "source": ("source", _text, False),
    "tile_count": ("tile_count", _positive_int, True),
    "tile_grid": ("tile_grid", _grid, True),
    "sram_per_tile": ("sram_bytes_per_tile", _quantity(Dimension.BYTES), True),
    "sram_buffering_stages": ("sram_buffering_stages", _at_least_two, True),
    "noc_topology": ("noc_topology", _one_of(NOC_TOPOLOGIES), True),
    "noc_link_bandwidth": ("noc_bandwidth_bytes_per_s_per_link", _quantity(Dimension.BANDWIDTH), True),
    "hop_latency": ("hop_latency_s", _quantity(Dimension.TIME, allow_zero=True), True),
    "dram_bandwidth": ("dram_bandwidth_bytes_per_s", _quantity(Dimension.BANDWIDTH), True),
    "dram_latency": ("dram_latency_s", _quantity(Dimension.TIME, allow_zero=True), True),
    "dram_capacity": ("dram_capacity_bytes", _quantity(Dimension.BYTES), False),
    "gemm_throughput_per_tile": ("gemm_flops_per_s_per_tile", _quantity(Dimension.THROUGHPUT), True),
    "vector_throughput_per_tile": ("vector_flops_per_s_per_tile", _quantity(Dimension.THROUGHPUT), True),
    "gemm_granule": ("gemm_granule_elements", _positive_int, True),
    "fused_attention_kernel": ("fused_attention_kernel", _flag, False),
}

_SYSTEM_FIELDS: dict[str, tuple[str, Reader, bool]] = {
    "name": ("name", _text, True),
    "description": ("description", _text, False),
    "source": ("source", _text, False),
    "chip": ("chip", _text, True),
    "chip_count": ("chip_count", _positive_int, True),
    "topology": ("topology", _one_of(SYSTEM_TOPOLOGIES), True),
    "topology_grid": ("topology_grid", _grid, False),
    "link_bandwidth": ("link_bandwidth_bytes_per_s", _quantity(Dimension.BANDWIDTH), True),
    "hop_latency": ("hop_latency_s", _quantity(Dimension.TIME, allow_zero=True), True),
    "collective_algorithm": ("collective_algorithm", _one_of(COLLECTIVE_ALGORITHMS), False),
    "transfers_through_dram": ("transfers_through_dram", _flag, False),
    "nccl_table": ("nccl_table", _text, False),
    "nccl_busbw_scale": ("nccl_busbw_scale", _positive_number, False),
}

#: A multi-node system file: ``node`` (a one-node system file), ``node_count`` and the
#: ``[inter_node]`` table (:data:`_INTER_NODE_FIELDS`).
_MULTI_NODE_FIELDS: dict[str, tuple[str, Reader, bool]] = {
    "name": ("name", _text, True),
    "description": ("description", _text, False),
    "source": ("source", _text, False),
    "node": ("node", _text, True),
    "node_count": ("node_count", _positive_int, True),
}

_INTER_NODE_FIELDS: dict[str, tuple[str, Reader, bool]] = {
    "nics_per_node": ("nics_per_node", _positive_int, True),
    "nic_bandwidth": ("nic_bandwidth_bytes_per_s", _quantity(Dimension.BANDWIDTH), True),
    "latency": ("latency_s", _quantity(Dimension.TIME, allow_zero=True), True),
    "switch": ("switch", _one_of(INTER_NODE_SWITCHES), True),
    "oversubscription": ("oversubscription", _positive_number, False),
}


def _read_fields(path: Path, table: dict[str, Any], fields: dict[str, tuple[str, Reader, bool]]) -> dict[str, Any]:
    unknown = sorted(set(table) - set(fields) - {"kind"})
    if unknown:
        raise InputFileError(f"{path}: field '{unknown[0]}': unknown field (known: {', '.join(fields)})")
    values: dict[str, Any] = {}
    for key, (attribute, reader, required) in fields.items():
        if key not in table:
            if required:
                raise InputFileError(f"{path}: field '{key}': missing")
            values[attribute] = None
            continue
        try:
            values[attribute] = reader(table[key])
        except ValueError as error:
            raise InputFileError(f"{path}: field '{key}': {error}") from None
    return values


def _chip_from_table(path: Path, table: dict[str, Any]) -> ChipSpec:
    table = dict(table)
    kernel_table = table.pop("kernel_model", None)
    tiled_table = table.pop("tiled_model", None)
    values = _read_fields(path, table, _CHIP_FIELDS)
    values["tiled_model"] = _tiled_model_from_table(path, tiled_table) if tiled_table is not None else None
    values["kernel_model"] = _kernel_model_from_table(path, kernel_table) if kernel_table is not None else None
    rows, cols = values.pop("tile_grid")
    if rows * cols != values["tile_count"]:
        raise InputFileError(
            f"{path}: field 'tile_grid': {rows}x{cols} holds {rows * cols} tiles but tile_count is {values['tile_count']}"
        )
    values["description"] = values["description"] or ""
    values["source"] = values["source"] or ""
    if values["fused_attention_kernel"] is None:
        values["fused_attention_kernel"] = True
    return ChipSpec(tile_grid_rows=rows, tile_grid_cols=cols, **values)


def _multi_node_from_table(path: Path, table: dict[str, Any], seen: tuple[Path, ...]) -> SystemSpec:
    """A system of ``node_count`` copies of the one-node system ``node``, joined by the NICs of
    ``[inter_node]``."""
    table = dict(table)
    inter_table = table.pop("inter_node", None)
    if not isinstance(inter_table, dict):
        raise InputFileError(f"{path}: field 'inter_node': expected a table (nics_per_node, nic_bandwidth, "
                             f"latency, switch), got {inter_table!r}")
    values = _read_fields(path, table, _MULTI_NODE_FIELDS)
    unknown = sorted(set(inter_table) - set(_INTER_NODE_FIELDS))
    if unknown:
        raise InputFileError(f"{path}: field 'inter_node.{unknown[0]}': unknown field "
                             f"(known: {', '.join(_INTER_NODE_FIELDS)})")
    inter = {}
    for key, (attribute, reader, required) in _INTER_NODE_FIELDS.items():
        if key not in inter_table:
            if required:
                raise InputFileError(f"{path}: field 'inter_node.{key}': missing")
            continue
        try:
            inter[attribute] = reader(inter_table[key])
        except ValueError as error:
            raise InputFileError(f"{path}: field 'inter_node.{key}': {error}") from None
    if values["node_count"] < 2:
        raise InputFileError(f"{path}: field 'node_count': a multi-node system needs at least 2 nodes, "
                             f"got {values['node_count']}")
    node_ref = values["node"]
    node_path = _resolve(node_ref, relative_to=path.parent)
    if node_path is None:
        raise InputFileError(f"{path}: field 'node': no bundled system or file named {node_ref!r}")
    node = _load(node_path, seen + (path,))
    if not isinstance(node, SystemSpec) or node.inter_node is not None:
        raise InputFileError(f"{path}: field 'node': {node_ref!r} is not a one-node system file")
    network = InterNodeNetwork(node=node, node_count=values["node_count"], **inter)
    return replace(node, name=values["name"], description=values["description"] or "",
                   source=values["source"] or "", chip_count=node.chip_count * values["node_count"],
                   inter_node=network)


def _system_from_table(path: Path, table: dict[str, Any], seen: tuple[Path, ...]) -> SystemSpec:
    if "node" in table or "inter_node" in table:
        return _multi_node_from_table(path, table, seen)
    values = _read_fields(path, table, _SYSTEM_FIELDS)
    chip = _system_chip(path, values.pop("chip"), seen)
    grid = values.pop("topology_grid")
    topology = values["topology"]
    if topology in ("mesh2d", "torus2d"):
        if grid is None:
            raise InputFileError(f"{path}: field 'topology_grid': missing (needed by topology '{topology}')")
        rows, cols = grid
        if rows * cols != values["chip_count"]:
            raise InputFileError(
                f"{path}: field 'topology_grid': {rows}x{cols} holds {rows * cols} chips but chip_count is {values['chip_count']}"
            )
    else:
        rows, cols = 1, values["chip_count"]
    allowed = _ALGORITHMS_BY_TOPOLOGY[topology]
    if values["collective_algorithm"] is None:
        values["collective_algorithm"] = allowed[0]
    elif values["collective_algorithm"] not in allowed:
        raise InputFileError(
            f"{path}: field 'collective_algorithm': {values['collective_algorithm']!r} does not run on topology "
            f"'{topology}' (allowed: {', '.join(allowed)})"
        )
    values["transfers_through_dram"] = bool(values["transfers_through_dram"])
    values["description"] = values["description"] or ""
    values["source"] = values["source"] or ""
    values["nccl_table"], values["nccl_busbw_scale"] = _nccl_table(path, values, topology)
    return SystemSpec(chip=chip, topology_rows=rows, topology_cols=cols, **values)


def _system_chip(path: Path, chip_ref: str, seen: tuple[Path, ...]) -> ChipSpec:
    """The chip that the one-node system file ``path`` names in its field ``chip``."""
    chip_path = _resolve(chip_ref, relative_to=path.parent)
    if chip_path is None:
        raise InputFileError(f"{path}: field 'chip': no bundled chip or file named {chip_ref!r}")
    chip = _load(chip_path, seen + (path,))
    if not isinstance(chip, ChipSpec):
        raise InputFileError(f"{path}: field 'chip': {chip_ref!r} describes a system, not a chip")
    return chip


def one_node_system_chip(name_or_path: str | Path) -> ChipSpec | None:
    """The chip of a one-node system file, loaded without the rest of the system (its network,
    its NCCL table); None for a chip file or a multi-node system (which ``load_hardware`` reads
    whole)."""
    path = _resolved_or_error(name_or_path)
    table = load_toml(path, "a hardware description (TOML)")
    if table.get("kind") != "system" or "node" in table or "inter_node" in table:
        return None
    return _system_chip(path, _read_fields(path, table, _SYSTEM_FIELDS)["chip"], ())


def _nccl_table(path: Path, values: dict[str, Any], topology: str) -> tuple[NcclTable | None, float]:
    """The system file's ``nccl_table`` (loaded; a path relative to the file) and its scale."""
    reference, scale = values["nccl_table"], values["nccl_busbw_scale"]
    if reference is None:
        if scale is not None:
            raise InputFileError(f"{path}: field 'nccl_busbw_scale': given without an 'nccl_table' to scale")
        return None, 1.0
    if topology != "switch":
        raise InputFileError(f"{path}: field 'nccl_table': a table measures one NVSwitch node; "
                             f"topology must be 'switch', not {topology!r}")
    table_path = _resolve(reference, relative_to=path.parent)
    if table_path is None:
        raise InputFileError(f"{path}: field 'nccl_table': no file {reference!r} (relative to {path.parent})")
    return load_nccl_table(table_path), 1.0 if scale is None else scale


def _resolve(name_or_path: str | Path, relative_to: Path | None = None) -> Path | None:
    """A bundled name (``tx8``) or a path (absolute, or relative to the cwd / the referring file)."""
    text = str(name_or_path)
    bundled = DATA_DIR / f"{text}.toml"
    if "/" not in text and not text.endswith(".toml") and bundled.is_file():
        return bundled
    candidates = [Path(text)]
    if relative_to is not None and not Path(text).is_absolute():
        candidates.insert(0, relative_to / text)
    for candidate in candidates:
        if candidate.exists():  # a directory or a device too: _load says what it is
            return candidate.resolve()
    return None


def _load(path: Path, seen: tuple[Path, ...] = ()) -> HardwareSpec:
    if path in seen:
        raise InputFileError(f"{path}: field 'chip': refers back to itself")
    table = load_toml(path, "a hardware description (TOML)")
    kind = table.get("kind")
    if kind == "chip":
        spec: HardwareSpec = _chip_from_table(path, table)
    elif kind == "system":
        spec = _system_from_table(path, table, seen)
    elif kind is None:
        raise InputFileError(f"{path}: field 'kind': missing (expected 'chip' or 'system')")
    else:
        raise InputFileError(f"{path}: field 'kind': expected 'chip' or 'system', got {kind!r}")
    logger.debug("loaded %s %s from %s", kind, spec.name, path)
    return spec


def bundled_hardware_names() -> list[str]:
    """Names accepted by :func:`load_hardware` without a path (the files in ``hardware/data``)."""
    return sorted(p.stem for p in DATA_DIR.glob("*.toml"))


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """Load a bundled description by name (``tx8``, ``tx8-16``, ``h100-sxm`` ...) or a TOML path."""
    return _load(_resolved_or_error(name_or_path))


def _resolved_or_error(name_or_path: str | Path) -> Path:
    path = _resolve(name_or_path)
    if path is None:
        raise InputFileError(
            f"{shown(name_or_path)}: no such hardware file or bundled name (bundled: {', '.join(bundled_hardware_names())})"
        )
    return path


def load_chip(name_or_path: str | Path) -> ChipSpec:
    """Like :func:`load_hardware` but always a chip: a system file gives its chip."""
    spec = load_hardware(name_or_path)
    return spec.chip if isinstance(spec, SystemSpec) else spec


def load_system(name_or_path: str | Path) -> SystemSpec:
    """Like :func:`load_hardware` but always a system: a chip file gives a one-chip system."""
    return as_system(load_hardware(name_or_path))


def as_system(spec: HardwareSpec) -> SystemSpec:
    """A system as is; a chip as a system of one chip (collectives on it take no time)."""
    if isinstance(spec, SystemSpec):
        return spec
    return SystemSpec(
        name=spec.name,
        description=f"a single {spec.name} (no chip-to-chip network)",
        source=spec.source,
        chip=spec,
        chip_count=1,
        topology="switch",
        topology_rows=1,
        topology_cols=1,
        link_bandwidth_bytes_per_s=float("inf"),
        hop_latency_s=0.0,
        collective_algorithm="switch",
    )
