"""Write every figure the README and docs quote from the committed result file it comes from.

A quoted figure sits between two markers in the Markdown (invisible once rendered)::

    the ring is <!-- fig split.worst -->0.29%<!-- /fig --> off

and a table copied from a result file between two lines::

    <!-- table results/latency.md -->
    | shape | ... |
    <!-- /table -->

Each figure's name is a key of :data:`FIGURES`: the result file it is read from and how it is
written (a cell of a result table, ``csv:``, or a value of a result JSON, ``json:``, needs no
entry). A table marker names its result file: the first Markdown table in it (what the sweep,
the plan search or a calibration wrote), its N-th as ``PATH#N``, or, for a JSON folder with a
renderer in :data:`TABLES`, the table that renderer makes from it.

    python3 scripts/docs_figures.py            # rewrite the figures in place
    python3 scripts/docs_figures.py --check    # exit 1 and name each figure that differs

Bad input (a marker with no figure of that name, a missing result file) is one ``Error:`` line
and exit code 2. CI runs ``--check`` (tests/test_docs_figures.py).
"""

from __future__ import annotations

import csv
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click

from hlo_trace.atomic import atomic_write
from hlo_trace.cli import OneLineCommand
from hlo_trace.errors import UsageError
from models.opensora.config import get_config
from models.opensora.flops import block_pair_gemm_flops, parameter_count
from models.opensora.inputs import REFERENCE_SHAPES, geometry

#: The documents whose figures this script owns.
DOCUMENTS = ("README.md", "docs/*.md")
FIGURE = re.compile(r"<!-- fig (?P<name>[^>]+?) -->(?P<text>.*?)<!-- /fig -->", re.S)
#: A cell of a result table quoted as is: ``csv:PATH[COLUMN=VALUE,...].COLUMN|FORMAT`` (the row
#: whose columns have those values, in a CSV file or a ``.md`` file's first table, or its N-th
#: as ``PATH#N``; FORMAT a format spec for a number, default ``.4g``: for a cell that holds more
#: than a number, such as ``57.6 s``, its first number).
#: A value of a result JSON: ``json:PATH#KEY.KEY...|FORMAT`` (keys may hold spaces, not dots).
JSON_VALUE = re.compile(r"json:(?P<path>[^#]+)#(?P<keys>[^|]+?)(?:\|(?P<form>.+))?")
CSV_CELL = re.compile(r"csv:(?P<path>[^\[]+)\[(?P<where>[^\]]*)\]\.(?P<column>[^|]+?)(?:\|(?P<form>.+))?")
TABLE = re.compile(r"^<!-- table (?P<name>[\w.:/#-]+) -->\n(?P<text>.*?)^<!-- /table -->$", re.S | re.M)
#: The classes of the GPU model that stream memory (everything but GEMMs and attention).
COMPUTE_CLASSES = frozenset({"gemm", "bmm", "flash_attention"})


@dataclass(frozen=True)
class Figure:
    """A quoted figure: the committed file it comes from and how it is written."""

    source: str
    render: Callable[[Path], str]


# -- readers of result files --------------------------------------------------------------------------------
def _residuals(path: Path, card: str) -> dict[str, tuple[float, float]]:
    """Each class's (mean abs error %, worst error %) on its fitted range, from the residual
    table ``scripts/calibrate_gpu.py --write`` writes for ``card``."""
    section = path.read_text().split(f"## {card}\n", 1)
    if len(section) != 2:
        raise UsageError(f"{path}: no section for {card}")
    found = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.match(r"\d+ points, mean abs error ([-+\d.]+)%, worst ([-+\d.]+)%", cells[-1])
        if len(cells) == 2 and match:
            found[cells[0]] = (float(match[1]), float(match[2]))
    if not found:
        raise UsageError(f"{path}: no residuals for {card}")
    return found


def _memory_bound_means(path: Path) -> str:
    means = [mean for name, (mean, _) in _residuals(path, "h100-sxm").items() if name not in COMPUTE_CLASSES]
    return f"{min(means):.1f}-{max(means):.1f}%"


def _class_residual(card: str, name: str) -> Callable[[Path], str]:
    def render(path: Path) -> str:
        residuals = _residuals(path, card)
        if name not in residuals:
            raise UsageError(f"{path}: no residual of class {name} for {card}")
        mean, worst = residuals[name]
        return f"{mean:.1f}% mean, worst {worst:+.1f}%"
    return render


def _worst_memory_bound_class(path: Path) -> str:
    residuals = _residuals(path, "h100-sxm")
    return max((name for name in residuals if name not in COMPUTE_CLASSES), key=lambda n: residuals[n][0])


def _split_worst(path: Path) -> str:
    with path.open(newline="") as handle:
        differences = [abs(float(row["difference %"])) for row in csv.DictReader(handle)]
    if not differences:
        raise UsageError(f"{path}: no rows")
    return f"{max(differences):.2f}%"


def _parameters(_path: Path) -> str:
    return f"{parameter_count(get_config('full')):,}"


def _pair_tflop(shape: str) -> Callable[[Path], str]:
    def render(_path: Path) -> str:
        config = get_config("full")
        tokens = geometry(config, shape)
        return f"{sum(block_pair_gemm_flops(config, tokens.T, tokens.S).values()) / 1e12:.2f}"
    return render


#: A number in a table's cell (``57.6 s``, ``0.92x``, ``+29.9%``).
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers(cell: str) -> list[float]:
    return [float(n) for n in NUMBER.findall(cell)]


@dataclass(frozen=True)
class Column:
    """One column of a result table (a CSV file, or the ``table``-th Markdown table of a ``.md``
    file) read as the ``number``-th number of each cell, in the rows whose cells equal ``where``
    and differ from ``unless`` (pairs of column and value). A cell without it (``-``) is no value."""

    column: str
    table: int = 1
    number: int = 0
    where: tuple[tuple[str, str], ...] = ()
    unless: tuple[tuple[str, str], ...] = ()

    def values(self, path: Path) -> list[float | None]:
        rows = [row for row in _table_rows(path, self.table)
                if all(row.get(k) == v for k, v in self.where) and not any(row.get(k) == v for k, v in self.unless)]
        if not rows or self.column not in rows[0]:
            raise UsageError(f"{path}: no rows with a column {self.column!r} in table {self.table}")
        numbers = [_numbers(row[self.column]) for row in rows]
        return [n[self.number] if len(n) > self.number else None for n in numbers]


def _range(found: list[float], form: str) -> str:
    """``LOW-HIGH`` (one value if both round alike)."""
    low, high = format(min(found), form), format(max(found), form)
    return low if low == high else f"{low}-{high}"


def _span(values: Column, over: Column | None = None, form: str = ".2f", excess: bool = False,
          scale: float = 1.0, files: str = "") -> Callable[[Path], str]:
    """The range ``LOW-HIGH`` of a column's values x ``scale`` (one value if they round alike),
    or of their ratios to ``over``'s in the same rows; ``excess`` writes a ratio r as the
    percentage r - 1. With ``files`` the source is a folder and the values those of its files
    that match that pattern, together."""
    def read(path: Path) -> list[float]:
        found = values.values(path)
        if over is not None:
            found = [a / b if a is not None and b else None for a, b in zip(found, over.values(path))]
        return [((v - 1) * 100 if excess else v * scale) for v in found if v is not None]

    def render(path: Path) -> str:
        found = [v for file in sorted(path.glob(files)) for v in read(file)] if files else read(path)
        if not found:
            raise UsageError(f"{path}: no values in column {values.column!r}")
        return _range(found, form)
    return render


def _matched(pattern: str, group: int = 1, form: str = "") -> Callable[[Path], str]:
    """A number in a line of a result file's text (what a script prints outside its tables), by a
    regular expression on the text; ``form`` reformats it."""
    def render(path: Path) -> str:
        match = re.search(pattern, path.read_text(), re.M)
        if match is None:
            raise UsageError(f"{path}: no text matching {pattern!r}")
        return format(float(match[group]), form) if form else match[group]
    return render


def _matched_quotient(pattern: str, numerator: int, denominator: int, form: str = ".2f") -> Callable[[Path], str]:
    """One number over another, both groups of one match of ``pattern`` in a result file's text."""
    def render(path: Path) -> str:
        match = re.search(pattern, path.read_text(), re.M)
        if match is None:
            raise UsageError(f"{path}: no text matching {pattern!r}")
        return format(float(match[numerator]) / float(match[denominator]), form)
    return render


def _all_matched(path: Path, pattern: str, group: int) -> list[float]:
    found = [float(m[group]) for m in re.finditer(pattern, path.read_text(), re.M)]
    if not found:
        raise UsageError(f"{path}: no line matching {pattern!r}")
    return found


def _matched_span(pattern: str, group: int = 1, form: str = ".4f") -> Callable[[Path], str]:
    """The range of a number over every line of a result file's text that ``pattern`` matches
    (a column of a table a command prints in plain text)."""
    return lambda path: _range(_all_matched(path, pattern, group), form)


def _matched_within(pattern: str, group: int = 1, tolerance: float = 0.05) -> Callable[[Path], str]:
    """``K of N``: of the N ratios ``pattern`` matches in a result file's text, the K within
    ``tolerance`` of 1."""
    def render(path: Path) -> str:
        found = _all_matched(path, pattern, group)
        return f"{sum(1 for v in found if abs(v - 1) <= tolerance)} of {len(found)}"
    return render


def _kernel_constant(*keys: str | int, form: str = ".2f") -> Callable[[Path], str]:
    """A constant of a GPU description's ``[kernel_model]`` (``scripts/calibrate_gpu.py --write``
    writes it from the microbenchmarks), by its keys below that table; a quantity with a unit
    (``2.58 us``) is its number, the unit left to the prose; a list of numbers (or of a curve's
    points, their last numbers) its range."""
    def render(path: Path) -> str:
        value = tomllib.loads(path.read_text())["kernel_model"]
        for key in keys:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                raise UsageError(f"{path}: no kernel_model constant {'.'.join(map(str, keys))}") from None
        if isinstance(value, list) and all(isinstance(v, list) and v for v in value):
            value = [v[-1] for v in value]   # a curve of (row length, efficiency) points: its efficiencies
        numbers = _numbers(value) if isinstance(value, str) else value if isinstance(value, list) else [value]
        if not numbers or not all(isinstance(n, (int, float)) for n in numbers):
            raise UsageError(f"{path}: kernel_model {'.'.join(map(str, keys))} is no number")
        return _range(numbers, form) if isinstance(value, list) else format(numbers[0], form)
    return render


#: Every figure a document may quote, by name.
FIGURES: dict[str, Figure] = {
    "calibration.h100.memory_bound_means": Figure("results/gpu_microbench/calibration.md", _memory_bound_means),
    "calibration.h100.worst_memory_bound_class": Figure("results/gpu_microbench/calibration.md",
                                                        _worst_memory_bound_class),
    "calibration.h100.group_norm": Figure("results/gpu_microbench/calibration.md",
                                          _class_residual("h100-sxm", "group_norm")),
    "calibration.h100.gemm": Figure("results/gpu_microbench/calibration.md", _class_residual("h100-sxm", "gemm")),
    "calibration.h100.flash_attention": Figure("results/gpu_microbench/calibration.md",
                                               _class_residual("h100-sxm", "flash_attention")),
    "split.worst": Figure("results/split.csv", _split_worst),
    # counts of the model's own code (the source is the code, not a result)
    "model.parameters": Figure("models/opensora/flops.py", _parameters),
    "model.pair_tflop.204_640_360": Figure("models/opensora/flops.py", _pair_tflop("204_640_360")),
}


# -- docs/gpu.md ---------------------------------------------------------------------------------------------
PREDICTIONS = "results/gpu_validation/predictions.md"
PREDICTIONS_H200 = "results/gpu_validation/predictions_h200.md"
MEASURED_H100 = "results/gpu_validation/NVIDIA_H100_80GB_HBM3.md"
_PUBLISHED_TIME = Column("published, one 80G H100 (whole generation)")
_MEASURED = "measured here, H100 SXM: loop + VAE decode = generation"
_PREDICTED_H100 = "h100-sxm: loop + decode = generation (/ measured, / published)"
#: Each number of a generation cell ``loop + decode = generation s (/ measured, / published)``.
_LOOP, _DECODE, _GENERATION, _VS_MEASURED = 0, 1, 2, 3
_NOT_MEASURED = ((_MEASURED, "-"),)
_TWO_SECONDS = (("duration", "2s"),)
_PARTS = {"loop": _LOOP, "decode": _DECODE, "generation": _GENERATION}


def _quotient(numerator: str, denominator: str, form: str = ".2f") -> Callable[[Path], str]:
    """One quoted figure over another (each a name :func:`figure` reads, from its own file)."""
    def render(_path: Path) -> str:
        values = [_numbers(figure(name)) for name in (numerator, denominator)]
        if not all(values) or not values[1][0]:
            raise UsageError(f"figure {numerator} / {denominator}: not two numbers")
        return format(values[0][0] / values[1][0], form)
    return render


def _measured_generation(shape: str) -> dict[str, Figure]:
    """The H100 generation measured at ``shape`` and the prediction's ratios to it."""
    at = (("shape", shape),)
    return {**{f"gpu.measured.{shape}.{part}": Figure(PREDICTIONS, _span(Column(_MEASURED, number=number, where=at),
                                                                           form=".2f" if part == "decode" else ".1f"))
               for part, number in _PARTS.items()},
            f"gpu.vs_measured.{shape}": Figure(PREDICTIONS, _span(Column(_PREDICTED_H100, number=_VS_MEASURED,
                                                                         where=at))),
            f"gpu.measured_vs_published.{shape}": Figure(PREDICTIONS, _span(
                Column(_MEASURED, number=_GENERATION, where=at), Column(_PUBLISHED_TIME.column, where=at)))}


def _kernel_constants(card: str, *names: str, keys: tuple[str | int, ...] = (), form: str = ".2f") -> dict[str, Figure]:
    """``card.NAME`` (``card.NAME.KEY...`` with ``keys``) for each constant of ``card``'s
    ``[kernel_model]``, or of its table ``vector_efficiency`` where NAME is a kernel class."""
    source = f"hardware/data/{card}.toml"
    return {".".join(map(str, (card, name, *keys))): Figure(source, _kernel_constant(
        *(("vector_efficiency", name) if name in VECTOR_CLASSES else (name,)), *keys, form=form)) for name in names}


VECTOR_CLASSES = frozenset({"broadcast", "copy", "elementwise", "gelu", "layer_norm", "layout_transpose", "select",
                            "strided", "transpose_copy"})

FIGURES.update({
    **_kernel_constants("h100-sxm", "kernel_overhead", "launch_floor", form=".1f"),
    **_kernel_constants("h200-sxm", "kernel_overhead", form=".1f"),
    **_kernel_constants("h100-sxm", *sorted(VECTOR_CLASSES), "gemm_mma_efficiency", "flash_efficiency"),
    **_kernel_constants("h200-sxm", "layer_norm", "broadcast"),
    **_kernel_constants("h100-sxm", "gemm_k_overhead", "flash_kv_overhead", form="d"),
    **{f"h100-sxm.{name}.{row}": Figure("hardware/data/h100-sxm.toml",
                                        _kernel_constant("row_efficiency", name, index, 1))
       for name, rows in (("reduction", (16, 64, 256, 1024)), ("layer_norm", (1024, 4096)))
       for index, row in enumerate(rows)},
    "h100-sxm.flash_efficiency.96": Figure("hardware/data/h100-sxm.toml", _kernel_constant("flash_efficiency", 2)),
    "h100-sxm.softmax.rows": Figure("hardware/data/h100-sxm.toml", _kernel_constant("row_efficiency", "softmax")),
    "a100-sxm.flash_efficiency.128": Figure("hardware/data/a100-sxm.toml", _kernel_constant("flash_efficiency", 3)),
    "microbench.launch_us": Figure("results/gpu_microbench", _span(
        Column("seconds", where=(("kind", "launch"), ("family", "add of one element"))),
        scale=1e6, form=".1f", files="microbench_*.csv")),
    "gpu.loop_over_pair_loop": Figure(MEASURED_H100, _span(Column("loop (s)", table=2),
                                                           Column("loop from the pair (s)", table=2),
                                                           form=".0f", excess=True)),
    "gpu.h200.forward_ms": Figure(PREDICTIONS_H200, _matched(r"against \d+ x (\d+) ms")),
    "gpu.h200.loop_measured_s": Figure(PREDICTIONS_H200, _matched(r"ms = ([\d.]+) s measured")),
    "gpu.h200.loop_predicted_s": Figure(PREDICTIONS_H200, _matched(r"loop ([\d.]+) s against")),
    "gpu.h200.loop_ratio": Figure(PREDICTIONS_H200, _matched(r"measured \(([\d.]+)x\)")),
    # the predicted generation against OpenSora's published figures and this project's H100 runs
    "gpu.generation_vs_published.longer": Figure(PREDICTIONS, _span(Column("/ published", table=2,
                                                                           unless=_TWO_SECONDS))),
    "gpu.measured_vs_published": Figure(PREDICTIONS, _span(Column(_MEASURED, number=_GENERATION), _PUBLISHED_TIME)),
    "gpu.loop_vs_measured": Figure(PREDICTIONS, _span(Column(_PREDICTED_H100, number=_LOOP),
                                                      Column(_MEASURED, number=_LOOP))),
    "gpu.generation_vs_measured": Figure(PREDICTIONS, _span(Column(_PREDICTED_H100, number=_VS_MEASURED,
                                                                   unless=_NOT_MEASURED))),
    "gpu.device_memory_vs_published": Figure(PREDICTIONS, _span(Column("/ published (3)", table=2,
                                                                       unless=(("shape", "408_854_480"),)))),
    "gpu.tensors_vs_published": Figure(PREDICTIONS, _span(Column("/ published (2)", table=2))),
    **_measured_generation("51_640_360"),
    **_measured_generation("51_854_480"),
    "gpu.device_vs_published.408_854_480": Figure("results/gpu_validation", _quotient(
        "csv:results/gpu_validation/generation_NVIDIA_H100_80GB_HBM3.md[shape=408_854_480].device peak (GiB)",
        "csv:results/gpu_validation/predictions.md#2[shape=408_854_480].published peak memory|.0f")),
    **{f"gpu.{system}.speedup": Figure(f"results/{system}/latency.csv", _quotient(
        f"csv:{PREDICTIONS}[shape=204_640_360].{card}: loop + decode = generation (/ measured, / published)|.1f",
        f"csv:results/{system}/latency.csv[shape=204_640_360,strategy=ds_ulysses].latency s (30 steps)", form=".1f"))
       for system, card in (("gpu8xh100", "h100-sxm"), ("gpu8xa100-40gb", "a100-sxm-40gb"))},
    "gpu.loop_vs_measured.204_640_360": Figure(PREDICTIONS, _span(
        Column(_PREDICTED_H100, number=_LOOP, where=(("shape", "204_640_360"),)),
        Column(_MEASURED, number=_LOOP, where=(("shape", "204_640_360"),)))),
})

# -- docs/plan_search.md -------------------------------------------------------------------------------------
def _search_plan(plan: str, *keys: str, pattern: str = "", form: str = "") -> Callable[[Path], str]:
    """A value of one plan of a ``plan-search --json`` file (``keys`` below the plan), or the
    first group of ``pattern`` in it; ``form`` formats a number."""
    def render(path: Path) -> str:
        found = [p for p in json.loads(path.read_text())["plans"] if p["plan"] == plan]
        if not found:
            raise UsageError(f"{path}: no plan {plan}")
        value = found[0]
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                raise UsageError(f"{path}: plan {plan} has no {'.'.join(keys)}")
            value = value[key]
        if pattern:
            match = re.search(pattern, str(value))
            if match is None:
                raise UsageError(f"{path}: plan {plan}'s {'.'.join(keys)} does not match {pattern!r}")
            value = match[1]
        return format(float(value), form) if form else str(value)
    return render


def _search_figures(search: str, plan: str, name: str) -> dict[str, Figure]:
    """``search.SEARCH.NAME.*``: one traced plan of an inference search's JSON."""
    source = f"results/plan_search/{search}.json"
    return {f"search.{search}.{name}.estimate": Figure(source, _search_plan(plan, "estimate", "latency_s", form=".6g")),
            f"search.{search}.{name}.traced": Figure(source, _search_plan(plan, "traced", "latency_s", form=".6g")),
            f"search.{search}.{name}.inexact": Figure(source, _search_plan(plan, "estimate", "basis",
                                                                           pattern=r"(\d+) of \d+ integers")),
            f"search.{search}.{name}.integers": Figure(source, _search_plan(plan, "estimate", "basis",
                                                                            pattern=r"of (\d+) integers", form=",.0f"))}


#: A traced plan's row in ``plan-search --mode train``'s printout: plan, estimate s, traced s,
#: estimate / traced, pair memory ratio (the ``*`` of a plan drawn at random before the plan).
def _train_row(plan: str = r"\d+x\d+:\S+(?: \S+)*") -> str:
    return rf"^ [ *]({plan})\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$"


def _train_figures(system: str) -> dict[str, Figure]:
    """``train.SYSTEM.*``: the training search at 204_640_360 on ``system`` (its printout)."""
    source = f"results/plan_search/train_204_640_360_{system}.txt"
    return {f"train.{system}.{name}": Figure(source, render) for name, render in {
        "estimated": _matched(r"space: (\d+) training plans estimated"),
        "fit": _matched(r"; (\d+) fit\n"),
        "within": _matched_within(_train_row(), 4),
        "ratio": _matched_span(_train_row(), 4),
        "ratio.m8": _matched_span(_train_row(r"\d+x\d+:\S+(?: \S+)* m=8 b=\d+"), 4),
        "ratio.m4": _matched_span(_train_row(r"\d+x\d+:\S+(?: \S+)* m=4 b=\d+"), 4, form=".3f"),
        "inexact": _matched(r"; (\d+) of \d+ integers inexact"),
        "integers": _matched(r"; \d+ of (\d+) integers inexact", form=",.0f"),
        "spearman": _matched(r"Spearman rank correlation ([\d.]+)"),
        "best": _matched(r"best plan \(traced [\d.]+ s\): (.+?) b=\d+$"),
        "best_s": _matched(r"best plan \(traced ([\d.]+) s\)", form=".3g"),
    }.items()}


def _confirmation(devices: int) -> str:
    """A sizing printout's confirmation line of ``devices``: group 1 the estimate, 2 the traced s."""
    return rf"^  confirmation {devices} devices, .*: estimate ([\d.]+) s, traced ([\d.]+) s"


def _sizing_figures(sizing: str, devices: tuple[int, ...]) -> dict[str, Figure]:
    """``sizing.SIZING.*``: a sizing run's target, answer, and each confirmation of ``devices``
    (traced seconds, and traced over estimated)."""
    source = f"results/sizing/{sizing}.txt"
    answer = r"^answer: (\d+) devices: (.+?): ([\d.]+) s \(traced\)"
    return {f"sizing.{sizing}.target": Figure(source, _matched(r"target inference latency ([\d.]+) s")),
            f"sizing.{sizing}.answer.devices": Figure(source, _matched(answer)),
            f"sizing.{sizing}.answer.plan": Figure(source, _matched(answer, 2)),
            f"sizing.{sizing}.answer.traced": Figure(source, _matched(answer, 3)),
            **{f"sizing.{sizing}.{n}.traced": Figure(source, _matched(_confirmation(n), 2, form=".4g"))
               for n in devices},
            **{f"sizing.{sizing}.{n}.ratio": Figure(source, _matched_quotient(_confirmation(n), 2, 1))
               for n in devices}}


FIGURES.update({
    **_sizing_figures("51_1280_720_tx8-64", (24, 23)),
    **_sizing_figures("51_1280_720_8x8xh100", (8, 7)),
    **_sizing_figures("102_1280_720_tx8-64", (24,)),
    **_sizing_figures("204_640_360_tx8-64", (24, 23)),
    **_sizing_figures("408_640_360_tx8-64", (16, 15)),
    **_search_figures("204_640_360_8xh100", "1x8:ds_ulysses@2x4 M=1", "ds_ulysses"),
    "search.408_640_360_8xh100.calibration": Figure("results/plan_search/408_640_360_8xh100.json", _search_plan(
        "1x8:ds_ulysses@2x4 M=1", "estimate", "basis", pattern=r"\((\w+), ")),
    **_train_figures("4x8xh100"),
    **_train_figures("tx8-64"),
    **_train_figures("8x8xh100"),
    "train.8x8xh100.usp_16x2": Figure("results/plan_search/train_204_640_360_8x8xh100.txt", _matched(
        _train_row(re.escape("2x32:usp@16x2(ring 1) zero0 recompute m=4 b=64")), 3, form=".3g")),
})

# -- docs/training.md ----------------------------------------------------------------------------------------
_GEMM_OVER_FORWARD = "gemm_over_3x_forward"
FIGURES.update({
    "training.comm_worst_percent": Figure("results/training.csv", _span(
        Column("comm_layout_max_relative_difference"), scale=100, form=".3f")),
    "training.gemm.dp": Figure("results/training.csv", _span(
        Column(_GEMM_OVER_FORWARD, where=(("strategy", "dp"),)), form=".4f")),
    "training.gemm.batch_on_x": Figure("results/training.csv", _span(
        Column(_GEMM_OVER_FORWARD, where=(("mesh", "2x8"),)), form=".4f")),
})

# -- tables -------------------------------------------------------------------------------------------------
def first_table(path: Path, number: int = 1) -> str:
    """The first (or the ``number``-th) Markdown table of a result file, as its lines."""
    tables, lines = [], []
    for line in [*path.read_text().splitlines(), ""]:
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            tables.append(lines)
            lines = []
    if len(tables) < number:
        raise UsageError(f"{path}: {len(tables)} Markdown table(s), no table {number}")
    return "\n".join(tables[number - 1]) + "\n"


def _split_number(name: str) -> tuple[str, int]:
    """``PATH#N`` (the N-th table of a Markdown file) as (PATH, N); a bare PATH is table 1."""
    path, _, number = name.partition("#")
    if number and not number.isdigit():
        raise UsageError(f"{name}: expected PATH#N, N the table's number in the file")
    return path, int(number or 1)


def plan_search_table(folder: Path) -> str:
    """One row per inference search of ``folder`` (``plan-search --json`` files)."""
    rows = ["| shape | system | best traced plan | latency s (30 steps) | memory GB/device | plans traced "
            "| estimate within 5% | Spearman | worst ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for search in _searches(folder):
        best, within = search["best"], search["within_tolerance"]
        traced = [p for p in search["plans"] if p["traced"]]
        drawn = sum(1 for p in traced if p["validation"])
        rows.append(f"| {search['shape']} | {search['hardware']} | `{best['plan']}` | {best['traced']['latency_s']:.2f} "
                    f"| {best['traced']['memory_bytes'] / 1e9:.2f} | {len(traced)} ({len(traced) - drawn} + {drawn} random) "
                    f"| {within['plans']} of {within['of']} | {search['spearman']:.3f} | {search['worst_ratio']:.3f} |")
    return "\n".join(rows) + "\n"


def _searches(folder: Path) -> list[dict]:
    """The inference searches of ``folder`` (``plan-search --json`` files), by system and shape."""
    def order(path: Path) -> tuple:
        shape, system = path.stem.rsplit("_", 1)
        return system, REFERENCE_SHAPES.index(shape) if shape in REFERENCE_SHAPES else len(REFERENCE_SHAPES), shape

    files = sorted(folder.glob("*_*.json"), key=order)
    if not files:
        raise UsageError(f"{folder}: no plan-search JSON files")
    return [json.loads(path.read_text()) for path in files]


def search_estimate_table(folder: Path) -> str:
    """How well the estimate ranks and times each search's traced plans: within 5%, Spearman, the
    worst ratio, the two largest residuals and the flat plans' largest."""
    rows = ["| search | within 5% | Spearman | worst ratio | largest errors | flat plans, largest error |",
            "|---|---|---|---|---|---|"]
    for search in _searches(folder):
        traced = sorted((p for p in search["plans"] if p["traced"] and p["residual"] is not None),
                        key=lambda p: -abs(p["residual"]))
        flat = [abs(p["residual"]) for p in traced if p["plan"].startswith("1x")]
        within = search["within_tolerance"]
        largest = ", ".join(f"`{p['plan']}` ({p['residual']:+.1%})" for p in traced[:2])
        rows.append(f"| {search['shape']} on {search['hardware']} | {within['plans']} of {within['of']} "
                    f"| {search['spearman']:.3f} | {search['worst_ratio']:.3f} | {largest} "
                    f"| {f'{max(flat):.1%}' if flat else '-'} |")
    return "\n".join(rows) + "\n"


#: Table renderers of result folders (a table marker naming a file takes its first table).
TABLES: dict[str, Callable[[Path], str]] = {"results/plan_search": plan_search_table,
                                            "results/plan_search:estimates": search_estimate_table}


def table(name: str) -> str:
    if name in TABLES:
        return TABLES[name](REPO_ROOT / name.partition(":")[0])   # FOLDER:KIND, a second table of FOLDER
    file, number = _split_number(name)
    if not (REPO_ROOT / file).is_file():
        raise UsageError(f"table {name}: no such result file")
    return first_table(REPO_ROOT / file, number)


def _table_rows(path: Path, number: int = 1) -> list[dict[str, str]]:
    """The rows of a CSV file, or of the first (``number``-th) Markdown table of a ``.md`` file,
    by column (a header a Markdown table repeats is ``NAME (2)`` the second time)."""
    if path.suffix == ".md":
        lines = [[cell.strip() for cell in line.strip().strip("|").split("|")]
                 for line in first_table(path, number).splitlines()]
        header = [name if lines[0][:i].count(name) == 0 else f"{name} ({lines[0][:i].count(name) + 1})"
                  for i, name in enumerate(lines[0])]
        return [dict(zip(header, cells)) for cells in lines[2:]]
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def table_cell(name: str) -> str:
    """The cell a ``csv:`` figure names (:data:`CSV_CELL`; a ``.md`` path reads its first table)."""
    match = CSV_CELL.fullmatch(name)
    if match is None:
        raise UsageError(f"figure {name}: expected csv:PATH[COLUMN=VALUE,...].COLUMN|FORMAT")
    file, number = _split_number(match["path"])
    path = REPO_ROOT / file
    if not path.is_file():
        raise UsageError(f"figure {name}: no such result file {file}")
    where = dict(pair.split("=", 1) for pair in match["where"].split(",") if pair)
    rows = [row for row in _table_rows(path, number) if all(row.get(k) == v for k, v in where.items())]
    if len(rows) != 1 or match["column"] not in rows[0]:
        raise UsageError(f"figure {name}: {len(rows)} rows of {match['path']} match, or no such column")
    cell = rows[0][match["column"]]
    try:
        return format(float(cell), match["form"] or ".4g")
    except ValueError:
        numbers = _numbers(cell)
        return format(numbers[0], match["form"]) if match["form"] and numbers else cell


def json_value(name: str) -> str:
    """The value a ``json:`` figure names (:data:`JSON_VALUE`)."""
    match = JSON_VALUE.fullmatch(name)
    if match is None:
        raise UsageError(f"figure {name}: expected json:PATH#KEY.KEY...|FORMAT")
    path = REPO_ROOT / match["path"]
    if not path.is_file():
        raise UsageError(f"figure {name}: no such result file {match['path']}")
    value = json.loads(path.read_text())
    for key in match["keys"].split("."):
        if not isinstance(value, dict) or key not in value:
            raise UsageError(f"figure {name}: {match['path']} has no field {match['keys']}")
        value = value[key]
    return format(value, match["form"] or "") if isinstance(value, (int, float)) else str(value)


def figure(name: str) -> str:
    if name.startswith("csv:"):
        return table_cell(name)
    if name.startswith("json:"):
        return json_value(name)
    if name not in FIGURES:
        raise UsageError(f"figure {name}: unknown (expected one of {', '.join(sorted(FIGURES))})")
    entry = FIGURES[name]
    path = REPO_ROOT / entry.source
    if not path.exists():
        raise UsageError(f"figure {name}: its source {entry.source} is missing")
    return entry.render(path)


# -- the documents ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    document: str
    line: int
    name: str
    quoted: str
    source: str


def documents(root: Path) -> Iterator[Path]:
    for pattern in DOCUMENTS:
        yield from sorted(root.glob(pattern))


def regenerate(text: str) -> tuple[str, list[tuple[int, str, str, str]]]:
    """``text`` with every marked figure and table written from its source, and each one that
    changed as (offset, name, quoted, written)."""
    changed = []

    def fill(pattern: re.Pattern, make: Callable[[str], str]) -> Callable[[re.Match], str]:
        def replace(match: re.Match) -> str:
            new = make(match["name"])
            if new != match["text"]:
                changed.append((match.start(), match["name"], match["text"], new))
            return match[0][:match.start("text") - match.start()] + new + match[0][match.end("text") - match.start():]
        return replace

    text = TABLE.sub(fill(TABLE, table), text)
    text = FIGURE.sub(fill(FIGURE, figure), text)
    return text, changed


def differences(root: Path) -> tuple[list[Difference], dict[Path, str]]:
    """Every quoted figure that differs from its source, and each document's regenerated text."""
    found, texts = [], {}
    for path in documents(root):
        old = path.read_text()
        new, changed = regenerate(old)
        where = str(path.relative_to(root))
        for offset, name, quoted, written in changed:
            line = old.count("\n", 0, offset) + 1
            found.append(Difference(where, line, name, _brief(quoted), _brief(written)))
        if new != old:
            texts[path] = new
    return found, texts


def _brief(text: str) -> str:
    return text if "\n" not in text else f"{text.count(chr(10))} lines"


@click.command(cls=OneLineCommand)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 and name every quoted figure that "
                                           "differs from its result file.")
def main(check: bool) -> None:
    """Write the figures that README.md and docs/*.md quote from the committed results."""
    found, texts = differences(REPO_ROOT)
    for d in found:
        click.echo(f"{d.document}:{d.line}: {d.name} reads {d.quoted!r}; its source gives {d.source!r}",
                   err=check)
    if check:
        if found:
            raise SystemExit(1)
        click.echo("ok: every quoted figure equals its result file")
        return
    for path, text in texts.items():
        atomic_write(path, text, force=True)
    click.echo(f"wrote {len(found)} figure(s) in {len(texts)} document(s)")


if __name__ == "__main__":
    main()
