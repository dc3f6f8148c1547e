"""Make the four hlo-report pages of the docs and a screenshot of each (docs/img/report_*.png).

    python3 scripts/report_screenshots.py [--out docs/img] [--pages DIR]

The pages come from the same inputs as tests/test_report_pages_browser.py: an analysis of a
bundled tiny dump on tx8 with its timeline, the bundled two-stage tiny pipeline, the committed
plan search at 204_640_360 on tx8-16, and the committed study (results/). The screenshots are
taken by headless Chromium (Debian's `chromium`; Playwright drives it), each at 1280 px wide
and the page's first 1,600 px.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
#: Where Debian's package puts the browser itself (/usr/bin/chromium is a shell wrapper).
CHROMIUM_PATHS = ("/usr/lib/chromium/chromium",)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """The Chromium to drive: $HLO_REPORT_CHROMIUM, Debian's binary, or one on PATH."""
    named = os.environ.get("HLO_REPORT_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def _run(*argv: str, cwd: Path = REPO) -> None:
    """``python -m ARGV`` in ``cwd`` with the repository importable (the pages show the names
    of their inputs as given: relative ones, no path of this machine)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, check=True)


def make_pages(work: Path) -> dict[str, Path]:
    """The four pages, written into ``work``."""
    pipeline = "dumps/pipeline"
    _run("hlo_analyzer.cli", "dumps/stablehlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir",
         "--hw", "tx8", "--format", "json", "-o", str(work / "analysis.json"),
         "--timeline", str(work / "timeline.json"), "--force")
    _run("hlo_analyzer.pipeline_cli", f"{pipeline}/tiny_2x2_stages.toml",
         f"{pipeline}/tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
         f"{pipeline}/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir", "--format", "json",
         "-o", str(work / "pipeline.json"), "--force")
    made = {"analysis": (["analysis", "analysis.json", "--timeline", "timeline.json"], work),
            "pipeline": (["pipeline", "pipeline.json"], work),
            "plan": (["plan", "results/plan_search/204_640_360_tx8-16.json"], REPO),
            "study": (["study", "results"], REPO)}
    pages = {}
    for kind, (argv, cwd) in made.items():
        pages[kind] = work / f"{kind}.html"
        _run("hlo_report.cli", *argv, "-o", str(pages[kind]), "--force", cwd=cwd)
    return pages


@click.command()
@click.option("--out", default=str(REPO / "docs/img"), show_default=True,
              type=click.Path(file_okay=False), help="Directory of the screenshots.")
@click.option("--pages", default=None, type=click.Path(file_okay=False),
              help="Keep the pages in this directory (else a temporary one).")
def main(out: str, pages: str | None) -> None:
    """Write docs/img/report_{analysis,pipeline,plan,study}.png."""
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise click.ClickException("no Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(pages or scratch)
        work.mkdir(parents=True, exist_ok=True)
        made = make_pages(work)
        Path(out).mkdir(parents=True, exist_ok=True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            for kind, path in made.items():
                page.goto(path.as_uri())
                page.wait_for_selector("body[data-ready=yes]")
                target = Path(out) / f"report_{kind}.png"
                page.screenshot(path=str(target))
                click.echo(f"wrote {target}", err=True)
            browser.close()


if __name__ == "__main__":
    main()
