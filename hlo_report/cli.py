"""``hlo-report``: one self-contained HTML page from the JSON (and CSV) the commands write.

    hlo-report analysis REPORT.json [--timeline TRACE.json] -o analysis.html
    hlo-report pipeline PIPELINE_REPORT.json -o pipeline.html
    hlo-report plan SEARCH.json -o plan.html
    hlo-report study results -o results/index.html

The page computes nothing: it shows the files' numbers (summary, sortable tables, plotly
figures, the timeline) and needs no network to be viewed (plotly.js is inlined, ~4.8 MB).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import click

from hlo_report.page import Page, plotly_js, render_page
from hlo_trace.atomic import check_targets
from hlo_trace.cli import emit, end_process, run_click

_OUTPUT = click.option("-o", "--output", required=True, metavar="FILE.html",
                       type=click.Path(dir_okay=False, path_type=str),
                       help="Write the page here (atomically).")
_FORCE = click.option("--force", is_flag=True, help="Overwrite an existing output file.")


def _write(build: Callable[[], Page], output: str, force: bool, inputs: dict[str, str | None]) -> int:
    check_targets({"-o": output}, force=force, inputs=inputs)  # before the work
    page = build()  # bad input is said whether or not plotly is installed
    emit(render_page(page, plotly_js()), output, force=force)
    return 0


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def report_command() -> None:
    """Write one self-contained HTML page (summary, sortable tables, interactive plots) from the
    JSON or CSV that analyze-hlo, analyze-pipeline, plan-search or the study wrote. The page
    needs no network to be viewed."""


@report_command.command("analysis")
@click.argument("report", type=click.Path(dir_okay=False, path_type=str))
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="TRACE.json", help="analyze-hlo's --timeline output: drawn in the page and "
                                         "embedded for Perfetto.")
@_OUTPUT
@_FORCE
def analysis_command(report: str, timeline: str | None, output: str, force: bool) -> int:
    """REPORT is `analyze-hlo DUMP --format json` output (with --hw for the mapping).

    Example: analyze-hlo DUMP --hw tx8 --format json -o a.json --timeline t.json &&
    hlo-report analysis a.json --timeline t.json -o analysis.html
    """
    from hlo_report.analysis import TIMELINE_WHAT, WHAT, analysis_page
    from hlo_report.document import Document

    def build():
        trace = None if timeline is None else Document.load(timeline, TIMELINE_WHAT)
        return analysis_page(Document.load(report, WHAT), trace,
                             Path(timeline).name if timeline else "timeline.json")

    return _write(build, output, force, {"report": report, "timeline": timeline})


@report_command.command("pipeline")
@click.argument("report", type=click.Path(dir_okay=False, path_type=str))
@_OUTPUT
@_FORCE
def pipeline_command(report: str, output: str, force: bool) -> int:
    """REPORT is `analyze-pipeline ... --format json` output."""
    from hlo_report.document import Document
    from hlo_report.pipeline import WHAT, pipeline_page

    return _write(lambda: pipeline_page(Document.load(report, WHAT)), output, force,
                  {"report": report})


@report_command.command("plan")
@click.argument("report", type=click.Path(dir_okay=False, path_type=str))
@_OUTPUT
@_FORCE
def plan_command(report: str, output: str, force: bool) -> int:
    """REPORT is `plan-search ... --json FILE` output (results/plan_search/*.json)."""
    from hlo_report.document import Document
    from hlo_report.plan import WHAT, plan_page

    return _write(lambda: plan_page(Document.load(report, WHAT)), output, force, {"report": report})


@report_command.command("study")
@click.argument("results", type=click.Path(file_okay=False, path_type=str))
@_OUTPUT
@_FORCE
def study_command(results: str, output: str, force: bool) -> int:
    """RESULTS is the study's directory (scripts/sweep.py -o RESULTS): its CSV tables, run.json
    and plan_search/*.json."""
    from hlo_report.study import load_study, study_page

    return _write(lambda: study_page(load_study(Path(results))), output, force, {})


def main(argv: Sequence[str] | None = None) -> None:
    end_process(run_click(report_command, argv))


if __name__ == "__main__":
    main()
