"""hlo-report without a browser: how CSV cells and log-axis labels are read, the one-line errors
on bad input, a page that refers to nothing outside itself, and the committed results/index.html
against the study's committed CSV files. (tests/test_report_pages_browser.py opens the pages
in Chromium.)"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hlo_report.analysis import analysis_page
from hlo_report.document import Document, csv_value
from hlo_report.figures import log_ticks
from hlo_report.page import Fact, Figure, Page, Section, Table, columns, render_page, shown
from hlo_report.plan import plan_page
from hlo_report.study import devices, load_study, study_page

REPO = Path(__file__).resolve().parent.parent
SEARCH = REPO / "results/plan_search/204_640_360_tx8-16.json"


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlo_report.cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_csv_cells_are_numbers_only_when_written_as_decimal_numbers():
    assert csv_value("17") == 17 and isinstance(csv_value("17"), int)
    assert csv_value("-0.2911") == -0.2911
    assert csv_value("1.5e3") == 1500.0
    # Python's int() takes underscores: a shape name must stay text
    for text in ("204_640_360", "1x16", "nan", "inf", " 5", "yes"):
        assert csv_value(text) == text
    assert csv_value("") is None and csv_value("n/a") is None


def test_log_axis_labels_are_1_2_5_steps_around_the_data():
    assert log_ticks([17.7, 443.3, None, 0]) == [10, 20, 50, 100, 200, 500]
    assert log_ticks([0.03]) == [0.02, 0.05]
    assert log_ticks([]) == []


def test_values_are_shown_in_readable_units():
    assert shown(4593924670.0, "B") == "4.594 GB (4.278 GiB)"
    assert shown(17179869184.0, "B") == "17.18 GB (16 GiB)"
    assert shown(784272, "B") == "784.3 kB"
    assert shown(4.189824e-05, "s") == "41.9 us"
    assert shown(1207643936) == "1,207,643,936"
    assert shown(None) == "n/a" and shown(True) == "yes"


class _Links(HTMLParser):
    """Every src/href attribute and every element of a page."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [value for name, value in attrs if name in ("src", "href") and value]


def test_a_page_loads_nothing_from_outside_itself():
    items = (Fact("k", "a </script> label", 1.5),
             Table("t", "t", columns("name", "n", text=("name",)), (("<b>", 1), ("x", None))))
    page = Page("p", "plan", ("x",), (Section("s", items),))
    text = "".join(render_page(page, "/* plotting library */"))
    parser = _Links()
    parser.feed(text)
    assert parser.links == []
    assert "link" not in parser.tags and "iframe" not in parser.tags
    assert "&lt;b&gt;" in text and "<b>" not in text  # cells are escaped
    assert text.count("</script>") == text.count("<script")  # none closed early


def test_the_plan_page_holds_the_searchs_plans_and_refusals():
    search = json.loads(SEARCH.read_text())
    page = plan_page(Document.load(SEARCH, "plan-search --json output"))
    tables = {item.key: item for section in page.sections for item in section.items
              if isinstance(item, Table)}
    assert len(tables["plans"].rows) == len(search["plans"])
    assert len(tables["refused"].rows) == len(search["infeasible"])
    traced = [row for row in tables["plans"].rows if row[3] is not None]
    assert sorted(row[0] for row in traced) == sorted(p["plan"] for p in search["plans"] if p["traced"])


def test_the_committed_study_page_is_the_one_the_committed_tables_make():
    """results/index.html is regenerated whenever results/ changes: rendered again here with the
    plotly.js it holds, it is the same page, and its fastest case per shape is the CSV's."""
    committed = (REPO / "results/index.html").read_text()
    javascript = re.search(r"<script>(.*?)</script>", committed, re.S).group(1)
    fresh = "".join(render_page(study_page(load_study(Path("results"))), javascript))
    assert fresh == committed, "results/index.html is stale: hlo-report study results -o results/index.html --force"
    rows = list(csv.DictReader(io.StringIO((REPO / "results/latency.csv").read_text())))
    column = next(name for name in rows[0] if name.startswith("latency s"))
    best = min((row for row in rows if row["shape"] == "204_640_360" and row[column]),
               key=lambda row: float(row[column]))
    assert f'data-key="fastest_latency_204_640_360" data-v="{float(best[column])!r}"' in committed


@pytest.mark.parametrize("argv, message", [
    (["analysis", str(SEARCH)], "field program: expected it to be there; expected analyze-hlo DUMP --format json output"),
    (["plan", str(REPO / "results/run.json")], "field plans: expected it to be there; expected plan-search --json output"),
    (["study", str(REPO / "docs")], "no run.json; expected the study's results directory"),
    (["pipeline", str(REPO / "pyproject.toml")], "not valid JSON"),
    (["plan", str(REPO / "no-such.json")], "no-such.json"),
])
def test_bad_input_is_one_line_naming_the_file_and_field(argv, message, tmp_path):
    completed = _cli(*argv, "-o", str(tmp_path / "page.html"))
    assert completed.returncode == 2
    assert completed.stderr.startswith("Error: ") and completed.stderr.count("\n") == 1
    assert message in completed.stderr
    assert not (tmp_path / "page.html").exists()


def test_a_field_of_the_wrong_type_is_named(tmp_path):
    search = json.loads(SEARCH.read_text())
    search["plans"][3]["estimate"]["latency_s"] = "fast"
    bad = tmp_path / "search.json"
    bad.write_text(json.dumps(search))
    completed = _cli("plan", str(bad), "-o", str(tmp_path / "page.html"))
    assert completed.returncode == 2
    assert "field plans[3].estimate.latency_s: expected a non-negative number" in completed.stderr


def test_an_existing_page_is_not_overwritten_without_force(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("mine")
    completed = _cli("plan", str(SEARCH), "-o", str(page))
    assert completed.returncode == 2 and "--force" in completed.stderr
    assert page.read_text() == "mine"


def test_without_plotly_the_command_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['plotly'] = None; sys.modules['plotly.offline'] = None\n"
            "from hlo_report.cli import main\n"
            f"main(['plan', {str(SEARCH)!r}, '-o', {str(tmp_path / 'page.html')!r}])")
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr == "Error: hlo-report needs plotly for its figures: pip install -e '.[plot]'\n"


def _figure_keys(page: Page) -> set[str]:
    return {item.key for section in page.sections for item in section.items
            if isinstance(item, Figure)}


def test_the_latency_against_devices_curve_is_drawn_where_the_study_has_two_device_counts():
    assert devices("1x16") == 16 and devices("2x4") == 8 and devices("n/a") is None
    assert "devices" in _figure_keys(study_page(load_study(REPO / "results")))  # 1 and 16 devices
    assert "devices" not in _figure_keys(study_page(load_study(REPO / "results/gpu8xh100")))  # 8 only


# -- what a new user found on the analysis and plan pages -------------------------------------------
def _items(page: Page, kind: type) -> dict:
    return {item.key: item for section in page.sections for item in section.items
            if isinstance(item, kind)}


def _analysis(tmp_path: Path, dump: Path, hardware: str) -> Document:
    report = tmp_path / "analysis.json"
    completed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", hardware,
                                "--format", "json", "-o", str(report)], cwd=REPO,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    return Document.load(report, "analyze-hlo DUMP --format json output")


def test_a_generic_transformers_analysis_page_shows_its_blocks(tmp_path):
    """A Llama-style decoder written in JAX (tests/jax_decoder_program.py, 2 blocks): the page
    times each block, as the text report does, and lists their labelled GEMMs; its time is not
    all "outside the pairs" (an STDiT3 stage's grouping)."""
    pytest.importorskip("jax")
    dump = tmp_path / "decoder.hlo.txt"
    subprocess.run([sys.executable, str(REPO / "tests" / "jax_decoder_program.py"), str(dump)],
                   check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    report = _analysis(tmp_path, dump, "h100-sxm")
    page = analysis_page(report)
    kernels = report.data["mapping"]["kernels"]
    blocks = report.data["transformer"]["blocks"]
    figure = _items(page, Figure)["blocks"]
    assert "pairs" not in _items(page, Figure)
    groups = ([None] if any(k["block"] is None for k in kernels) else []) + list(range(blocks))
    names = [("outside the blocks" if b is None else f"block {b}") for b in groups]
    assert all(trace["x"] == names for trace in figure.data)
    stacked = [sum(trace["y"][i] for trace in figure.data) for i in range(len(names))]
    by_block = [sum(k["latency_s"] for k in kernels if k["block"] == b) for b in groups]
    assert stacked == pytest.approx(by_block) and all(t > 0 for t in stacked[-blocks:])
    tables = _items(page, Table)
    assert [row[0] for row in tables["block_times"].rows] == names
    assert {row[0] for row in tables["blocks"].rows} == set(range(blocks))  # labelled GEMMs
    facts = _items(page, Fact)
    assert facts["transformer_blocks"].value == blocks == 2
    text = "".join(render_page(page, ""))
    assert "outside the pairs" not in text


def test_the_analysis_page_bars_differ_and_every_fraction_is_a_percent(tmp_path):
    """The bars against a bound leave out the collectives (their bound is their own modelled
    time: two equal bars), on a log axis; utilisation is shown in percent, in the summary and
    the kernel table alike."""
    report = _analysis(tmp_path, REPO / "dumps/stablehlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir",
                       "tx8")
    mapping = report.data["mapping"]
    page = analysis_page(report)
    figure = _items(page, Figure)["classes"]
    time, bound = (dict(zip(trace["x"], trace["y"])) for trace in figure.data)
    assert set(time) == {c["class"] for c in mapping["classes"]} - {"collective"}
    assert all(time[name] != bound[name] for name in time)
    assert figure.layout["yaxis"]["type"] == "log"
    # the axis starts well below the shortest bar: every bar has a height
    assert 10 ** figure.layout["yaxis"]["range"][0] <= min(bound.values()) / 2
    facts = _items(page, Fact)
    assert facts["gemm_utilization"].unit == "%"
    assert facts["gemm_utilization"].value == pytest.approx(100 * mapping["totals"]["gemm_utilization"])
    table = _items(page, Table)["kernels"]
    column = [c.name for c in table.columns].index("utilisation %")
    by_position = {k["position"]: k["utilization"] for k in mapping["kernels"]}
    assert all(row[column] == pytest.approx(100 * by_position[row[0]]) for row in table.rows)
    assert "utilisation" not in [c.name for c in table.columns]


def test_the_plan_page_of_a_small_search_is_readable():
    """3 traced plans of under 1 MB on 17 GB chips (plan-search --config tiny on tx8-16): the
    limit is not drawn (it put the plans in a sliver at the left edge) and the note says why;
    each plan is named beside its point."""
    small = REPO / "tests/data/plan_search_tiny.json"
    search = json.loads(small.read_text())
    figure = _items(plan_page(Document.load(small, "plan-search --json output")), Figure)["pareto"]
    memories = [x for trace in figure.data for x in trace["x"]]
    assert max(memories) * 1e9 < search["memory_limit_bytes"] / 1000
    assert figure.layout["shapes"] == []
    assert "memory limit (17.18 GB) is not drawn" in figure.note
    assert all(trace["mode"] == "markers+text" for trace in figure.data[:2])
    # a search whose plans come near the limit keeps the line
    large = _items(plan_page(Document.load(SEARCH, "plan-search --json output")), Figure)["pareto"]
    assert [shape["x0"] for shape in large.layout["shapes"]] == [
        json.loads(SEARCH.read_text())["memory_limit_bytes"] / 1e9]
