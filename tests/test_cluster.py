"""Cases on a Dask distributed cluster (issue 25, the ``cluster`` extra): a local cluster of two
worker processes runs a small sweep of tiny pipeline cases and writes byte for byte what a local
run writes; a worker killed in the middle of a case has the case run again and the sweep
completes; no scheduler is one line."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from planning.runner import Paths, Progress, Settings, run_cases  # noqa: E402
from plans.cases import PipelineCase, PipelineShape  # noqa: E402

SETTINGS = Settings(stage_ids="", num_stages=0, hardware="tx8-16", steps=30, dialect="stablehlo")
#: Two flat cases of the tiny model on 4 devices (one stage each, about 5 s to trace).
CASES = [PipelineCase("tiny", "28_64_64", PipelineShape(1, 4, strategy), 1, 2, mesh=mesh)
         for strategy, mesh in (("ds_ulysses", (2, 2)), ("megatron", (1, 4)))]


def _quiet(total: int) -> Progress:
    return Progress(total, stream=open(os.devnull, "w"))


def _files(work: Path) -> dict[str, bytes]:
    """Every pipeline file and analysis under ``work`` (the dumps are compared by the
    analyses they give; their sidecars hold wall times)."""
    return {str(path.relative_to(work)): path.read_bytes()
            for path in sorted((work / "pipelines").rglob("*"))
            if path.is_file() and (path.suffix == ".toml" or "analyses" in path.parts)}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> dict[str, bytes]:
    pytest.importorskip("torch_xla")
    work = tmp_path_factory.mktemp("local")
    run_cases(CASES, Paths(work=work), SETTINGS, jobs=2, retry_failed=False,
              progress=_quiet(len(CASES)))
    files = _files(work)
    assert len([name for name in files if "analyses" in name]) == len(CASES)
    return files


@pytest.fixture
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as local:
        yield local


@pytest.mark.slow  # traces the cases on a local Dask cluster (about a minute)
def test_a_cluster_sweep_writes_what_a_local_run_writes(local_run, cluster, tmp_path):
    run_cases(CASES, Paths(work=tmp_path), SETTINGS, jobs=1, retry_failed=False,
              progress=_quiet(len(CASES)), scheduler=cluster.scheduler_address)
    assert _files(tmp_path) == local_run
    assert not (tmp_path / "failures").exists() or not any((tmp_path / "failures").iterdir())


@pytest.mark.slow  # traces the cases on a local Dask cluster (about a minute)
def test_a_worker_killed_mid_case_has_the_case_run_again(local_run, cluster, tmp_path):
    import psutil
    from distributed import Client

    with Client(cluster.scheduler_address) as client:
        workers = client.run(os.getpid)  # worker address -> process id
    killed: list[int] = []

    def kill_a_worker_while_it_traces() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for pid in workers.values():
                try:
                    children = psutil.Process(pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                if any("tracing.cli" in " ".join(child.cmdline()) for child in children):
                    os.kill(pid, signal.SIGKILL)  # the worker first: it never sees its step die
                    for child in children:
                        try:
                            child.kill()
                        except psutil.NoSuchProcess:
                            pass
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_worker_while_it_traces)
    killer.start()
    run_cases(CASES, Paths(work=tmp_path), SETTINGS, jobs=1, retry_failed=False,
              progress=_quiet(len(CASES)), scheduler=cluster.scheduler_address)
    killer.join()
    assert len(killed) == 1  # a worker died in the middle of a trace
    assert _files(tmp_path) == local_run  # and every case still finished, the same bytes
    assert not (tmp_path / "failures").exists() or not any((tmp_path / "failures").iterdir())


def test_no_scheduler_is_one_line(tmp_path):
    from click.testing import CliRunner

    from planning.plan_search_cli import plan_search_command

    result = CliRunner().invoke(plan_search_command, [
        "--config", "tiny", "--devices", "8", "--scheduler", "tcp://127.0.0.1:9",
        "--work-dir", str(tmp_path / "w"), "-o", str(tmp_path / "best.toml")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: --scheduler tcp://127.0.0.1:9: no Dask scheduler answered")
    assert not (tmp_path / "w").exists()
