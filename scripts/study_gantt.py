"""Gantt charts of the strategy study: one block pair per strategy, from the cached timelines.

``scripts/sweep.py`` caches, per case of the detailed shape, the Chrome trace-event timeline of
block pair 0 of its stage-0 dump (``analyze-hlo DUMP --hw SYSTEM --timeline FILE
--timeline-pair 0``, ``hlo_analyzer/mapping/timeline.py``). This module reads such a timeline into a
:class:`GanttChart` (computing) and draws it as one PNG per strategy (rendering): one row per
track (GEMM, vector, flash-attention, DRAM, NoC, chip-to-chip network), each kernel a bar
coloured by its track, time in ms.

Run as a script, it draws the Gantt chart of any ``--timeline`` JSON (``analyze-hlo DUMP --hw NAME
--timeline FILE [--timeline-pair K]``)::

    python3 scripts/study_gantt.py --timeline pair0.json -o pair0.png
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_trace.atomic import check_target, write_png  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402
from hlo_trace.errors import UsageError, shown  # noqa: E402

log = logging.getLogger(__name__)

_MS_PER_US = 1e-3
#: Bar colour per track name of ``hlo_analyzer.mapping.timeline.TRACKS`` (grey for any other track).
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
    for index, event in enumerate(events):
        try:
            if event.get("ph") == "M" and event.get("name") == "thread_name":
                tracks[event["tid"]] = str(event["args"]["name"])
            elif event.get("ph") == "M" and event.get("name") == "process_name":
                hardware = str(event["args"]["name"])
            elif event.get("ph") == "X":
                start, duration = float(event["ts"]), float(event["dur"])
                if not (math.isfinite(start) and math.isfinite(duration) and duration >= 0):
                    raise ValueError("a time that is not a finite number (or a negative duration)")
                bars.setdefault(event["tid"], []).append(
                    Bar(str(event["name"]), start * _MS_PER_US, duration * _MS_PER_US))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            what = f"no {error}" if isinstance(error, KeyError) else str(error) or type(error).__name__
            raise ValueError(f"trace event {index} is not a complete event or track name: {what}") from None
    unnamed = sorted(set(bars) - set(tracks))
    if unnamed:
        raise ValueError(f"events on tracks without a thread_name: {unnamed}")
    rows = tuple(GanttRow(tracks[tid], tuple(sorted(bars.get(tid, []), key=lambda b: b.start_ms)))
                 for tid in sorted(tracks))
    return GanttChart(hardware, rows)


def draw_gantt(chart: GanttChart, title: str, path: Path, *, force: bool = True) -> Path:
    """Write ``chart`` as a PNG at ``path`` (atomically; an existing file is replaced only with
    ``force``): the first row at the top."""
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
    path.parent.mkdir(parents=True, exist_ok=True)
    written = write_png(fig, path, force=force)
    plt.close(fig)
    return written


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


def timeline_title(path: Path, chart: GanttChart) -> str:
    """The title of a chart drawn from any timeline file."""
    return f"{path.name} on {chart.hardware}, {chart.span_ms:.4g} ms"


def read_timeline(path: Path) -> GanttChart:
    """The chart of the timeline file at ``path``; a UsageError naming it if it is not one."""
    name = shown(path)
    if not path.exists():
        raise UsageError(f"{name}: no such file")
    if not path.is_file():  # a directory, a FIFO or a device: never read (a FIFO would block)
        raise UsageError(f"{name}: not a regular file, expected a --timeline JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not UTF-8 text, expected a --timeline JSON file") from None
    except OSError as error:
        raise UsageError(f"{name}: cannot read: {error.strerror or error}") from None
    try:
        document = json.loads(text)
    except ValueError as error:
        raise UsageError(f"{name}: not JSON ({error}); expected the trace-event file that "
                         "analyze-hlo --timeline writes") from None
    try:
        chart = gantt_chart(document)
    except ValueError as error:
        raise UsageError(f"{name}: {error}; expected the trace-event file that analyze-hlo "
                         "--timeline writes") from None
    if not any(row.bars for row in chart.rows):
        raise UsageError(f"{name}: the timeline has no kernels (no complete events) to draw")
    return chart


@click.command(help="""Draw the Gantt chart of a --timeline JSON as a PNG.

The timeline is the Chrome trace-event file that `analyze-hlo DUMP --hw NAME --timeline FILE`
writes (add `--timeline-pair K` for one block pair of an STDiT3 stage): one row per track (GEMM,
vector, flash-attention, DRAM, NoC, chip-to-chip network), each kernel a bar coloured by its
track, time in ms, kernels one after another as the cost model runs them. Needs matplotlib
(pip install -e '.[plot]').

\b
Example (one block pair of a bundled dump on a TX8 chip):
  analyze-hlo dumps/stablehlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir \\
      --hw tx8 --timeline pair0.json --timeline-pair 0
  python3 scripts/study_gantt.py --timeline pair0.json -o pair0.png""")
@click.option("--timeline", "timeline", required=True, type=click.Path(path_type=Path),
              help="the trace-event JSON written by analyze-hlo --timeline")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="the PNG to write (refused if it exists, unless --force)")
@click.option("--title", default=None, help="the chart's title (default: the file name, the "
              "hardware the timeline ran on and its span)")
@click.option("--force", is_flag=True, help="overwrite the output file")
def main(timeline: Path, output: Path, title: str | None, force: bool) -> None:
    check_target(output, force=force)
    chart = read_timeline(timeline)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("drawing needs matplotlib: pip install -e '.[plot]'") from None
    draw_gantt(chart, title or timeline_title(timeline, chart), output, force=force)
    click.echo(f"wrote {shown(output)}: {sum(len(row.bars) for row in chart.rows)} kernels on "
               f"{len(chart.rows)} tracks, {chart.span_ms:.4g} ms", err=True)


if __name__ == "__main__":
    sys.exit(run_click(main))
