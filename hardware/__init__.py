"""hardware: hardware descriptions (TOML data), the collective model and the mappers.

Never imports torch or jax: only the standard library, numpy and ``hlo_trace.errors``.

    from hardware import load_hardware, map_block, inference_totals
"""

from hardware.block import (
    BlockMapping,
    InferenceTotals,
    comm_latency_s,
    inference_totals,
    map_block,
    map_op,
)
from hardware.collectives import collective_time_s, per_device_bytes
from hardware.flash_attention_mapper import flashatten_mapper
from hardware.gemm_mapper import GemmPreset, gemm_auto_opt_mapper, gemm_exhaustive_search
from hardware.kernel_mapping import (
    FlashAttentionTiling,
    GemmTiling,
    KernelTiling,
    Mapping,
    VectorTiling,
)
from hardware.model_info import ModelAssumptions, model_assumptions
from hardware.ops import Op, OpType
from hardware.spec import (
    MEMORY_KERNEL_CLASSES,
    ROW_KERNEL_CLASSES,
    ChipSpec,
    KernelModel,
    SystemSpec,
    as_system,
    bundled_hardware_names,
    load_chip,
    load_hardware,
    load_system,
)
from hardware.vector_mapper import MappingError, vector_mapper

__all__ = [
    "MEMORY_KERNEL_CLASSES",
    "ROW_KERNEL_CLASSES",
    "BlockMapping",
    "ChipSpec",
    "FlashAttentionTiling",
    "GemmPreset",
    "GemmTiling",
    "InferenceTotals",
    "KernelModel",
    "KernelTiling",
    "Mapping",
    "MappingError",
    "ModelAssumptions",
    "Op",
    "OpType",
    "SystemSpec",
    "VectorTiling",
    "as_system",
    "bundled_hardware_names",
    "collective_time_s",
    "comm_latency_s",
    "flashatten_mapper",
    "gemm_auto_opt_mapper",
    "gemm_exhaustive_search",
    "inference_totals",
    "load_chip",
    "load_hardware",
    "load_system",
    "map_block",
    "map_op",
    "model_assumptions",
    "per_device_bytes",
    "vector_mapper",
]
