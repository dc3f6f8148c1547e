"""``--timeline FILE``: the mapped kernels as a Chrome trace-event JSON (Perfetto, chrome://tracing).

The schedule is the cost model's: kernels run one after another in program order, each from the
end of the one before (no overlap of compute and communication). One process (the chip), one
thread (track) per kind of work:

* ``GEMM``, ``vector``, ``flash-attention``: the kernel, for its whole latency;
* ``DRAM`` and ``NoC``: the same kernel's busy time on the chip's DRAM interface and on the
  network on chip, starting with the kernel (they overlap its compute; the gap to the kernel's end
  is its compute or latency chain, ``hardware.kernel_mapping``);
* ``chip-to-chip network``: each collective, for its latency.

Events are complete events (``"ph": "X"``) with ``ts``/``dur`` in microseconds, as the format
defines; ``args`` carry the op names, shapes, bound, utilisation and HLO walk positions.
``pair`` selects one block pair's kernels (laid out from 0).
"""

from __future__ import annotations

import json
from typing import Any

from hlo_analyzer.mapping.results import FLASH_KIND, GEMM_KIND, NETWORK_KIND, VECTOR_KIND, MappedOp
from hlo_analyzer.mapping.sections import MappingSection
from hlo_trace.errors import UsageError

__all__ = ["TRACKS", "timeline_events", "timeline_json"]

#: Track (thread) id and name of each kind of work.
TRACKS = {GEMM_KIND: (1, "GEMM"), VECTOR_KIND: (2, "vector"), FLASH_KIND: (3, "flash-attention"),
          "dram": (4, "DRAM"), "noc": (5, "NoC"), NETWORK_KIND: (6, "chip-to-chip network")}
_PID = 1
_US = 1e6


def _event(name: str, track: str, start_s: float, duration_s: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": track, "ph": "X", "ts": start_s * _US, "dur": duration_s * _US,
            "pid": _PID, "tid": TRACKS[track][0], "args": args}


def _kernel_events(op: MappedOp, start_s: float) -> list[dict[str, Any]]:
    args = {"shapes": op.shapes, "bound": op.bound, "utilization": op.utilization, "flops": op.flops,
            "hlo_positions": list(op.positions)}
    events = [_event(op.name, op.kind, start_s, op.latency_s, args)]
    for track, busy_s in (("dram", op.dram_s), ("noc", op.noc_s)):
        if busy_s > 0:
            events.append(_event(f"{op.name} ({track})", track, start_s, min(busy_s, op.latency_s), args))
    return events


def _metadata(mapping: MappingSection) -> list[dict[str, Any]]:
    system = mapping.system.system
    events = [{"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "ts": 0, "dur": 0,
               "args": {"name": f"{system.chip.name} ({mapping.options.execution}) - {system.name}"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "ts": 0, "dur": 0,
                "args": {"name": name}} for tid, name in TRACKS.values()]
    return events


def timeline_events(mapping: MappingSection, *, pair: int | None = None) -> list[dict[str, Any]]:
    """Metadata events, then one event per kernel (and its DRAM/NoC busy time) in program order."""
    selected = [op for op, owner in zip(mapping.program.ops, mapping.pair_of) if pair is None or owner == pair]
    if pair is not None and not selected:
        found = mapping.totals.pairs_found
        raise UsageError(f"--timeline-pair {pair}: no such block pair "
                         f"({'pairs 0..' + str(found - 1) if found else 'the dump has no STDiT3 block pairs'})")
    events = _metadata(mapping)
    clock_s = 0.0
    for op in selected:
        events += _kernel_events(op, clock_s)
        clock_s += op.latency_s
    return events


def timeline_json(mapping: MappingSection, *, pair: int | None = None) -> str:
    return json.dumps({"traceEvents": timeline_events(mapping, pair=pair), "displayTimeUnit": "ns"}) + "\n"
