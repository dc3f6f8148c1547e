"""Strategy study: trace the full STDiT3 stage by stage for every shape x strategy, analyze each
dump, map it on a hardware system, and write result tables (markdown + CSV) and plots.

Every stage is one case step, run by ``planning.runner`` as two subprocesses that are the
project's own commands: ``python3 -m tracing.cli`` (one fresh process per stage: torch-xla fixes
its device count per process) and ``python3 -m hlo_analyzer.cli --hw SYSTEM --format json``.
Their outputs, kept in the work directory (``results/.cache`` by default), are the cache: a rerun
skips every stage whose analysis exists, so an interrupted sweep resumes where it stopped and a
finished one only rebuilds the tables.  For the first shape, each case also caches the timeline of block pair 0
of its stage-0 dump (``--timeline``), made only when missing, from which
``scripts/study_gantt.py`` draws one Gantt chart per strategy.  A case that fails (e.g. dp
cannot split a batch of 2 over 16 devices) is recorded with its one-line error, reported in the
tables and skipped on later runs unless ``--retry-failed``.

Beside the flat strategies, pipeline cases (``plans.cases``): P stages of C chips
on disjoint submeshes, a strategy inside each, PipeFusion with M patches; every stage traced on
one patch (``trace-stage --pipeline``), the set analyzed by ``analyze-pipeline``.

    python3 scripts/sweep.py                      # 4 shapes x 8 strategies + pipelines, into study/
    python3 scripts/sweep.py -o results --force   # regenerate the committed study in results/
    python3 scripts/sweep.py --config tiny --devices 4 --shapes 28_64_64 -o /tmp/study
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_analyzer.mapping.json_report import JsonReport  # noqa: E402
from hlo_analyzer.mapping.pipeline import PipelineReport  # noqa: E402
from hlo_analyzer.sidecar import STATISTICS, read_sidecar  # noqa: E402
from hlo_trace.cli import OneLineCommand  # noqa: E402
from hlo_trace.errors import UsageError  # noqa: E402
from models.opensora.inputs import REFERENCE_SHAPES  # noqa: E402
from models.opensora.parallel import default_mesh  # noqa: E402
from planning.runner import (  # noqa: E402
    Case,
    Paths,
    Progress,
    Settings,
    jobs_within_memory,
    run_cases,
    stage_steps,
)
from plans.cases import (  # noqa: E402
    PipelineCase,
    default_pipelines,
    parse_pipelines,
    split_pairs,
)
from scripts.study_gantt import GanttCase, write_gantt_plots  # noqa: E402
from scripts.study_tables import (  # noqa: E402
    STUDY_SECTIONS,
    CaseResult,
    PipelineResult,
    StageResult,
    write_results,
)

log = logging.getLogger("sweep")

#: The study's strategies on 16 devices, in the order of the tables (the table of strategies is
#: models.opensora.parallel, where --strategies may pick any; dp and none are the baselines;
#: opensora_sp needs the devices to divide S, which 16 does not at 640x360).
STRATEGIES = ("megatron", "megatron_sp", "two_dimension", "ds_ulysses", "ring_attention", "usp",
              "dp", "none")
#: The file whose presence marks a directory that holds a finished study.
SUMMARY = "summary.md"


def strategy_mesh(strategy: str, devices: int) -> str:
    """The mesh a strategy runs on (``models.opensora.parallel``), as ``XxY``."""
    x_devices, y_devices = default_mesh(strategy, devices)
    return f"{x_devices}x{y_devices}"


def load_pipeline_case(case: PipelineCase, paths: Paths, steps: int = 30) -> PipelineResult:
    """The cached analysis of a finished pipeline case (or its failure)."""
    result = PipelineResult(case.config, case.shape, case.pipeline.stages, case.pipeline.chips,
                            case.pipeline.strategy, case.patches)
    failure = paths.failure(case)
    if failure.exists():
        result.error = failure.read_text().strip()
    else:
        result.analysis = PipelineReport.read(paths.pipeline_analysis(case, steps))
    return result


def load_case(case: Case, paths: Paths, settings: Settings) -> CaseResult:
    """The cached per-stage sidecars and analyses of a finished case (or its failure)."""
    failure = paths.failure(case)
    if failure.exists():
        return CaseResult(case.config, case.shape, case.strategy, case.mesh,
                          error=failure.read_text().strip())
    stages = []
    for stage in range(settings.num_stages):
        sidecar = read_sidecar(paths.sidecar(case, stage), required=(*STATISTICS, "mlir_bytes"))
        analysis = JsonReport.read(paths.analysis(case, stage), required=STUDY_SECTIONS)
        stages.append(StageResult(sidecar.statistics, analysis))
    one_pair = None
    if settings.one_pair_ids is not None:
        path = paths.analysis(case.one_pair(settings.one_pair_ids), 0)
        one_pair = JsonReport.read(path, required=STUDY_SECTIONS) if path.exists() else None
    return CaseResult(case.config, case.shape, case.strategy, case.mesh, stages=stages,
                      one_pair=one_pair)


def one_pair_stage_ids(config: str) -> tuple[str | None, int]:
    """(stage split with one pair in stage 0, the model's pairs); None for a one-pair model."""
    from models.opensora.config import get_config

    depth = get_config(config).depth
    return (f"0-0,1-{depth - 1}" if depth > 1 else None), depth


def default_stage_ids(config: str) -> str:
    """Two stages of equal halves, the reference's 0-13,14-27 for the full model."""
    from models.opensora.config import get_config

    depth = get_config(config).depth
    if depth < 2:
        return f"0-{depth - 1}"
    half = depth // 2
    return f"0-{half - 1},{half}-{depth - 1}"


def plan_pipelines(model_config: str, shapes: list[str], devices: int, pipelines: str | None,
                   patch_counts: str) -> list[PipelineCase]:
    """Every pipeline configuration x patch count x shape of the study."""
    from models.opensora.config import get_config

    depth = get_config(model_config).depth
    layouts = parse_pipelines(default_pipelines(devices, depth) if pipelines is None
                              else pipelines, devices)
    for layout in layouts:
        split_pairs(depth, layout.stages)  # more stages than block pairs: one line, now
    try:
        counts = [int(part) for part in patch_counts.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(f"--patches {patch_counts!r}: expected positive integers, e.g. 2,4,8")
    from plans.config import PipelineConfigError
    from plans.patches import patch_plan

    model = get_config(model_config)
    cases, skipped = [], []
    for shape in shapes:
        for patches in dict.fromkeys(counts):
            try:
                patch_plan(model, shape, patches)
            except PipelineConfigError as error:  # more patches than the latent has rows
                skipped.append(f"M = {patches} at {shape} ({error})")
                continue
            cases += [PipelineCase(model_config, shape, layout, patches, depth) for layout in layouts]
    if skipped:
        log.warning("pipeline cases skipped, their shape cannot be cut in that many patches: %s",
                    "; ".join(skipped))
    return cases



def write_study_page(results: Path) -> list[Path]:
    """RESULTS/index.html, the study's page (hlo-report study RESULTS), where plotly is
    installed (the plot extra)."""
    from hlo_report.page import plotly_js, render_page
    from hlo_report.study import load_study, study_page
    from hlo_trace.atomic import atomic_write

    try:
        javascript = plotly_js()
    except UsageError as error:
        log.warning("no %s: %s", results / "index.html", error)
        return []
    page = render_page(study_page(load_study(results)), javascript)
    return [atomic_write(results / "index.html", page, force=True)]


def machine_description() -> dict:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for package in ("torch", "torch_xla", "jaxlib"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpus": os.cpu_count(), "memory_gib": round(memory / 2**30, 1),
            "platform": platform.platform(), "versions": versions}



def sweep(cases: list[Case | PipelineCase], paths: Paths, settings: Settings, *, jobs: int,
          retry_failed: bool, progress: Progress,
          scheduler: str | None = None) -> list[CaseResult | PipelineResult]:
    """Run every case not cached (``planning.runner.run_cases``, on a Dask cluster given its
    ``scheduler``), flat and pipeline alike; their results in the same order."""
    run_cases(cases, paths, settings, jobs=jobs, retry_failed=retry_failed, progress=progress,
              scheduler=scheduler)
    return [load_pipeline_case(case, paths, settings.steps) if isinstance(case, PipelineCase)
            else load_case(case, paths, settings) for case in cases]


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "model_config", default="full", show_default=True,
              help="Model config: full, tiny or a model TOML file.")
@click.option("--shapes", default=",".join(REFERENCE_SHAPES), show_default=True,
              help="Comma-separated video shapes FRAMES_WIDTH_HEIGHT.")
@click.option("--strategies", default=",".join(STRATEGIES), show_default=True,
              help="Comma-separated strategies (dp and none are the baselines).")
@click.option("--devices", default=16, show_default=True, type=click.IntRange(min=1),
              help="Devices of the parallel strategies (none always runs on one).")
@click.option("--stage-ids", default=None,
              help="Pipeline stages as block-pair ranges.  [default: two halves, 0-13,14-27 for full]")
@click.option("--pipelines", default=None,
              help="Pipeline configurations STAGESxCHIPS:STRATEGY, comma-separated, each on "
                   "--devices chips, traced on one PipeFusion patch per stage ('' for none).  "
                   "[default: 2 and 4 stages with ds_ulysses inside and one stage per chip "
                   "with none: 2x8:ds_ulysses,4x4:ds_ulysses,16x1:none on 16 devices]")
@click.option("--pipeline-shapes", default=None,
              help="Shapes of the pipeline configurations, comma-separated.  [default: the "
                   "first of --shapes]")
@click.option("--patches", "patch_counts", default="2,4,8", show_default=True,
              help="PipeFusion patch counts M of every pipeline configuration, comma-separated.")
@click.option("--hw", "hardware", default="tx8-16", show_default=True,
              help="Hardware system to map every dump on (name or TOML path).")
@click.option("--steps", default=30, show_default=True, type=click.IntRange(min=1),
              help="Sampling steps of one inference.")
@click.option("--dialect", type=click.Choice(["stablehlo", "mhlo"]), default="stablehlo",
              show_default=True, help="Dialect of the cached dumps.")
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(min=1),
              help="Cases run in parallel processes (clamped to the memory available, ~4 GiB each).")
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
              help="Run the cases on the workers of this Dask distributed scheduler (the "
                   "cluster extra; the work directory must be on a filesystem every worker "
                   "sees at the same path).  [default: a local pool of --jobs]")
@click.option("-o", "--results", "results_dir", default="study", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory of the tables and plots. The committed study is results/: write "
                   "there only on purpose (-o results --force).")
@click.option("--force", is_flag=True,
              help="Rewrite the tables of a directory that already holds a finished study.")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Cache of dumps and analyses.  [default: RESULTS/.cache]")
@click.option("--retry-failed", is_flag=True, help="Run again the cases that failed before.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots (they need matplotlib).")
@click.option("-v", "--verbose", is_flag=True, help="Log details to stderr.")
def main(model_config: str, shapes: str, strategies: str, devices: int, stage_ids: str | None,
         pipelines: str | None, pipeline_shapes: str | None, patch_counts: str, hardware: str, steps: int, dialect: str, jobs: int, scheduler: str | None, results_dir: str,
         force: bool, work_dir: str | None, retry_failed: bool, no_plots: bool,
         verbose: bool) -> None:
    """Sweep shapes x strategies: trace each stage, analyze it, map it on a hardware system,
    and write tables (markdown + CSV) and plots into RESULTS.  Reruns reuse the cache."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    started = time.perf_counter()
    try:
        from plans.config import parse_stage_ids

        stage_ids = stage_ids or default_stage_ids(model_config)
        num_stages = len(parse_stage_ids(stage_ids))
        from models.opensora.parallel import STRATEGY_NAMES

        unknown = [s for s in strategies.split(",") if s not in STRATEGY_NAMES]
        if unknown:
            raise UsageError(f"--strategies: unknown {', '.join(unknown)}; expected some of "
                             f"{', '.join(STRATEGY_NAMES)}")
        cases = [Case(model_config, shape, strategy, strategy_mesh(strategy, devices), stage_ids)
                 for shape in shapes.split(",") for strategy in strategies.split(",")]
        piped_shapes = pipeline_shapes.split(",") if pipeline_shapes else shapes.split(",")[:1]
        pipeline_cases = plan_pipelines(model_config, piped_shapes, devices, pipelines,
                                        patch_counts)
        results = Path(results_dir)
        if (results / SUMMARY).exists() and not force:
            raise UsageError(f"{results}: already holds a study ({SUMMARY}); pass --force to "
                             "rewrite its tables, or -o another directory")
        paths = Paths(work=Path(work_dir) if work_dir else results / ".cache", hardware=hardware)
        one_pair_ids, pairs = one_pair_stage_ids(model_config)
        settings = Settings(stage_ids=stage_ids, num_stages=num_stages, hardware=hardware,
                            steps=steps, dialect=dialect,
                            timeline_shape=None if no_plots else shapes.split(",")[0],
                            one_pair_ids=one_pair_ids, pairs=pairs)
        progress = Progress(total=sum(stage_steps(case, settings)
                                      for case in [*cases, *pipeline_cases]))
        everything = sweep([*cases, *pipeline_cases], paths, settings,
                           jobs=jobs_within_memory(jobs), retry_failed=retry_failed,
                           progress=progress, scheduler=scheduler)
        outcomes = everything[:len(cases)]
        pipeline_outcomes = everything[len(cases):]
        run = {"command": "python3 scripts/sweep.py " + " ".join(sys.argv[1:]),
               "machine": machine_description(), "stage_ids": stage_ids, "hardware": hardware,
               "steps": steps, "devices": devices,
               "this_run_seconds": round(time.perf_counter() - started, 1),
               # what the cached traces cost when they were made (their sidecars' wall times)
               "trace_seconds_total": round(sum(o.trace_seconds for o in outcomes if o.ok), 1)}
        written = write_results(outcomes, run, results, plots=not no_plots,
                                pipelines=pipeline_outcomes)
        if not no_plots:
            written += write_gantt_plots(
                [GanttCase(c.shape, c.strategy, c.mesh, paths.timeline(c))
                 for c, outcome in zip(cases, outcomes) if outcome.ok and paths.timeline(c).exists()],
                results / "plots")
            written += write_study_page(results)
    except UsageError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("Interrupted: the finished stages are cached and the interrupted one is not "
                   "marked failed; run the same command again to resume.", err=True)
        sys.exit(130)
    failed = sum(1 for outcome in everything if outcome.error)
    click.echo(f"{len(everything) - failed} cases done, {failed} failed (see the tables); wrote "
               f"{len(written)} files into {results} in {time.perf_counter() - started:.1f} s",
               err=True)


if __name__ == "__main__":
    main()
