"""hardware: hardware descriptions (TOML data), the collective model, mappers and the STDiT3 op builder.

Never imports torch or jax: only the standard library, numpy and ``hlo_analyzer.errors``.
"""

from hardware.collectives import collective_time_s, per_device_bytes
from hardware.spec import ChipSpec, SystemSpec, as_system, bundled_hardware_names, load_chip, load_hardware, load_system

__all__ = [
    "ChipSpec",
    "SystemSpec",
    "as_system",
    "bundled_hardware_names",
    "collective_time_s",
    "load_chip",
    "load_hardware",
    "load_system",
    "per_device_bytes",
]
