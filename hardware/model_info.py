"""What a prediction assumed: the chip's execution model and efficiencies, the system's
collective algorithm and measured NCCL table. Reports put this next to their figures
(``analyze-hlo --hw`` writes it in the ``mapping`` section as ``model``), so a table says which
efficiencies and algorithms it used."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hardware.nccl import NCCL_KINDS
from hardware.spec import SystemSpec

__all__ = ["ModelAssumptions", "model_assumptions", "nccl_assumption"]


@dataclass(frozen=True)
class ModelAssumptions:
    """``execution``: ``gpu_kernels`` (one library kernel per op at the achieved efficiencies of
    the chip's ``[kernel_model]``) or ``tiled`` (the pipelined tile mappers at peak).
    ``efficiencies``: the kernel-model constants; for ``tiled`` those of the chip's tiled GEMM
    model (``gemm_model``, ``math_fidelity`` by dtype, ...) or empty when it has none.
    ``collective_algorithm`` / ``topology`` / ``transfers_through_dram``: the system's network.
    ``nccl_table``: the measured NCCL table that times the collectives it holds (name, source,
    ``busbw_scale``, ``kinds``, and ``assumption``: what a table of another system scaled
    assumes, None for the system's own), or None (:mod:`hardware.nccl`)."""

    hardware: str
    chip: str
    execution: str
    efficiencies: dict[str, object]
    topology: str
    collective_algorithm: str
    transfers_through_dram: bool
    nccl_table: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def model_assumptions(system: SystemSpec) -> ModelAssumptions:
    """The assumptions behind every latency computed on ``system``."""
    kernel_model = system.chip.kernel_model
    efficiencies: dict[str, object] = {}
    if kernel_model is not None:
        efficiencies = {
            "kernel_overhead_s": kernel_model.kernel_overhead_s,
            "gemm_mma_efficiency": kernel_model.gemm_mma_efficiency,
            "gemm_k_overhead_elements": kernel_model.gemm_k_overhead_elements,
            "gemm_cta_tiles": ["x".join(map(str, t)) for t in kernel_model.gemm_cta_tiles],
            "hbm_efficiency": kernel_model.hbm_efficiency,
            "flash_efficiency_by_head_dim": dict(zip(map(str, kernel_model.flash_head_dims), kernel_model.flash_efficiency, strict=True)),
            "flash_kv_overhead": kernel_model.flash_kv_overhead,
            "group_norm_row_bandwidth_bytes_per_s": kernel_model.group_norm_row_bandwidth_bytes_per_s,
            "vector_efficiency": dict(kernel_model.vector_efficiency),
            "launch_floor_s": kernel_model.launch_floor_s,
            "row_efficiency": {name: [list(p) for p in curve] for name, curve in kernel_model.row_efficiency},
            "provenance": dict(kernel_model.provenance),
        }
    tiled_model = system.chip.tiled_model
    if tiled_model is not None:
        efficiencies = {
            "gemm_model": "tiled_gemm",
            "math_fidelity": {dtype: tiled_model.fidelity_for(dtype) for dtype, _ in tiled_model.default_fidelity},
            "fidelity_chosen_by": "--fidelity" if tiled_model.fidelity_override else "the vendor's default per dtype",
            "dispatch_trace_s": tiled_model.dispatch_trace_s,
            "unpack_bytes_per_noc_byte": dict(tiled_model.unpack_bytes_per_noc_byte),
            "tile_overhead_cycles": tiled_model.tile_overhead_cycles,
            "partial_reload_cycles": tiled_model.partial_reload_cycles,
            "sender_read_efficiency": tiled_model.sender_read_efficiency,
            "provenance": dict(tiled_model.provenance),
        }
    return ModelAssumptions(
        hardware=system.name,
        chip=system.chip.name,
        execution="gpu_kernels" if kernel_model is not None else "tiled",
        efficiencies=efficiencies,
        topology=system.topology,
        collective_algorithm=system.collective_algorithm,
        transfers_through_dram=system.transfers_through_dram,
        nccl_table=None if system.nccl_table is None else {
            "name": system.nccl_table.name,
            "source": system.nccl_table.source,
            "busbw_scale": system.nccl_busbw_scale,
            "kinds": list(NCCL_KINDS),
            "assumption": nccl_assumption(system),
        },
    )


def nccl_assumption(system: SystemSpec) -> str | None:
    """What a system's collectives assume when its NCCL table was measured on another system
    and scaled (``nccl_busbw_scale``), or None when the table is the system's own."""
    table = system.nccl_table
    if table is None or system.nccl_busbw_scale == 1:
        return None
    return (f"an assumption: the nccl-tests table measured on {table.name} with every bus "
            f"bandwidth x{system.nccl_busbw_scale:g}; no measurement of this system is bundled")
