"""The page of one plan search: ``plan-search ... --json FILE`` (results/plan_search/*.json).

Summary (the best traced plan, the memory limit, how far the estimate ranks right), the
latency-memory plane (every estimated plan, the traced ones, the Pareto front, the limit), the
estimate against the traced figure, and the tables of plans and of refused ones.
"""

from __future__ import annotations

from collections.abc import Iterator

from hlo_report.document import Document
from hlo_report.figures import PALETTE, scatter, scatter_trace, vertical_line
from hlo_report.page import Fact, Figure, Item, Page, Section, Table, columns

WHAT = "plan-search --json output"

#: Bytes per GB, as plan-search's report prints memory.
GIGA = 1e9
#: The memory limit is drawn when it is at most this many times the largest memory plotted
#: (beyond, the plans would sit in a sliver at the left of the axis).
LIMIT_DRAWN_WITHIN = 4
#: Up to this many plans, each point is labelled with its plan beside the marker.
LABELLED_PLANS = 5


def plan_page(search: Document) -> Page:
    plans = list(search.children("plans"))
    sections = (Section("Summary", tuple(_summary(search, plans))),
                Section("Plans", tuple(_figures(search, plans))),
                Section("Tables", tuple(_tables(search, plans))))
    return Page(f"Plan search: {search.text('config')} at {search.text('shape')} on "
                f"{search.text('hardware')}", "plan", (search.origin,), sections)


def _summary(search: Document, plans: list[Document]) -> Iterator[Item]:
    best = search.child("best", optional=True)
    yield Fact("best_plan", "best traced plan", None if best is None else best.text("plan"))
    if best is not None and best.has("traced"):
        yield Fact("best_latency_s", "its latency", best.number("traced.latency_s"), "s")
        yield Fact("best_memory_bytes", "its memory per device", best.number("traced.memory_bytes"), "B")
    yield Fact("devices", "devices", search.number("devices"))
    yield Fact("memory_limit_bytes", "memory limit per device", search.number("memory_limit_bytes"), "B")
    yield Fact("steps", "sampling steps", search.number("steps"))
    yield Fact("plans", "plans estimated", len(plans))
    yield Fact("traced", "plans traced", sum(1 for plan in plans if plan.has("traced")))
    yield Fact("refused", "plans refused", len(search.values("infeasible")))
    yield Fact("budget", "trace budget", search.number("budget"))
    yield Fact("stopped", "stopped", search.text("stopped"))
    yield Fact("spearman", "estimate's Spearman on the traced plans",
               search.number("spearman", optional=True, signed=True))
    yield Fact("worst_ratio", "estimate's worst ratio", search.number("worst_ratio", optional=True))


def _traced(plans: list[Document]) -> list[Document]:
    return [plan for plan in plans if plan.has("traced")]


def _figures(search: Document, plans: list[Document]) -> Iterator[Figure]:
    traced = _traced(plans)
    by_label = {plan.text("plan"): plan for plan in traced}
    front = [by_label[label] for label in search.texts("pareto") if label in by_label]
    front.sort(key=lambda plan: plan.number("traced.memory_bytes"))
    estimated = [plan for plan in plans if not plan.has("traced")]
    traces = [
        scatter_trace("estimated only", [p.number("estimate.memory_bytes") / GIGA for p in estimated],
                      [p.number("estimate.latency_s") for p in estimated],
                      [p.text("plan") for p in estimated], index=0, color="#bbbbbb", size=6,
                      x_unit="GB", y_unit="s"),
        scatter_trace("traced", [p.number("traced.memory_bytes") / GIGA for p in traced],
                      [p.number("traced.latency_s") for p in traced],
                      [p.text("plan") for p in traced], index=0, x_unit="GB", y_unit="s"),
        scatter_trace("Pareto front (traced)", [p.number("traced.memory_bytes") / GIGA for p in front],
                      [p.number("traced.latency_s") for p in front],
                      [p.text("plan") for p in front], index=1, mode="lines+markers",
                      x_unit="GB", y_unit="s"),
    ]
    best = search.child("best", optional=True)
    if best is not None and best.has("traced"):
        traces.append(scatter_trace("best", [best.number("traced.memory_bytes") / GIGA],
                                    [best.number("traced.latency_s")], [best.text("plan")],
                                    index=3, size=14, x_unit="GB", y_unit="s"))
    if len(plans) <= LABELLED_PLANS:  # few points: name each beside it
        for trace in traces[:2]:
            trace |= {"mode": "markers+text", "textposition": "top center"}
    limit_gb = search.number("memory_limit_bytes") / GIGA
    largest = max((x for trace in traces for x in trace["x"]), default=0.0)
    drawn = largest > 0 and limit_gb <= LIMIT_DRAWN_WITHIN * largest
    note = ("Grey: the estimate of a plan that was not traced; blue: traced plans at their traced "
            "figures; the line joins the traced Pareto front.")
    if not drawn and largest > 0:
        note += (f" The memory limit ({limit_gb:.4g} GB) is not drawn: every plan needs under "
                 f"{largest / limit_gb:.2%} of it, and a line there would squeeze the plans "
                 "against the left edge.")
    yield scatter("pareto", "Latency against memory per device", traces,
                  x_title="memory per device (GB)", y_title="latency (s)", y_log=True,
                  shapes=(vertical_line(limit_gb, "memory limit"),) if drawn else (), note=note)
    if traced:
        measured = [p.number("traced.latency_s") for p in traced]
        line = [min(measured), max(measured)]
        yield scatter("estimate", "Estimate against traced latency", [
            scatter_trace("traced plans", measured, [p.number("estimate.latency_s") for p in traced],
                          [p.text("plan") for p in traced], index=0, x_unit="s", y_unit="s"),
            {"type": "scatter", "mode": "lines", "name": "estimate = traced", "x": line, "y": line,
             "line": {"dash": "dot", "color": PALETTE[7]}, "hoverinfo": "skip"}],
            x_title="traced latency (s)", y_title="estimated latency (s)")


def _tables(search: Document, plans: list[Document]) -> Iterator[Table]:
    limit = search.number("memory_limit_bytes")
    rows = []
    for plan in plans:
        traced = plan.child("traced", optional=True)
        memory = None if traced is None else traced.number("memory_bytes")
        latency = None if traced is None else traced.number("latency_s")
        estimate = plan.number("estimate.latency_s")
        rows.append((plan.text("plan"), estimate, plan.number("estimate.memory_bytes") / GIGA,
                     latency, None if memory is None else memory / GIGA,
                     None if latency is None or not latency else estimate / latency,
                     None if memory is None else ("yes" if memory <= limit else "no"),
                     plan.text("error", optional=True) or "", plan.text("estimate.basis")))
    yield Table("plans", "Every plan", columns(
        "plan", "estimate s", "estimate GB", "traced s", "traced GB", "estimate / traced",
        "fits", "error", "estimate's basis", text=("plan", "fits", "error", "estimate's basis")),
        tuple(rows))
    yield Table("refused", "Refused plans", columns("plan", "reason", text=("plan", "reason")),
                tuple((entry.text("plan"), entry.text("reason"))
                      for entry in search.children("infeasible")))
