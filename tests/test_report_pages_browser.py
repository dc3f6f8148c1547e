"""hlo-report's four pages opened in a real browser (headless Chromium through Playwright): each
loads with no console error and asks for nothing but its own file, its key numbers are in the
DOM (checked against sums the test makes from the JSON and CSV the page came from), sorting a
table sorts it, hovering a plot shows its hover label, and a screenshot is not blank.

Marked slow (about 30 s: each page parses 4.8 MB of plotly.js; CI's slow leg runs them).
Skipped as a whole file without Playwright (the dev extra), plotly (the plot extra) or a
Chromium (Debian's `chromium` package; .ci/run installs it)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the report pages need plotly (pip install -e '.[plot]')")
pytest.importorskip("PIL", reason="the screenshot check needs Pillow (the plot extra)")
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="the browser tests need playwright (pip install -e '.[dev]')")

from PIL import Image, ImageStat  # noqa: E402

from scripts.report_screenshots import find_chromium  # noqa: E402

CHROMIUM = find_chromium()
if CHROMIUM is None:
    pytest.skip("no Chromium to drive: apt-get install chromium (or set HLO_REPORT_CHROMIUM)",
                allow_module_level=True)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DUMP = REPO / "dumps/stablehlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
PIPELINE = REPO / "dumps/pipeline"
SEARCH = REPO / "results/plan_search/204_640_360_tx8-16.json"


def _run(*argv: str) -> None:
    completed = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                               text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Path, list[Path]]]:
    """The four pages and the files each was made from."""
    work = tmp_path_factory.mktemp("pages")
    report, trace = work / "analysis.json", work / "timeline.json"
    _run("hlo_analyzer.cli", str(DUMP), "--hw", "tx8", "--format", "json", "-o", str(report),
         "--timeline", str(trace))
    piped = work / "pipeline.json"
    _run("hlo_analyzer.pipeline_cli", str(PIPELINE / "tiny_2x2_stages.toml"),
         str(PIPELINE / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir"),
         str(PIPELINE / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"),
         "--format", "json", "-o", str(piped))
    made = {"analysis": (["analysis", str(report), "--timeline", str(trace)], [report, trace]),
            "pipeline": (["pipeline", str(piped)], [piped]),
            "plan": (["plan", str(SEARCH)], [SEARCH]),
            "study": (["study", str(REPO / "results")], [REPO / "results"])}
    out = {}
    for kind, (argv, sources) in made.items():
        page = work / f"{kind}.html"
        _run("hlo_report.cli", *argv, "-o", str(page))
        out[kind] = (page, sources)
    return out


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


class Opened:
    """A page loaded in the browser with every request and console error recorded; requests
    for anything but a file are aborted (and recorded)."""

    def __init__(self, browser, path: Path):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900},
                                           accept_downloads=True)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready=yes]", timeout=30_000)

    def _route(self, route):
        url = route.request.url
        self.requests.append(url)
        if url.startswith("file:"):
            route.continue_()
        else:
            route.abort()

    def value(self, key: str) -> float:
        return float(self.page.get_attribute(f'[data-key="{key}"]', "data-v"))

    def text(self, key: str) -> str:
        return self.page.inner_text(f'[data-key="{key}"]')

    def column(self, table: str, index: int) -> list[float]:
        return [float(v) if v else float("nan") for v in self.page.eval_on_selector_all(
            f"#table-{table} tbody tr", f"rows => rows.map(r => r.cells[{index}].dataset.v)")]

    def header_index(self, table: str, name: str) -> int:
        names = self.page.eval_on_selector_all(f"#table-{table} th", "hs => hs.map(h => h.textContent)")
        return names.index(name)

    def sort(self, table: str, name: str) -> list[float]:
        index = self.header_index(table, name)
        self.page.click(f"#table-{table} th:nth-child({index + 1})")
        return self.column(table, index)

    def hover_label(self, figure: str, selector: str = ".point path") -> str:
        """Hover the first mark of a plotly figure and return its hover label's text, a line
        for each line of the label."""
        marks = self.page.locator(f"#figure-{figure} {selector}")
        assert marks.count() > 0
        self.page.locator(f"#figure-{figure}").scroll_into_view_if_needed()
        # the middle of the mark's visible part: a bar on a log axis reaches far below the plot
        mark = marks.first.bounding_box()
        area = self.page.locator(f"#figure-{figure} .nsewdrag").first.bounding_box()
        left, right = max(mark["x"], area["x"]), min(mark["x"] + mark["width"], area["x"] + area["width"])
        top = max(mark["y"], area["y"])
        bottom = min(mark["y"] + mark["height"], area["y"] + area["height"])
        assert left <= right and top <= bottom, "the mark is outside the plot"
        self.page.mouse.move((left + right) / 2, (top + bottom) / 2)
        label = self.page.locator(f"#figure-{figure} .hoverlayer .hovertext").first
        label.wait_for(timeout=10_000)
        lines = label.locator("tspan.line").all_text_contents()
        return "\n".join(lines) if lines else label.text_content()

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def opened(browser, pages):
    """Each page loaded once for the module's tests (a load parses 4.8 MB of plotly.js)."""
    made: dict[str, Opened] = {}

    def open_page(kind: str) -> Opened:
        if kind not in made:
            made[kind] = Opened(browser, pages[kind][0])
        return made[kind]

    yield open_page
    for page in made.values():
        page.close()


def _finite_sorted(values: list[float], reverse: bool = False) -> bool:
    finite = [v for v in values if v == v]
    return finite == sorted(finite, reverse=reverse) and all(v != v for v in values[len(finite):])


@pytest.mark.parametrize("kind", ["analysis", "pipeline", "plan", "study"])
def test_the_page_loads_alone_without_errors_and_draws_something(opened, pages, kind, tmp_path):
    page = opened(kind)
    assert page.errors == []
    assert page.requests == [pages[kind][0].as_uri()]  # its own file, nothing from a network
    figures = page.page.locator(".figure")
    assert figures.count() >= 2
    assert page.page.locator(".figure .main-svg").count() >= figures.count()  # plotly drew each
    shot = tmp_path / "shot.png"
    page.page.screenshot(path=str(shot))
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 900)
    assert ImageStat.Stat(image).stddev[0] > 20  # not a blank page (blank: 0)
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50


def test_the_analysis_page_shows_the_reports_numbers_sorts_hovers_and_draws_the_timeline(opened, pages):
    page = opened("analysis")
    report_path, trace_path = pages["analysis"][1]
    report = json.loads(report_path.read_text())
    ops = report["ops"]
    assert page.value("gemm_flops") == sum(o["flops"] * o["count"] for o in ops
                                           if o["category"] == "gemm")
    kernels = report["mapping"]["kernels"]
    step = sum(kernel["latency_s"] for kernel in kernels)  # one run: its kernels one after another
    assert page.value("step_latency_s") == pytest.approx(step, rel=1e-12)
    assert page.value("inference_latency_s") == pytest.approx(30 * step, rel=1e-12)  # 30 steps, 1 pair
    assert page.value("devices") == 4
    assert page.page.locator("#table-ops tbody tr").count() == len(ops)
    assert page.page.locator("#table-kernels tbody tr").count() == len(kernels)

    ascending = page.sort("ops", "FLOPs")
    assert ascending == sorted(float(o["flops"]) for o in ops)
    descending = page.sort("ops", "FLOPs")
    assert descending == sorted((float(o["flops"]) for o in ops), reverse=True)
    texts = page.page.eval_on_selector_all("#table-ops tbody tr", "rs => rs.map(r => r.cells[1].textContent)")
    page.page.click(f"#table-ops th:nth-child({page.header_index('ops', 'op') + 1})")
    texts_sorted = page.page.eval_on_selector_all("#table-ops tbody tr", "rs => rs.map(r => r.cells[1].textContent)")
    assert texts_sorted == sorted(texts) and texts_sorted != texts

    classes = [c["class"] for c in report["mapping"]["classes"]]
    assert page.hover_label("classes").splitlines()[0] in classes

    trace = json.loads(trace_path.read_text())
    bars = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert page.page.locator("#figure-timeline .point").count() == len(bars)
    assert page.hover_label("timeline").splitlines()[0] in {event["name"] for event in bars}

    with page.page.expect_download() as download:
        page.page.click("button.download")
    saved = download.value.path()
    assert json.loads(Path(saved).read_text()) == trace  # the Perfetto file, whole


def test_the_pipeline_page_shows_its_numbers(opened, pages):
    page = opened("pipeline")
    report = json.loads(pages["pipeline"][1][0].read_text())
    stages = report["stages"]
    assert page.value("memory_per_device_bytes") == max(s["memory"]["total_bytes"] for s in stages)
    assert page.value("inference_s") == report["totals"]["inference_s"]
    assert page.page.locator("#table-stages tbody tr").count() == len(stages)
    assert page.sort("stages", "compute s") == sorted(s["compute_s"] for s in stages)
    assert "stage 0" in page.hover_label("stage_step")


def test_the_plan_page_shows_the_best_fitting_traced_plan_and_the_front(opened, pages):
    page = opened("plan")
    search = json.loads(pages["plan"][1][0].read_text())
    limit = search["memory_limit_bytes"]
    fitting = [p for p in search["plans"] if p["traced"] and p["traced"]["memory_bytes"] <= limit]
    best = min(fitting, key=lambda p: p["traced"]["latency_s"])
    assert page.text("best_plan") == best["plan"]
    assert page.value("best_latency_s") == best["traced"]["latency_s"]
    assert page.value("traced") == sum(1 for p in search["plans"] if p["traced"])
    front = page.page.locator("#figure-pareto .scatterlayer .trace:nth-child(3) .point")
    assert front.count() == len(search["pareto"])
    traced = page.sort("plans", "traced s")
    assert _finite_sorted(traced)
    assert len([v for v in traced if v == v]) == len(fitting)  # every traced plan fits here
    # plans of equal figures share a point: the label names one of the traced plans
    label = page.hover_label("pareto", ".scatterlayer .trace:nth-child(4) .point").splitlines()
    assert label[0] in {p["plan"] for p in search["plans"] if p["traced"]}
    assert label[1] == f"{best['traced']['memory_bytes'] / 1e9:.4g} GB"


def test_the_study_page_shows_the_fastest_case_of_each_shape(opened, pages):
    page = opened("study")
    rows = list(csv.DictReader(io.StringIO((REPO / "results/latency.csv").read_text())))
    column = next(name for name in rows[0] if name.startswith("latency s"))
    for shape in {row["shape"] for row in rows}:
        done = [row for row in rows if row["shape"] == shape and row[column]]
        best = min(done, key=lambda row: float(row[column]))
        assert page.value(f"fastest_latency_{shape}") == float(best[column])
        assert page.text(f"fastest_{shape}") == f"{best['strategy']} {best['mesh']}"
    latency = page.sort("latency", column)
    assert _finite_sorted(latency)
    assert [v for v in latency if v == v] == sorted(float(row[column]) for row in rows if row[column])
    assert page.hover_label("latency").splitlines()[0] in {row["strategy"] for row in rows}


def test_no_page_asked_for_anything_after_the_sorting_and_hovering(opened, pages):
    """Last in the file: every page the tests above loaded and used still asked for nothing but
    its own file and logged no error."""
    for kind in ("analysis", "pipeline", "plan", "study"):
        page = opened(kind)
        assert page.errors == []
        assert page.requests == [pages[kind][0].as_uri()]


def test_the_plan_page_of_a_small_search_spreads_its_plans_across_the_plot(browser, tmp_path):
    """3 traced plans of about 0.8 MB on chips of 17 GB (plan-search --config tiny on tx8-16):
    drawn, the points span much of the plot's width and each is named beside it (a memory
    limit line at 17 GB put them all within a pixel of the left edge)."""
    small = REPO / "tests/data/plan_search_tiny.json"
    page_path = tmp_path / "plan.html"
    _run("hlo_report.cli", "plan", str(small), "-o", str(page_path))
    page = Opened(browser, page_path)
    try:
        assert page.errors == []
        search = json.loads(small.read_text())
        memories = [p["traced"]["memory_bytes"] / 1e9 for p in search["plans"] if p["traced"]]
        low, high = page.page.evaluate(
            "document.getElementById('figure-pareto')._fullLayout.xaxis.range")
        assert len(memories) == 3 and (max(memories) - min(memories)) > 0.3 * (high - low)
        labels = page.page.locator("#figure-pareto .scatterlayer .textpoint").all_text_contents()
        assert {p["plan"] for p in search["plans"] if p["traced"]} <= set(labels)
    finally:
        page.close()
