"""Gantt charts of the strategy study: one block pair per strategy, from the cached timelines.

``scripts/sweep.py`` caches, per case of the detailed shape, the Chrome trace-event timeline of
block pair 0 of its stage-0 dump (``analyze-hlo DUMP --hw SYSTEM --timeline FILE
--timeline-pair 0``, ``hlo_analyzer/timeline.py``). This module reads such a timeline into a
:class:`GanttChart` (computing) and draws it as one PNG per strategy (rendering): one row per
track (GEMM, vector, flash-attention, DRAM, NoC, chip-to-chip network), each kernel a bar
coloured by its track, time in ms.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_trace.atomic import atomic_write

log = logging.getLogger(__name__)

_MS_PER_US = 1e-3
#: Bar colour per track name of ``hlo_analyzer.timeline.TRACKS`` (grey for any other track).
TRACK_COLOURS = {"GEMM": "tab:blue", "vector": "tab:orange", "flash-attention": "tab:green",
                 "DRAM": "tab:purple", "NoC": "tab:pink", "chip-to-chip network": "tab:red"}
#: A bar is labelled with its op name when it spans at least this fraction of the chart.
LABEL_MIN_FRACTION = 0.04


@dataclass(frozen=True)
class Bar:
    name: str
    start_ms: float
    duration_ms: float


@dataclass(frozen=True)
class GanttRow:
    track: str
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class GanttChart:
    """The rows of one timeline, in track order, and what it ran on (the trace's process name,
    e.g. ``tx8 (fused) - tx8-16``)."""

    hardware: str
    rows: tuple[GanttRow, ...]

    @property
    def span_ms(self) -> float:
        return max((b.start_ms + b.duration_ms for row in self.rows for b in row.bars), default=0.0)


@dataclass(frozen=True)
class GanttCase:
    """One case of the study and the timeline its chart is drawn from."""

    shape: str
    strategy: str
    mesh: str
    timeline: Path


def gantt_chart(document: dict[str, Any]) -> GanttChart:
    """The chart of a trace-event document; ValueError if it is not one."""
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a trace-event document: no traceEvents list")
    tracks: dict[int, str] = {}
    hardware = "?"
    bars: dict[int, list[Bar]] = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            tracks[event["tid"]] = event["args"]["name"]
        elif event.get("ph") == "M" and event.get("name") == "process_name":
            hardware = event["args"]["name"]
        elif event.get("ph") == "X":
            bars.setdefault(event["tid"], []).append(
                Bar(event["name"], event["ts"] * _MS_PER_US, event["dur"] * _MS_PER_US))
    unnamed = sorted(set(bars) - set(tracks))
    if unnamed:
        raise ValueError(f"events on tracks without a thread_name: {unnamed}")
    rows = tuple(GanttRow(tracks[tid], tuple(sorted(bars.get(tid, []), key=lambda b: b.start_ms)))
                 for tid in sorted(tracks))
    return GanttChart(hardware, rows)


def draw_gantt(chart: GanttChart, title: str, path: Path) -> Path:
    """Write ``chart`` as a PNG at ``path`` (atomically): the first row at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(14, 1.0 + 0.6 * len(chart.rows)))
    span = chart.span_ms or 1.0
    for index, row in enumerate(chart.rows):
        y = len(chart.rows) - 1 - index
        colour = TRACK_COLOURS.get(row.track, "tab:gray")
        axis.broken_barh([(b.start_ms, b.duration_ms) for b in row.bars], (y - 0.4, 0.8),
                         facecolors=colour, edgecolors="black", linewidth=0.2)
        for bar in row.bars:
            if bar.duration_ms >= LABEL_MIN_FRACTION * span:
                axis.text(bar.start_ms + bar.duration_ms / 2, y, bar.name[:24], ha="center",
                          va="center", fontsize=6, clip_on=True)
    axis.set_yticks(range(len(chart.rows)), [row.track for row in reversed(chart.rows)])
    axis.set_xlim(0, span)
    axis.set_xlabel("time, ms (kernels one after another, as the cost model runs them)")
    axis.set_title(title, fontsize=10)
    axis.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, buffer.getvalue(), force=True)


def gantt_title(case: GanttCase, chart: GanttChart) -> str:
    return (f"{case.shape} {case.strategy} ({case.mesh}): block pair 0 of stage 0 on {chart.hardware}, "
            f"{chart.span_ms:.4g} ms")


def write_gantt_plots(cases: list[GanttCase], out_dir: Path) -> list[Path]:
    """``out_dir/gantt_<shape>_<strategy>.png`` for every case; returns the written paths (none,
    with a warning, without matplotlib)."""
    written = []
    try:
        for case in cases:
            chart = gantt_chart(json.loads(case.timeline.read_text()))
            written.append(draw_gantt(chart, gantt_title(case, chart),
                                      out_dir / f"gantt_{case.shape}_{case.strategy}.png"))
    except ImportError:
        log.warning("matplotlib is not installed: no Gantt charts (pip install -e '.[plot]')")
    return written
