"""The memory walk run beside the rest of the analysis, in a forked child (issue 11's speed):
``hlo_trace.isolate.start_in_child`` and ``analyze-hlo``'s use of it give the same report as the
one walk, and a child that fails, crashes or is cancelled leaves one line and no process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import hlo_analyzer.cli as cli
import hlo_analyzer.measurement as measurement
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError
from hlo_trace.examples import example_dump
from hlo_trace.isolate import InputCrashed, keep_until_exit, start_in_child

REPO_ROOT = Path(__file__).resolve().parent.parent
DUMPS = REPO_ROOT / "dumps"
STAGE_DUMPS = sorted((DUMPS / "stablehlo").glob("*.mlir")) + sorted((DUMPS / "mhlo").glob("*.mlir"))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _square(value: int) -> int:
    return value * value


def _refuse(path: str) -> None:
    raise InputFileError(f"{path}: not a dump")


def _refuse_holding_what_does_not_pickle(path: str) -> None:
    error = InputFileError(f"{path}: does not parse")
    error.diagnostics = [lambda: None]  # e.g. the bindings' DiagnosticInfo objects
    raise error


def _die() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _sleep_after_writing_pid(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(60)


def test_started_child_returns_its_value_while_this_process_goes_on():
    task = start_in_child(_square, 12, origin="x")
    assert _square(3) == 9  # this process works meanwhile
    assert task.result() == 144


def test_started_child_usage_error_is_raised_as_is():
    with pytest.raises(InputFileError, match="^a.mlir: not a dump$"):
        start_in_child(_refuse, "a.mlir", origin="a.mlir").result()


def test_a_usage_error_that_does_not_pickle_still_arrives_as_its_one_line():
    """A usage error holding something that does not pickle arrives as its class and message
    (exit code 2 for the command), not as an internal error."""
    with pytest.raises(InputFileError, match="^a.mlir: does not parse$"):
        start_in_child(_refuse_holding_what_does_not_pickle, "a.mlir", origin="a.mlir").result()


def test_started_child_crash_is_one_usage_error_naming_the_input_and_what():
    with pytest.raises(InputCrashed) as error:
        start_in_child(_die, origin="big.mlir", what="measuring its memory").result()
    assert str(error.value).startswith("big.mlir: jaxlib crashed (SIGSEGV")
    assert "while measuring its memory" in str(error.value)


def test_cancel_stops_a_running_child(tmp_path):
    pid_file = tmp_path / "pid"
    task = start_in_child(_sleep_after_writing_pid, str(pid_file), origin="x")
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(ProcessLookupError):  # killed and reaped: no such process any more
        os.kill(pid, 0)


class _Noted:
    """Writes ``freed`` to its file when freed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __del__(self) -> None:
        self.path.write_text("freed")


def _keep_one(path: Path) -> str:
    keep_until_exit(_Noted(path))
    return "done"


def test_a_child_keeps_what_it_is_told_until_it_ends_and_frees_nothing_one_by_one(tmp_path):
    note = tmp_path / "note"
    assert start_in_child(_keep_one, note, origin="x").result() == "done"
    assert not note.exists()  # held to the child's os._exit, never freed on its own
    assert _keep_one(note) == "done"  # outside a child: nothing held
    assert note.read_text() == "freed"


@pytest.mark.parametrize("dump", STAGE_DUMPS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_memory_in_a_second_process_gives_the_report_of_the_one_walk(dump, tmp_path, monkeypatch):
    one_walk, beside = tmp_path / "one.json", tmp_path / "beside.json"
    assert run_click(cli.analyze_command, [str(dump), "--format", "json", "-o", str(one_walk)]) == 0
    monkeypatch.setattr(measurement, "PARALLEL_MIN_BYTES", 0)
    if _cores() >= 2:
        assert measurement.run_in_parallel(str(dump))
    assert run_click(cli.analyze_command, [str(dump), "--format", "json", "-o", str(beside)]) == 0
    assert beside.read_text() == one_walk.read_text()
    assert '"peak_live_bytes": ' in beside.read_text()


def test_small_dumps_and_one_core_keep_the_one_walk(monkeypatch):
    dump = str(example_dump())
    assert os.path.getsize(dump) < measurement.PARALLEL_MIN_BYTES
    assert not measurement.run_in_parallel(dump)
    monkeypatch.setattr(measurement, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert not measurement.run_in_parallel(dump)


def test_existing_output_is_refused_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("module { this does not parse }\n")
    output = tmp_path / "report.json"
    output.write_text("keep me")
    code = run_click(cli.analyze_command, [str(bad), "--format", "json", "-o", str(output)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"Error: {output}: already exists; pass --force to overwrite it"
    assert output.read_text() == "keep me"

