"""Which system a dump runs on: ``--hw NAME`` on an N-device dump, and network overrides.

A user who names a chip (``--hw tx8``) on a dump that spans N devices means "a system of N of
these chips". Its chip-to-chip network is the chip's *default network*: the one of the bundled
system file built from that chip (``hardware/data/tx8-16.toml`` for tx8,
``hardware/data/8xh100.toml`` for h100-sxm; their comments give the sources). The N chips are
laid out on the same topology: a ``mesh2d``/``torus2d`` default becomes the most nearly square
``rows x cols`` grid of N chips (rows <= cols), a ``ring``/``switch`` keeps its kind.

A system file (``--hw tx8-16``) is used as it is; it must have at least as many chips as the dump
has devices (a larger one is reported as such). ``--link-bandwidth`` / ``--hop-latency`` replace
the network's per-link figures (and drop a measured NCCL table: every collective is then timed
on the port model); a chip with no default network needs ``--link-bandwidth`` on a
multi-device dump (the network is then a switch, one hop between any two chips).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hardware.spec import (
    SYSTEM_TOPOLOGIES,
    ChipSpec,
    HardwareSpec,
    SystemSpec,
    as_system,
    bundled_hardware_names,
    load_hardware,
    one_node_system_chip,
    with_math_fidelity,
)
from hlo_trace.errors import UsageError

__all__ = ["Hardware", "ResolvedSystem", "default_network", "load_choice", "near_square_grid",
           "resolve_system"]


@dataclass(frozen=True)
class Hardware:
    """A ``--hw`` choice loaded once: the name or path as the user gave it (the reports show it)
    and its description."""

    name: str
    spec: HardwareSpec

    @property
    def chip(self) -> ChipSpec:
        return self.spec.chip if isinstance(self.spec, SystemSpec) else self.spec


def load_choice(name_or_path: str | Hardware) -> Hardware:
    """``--hw name_or_path`` loaded (a :class:`Hardware` as is)."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    return Hardware(str(name_or_path), load_hardware(name_or_path))


@dataclass(frozen=True)
class ResolvedSystem:
    """The system a mapping runs on and, in words, how it was chosen (for the report)."""

    system: SystemSpec
    devices: int
    assumption: str


def near_square_grid(count: int) -> tuple[int, int]:
    """``rows x cols = count`` with rows <= cols and rows the largest such divisor (4 -> 2x2, 8 -> 2x4)."""
    rows = max(d for d in range(1, math.isqrt(count) + 1) if count % d == 0)
    return rows, count // rows


def default_network(chip: ChipSpec) -> SystemSpec | None:
    """The first bundled one-node system file (by name) whose chip is ``chip``, or None
    (a multi-node system is no chip's default network). Each file's chip is read alone, and
    only the one found is loaded whole (not every GPU system's NCCL table)."""
    for name in bundled_hardware_names():
        found = one_node_system_chip(name)
        if found is not None and found.name == chip.name:
            spec = load_hardware(name)
            assert isinstance(spec, SystemSpec) and spec.inter_node is None
            return spec
    return None


def _scaled(template: SystemSpec, chip: ChipSpec, count: int) -> SystemSpec:
    rows, cols = near_square_grid(count) if template.topology in ("mesh2d", "torus2d") else (1, count)
    return replace(template, name=f"{chip.name}x{count}", chip=chip, chip_count=count,
                   topology_rows=rows, topology_cols=cols,
                   description=f"{count} {chip.name} chips on the {template.name} network "
                               f"({template.topology} {rows}x{cols})")


def _with_overrides(system: SystemSpec, link_bandwidth_bytes_per_s: float | None,
                    hop_latency_s: float | None) -> tuple[SystemSpec, str]:
    changes = {}
    words = []
    if link_bandwidth_bytes_per_s is not None:
        changes["link_bandwidth_bytes_per_s"] = link_bandwidth_bytes_per_s
        words.append(f"link bandwidth {link_bandwidth_bytes_per_s / 1e9:g} GB/s")
    if hop_latency_s is not None:
        changes["hop_latency_s"] = hop_latency_s
        words.append(f"hop latency {hop_latency_s * 1e6:g} us")
    if not changes:
        return system, ""
    if system.nccl_table is not None:
        # The measured curve belongs to the network as it was: new link figures time every
        # collective on the port model.
        changes["nccl_table"], changes["nccl_busbw_scale"] = None, 1.0
        words.append(f"NCCL table {system.nccl_table.name} dropped")
    return replace(system, **changes), "; network overridden: " + ", ".join(words)


def _with_fidelity(spec: HardwareSpec, fidelity: str, name_or_path: str) -> HardwareSpec:
    chip = spec.chip if isinstance(spec, SystemSpec) else spec
    try:
        chip = with_math_fidelity(chip, fidelity)
    except ValueError as error:
        raise UsageError(f"--fidelity {fidelity} with --hw {name_or_path}: {error}") from None
    return replace(spec, chip=chip) if isinstance(spec, SystemSpec) else chip


def resolve_system(hardware: str | Hardware, devices: int, *, link_bandwidth_bytes_per_s: float | None = None,
                   hop_latency_s: float | None = None, fidelity: str | None = None) -> ResolvedSystem:
    """The system for a dump of ``devices`` devices on ``--hw hardware`` (module docstring);
    ``fidelity``: every GEMM at this math fidelity (a chip with a ``[tiled_model]`` only)."""
    devices = max(1, devices)
    choice = load_choice(hardware)
    name_or_path, spec = choice.name, choice.spec
    if fidelity is not None:
        spec = _with_fidelity(spec, fidelity, name_or_path)
    if isinstance(spec, SystemSpec):
        if spec.chip_count < devices:
            raise UsageError(f"--hw {name_or_path}: the dump spans {devices} devices but {spec.name} "
                             f"has {spec.chip_count} chip(s); pass a chip name (e.g. --hw {spec.chip.name}) "
                             "or a system with enough chips")
        system = spec
        said = f"{spec.name}: {spec.chip_count} {spec.chip.name} chips ({spec.topology} " \
               f"{spec.topology_rows}x{spec.topology_cols})"
        if spec.chip_count > devices:
            said += f", larger than the dump's {devices} devices (chips {devices}..{spec.chip_count - 1} idle)"
    elif devices == 1:
        system = replace(as_system(spec), name=spec.name)
        said = f"one {spec.name} chip (the dump has one device)"
    else:
        template = default_network(spec)
        if template is None:
            if link_bandwidth_bytes_per_s is None:
                raise UsageError(f"--hw {name_or_path}: the dump spans {devices} devices and {spec.name} has no "
                                 "default chip-to-chip network; pass --link-bandwidth (and --hop-latency) "
                                 "or a system file")
            template = replace(as_system(spec), name="switch", topology="switch",
                               hop_latency_s=hop_latency_s or 0.0)
        system = _scaled(template, spec, devices)
        said = f"{devices} {spec.name} chips (one per device of the dump) on the default network of " \
               f"{template.name}: {system.topology} {system.topology_rows}x{system.topology_cols}, " \
               f"{system.link_bandwidth_bytes_per_s / 1e9:g} GB/s per link, " \
               f"{system.hop_latency_s * 1e6:g} us per hop"
    system, overridden = _with_overrides(system, link_bandwidth_bytes_per_s, hop_latency_s)
    if fidelity is not None:
        overridden += f"; math fidelity {fidelity} for every dtype (--fidelity)"
    assert system.topology in SYSTEM_TOPOLOGIES
    return ResolvedSystem(system=system, devices=devices, assumption=said + overridden)

