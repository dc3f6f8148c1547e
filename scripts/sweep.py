"""Strategy study: trace the full STDiT3 stage by stage for every shape x strategy, analyze each
dump, map it on a hardware system, and write result tables (markdown + CSV) and plots.

Every stage is one case step, run as two subprocesses that are the project's own commands:
``python3 -m tracing.cli`` (one fresh process per stage: torch-xla fixes its device count per
process) and ``python3 -m hlo_analyzer.cli --hw SYSTEM --format json``.  Their outputs, kept in
the work directory (``results/.cache`` by default), are the cache: a rerun skips every stage whose
analysis exists, so an interrupted sweep resumes where it stopped and a finished one only
rebuilds the tables.  For the first shape, each case also caches the timeline of block pair 0
of its stage-0 dump (``--timeline``), made only when missing, from which
``scripts/study_gantt.py`` draws one Gantt chart per strategy.  A case that fails (e.g. dp
cannot split a batch of 2 over 16 devices) is recorded with its one-line error, reported in the
tables and skipped on later runs unless ``--retry-failed``.

Beside the flat strategies, pipeline cases (``scripts/study_pipelines.py``): P stages of C chips
on disjoint submeshes, a strategy inside each, PipeFusion with M patches; every stage traced on
one patch (``trace-stage --pipeline``), the set analyzed by ``analyze-pipeline``.

    python3 scripts/sweep.py                      # 4 shapes x 8 strategies + pipelines, into study/
    python3 scripts/sweep.py -o results --force   # regenerate the committed study in results/
    python3 scripts/sweep.py --config tiny --devices 4 --shapes 28_64_64 -o /tmp/study
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_trace.atomic import atomic_write  # noqa: E402
from hlo_trace.cli import OneLineCommand  # noqa: E402
from hlo_trace.errors import UsageError  # noqa: E402
from models.opensora.inputs import REFERENCE_SHAPES  # noqa: E402
from models.opensora.parallel import default_mesh  # noqa: E402
from scripts.study_gantt import GanttCase, write_gantt_plots  # noqa: E402
from scripts.study_pipelines import (  # noqa: E402
    PipelineCase,
    default_pipelines,
    parse_pipelines,
    split_pairs,
)
from scripts.study_tables import CaseResult, PipelineResult, write_results  # noqa: E402

log = logging.getLogger("sweep")

#: The study's strategies on 16 devices, in the order of the tables (the table of strategies is
#: models.opensora.parallel, where --strategies may pick any; dp and none are the baselines;
#: opensora_sp needs the devices to divide S, which 16 does not at 640x360).
STRATEGIES = ("megatron", "megatron_sp", "two_dimension", "ds_ulysses", "ring_attention", "usp",
              "dp", "none")
#: Peak RSS of one full-size stage trace measured on the reference machine (3.6 GiB with the
#: whole CPU compile, less since the capture stops after partitioning), rounded up: the budget
#: per parallel job.
TRACE_MEMORY_BYTES = 4 * 2**30
#: Seconds a step gets to stop after an interrupt before it is killed (a trace inside XLA's
#: C++ compile only sees SIGINT when it returns to Python).
STOP_GRACE_S = 10.0
#: The file whose presence marks a directory that holds a finished study.
SUMMARY = "summary.md"


def strategy_mesh(strategy: str, devices: int) -> str:
    """The mesh a strategy runs on (``models.opensora.parallel``), as ``XxY``."""
    x_devices, y_devices = default_mesh(strategy, devices)
    return f"{x_devices}x{y_devices}"


@dataclass(frozen=True)
class Case:
    """One shape x strategy of the study; its dumps are named like trace-stage names them."""

    config: str
    shape: str
    strategy: str
    mesh: str

    stage_ids: str

    @property
    def name(self) -> str:
        return f"{Path(self.config).stem}_{self.shape}_{self.strategy}_{self.mesh}"

    def one_pair(self, stage_ids: str) -> Case:
        """The same case split so that stage 0 holds one block pair (the one-pair check)."""
        return Case(self.config, self.shape, self.strategy, self.mesh, stage_ids)

    def stage_name(self, stage: int) -> str:
        """The name trace-stage gives this stage's dump (tracing.config owns the format)."""
        from tracing.config import build_config

        return build_config(config=self.config, shape=self.shape, strategy=self.strategy,
                            mesh=self.mesh, stage_ids=self.stage_ids).dump_name(stage)


@dataclass(frozen=True)
class Paths:
    """Where the sweep keeps its cache: dumps, analyses and failures. The dumps serve every
    hardware; analyses and timelines are kept per hardware (a directory named after it)."""

    work: Path
    hardware: str = "tx8-16"

    @property
    def _hardware_tag(self) -> str:
        return Path(self.hardware).stem if self.hardware.endswith(".toml") else self.hardware

    @property
    def dumps(self) -> Path:
        return self.work / "dumps"

    @property
    def analyses(self) -> Path:
        return self.work / "analyses" / self._hardware_tag

    @property
    def failures(self) -> Path:
        return self.work / "failures"

    def dump(self, case: Case, stage: int) -> Path:
        return self.dumps / f"{case.stage_name(stage)}.mlir"

    def sidecar(self, case: Case, stage: int) -> Path:
        return self.dumps / f"{case.stage_name(stage)}.json"

    def analysis(self, case: Case, stage: int) -> Path:
        return self.analyses / f"{case.stage_name(stage)}.json"

    def failure(self, case: Case | PipelineCase) -> Path:
        return self.failures / f"{case.name}.txt"

    @property
    def pipelines(self) -> Path:
        """Pipeline cases: their TOML files, stage dumps (``dumps/``) and analyses."""
        return self.work / "pipelines"

    def pipeline_file(self, case: PipelineCase) -> Path:
        return self.pipelines / f"{case.name}.toml"

    def pipeline_analysis(self, case: PipelineCase) -> Path:
        return self.pipelines / "analyses" / self._hardware_tag / f"{case.name}.json"

    @property
    def timelines(self) -> Path:
        return self.work / "timelines" / self._hardware_tag

    def timeline(self, case: Case) -> Path:
        """The trace-event timeline of block pair 0 of the case's stage-0 dump."""
        return self.timelines / f"{case.stage_name(0)}.pair0.json"


class CaseFailed(Exception):
    """A step of a case failed; the message is the step's one-line error."""


class Progress:
    """A one-line bar over all stage steps on stderr (a line per event when not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.started = time.perf_counter()
        self.tty = stream.isatty()

    def show(self, text: str, *, advance: int = 0) -> None:
        self.done += advance
        width = 24
        filled = width * self.done // max(self.total, 1)
        elapsed = time.perf_counter() - self.started
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} stages "
                f"{elapsed:6.0f} s  {text}")
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


class Interrupted(Exception):
    """The sweep was interrupted (Ctrl-C): the running step is abandoned, never recorded as
    failed, so that the next run does it again."""


class _Steps:
    """The step subprocesses running now, so that an interrupt can stop them all."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, command: list[str]) -> subprocess.CompletedProcess:
        if self.stopping.is_set():
            raise Interrupted
        with self._lock:
            process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
            self._running.add(process)
        try:
            stdout, stderr = process.communicate()
        finally:
            with self._lock:
                self._running.discard(process)
        if self.stopping.is_set() or process.returncode in _INTERRUPTED_CODES:
            raise Interrupted
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Ask every running step to stop (SIGINT, as Ctrl-C would), then kill what is left."""
        self.stopping.set()
        with self._lock:
            running = list(self._running)
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


#: Exit codes of a step that was interrupted rather than failed: killed by SIGINT/SIGTERM, or
#: the project's commands' own 130 after Ctrl-C.
_INTERRUPTED_CODES = {-signal.SIGINT, -signal.SIGTERM, 130}

STEPS = _Steps()


def _run(command: list[str], what: str) -> None:
    """Run one step; a failure becomes CaseFailed with the step's last error line, an
    interrupt becomes Interrupted."""
    completed = STEPS.run(command)
    if completed.returncode:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("Error:")]
        reason = (errors or lines or [f"exit code {completed.returncode}"])[-1]
        raise CaseFailed(f"{what}: {reason.removeprefix('Error: ')}")


@dataclass(frozen=True)
class Settings:
    stage_ids: str
    num_stages: int
    hardware: str
    steps: int
    dialect: str
    timeline_shape: str | None = None  # the shape whose cases get a pair-0 timeline (for plots)
    #: The stage split of the one-pair check (``0-0,1-27`` for the full model: stage 0 holds the
    #: embeddings and one pair) and the model's pairs, or None for a model of one pair.
    one_pair_ids: str | None = None
    pairs: int = 1

    @property
    def case_steps(self) -> int:
        """Steps of a flat case on the progress bar: its stages and the one-pair trace."""
        return self.num_stages + (self.one_pair_ids is not None)


def run_case(case: Case, paths: Paths, settings: Settings, progress: Progress) -> None:
    """Trace and analyze every stage of ``case`` that is not cached; on a failure, advance the
    progress over the stages left and raise CaseFailed."""
    for stage in range(settings.num_stages):
        try:
            _run_stage(case, stage, paths, settings, progress)
        except CaseFailed:
            progress.show(f"{case.name}: failed", advance=settings.case_steps - stage)
            raise
    if settings.one_pair_ids is not None:
        try:
            _run_stage(case.one_pair(settings.one_pair_ids), 0, paths, settings, progress,
                       pairs=settings.pairs)
        except CaseFailed as error:  # the flat stages are done: the check is left out, logged
            log.warning("%s: no one-pair check: %s", case.name, error)
    if case.shape == settings.timeline_shape:
        _run_timeline(case, paths, settings, progress)


def _run_timeline(case: Case, paths: Paths, settings: Settings, progress: Progress) -> None:
    """Cache the timeline of block pair 0 of the stage-0 dump unless it is newer than the dump
    (a separate step, so that cached analyses are never redone for it). A failure is logged,
    not the case's: the tables do not need the timeline."""
    dump, timeline = paths.dump(case, 0), paths.timeline(case)
    if timeline.exists() and timeline.stat().st_mtime >= dump.stat().st_mtime:
        return
    progress.show(f"{case.shape} {case.strategy} ({case.mesh}): timeline of pair 0")
    try:
        # the report (a short summary table) goes to the step's captured stdout
        _run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", settings.hardware,
              "--steps", str(settings.steps), "--timeline", str(timeline), "--timeline-pair", "0",
              "--force"], "timeline of stage 0")
    except CaseFailed as error:
        log.warning("%s: no Gantt chart: %s", case.name, error)


def _run_stage(case: Case, stage: int, paths: Paths, settings: Settings,
               progress: Progress, *, pairs: int | None = None) -> None:
    """Trace (unless cached) and analyze one stage; ``pairs``: the inference total of that
    many pairs (``analyze-hlo --pairs``)."""
    label = f"{case.shape} {case.strategy} ({case.mesh}) stage {stage}"
    if pairs is not None:
        label += f" (one pair x {pairs})"
    dump, analysis = paths.dump(case, stage), paths.analysis(case, stage)
    if analysis.exists() and dump.exists() and analysis.stat().st_mtime >= dump.stat().st_mtime:
        progress.show(f"{label}: cached", advance=1)
        return
    if not (dump.exists() and paths.sidecar(case, stage).exists()):
        progress.show(f"{label}: tracing")
        _run([sys.executable, "-m", "tracing.cli", "--config", case.config,
              "--shape", case.shape, "--strategy", case.strategy, "--mesh", case.mesh,
              "--stage-ids", case.stage_ids, "--stage", str(stage),
              "--dialect", settings.dialect, "-o", str(paths.dumps), "--force"],
             f"trace stage {stage}")
    progress.show(f"{label}: analyzing")
    _run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", settings.hardware,
          "--steps", str(settings.steps), "--format", "json", "-o", str(analysis), "--force",
          *(["--pairs", str(pairs)] if pairs is not None else [])],
         f"analyze stage {stage}")
    progress.show(f"{label}: done", advance=1)


def run_pipeline_case(case: PipelineCase, paths: Paths, settings: Settings,
                      progress: Progress) -> None:
    """Write the case's pipeline file, trace every stage on one of its M patches (cached like
    the flat cases' stages) and analyze the set with ``analyze-pipeline``."""
    from tracing.config import load_config_file

    plan = paths.pipeline_file(case)
    plan.parent.mkdir(parents=True, exist_ok=True)
    if not plan.exists() or plan.read_text() != case.toml():
        atomic_write(plan, case.toml(), force=True)
    config = load_config_file(plan)
    dump_dir = paths.pipelines / "dumps"
    dumps = [dump_dir / f"{config.dump_name(stage)}.mlir" for stage in range(case.pipeline.stages)]
    label = f"{case.shape} {case.pipeline.label} M={case.patches}"
    for stage, dump in enumerate(dumps):
        if dump.exists() and dump.with_suffix(".json").exists():
            progress.show(f"{label} stage {stage}: cached", advance=1)
            continue
        progress.show(f"{label} stage {stage}: tracing")
        try:
            _run([sys.executable, "-m", "tracing.cli", "--pipeline", str(plan),
                  "--stage", str(stage), "--dialect", settings.dialect, "-o", str(dump_dir),
                  "--force"], f"trace stage {stage}")
        except CaseFailed:
            progress.show(f"{label}: failed", advance=case.pipeline.stages - stage)
            raise
        progress.show(f"{label} stage {stage}: done", advance=1)
    analysis = paths.pipeline_analysis(case)
    newest_dump = max(dump.stat().st_mtime for dump in dumps)
    if analysis.exists() and analysis.stat().st_mtime >= max(newest_dump, plan.stat().st_mtime):
        return
    progress.show(f"{label}: analyzing")
    analysis.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "hlo_analyzer.pipeline_cli", str(plan), *map(str, dumps),
          "--hw", settings.hardware, "--steps", str(settings.steps), "--format", "json",
          "-o", str(analysis), "--force"], "analyze pipeline")


def load_pipeline_case(case: PipelineCase, paths: Paths) -> PipelineResult:
    """The cached analysis of a finished pipeline case (or its failure)."""
    result = PipelineResult(case.config, case.shape, case.pipeline.stages, case.pipeline.chips,
                            case.pipeline.strategy, case.patches)
    failure = paths.failure(case)
    if failure.exists():
        result.error = failure.read_text().strip()
    else:
        result.analysis = json.loads(paths.pipeline_analysis(case).read_text())
    return result


def load_case(case: Case, paths: Paths, settings: Settings) -> CaseResult:
    """The cached per-stage sidecars and analyses of a finished case (or its failure)."""
    failure = paths.failure(case)
    if failure.exists():
        return CaseResult(case.config, case.shape, case.strategy, case.mesh,
                          error=failure.read_text().strip())
    stages = []
    for stage in range(settings.num_stages):
        stages.append({"sidecar": json.loads(paths.sidecar(case, stage).read_text()),
                       "analysis": json.loads(paths.analysis(case, stage).read_text())})
    one_pair = None
    if settings.one_pair_ids is not None:
        path = paths.analysis(case.one_pair(settings.one_pair_ids), 0)
        one_pair = json.loads(path.read_text()) if path.exists() else None
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
    from tracing.config import PipelineConfigError
    from tracing.pipefusion import patch_plan

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


def _jobs_within_memory(jobs: int) -> int:
    """Clamp the parallel jobs so that their traces fit in the memory available now."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return jobs
    fitting = max(1, available // TRACE_MEMORY_BYTES)
    if jobs > fitting:
        log.warning("--jobs %d: only %d trace(s) of ~%d GiB fit in %.1f GiB available; using %d",
                    jobs, fitting, TRACE_MEMORY_BYTES >> 30, available / 2**30, fitting)
    return min(jobs, fitting)


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


def stage_steps(case: Case | PipelineCase, settings: Settings) -> int:
    """The stages a case traces (the progress bar's unit)."""
    return case.pipeline.stages if isinstance(case, PipelineCase) else settings.case_steps


def sweep(cases: list[Case | PipelineCase], paths: Paths, settings: Settings, *, jobs: int,
          retry_failed: bool, progress: Progress) -> list[CaseResult | PipelineResult]:
    """Run every case not cached, flat and pipeline alike; their results in the same order."""
    for directory in (paths.dumps, paths.analyses, paths.failures, paths.timelines):
        directory.mkdir(parents=True, exist_ok=True)
    pending = []
    for case in cases:
        failure = paths.failure(case)
        if failure.exists() and retry_failed:
            failure.unlink()
        if failure.exists():
            progress.show(f"{case.name}: failed before, skipped",
                          advance=stage_steps(case, settings))
        else:
            pending.append(case)

    def attempt(case: Case | PipelineCase) -> None:
        try:
            if isinstance(case, PipelineCase):
                run_pipeline_case(case, paths, settings, progress)
            else:
                run_case(case, paths, settings, progress)
        except CaseFailed as error:
            atomic_write(paths.failure(case), f"{error}\n", force=True)
            progress.show(f"{case.name}: FAILED ({error}); skipped")
            log.warning("%s failed: %s", case.name, error)
        except Interrupted:  # not a failure: the next run does this case again
            STEPS.stopping.set()

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for future in [pool.submit(attempt, case) for case in pending]:
            future.result()
        if STEPS.stopping.is_set():  # a step was interrupted though this process was not
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        STEPS.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        progress.close()
        raise
    pool.shutdown(wait=True)
    progress.close()
    return [load_pipeline_case(case, paths) if isinstance(case, PipelineCase)
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
         pipelines: str | None, pipeline_shapes: str | None, patch_counts: str, hardware: str, steps: int, dialect: str, jobs: int, results_dir: str,
         force: bool, work_dir: str | None, retry_failed: bool, no_plots: bool,
         verbose: bool) -> None:
    """Sweep shapes x strategies: trace each stage, analyze it, map it on a hardware system,
    and write tables (markdown + CSV) and plots into RESULTS.  Reruns reuse the cache."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    started = time.perf_counter()
    try:
        from tracing.config import parse_stage_ids

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
                           jobs=_jobs_within_memory(jobs), retry_failed=retry_failed,
                           progress=progress)
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
