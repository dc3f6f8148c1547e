"""Run the cases of a study or a plan search: trace every stage, analyze it, cache both.

Every stage is one case step, run as two subprocesses that are the project's own commands:
``trace-stage`` (one fresh process per stage: torch-xla fixes its device count per process;
``planning.trace_process``) and ``python3 -m hlo_analyzer.cli --hw SYSTEM --format json`` (a flat case's stages)
or ``python3 -m hlo_analyzer.pipeline_cli`` (a pipeline case, ``plans.cases``).  Their outputs,
kept in a work directory (:class:`Paths`), are the cache: a rerun skips every stage whose
analysis exists, so an interrupted run resumes where it stopped.  The files are named by what
decides them (model, shape, strategy, mesh, pairs, patches; the pipeline file's content), so
any process, here or on another machine, that runs a case makes the same files.  A case that
fails is recorded with its one-line error and skipped on later runs unless asked to retry.
Ctrl-C abandons the running steps (never recorded as failed) and leaves no half-written file
(every output is written atomically by the commands).

Used by ``scripts/sweep.py`` (the strategy study) and ``planning.plan_search``.  No torch here:
the steps import it in their own processes.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from hlo_trace.isolate import ChildLimitExceeded, call_in_child, child_environment
from hlo_trace.numbers import brief
from planning.trace_process import CaseStageTrace, PipelineStageTrace
from plans.cases import PipelineCase
from plans.config import build_config, load_config_file

log = logging.getLogger(__name__)

#: The directory that holds the project's packages: the steps' subprocesses import them from it.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent

#: Peak RSS of one full-size stage trace measured on the reference machine (3.6 GiB with the
#: whole CPU compile, less since the capture stops after partitioning), rounded up: the budget
#: per parallel job.
TRACE_MEMORY_BYTES = 4 * 2**30
#: Seconds a step gets to stop after an interrupt before it is killed (a trace inside XLA's
#: C++ compile only sees SIGINT when it returns to Python).
STOP_GRACE_S = 10.0


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
        """The name trace-stage gives this stage's dump (plans.config owns the format)."""

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

    def pipeline_analysis(self, case: PipelineCase, steps: int = 30) -> Path:
        """The case's ``analyze-pipeline`` JSON for ``steps`` sampling steps (named apart
        unless 30, the study's)."""
        suffix = "" if steps == 30 else f"_steps{steps}"
        return self.pipelines / "analyses" / self._hardware_tag / f"{case.name}{suffix}.json"

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
        from planning.eta import duration_text

        elapsed = time.perf_counter() - self.started
        left = (f", ETA {duration_text(elapsed / self.done * (self.total - self.done))}"
                if 0 < self.done < self.total else "")
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} stages "
                f"{elapsed:6.0f} s{left}  {text}")
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

    def run(self, command: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
        with self._lock:  # checked under the lock: stop() sees every step started before it
            if self.stopping.is_set():
                raise Interrupted
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=child_environment(_step_environment()),
                                       cwd=cwd)
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


def _run(command: list[str], what: str, cwd: Path | None = None) -> None:
    """Run one step (in ``cwd``); a failure becomes CaseFailed with the step's last error
    line, an interrupt becomes Interrupted."""
    completed = STEPS.run(command, cwd)
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
        _run(CaseStageTrace(config=case.config, shape=case.shape, strategy=case.strategy,
                            mesh=case.mesh, stage_ids=case.stage_ids, stage=stage,
                            dialect=settings.dialect, out=str(paths.dumps)).command(),
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
    the flat cases' stages) and analyze the set with ``analyze-pipeline``.  The steps run in the
    work directory on paths relative to it, so the analysis names the same files wherever the
    work directory is (a cluster's workers and a local run write the same bytes)."""

    plan = paths.pipeline_file(case)
    plan.parent.mkdir(parents=True, exist_ok=True)
    if not plan.exists() or plan.read_text() != case.toml():
        atomic_write(plan, case.toml(), force=True)
    config = load_config_file(plan)
    dump_dir = paths.pipelines / "dumps"
    dumps = [dump_dir / f"{config.dump_name(stage)}.mlir" for stage in range(case.pipeline.stages)]
    label = f"{case.shape} {case.pipeline.label} M={case.patches}"

    def here(path: Path) -> str:
        return os.path.relpath(path, paths.work)

    for stage, dump in enumerate(dumps):
        if dump.exists() and dump.with_suffix(".json").exists():
            progress.show(f"{label} stage {stage}: cached", advance=1)
            continue
        progress.show(f"{label} stage {stage}: tracing")
        try:
            _run(PipelineStageTrace(pipeline=here(plan), stage=stage, dialect=settings.dialect,
                                    out=here(dump_dir)).command(), f"trace stage {stage}", cwd=paths.work)
        except CaseFailed:
            progress.show(f"{label}: failed", advance=case.pipeline.stages - stage)
            raise
        progress.show(f"{label} stage {stage}: done", advance=1)
    analysis = paths.pipeline_analysis(case, settings.steps)
    newest_dump = max(dump.stat().st_mtime for dump in dumps)
    if analysis.exists() and analysis.stat().st_mtime >= max(newest_dump, plan.stat().st_mtime):
        return
    progress.show(f"{label}: analyzing")
    analysis.parent.mkdir(parents=True, exist_ok=True)
    hardware = (str(Path(settings.hardware).resolve()) if settings.hardware.endswith(".toml")
                else settings.hardware)
    _run([sys.executable, "-m", "hlo_analyzer.pipeline_cli", here(plan), *map(here, dumps),
          "--hw", hardware, "--steps", str(settings.steps), "--format", "json",
          "-o", here(analysis), "--force"], "analyze pipeline", cwd=paths.work)


def jobs_within_memory(jobs: int) -> int:
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


def stage_steps(case: Case | PipelineCase, settings: Settings) -> int:
    """The stages a case traces (the progress bar's unit)."""
    return case.pipeline.stages if isinstance(case, PipelineCase) else settings.case_steps


def _step_environment() -> dict[str, str]:
    """The environment of a step: this one, with the project's packages first on the path."""
    paths = [str(PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def run_one(case: Case | PipelineCase, paths: Paths, settings: Settings,
            progress: Progress) -> None:
    """Run one case of either kind (CaseFailed when a step fails)."""
    if isinstance(case, PipelineCase):
        run_pipeline_case(case, paths, settings, progress)
    else:
        run_case(case, paths, settings, progress)


def _record_failure(case: Case | PipelineCase, error: str, paths: Paths, progress: Progress,
                    advance: int = 0) -> None:
    atomic_write(paths.failure(case), f"{error}\n", force=True)
    progress.show(f"{case.name}: FAILED ({error}); skipped", advance=advance)
    log.warning("%s failed: %s", case.name, error)


def run_cases(cases: list[Case | PipelineCase], paths: Paths, settings: Settings, *, jobs: int,
              retry_failed: bool, progress: Progress, scheduler: str | None = None) -> None:
    """Run every case not cached, flat and pipeline alike, ``jobs`` at a time; a failed case is
    recorded (``paths.failure``) and skipped on later runs unless ``retry_failed``.  Ctrl-C
    stops the running steps and raises KeyboardInterrupt; nothing is recorded for them.
    ``scheduler``: the address of a Dask distributed scheduler (``tcp://HOST:PORT``) whose
    workers run the cases instead (:func:`run_cases_on_cluster`)."""
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
    if scheduler is not None:
        run_cases_on_cluster(pending, paths, settings, scheduler, progress)
        return

    def attempt(case: Case | PipelineCase) -> None:
        try:
            run_one(case, paths, settings, progress)
        except CaseFailed as error:
            _record_failure(case, str(error), paths, progress)
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


# ---------------------------------------------------------------------------------------------
# On a Dask distributed cluster (the ``cluster`` extra)
# ---------------------------------------------------------------------------------------------

#: Seconds to wait for the scheduler to answer before giving up with one line.
SCHEDULER_TIMEOUT_S = 5


def run_case_on_worker(case: Case | PipelineCase, paths: Paths, settings: Settings) -> str | None:
    """What a Dask worker runs for one case: the same steps as a local run, in the same work
    directory (a filesystem every worker sees at the same path); its one-line error if it
    failed, else None.  A worker lost mid-case leaves no half-written file (every output is
    written atomically) and the scheduler gives the case to another worker."""
    progress = Progress(stage_steps(case, settings), stream=open(os.devnull, "w"))
    try:
        run_one(case, paths, settings, progress)
    except CaseFailed as error:
        return str(error)
    return None


#: A scheduler address: ``tcp://HOST:PORT`` (or ``HOST:PORT``), HOST a name, an IPv4 address
#: or a bracketed IPv6 one.
_SCHEDULER_ADDRESS = re.compile(r"(?:tcp://)?(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9_.-]{1,253}):[0-9]{1,5}")
#: Memory the scheduler check may take: far above what a handshake needs, so that a listener
#: that is no scheduler (an HTTP server's reply read as a message length) is refused at once.
SCHEDULER_CHECK_BYTES = 1 << 30


def check_scheduler(scheduler: str) -> None:
    """One line now, before any work, when ``scheduler`` is no ``tcp://HOST:PORT`` address or
    no Dask scheduler answers there within ``SCHEDULER_TIMEOUT_S``. The handshake runs in a
    forked child with a time and memory limit: a listener that never answers, or answers as
    something else, would hang the client or make it allocate exabytes."""

    if not _SCHEDULER_ADDRESS.fullmatch(scheduler):
        raise UsageError(f"--scheduler {brief(scheduler)}: expected a Dask scheduler address "
                         "tcp://HOST:PORT (ucx:// and tls:// need a Dask configuration this "
                         "command does not take)")
    try:
        import distributed  # noqa: F401 - the extra, checked here (the child would say less)
    except ImportError:
        raise UsageError("--scheduler needs Dask distributed: pip install 'hlo-trace[cluster]'"
                         ) from None
    try:
        call_in_child(_close_client, scheduler, origin=f"--scheduler {scheduler}",
                      what="waiting for the scheduler's handshake",
                      time_s=2 * SCHEDULER_TIMEOUT_S + 5, memory_bytes=SCHEDULER_CHECK_BYTES)
    except ChildLimitExceeded as error:
        raise UsageError(f"--scheduler {scheduler}: no Dask scheduler answered ({error.reason})"
                         ) from None


def _close_client(scheduler: str) -> None:
    """In the check's child: connect and disconnect; any failure is one line."""
    _cluster_client(scheduler).close()


def _cluster_client(scheduler: str):
    """A client of the scheduler at ``scheduler``, or one line saying why not."""

    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler needs Dask distributed: pip install 'hlo-trace[cluster]'"
                         ) from None
    try:
        return Client(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - whatever a listener that is no scheduler makes
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UsageError(f"--scheduler {scheduler}: no Dask scheduler answered "
                         f"({type(error).__name__}: {reason[:200]})") from None


def run_cases_on_cluster(cases: list[Case | PipelineCase], paths: Paths, settings: Settings,
                         scheduler: str, progress: Progress) -> None:
    """Run ``cases`` on the workers of the Dask scheduler at ``scheduler``, each case one task
    (:func:`run_case_on_worker`), as many at once as the workers take.  The work directory must
    be on a filesystem every worker sees at the same path; the files are named by content, so
    any worker writes the same bytes a local run would.  A worker that dies mid-case has its
    case run again elsewhere (the scheduler's ``allowed-failures``, 3 by default); a failed case
    is recorded as a local run records it; Ctrl-C cancels what is queued or running."""
    from distributed import as_completed

    work = Paths(work=paths.work.resolve(), hardware=paths.hardware)
    client = _cluster_client(scheduler)
    futures: dict = {}
    try:
        futures = {client.submit(run_case_on_worker, case, work, settings, pure=False,
                                 key=f"hlo-trace-{case.name}"): case for case in cases}
        for future in as_completed(futures):
            case = futures[future]
            error = future.result()
            if error is not None:
                _record_failure(case, error, paths, progress, stage_steps(case, settings))
            else:
                progress.show(f"{case.name}: done on the cluster",
                              advance=stage_steps(case, settings))
    except KeyboardInterrupt:
        client.cancel(list(futures))
        raise
    finally:
        client.close()
        progress.close()
