"""The plotly figures the pages share: bars by category, scatters, and a Chrome trace's timeline.

Each returns a :class:`~hlo_report.page.Figure` (plotly.js's traces and layout as plain data);
the hover text of every mark names what it is and its exact value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hlo_report.document import Document
from hlo_report.page import Figure, Value

#: On a log axis of bars, the axis starts at least this factor below the shortest bar, so
#: that every bar shows (a bar at the axis' foot has no height).
LOG_BAR_FOOT = 2.5
#: Marker colours by series, in order (colour-blind safe: Okabe and Ito's palette).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def _axis(title: str, log: bool = False, values: Iterable[Value] = ()) -> dict[str, Any]:
    """An axis; a log axis is labelled at 1, 2 and 5 times the powers of ten within its data
    (plotly's own log labels abbreviate the 2-9 digits)."""
    axis: dict[str, Any] = {"title": {"text": title}, "automargin": True}
    if log:
        axis["type"] = "log"
        ticks = log_ticks(values)
        if ticks:
            axis |= {"tickmode": "array", "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks],
                     "range": [math.log10(ticks[0]) - 0.05, math.log10(ticks[-1]) + 0.05]}
    return axis


def log_ticks(values: Iterable[Value]) -> list[float]:
    """1, 2 and 5 times the powers of ten from just below the least positive value to just
    above the largest."""
    positive = [float(v) for v in values
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    if not positive:
        return []
    low, high = min(positive), max(positive)
    ticks = [float(f"{m}e{k}") for k in range(math.floor(math.log10(low)) - 1,
                                               math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    below = max((t for t in ticks if t <= low), default=ticks[0])
    above = min((t for t in ticks if t >= high), default=ticks[-1])
    return [t for t in ticks if below <= t <= above]


def bars(key: str, title: str, categories: Sequence[str], series: Mapping[str, Sequence[Value]],
         *, y_title: str, x_title: str = "", stacked: bool = False, log: bool = False,
         foot_below: bool = False, shapes: Sequence[dict[str, Any]] = (), note: str = "") -> Figure:
    """One bar per category and series (grouped, or stacked); ``foot_below``: a log axis starts
    :data:`LOG_BAR_FOOT` times below the shortest bar, so that every bar shows."""
    data = tuple({"type": "bar", "name": name, "x": list(categories), "y": list(values),
                  "marker": {"color": PALETTE[index % len(PALETTE)]},
                  "hovertemplate": "%{x}<br>%{fullData.name}: %{y:.4g}<extra></extra>"}
                 for index, (name, values) in enumerate(series.items()))
    values = [v for series_values in series.values() for v in series_values]
    if log and foot_below:  # a bar reaches up from the axis' foot: a step below the shortest
        positive = [float(v) for v in values if isinstance(v, (int, float)) and v > 0]
        values += [min(positive) / LOG_BAR_FOOT] if positive else []
    layout = {"barmode": "stack" if stacked else "group",
              "yaxis": _axis(y_title, log, values),
              "xaxis": _axis(x_title), "legend": {"orientation": "h", "y": -0.25},
              "shapes": list(shapes)}
    return Figure(key, title, data, layout, note)


def scatter_trace(name: str, x: Sequence[Value], y: Sequence[Value], labels: Sequence[str], *,
                  index: int, mode: str = "markers", x_unit: str = "", y_unit: str = "",
                  color: str | None = None, size: int = 9) -> dict[str, Any]:
    """A scatter trace whose hover shows each point's label and both values."""
    return {"type": "scatter", "mode": mode, "name": name, "x": list(x), "y": list(y),
            "text": list(labels), "marker": {"color": color or PALETTE[index % len(PALETTE)],
                                             "size": size},
            "hovertemplate": f"%{{text}}<br>%{{x:.4g}} {x_unit}<br>%{{y:.4g}} {y_unit}"
                             "<extra>%{fullData.name}</extra>"}


def scatter(key: str, title: str, traces: Sequence[dict[str, Any]], *, x_title: str,
            y_title: str, x_log: bool = False, y_log: bool = False,
            shapes: Sequence[dict[str, Any]] = (), note: str = "") -> Figure:
    layout = {"xaxis": _axis(x_title, x_log, (v for trace in traces for v in trace.get("x", ()))),
              "yaxis": _axis(y_title, y_log, (v for trace in traces for v in trace.get("y", ()))),
              "hovermode": "closest", "shapes": list(shapes),
              "legend": {"orientation": "h", "y": -0.25}}
    return Figure(key, title, tuple(traces), layout, note)


def vertical_line(x: float, label: str) -> dict[str, Any]:
    """A dashed vertical line across the plot (a limit), as a plotly shape."""
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
            "line": {"dash": "dash", "color": "#888"}, "label": {"text": label}}


def horizontal_line(y: float, label: str) -> dict[str, Any]:
    """A dashed horizontal line across the plot (a capacity), as a plotly shape."""
    return {"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": y, "y1": y,
            "line": {"dash": "dash", "color": "#888"}, "label": {"text": label}}


def timeline(key: str, title: str, trace: Document, *, note: str = "") -> Figure:
    """The kernels of a Chrome trace-event JSON (``analyze-hlo --timeline``) as a Gantt chart:
    one row per track (thread), one bar per complete event ('X'), time in microseconds."""
    tracks: dict[int, str] = {}
    bars_by_track: dict[int, list[Document]] = {}
    for event in trace.children("traceEvents"):
        phase = event.text("ph")
        if phase == "M" and event.text("name") == "thread_name":
            tracks[int(event.number("tid"))] = event.text("args.name") or ""
        elif phase == "X":
            bars_by_track.setdefault(int(event.number("tid")), []).append(event)
    data = []
    for index, tid in enumerate(sorted(bars_by_track)):
        events = bars_by_track[tid]
        name = tracks.get(tid, f"track {tid}")
        data.append({"type": "bar", "orientation": "h", "name": name,
                     "y": [name] * len(events), "base": [event.number("ts") for event in events],
                     "x": [event.number("dur") for event in events],
                     "hovertext": [event.text("name") for event in events],
                     "marker": {"color": PALETTE[index % len(PALETTE)]},
                     "hovertemplate": "%{hovertext}<br>start %{base:.4g} us<br>%{x:.4g} us"
                                      "<extra>%{fullData.name}</extra>"})
    order = [tracks.get(tid, f"track {tid}") for tid in sorted(bars_by_track)]
    layout = {"barmode": "overlay", "xaxis": _axis("time (us)"),
              "yaxis": {"categoryorder": "array", "categoryarray": order[::-1], "automargin": True},
              "hovermode": "closest", "showlegend": False}
    return Figure(key, title, tuple(data), layout, note)
