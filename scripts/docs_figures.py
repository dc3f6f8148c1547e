"""Write every figure the README and docs quote from the committed result file it comes from.

A quoted figure sits between two markers in the Markdown (invisible once rendered)::

    the ring is <!-- fig split.worst -->0.29%<!-- /fig --> off

and a table copied from a result file between two lines::

    <!-- table results/latency.md -->
    | shape | ... |
    <!-- /table -->

Each figure's name is a key of :data:`FIGURES`: the result file it is read from and how it is
written. A table marker names its result file: the first Markdown table in it (what the sweep,
the plan search or a calibration wrote), or, for a JSON folder with a renderer in
:data:`TABLES`, the table that renderer makes from it.

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
#: whose columns have those values, in a CSV file or a ``.md`` file's first table; FORMAT a
#: format spec for a number, default ``.4g``).
#: A value of a result JSON: ``json:PATH#KEY.KEY...|FORMAT`` (keys may hold spaces, not dots).
JSON_VALUE = re.compile(r"json:(?P<path>[^#]+)#(?P<keys>[^|]+?)(?:\|(?P<form>.+))?")
CSV_CELL = re.compile(r"csv:(?P<path>[^\[]+)\[(?P<where>[^\]]*)\]\.(?P<column>[^|]+?)(?:\|(?P<form>.+))?")
TABLE = re.compile(r"^<!-- table (?P<name>[\w.:/-]+) -->\n(?P<text>.*?)^<!-- /table -->$", re.S | re.M)
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


# -- tables -------------------------------------------------------------------------------------------------
def first_table(path: Path) -> str:
    """The first Markdown table of a result file, as its lines."""
    lines, started = [], False
    for line in path.read_text().splitlines():
        if line.startswith("|"):
            lines.append(line)
            started = True
        elif started:
            break
    if not lines:
        raise UsageError(f"{path}: no Markdown table")
    return "\n".join(lines) + "\n"


def plan_search_table(folder: Path) -> str:
    """One row per inference search of ``folder`` (``plan-search --json`` files)."""
    rows = ["| shape | system | best traced plan | latency s (30 steps) | memory GB/device | plans traced "
            "| estimate within 5% | Spearman | worst ratio |", "|---|---|---|---|---|---|---|---|---|"]
    def order(path: Path) -> tuple:
        shape, system = path.stem.rsplit("_", 1)
        return system, REFERENCE_SHAPES.index(shape) if shape in REFERENCE_SHAPES else len(REFERENCE_SHAPES), shape

    files = sorted(folder.glob("*_*.json"), key=order)
    if not files:
        raise UsageError(f"{folder}: no plan-search JSON files")
    for path in files:
        search = json.loads(path.read_text())
        best, within = search["best"], search["within_tolerance"]
        traced = [p for p in search["plans"] if p["traced"]]
        drawn = sum(1 for p in traced if p["validation"])
        rows.append(f"| {search['shape']} | {search['hardware']} | `{best['plan']}` | {best['traced']['latency_s']:.2f} "
                    f"| {best['traced']['memory_bytes'] / 1e9:.2f} | {len(traced)} ({len(traced) - drawn} + {drawn} random) "
                    f"| {within['plans']} of {within['of']} | {search['spearman']:.3f} | {search['worst_ratio']:.3f} |")
    return "\n".join(rows) + "\n"


#: Table renderers of result folders (a table marker naming a file takes its first table).
TABLES: dict[str, Callable[[Path], str]] = {"results/plan_search": plan_search_table}


def table(name: str) -> str:
    path = REPO_ROOT / name
    if name in TABLES:
        return TABLES[name](path)
    if not path.is_file():
        raise UsageError(f"table {name}: no such result file")
    return first_table(path)


def _table_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file, or of the first Markdown table of a ``.md`` file, by column."""
    if path.suffix == ".md":
        lines = [[cell.strip() for cell in line.strip().strip("|").split("|")]
                 for line in first_table(path).splitlines()]
        return [dict(zip(lines[0], cells)) for cells in lines[2:]]
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def table_cell(name: str) -> str:
    """The cell a ``csv:`` figure names (:data:`CSV_CELL`; a ``.md`` path reads its first table)."""
    match = CSV_CELL.fullmatch(name)
    if match is None:
        raise UsageError(f"figure {name}: expected csv:PATH[COLUMN=VALUE,...].COLUMN|FORMAT")
    path = REPO_ROOT / match["path"]
    if not path.is_file():
        raise UsageError(f"figure {name}: no such result file {match['path']}")
    where = dict(pair.split("=", 1) for pair in match["where"].split(",") if pair)
    rows = [row for row in _table_rows(path) if all(row.get(k) == v for k, v in where.items())]
    if len(rows) != 1 or match["column"] not in rows[0]:
        raise UsageError(f"figure {name}: {len(rows)} rows of {match['path']} match, or no such column")
    cell = rows[0][match["column"]]
    try:
        return format(float(cell), match["form"] or ".4g")
    except ValueError:
        return cell


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
