"""scripts/docs_figures.py: the figures the README and docs quote equal their result files."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from hlo_trace.cli import run_click

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
docs_figures = importlib.util.module_from_spec(spec)
sys.modules["docs_figures"] = docs_figures
spec.loader.exec_module(docs_figures)


def test_every_quoted_figure_equals_its_result_file(capsys):
    assert run_click(docs_figures.main, ["--check"]) == 0
    assert "ok: every quoted figure" in capsys.readouterr().out


def test_the_docs_quote_figures_through_markers():
    """The check is not vacuous: the corrected calibration summary and the split figure are marked."""
    names = {m["name"] for path in docs_figures.documents(ROOT)
             for m in docs_figures.FIGURE.finditer(path.read_text())}
    assert {"calibration.h100.group_norm", "calibration.h100.gemm", "split.worst"} <= names
    assert {"gpu.loop_vs_measured", "h100-sxm.launch_floor", "train.4x8xh100.within", "training.gemm.dp"} <= names
    tables = {m["name"] for path in docs_figures.documents(ROOT) for m in docs_figures.TABLE.finditer(path.read_text())}
    assert {"results/gpu_validation/predictions.md", "results/plan_search:estimates"} <= tables


@pytest.fixture
def copy(tmp_path, monkeypatch) -> Path:
    """The documents and results in a scratch root the script reads instead of the repository."""
    for name in ("README.md", "docs", "results", "models", "hardware/data"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    monkeypatch.setattr(docs_figures, "REPO_ROOT", tmp_path)
    return tmp_path


def test_a_hand_edited_figure_is_caught_and_rewritten(copy, capsys):
    gpu = copy / "docs" / "gpu.md"
    text = gpu.read_text()
    marker = "<!-- fig calibration.h100.group_norm -->"
    start = text.index(marker) + len(marker)
    end = text.index("<!-- /fig -->", start)
    gpu.write_text(text[:start] + "1.0% mean, worst -2.0%" + text[end:])
    with pytest.raises(SystemExit) as stop:
        run_click(docs_figures.main, ["--check"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "docs/gpu.md:" in err and "calibration.h100.group_norm reads '1.0% mean, worst -2.0%'" in err
    assert run_click(docs_figures.main, []) == 0
    assert gpu.read_text() == text


def test_a_result_that_moved_is_caught(copy, capsys):
    split = copy / "results" / "split.csv"
    lines = split.read_text().splitlines()
    cells = lines[1].split(",")
    cells[-1] = "-7.5"  # a pair 7.5% off the stage
    split.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    with pytest.raises(SystemExit) as stop:
        run_click(docs_figures.main, ["--check"])
    assert stop.value.code == 1
    assert "its source gives '7.50%'" in capsys.readouterr().err


def test_split_worst_is_the_largest_absolute_difference(tmp_path):
    path = tmp_path / "split.csv"
    path.write_text("shape,strategy,mesh,a,b,difference %\ns,x,1x1,1,1,-0.25\ns,y,1x1,1,1,0.125\n")
    assert docs_figures._split_worst(path) == "0.25%"


def test_an_unknown_figure_is_one_error_line(copy, capsys):
    readme = copy / "README.md"
    readme.write_text(readme.read_text() + "\n<!-- fig no.such.figure -->1<!-- /fig -->\n")
    assert run_click(docs_figures.main, ["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("Error: figure no.such.figure: unknown")


def test_a_table_cell_is_read_from_a_csv_or_a_markdown_table(tmp_path, monkeypatch):
    monkeypatch.setattr(docs_figures, "REPO_ROOT", tmp_path)
    (tmp_path / "t.csv").write_text("shape,s\na,1.25\nb,2.5\n")
    (tmp_path / "t.md").write_text("# T\n\n| rows | median |\n|---|---|\n| n150 x | 7.0% |\n| p150 y | 8.7% |\n")
    assert docs_figures.figure("csv:t.csv[shape=b].s|.2f") == "2.50"
    assert docs_figures.figure("csv:t.csv[shape=a].s") == "1.25"
    assert docs_figures.figure("csv:t.md[rows=p150 y].median") == "8.7%"
    with pytest.raises(docs_figures.UsageError, match="0 rows"):
        docs_figures.figure("csv:t.csv[shape=c].s")


def test_a_json_value_is_read_by_its_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(docs_figures, "REPO_ROOT", tmp_path)
    (tmp_path / "r.json").write_text('{"best": {"this checkout": {"wall_s": 9.94}}, "repeat": 3}')
    assert docs_figures.figure("json:r.json#best.this checkout.wall_s|.1f") == "9.9"
    assert docs_figures.figure("json:r.json#repeat") == "3"
    with pytest.raises(docs_figures.UsageError, match="no field best.baseline"):
        docs_figures.figure("json:r.json#best.baseline")


TWO_TABLES = """# a result

| shape | loop (s) | / published | / published |
|---|---|---|---|
| a | 14.9 + 1.15 = 16.0 s | 0.80 | 1.20 |
| b | - | 0.95 | 1.425 |

| shape | kernels |
|---|---|
| a | 3 |
"""


def test_a_cell_of_the_second_markdown_table_and_a_number_inside_a_cell(copy):
    (copy / "results" / "made.md").write_text(TWO_TABLES)
    assert docs_figures.table_cell("csv:results/made.md#2[shape=a].kernels") == "3"
    assert docs_figures.table_cell("csv:results/made.md[shape=a].loop (s)|.2f") == "14.90"
    assert docs_figures.table_cell("csv:results/made.md[shape=a].loop (s)") == "14.9 + 1.15 = 16.0 s"
    assert docs_figures.table("results/made.md#2") == "| shape | kernels |\n|---|---|\n| a | 3 |\n"
    with pytest.raises(docs_figures.UsageError, match="no table 3"):
        docs_figures.table("results/made.md#3")


def test_a_repeated_header_is_numbered_and_a_span_reads_the_cells(tmp_path):
    path = tmp_path / "made.md"
    path.write_text(TWO_TABLES)
    column = docs_figures.Column
    assert docs_figures._span(column("/ published"))(path) == "0.80-0.95"
    assert docs_figures._span(column("/ published (2)"), form=".1f")(path) == "1.2-1.4"
    # the third number of each cell ("-" has none), and a ratio written as the percentage over 1
    assert docs_figures._span(column("loop (s)", number=2))(path) == "16.00"
    assert docs_figures._span(column("/ published (2)"), column("/ published"), form=".0f", excess=True)(path) == "50"
    assert docs_figures._span(column("/ published", unless=(("shape", "b"),)))(path) == "0.80"
    with pytest.raises(docs_figures.UsageError, match="no rows with a column"):
        docs_figures._span(column("no such column"))(path)


def test_a_span_over_the_files_of_a_folder_scaled(tmp_path):
    for run, seconds in (("1", "6.44e-06"), ("2", "1.146e-05")):
        (tmp_path / f"microbench_{run}.csv").write_text(f"kind,seconds\nlaunch,{seconds}\nstream,1.0\n")
    read = docs_figures._span(docs_figures.Column("seconds", where=(("kind", "launch"),)), scale=1e6, form=".1f",
                              files="microbench_*.csv")
    assert read(tmp_path) == "6.4-11.5"


def test_a_number_in_a_printed_line(tmp_path):
    path = tmp_path / "printout.md"
    path.write_text("| t |\n|---|\n\nh200-sxm at s: loop 48.7 s against 30 x 1774 ms = 53.2 s measured (0.91x)\n")
    assert docs_figures._matched(r"x (\d+) ms")(path) == "1774"
    assert docs_figures._matched(r"loop ([\d.]+) s", form=".0f")(path) == "49"
    with pytest.raises(docs_figures.UsageError, match="no text matching"):
        docs_figures._matched(r"nothing (\d)")(path)


def test_a_kernel_constant_a_list_and_a_curve(tmp_path):
    path = tmp_path / "card.toml"
    path.write_text('name = "x"\n[kernel_model]\nkernel_overhead = "2.58 us"\nflash_efficiency = [0.177, 0.297]\n'
                    "[kernel_model.vector_efficiency]\nbroadcast = 0.437\n"
                    "[kernel_model.row_efficiency]\nsoftmax = [[16, 0.784], [64, 0.895]]\n")
    constant = docs_figures._kernel_constant
    assert constant("kernel_overhead", form=".1f")(path) == "2.6"
    assert constant("vector_efficiency", "broadcast")(path) == "0.44"
    assert constant("flash_efficiency")(path) == "0.18-0.30"
    assert constant("flash_efficiency", 1)(path) == "0.30"
    assert constant("row_efficiency", "softmax")(path) == "0.78-0.90"
    assert constant("row_efficiency", "softmax", 0, 0, form="d")(path) == "16"
    with pytest.raises(docs_figures.UsageError, match="no kernel_model constant launch_floor"):
        constant("launch_floor")(path)


def test_a_quotient_of_two_quoted_figures(copy):
    (copy / "results" / "made.md").write_text(TWO_TABLES)
    quotient = docs_figures._quotient("csv:results/made.md[shape=a].loop (s)|.1f",
                                      "csv:results/made.md#2[shape=a].kernels", form=".2f")
    assert quotient(copy) == "4.97"


def _search(shape: str, hardware: str, residuals: dict[str, float]) -> dict:
    plans = [{"plan": plan, "traced": {"latency_s": 2.0, "memory_bytes": 1e9}, "residual": residual,
              "validation": False, "estimate": {"latency_s": 2.0 * (1 + residual),
                                                "basis": "traced kernels (41_384_360, 123_1920_360; 7 of 1234 integers inexact)"}}
             for plan, residual in residuals.items()]
    return {"shape": shape, "hardware": hardware, "plans": [*plans, {"plan": "untraced", "traced": None, "residual": None}],
            "best": {"plan": plans[0]["plan"], "traced": plans[0]["traced"]},
            "within_tolerance": {"plans": 2, "of": 3}, "spearman": 0.5, "worst_ratio": 1.08}


def test_the_estimate_table_of_the_searches(tmp_path):
    import json
    (tmp_path / "204_640_360_tx8-16.json").write_text(json.dumps(_search("204_640_360", "tx8-16", {
        "1x16:none M=1": -0.01, "2x8:usp M=4": 0.08, "4x4:dp M=2": 0.02})))
    (tmp_path / "51_1280_720_8xh100.json").write_text(json.dumps(_search("51_1280_720", "8xh100", {
        "2x4:usp M=2": 0.001})))
    lines = docs_figures.search_estimate_table(tmp_path).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| search | within 5% |")
    # by system first (8xh100 before tx8-16), the two largest residuals by size, the flat plans' worst
    assert lines[2] == "| 51_1280_720 on 8xh100 | 2 of 3 | 0.500 | 1.080 | `2x4:usp M=2` (+0.1%) | - |"
    assert lines[3] == ("| 204_640_360 on tx8-16 | 2 of 3 | 0.500 | 1.080 | `2x8:usp M=4` (+8.0%), "
                        "`4x4:dp M=2` (+2.0%) | 1.0% |")


def test_a_value_of_one_plan_of_a_search(tmp_path):
    import json
    path = tmp_path / "search.json"
    path.write_text(json.dumps(_search("s", "h", {"1x8:a M=1": 0.0, "2x4:b M=2": 0.5})))
    plan = docs_figures._search_plan
    assert plan("2x4:b M=2", "estimate", "latency_s", form=".3g")(path) == "3"
    assert plan("1x8:a M=1", "estimate", "basis", pattern=r"of (\d+) integers", form=",.0f")(path) == "1,234"
    with pytest.raises(docs_figures.UsageError, match="no plan 9x9"):
        plan("9x9", "estimate")(path)


PRINTOUT = """target inference latency 18.56 s
  confirmation 16 devices, 1x16:a M=1: estimate 10.00 s, traced 12.50 s, 7.2 GB per device
  plan                                     estimate s   traced s est/traced pair mem
  2x16:a zero0 m=8 b=32                          5.49      5.483     1.0013   1.0000
 *2x16:b@8x2(ring 1) zero2 m=4 b=32             7.482      7.794     0.9600   1.0000
  2x16:c zero0 m=4 b=32                          9.00       8.00     1.1250   1.0000
fastest plans that fit (estimate)
  2x16:a zero0 m=8 b=32              5.49    1.19    1.19    7.14       11
"""


def test_numbers_of_a_plain_text_table_and_a_quotient_in_one_line(tmp_path):
    path = tmp_path / "printout.txt"
    path.write_text(PRINTOUT)
    row = docs_figures._train_row()
    assert docs_figures._matched_span(row, 4)(path) == "0.9600-1.1250"
    assert docs_figures._matched_within(row, 4)(path) == "2 of 3"
    assert docs_figures._matched_span(docs_figures._train_row(r"\S+(?: \S+)* m=8 b=\d+"), 3, form=".2f")(path) == "5.48"
    assert docs_figures._matched_quotient(docs_figures._confirmation(16), 2, 1)(path) == "1.25"
    with pytest.raises(docs_figures.UsageError, match="no line matching"):
        docs_figures._matched_span(r"^nothing ([\d.]+)")(path)
