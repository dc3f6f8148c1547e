"""The study's page (``results/index.html``): the CSV tables and run.json that
``scripts/sweep.py`` writes, and the plan searches in ``plan_search/*.json`` beside them.

Figures: latency and memory by strategy and shape, where the time goes (GEMM, vector,
flash attention), latency against devices with the one-device baseline's ideal scaling, latency
against memory of the flat and pipelined rows, and each plan search's traced plans. Tables: every
CSV, sortable, and the plan searches' answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_report.document import Document, load_csv, require_columns
from hlo_report.figures import bars, scatter, scatter_trace
from hlo_report.page import Column, Fact, Figure, Item, Page, Section, Table, Text
from hlo_trace.errors import InputFileError, shown

WHAT = "the study's results directory (python3 scripts/sweep.py -o DIR)"

#: The study's tables the page shows, in order, with their titles (absent ones are skipped
#: except latency.csv, the study's answer).
TABLES = (("latency", "Latency, compute, communication and memory per case"),
          ("pipelines", "Pipelines (PipeFusion)"),
          ("communication", "Per-device communication of one denoising step (GB)"),
          ("flops", "FLOPs of one denoising step (TFLOP)"),
          ("split", "Stage traces against one traced pair"),
          ("runs", "Trace runs"))
#: Columns of latency.csv the figures read (the latency column is found by its prefix).
LATENCY_COLUMNS = ("shape", "strategy", "mesh", "memory GB/device", "GEMM time %",
                   "vector time %", "flash-attention time %")


@dataclass(frozen=True)
class Study:
    directory: str
    run: Document
    tables: dict[str, list[dict[str, Any]]]  # CSV name -> rows
    block_ops: tuple[str, list[dict[str, Any]]] | None  # (shape, rows) of block_ops_SHAPE.csv
    searches: tuple[Document, ...]  # plan_search/*.json


def load_study(directory: Path) -> Study:
    """Read the study's files; a missing directory, run.json or latency.csv is one line."""
    if not directory.is_dir():
        raise InputFileError(f"{shown(directory)}: no such directory; expected {WHAT}")
    for required in ("run.json", "latency.csv"):
        if not (directory / required).is_file():
            raise InputFileError(f"{shown(directory)}: no {required}; expected {WHAT}")
    tables = {name: load_csv(directory / f"{name}.csv", f"the study's {name}.csv")
              for name, _ in TABLES if (directory / f"{name}.csv").is_file()}
    require_columns(tables["latency"], LATENCY_COLUMNS, shown(directory / "latency.csv"),
                    "the study's latency.csv")
    block_ops = None
    for path in sorted(directory.glob("block_ops_*.csv")):
        block_ops = (path.stem.removeprefix("block_ops_"), load_csv(path, "the study's per-op table"))
        break
    searches = tuple(Document.load(path, "plan-search --json output")
                     for path in sorted((directory / "plan_search").glob("*.json")))
    return Study(str(directory), Document.load(directory / "run.json", "the study's run.json"),
                 tables, block_ops, searches)


def study_page(study: Study) -> Page:
    latency = study.tables["latency"]
    sections = [Section("The study", tuple(_summary(study, latency))),
                Section("Latency and memory", tuple(_figures(study, latency)))]
    if study.searches:
        sections.append(Section("Plan search", tuple(_searches(study))))
    sections.append(Section("Tables", tuple(_tables(study))))
    sources = (study.directory,)
    return Page(f"Strategy study on {study.run.text('hardware')}", "study", sources,
                tuple(sections))


def _latency_column(rows: list[dict[str, Any]]) -> str:
    return next(name for name in rows[0] if name.startswith("latency s")) if rows else "latency s"


def devices(mesh: str) -> int | None:
    """The devices of a mesh written AxB (1x16 -> 16)."""
    parts = mesh.split("x")
    if not all(part.isdigit() for part in parts):
        return None
    count = 1
    for part in parts:
        count *= int(part)
    return count


def _summary(study: Study, latency: list[dict[str, Any]]) -> Iterator[Item]:
    run = study.run
    yield Text(f"Made by {run.text('command')}.")
    yield Fact("hardware", "system", run.text("hardware"))
    yield Fact("devices", "devices", run.number("devices"))
    yield Fact("steps", "sampling steps", run.number("steps"))
    yield Fact("stage_ids", "stages", run.text("stage_ids", optional=True))
    column = _latency_column(latency)
    for shape in dict.fromkeys(row["shape"] for row in latency):
        done = [row for row in latency if row["shape"] == shape and row[column] is not None]
        if done:
            best = min(done, key=lambda row: row[column])
            yield Fact(f"fastest_{shape}", f"fastest at {shape}", f"{best['strategy']} {best['mesh']}")
            yield Fact(f"fastest_latency_{shape}", "its latency", best[column], "s")


def _figures(study: Study, latency: list[dict[str, Any]]) -> Iterator[Figure]:
    column = _latency_column(latency)
    shapes = list(dict.fromkeys(row["shape"] for row in latency))
    strategies = list(dict.fromkeys(row["strategy"] for row in latency))
    cell = {(row["shape"], row["strategy"]): row for row in latency}

    def series(name: str) -> dict[str, list[Any]]:
        return {shape: [cell.get((shape, strategy), {}).get(name) for strategy in strategies]
                for shape in shapes}

    yield bars("latency", f"Latency by strategy and shape ({column})", strategies, series(column),
               y_title="seconds (log)", log=True,
               note="A missing bar is a case that failed (its error is in the table below).")
    yield bars("memory", "Memory per device by strategy and shape", strategies,
               series("memory GB/device"), y_title="GB per device")
    detail = shapes[0]
    rows = [cell[(detail, s)] for s in strategies if (detail, s) in cell and cell[(detail, s)][column]]
    yield bars("time_share", f"Where the time goes at {detail}", [row["strategy"] for row in rows],
               {kind: [row[f"{kind} time %"] for row in rows]
                for kind in ("GEMM", "vector", "flash-attention")},
               y_title="% of the compute time", stacked=True)
    meshes = {devices(str(row["mesh"])) for row in latency if row[column] is not None}
    if len(meshes - {None}) > 1:  # a curve needs two device counts (a GPU study has one)
        yield _devices_figure(latency, column, shapes)
    pipelines = study.tables.get("pipelines")
    if pipelines:
        yield _latency_memory(latency, pipelines, column)


def _devices_figure(latency: list[dict[str, Any]], column: str, shapes: list[str]) -> Figure:
    traces = []
    for index, shape in enumerate(shapes):
        rows = [row for row in latency if row["shape"] == shape and row[column] is not None
                and devices(str(row["mesh"])) is not None]
        traces.append(scatter_trace(shape, [devices(str(row["mesh"])) for row in rows],
                                    [row[column] for row in rows],
                                    [f"{row['strategy']} {row['mesh']}" for row in rows],
                                    index=index, x_unit="devices", y_unit="s"))
        baseline = [row for row in rows if devices(str(row["mesh"])) == 1]
        counts = sorted({devices(str(row["mesh"])) for row in rows})
        if baseline and len(counts) > 1:
            one = baseline[0][column]
            traces.append({"type": "scatter", "mode": "lines", "name": f"{shape}: one device / n",
                           "x": counts, "y": [one / count for count in counts],
                           "line": {"dash": "dot", "color": traces[-1]["marker"]["color"]},
                           "hovertemplate": "ideal scaling: %{y:.4g} s on %{x} devices<extra></extra>"})
    return scatter("devices", "Latency against devices", traces, x_title="devices (log)",
                   y_title="seconds (log)", x_log=True, y_log=True,
                   note="Each case at the devices of its mesh; the dotted line divides the "
                        "one-device latency by the devices (perfect scaling).")


def _latency_memory(latency: list[dict[str, Any]], pipelines: list[dict[str, Any]],
                    column: str) -> Figure:
    shape = pipelines[0]["shape"]
    flat = [row for row in latency if row["shape"] == shape and row[column] is not None]
    piped_column = _latency_column(pipelines)
    piped = [row for row in pipelines if row[piped_column] is not None]
    return scatter("latency_memory", f"Latency against memory per device at {shape}", [
        scatter_trace("flat", [row["memory GB/device"] for row in flat], [row[column] for row in flat],
                      [f"{row['strategy']} {row['mesh']}" for row in flat], index=0,
                      x_unit="GB", y_unit="s"),
        scatter_trace("pipelined", [row["memory GB/device"] for row in piped],
                      [row[piped_column] for row in piped],
                      [f"{row['pipeline']} M={row['M']}" for row in piped], index=1,
                      x_unit="GB", y_unit="s")],
        x_title="memory per device (GB)", y_title="seconds (log)", y_log=True)


def _searches(study: Study) -> Iterator[Item]:
    rows = []
    for search in study.searches:
        best = search.child("best", optional=True)
        traced = None if best is None else best.child("traced", optional=True)
        rows.append((search.text("shape"), search.text("hardware"),
                     None if best is None else best.text("plan"),
                     None if traced is None else traced.number("latency_s"),
                     None if traced is None else traced.number("memory_bytes") / 1e9,
                     sum(1 for plan in search.children("plans") if plan.has("traced")),
                     len(search.values("plans")),
                     search.number("spearman", optional=True, signed=True)))
    yield Table("searches", "The plan searches' answers", (
        Column("shape", False), Column("system", False), Column("best traced plan", False),
        Column("latency s"), Column("memory GB/device"), Column("traced"), Column("estimated"),
        Column("Spearman")), tuple(rows))
    shape = study.searches[0].text("shape")
    traces = []
    for index, search in enumerate(s for s in study.searches if s.text("shape") == shape):
        plans = [plan for plan in search.children("plans") if plan.has("traced")]
        traces.append(scatter_trace(search.text("hardware"),
                                    [plan.number("traced.memory_bytes") / 1e9 for plan in plans],
                                    [plan.number("traced.latency_s") for plan in plans],
                                    [plan.text("plan") for plan in plans], index=index,
                                    x_unit="GB", y_unit="s"))
    yield scatter("searches", f"Traced plans at {shape}, by system", traces,
                  x_title="memory per device (GB)", y_title="seconds (log)", y_log=True)


def _tables(study: Study) -> Iterator[Table]:
    for name, title in TABLES:
        if name in study.tables:
            yield csv_table(name, title, study.tables[name])
    if study.block_ops is not None:
        shape, rows = study.block_ops
        yield csv_table("block_ops", f"One block pair at {shape}, per op", rows)


def csv_table(key: str, title: str, rows: list[dict[str, Any]]) -> Table:
    """A CSV's rows as a sortable table: a column is numeric when every value in it is."""
    names = list(rows[0]) if rows else []
    numeric = {name: all(isinstance(row[name], (int, float)) or row[name] is None for row in rows)
               for name in names}
    return Table(key, title, tuple(Column(name, numeric[name]) for name in names),
                 tuple(tuple(row[name] for name in names) for row in rows))
