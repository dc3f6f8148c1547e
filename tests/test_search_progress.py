"""Progress that tells the truth (``planning.eta``): what the search does, k of n, and the time
left at the pace so far; and a Ctrl-C that leaves a cache the next run resumes from."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planning.eta import EtaReporter, duration_text, eta_line
from planning.train_estimate import DUMPS_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_time_left_is_the_pace_so_far_times_the_items_left():
    # 3 of 12 traces in 30 s: 10 s each, 9 left: 90 s
    assert eta_line("calibrating", 3, 12, 30.0, "traces") == "calibrating 3 of 12 traces, 30 s, ETA 1 min 30 s"
    assert eta_line("estimating", 0, 5, 0.2, "plans") == "estimating 0 of 5 plans, 0 s, ETA unknown"
    assert eta_line("tracing", 4, 4, 3725.0) == "tracing 4 of 4, 1 h 2 min, done"
    assert [duration_text(s) for s in (0.4, 59.6, 61, 3599, 7260)] == ["0 s", "1 min 0 s", "1 min 1 s",
                                                                      "59 min 59 s", "2 h 1 min"]


def test_a_reporter_speaks_at_the_start_the_end_and_every_interval():
    now = [0.0]
    lines: list[str] = []
    report = EtaReporter("tracing", 10, lines.append, interval_s=5.0, clock=lambda: now[0])
    for done, at in ((0, 0.0), (1, 1.0), (2, 2.0), (3, 6.0), (3, 7.0), (4, 8.0), (10, 9.0)):
        now[0] = at
        report(done)
    # 0 (start), 1 and 2 within 5 s of it: quiet; 3 at 6 s: 2 s each, 7 left; 4 at 8 s: within
    # 5 s of the last line; 10: the end
    assert lines == ["tracing 0 of 10, 0 s, ETA unknown", "tracing 3 of 10, 6 s, ETA 14 s", "tracing 10 of 10, 9 s, done"]
    report(10, 12)  # a caller that learns the total later (cached items leave it)
    assert report.total == 12


def _complete_traces(work: Path) -> int:
    """Calibration requests whose dump and sidecar are both written."""
    dumps = work / "train_calibrations" / DUMPS_DIR
    return sum(1 for mlir in dumps.rglob("*.mlir") if mlir.with_suffix(".json").exists()) if dumps.exists() else 0


@pytest.mark.slow  # two tiny training searches, 12 small traces in all
@pytest.mark.trace
def test_ctrl_c_leaves_a_cache_the_next_run_resumes_from(tmp_path):
    """The tiny training search on one device, ZeRO 0: six strategies on the 1 x 1 mesh, each
    with and without recompute; a recompute plan is calibrated by its twin without it, so six
    calibration keys of two traces each: 12 (by hand). Ctrl-C (SIGINT to the process group, as
    a terminal sends it) once a few are written: 'Interrupted.', exit 130; the next run traces
    only the rest and answers."""
    pytest.importorskip("torch_xla")
    from waiting import wait_until

    work = tmp_path / "work"
    command = [sys.executable, "-m", "planning.plan_search_cli", "--config", "tiny", "--mode", "train", "--hw",
               "tx8-16", "--devices", "1", "--zero", "0", "--no-confirm",
               "--work-dir", str(work)]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    environment.pop("HLO_TRACE_PARENT_PID", None)
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=environment, start_new_session=True)
    try:
        wait_until(lambda: _complete_traces(work) >= 3, "three calibration traces",
                   still_running=lambda: first.poll() is None)
        os.killpg(first.pid, signal.SIGINT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert (first.returncode, err.strip().splitlines()[-1:]) == (130, ["Interrupted."]), err[-2000:]
    assert "Traceback" not in err
    assert "calibrating 0 of 12 traces" in err
    time.sleep(1.0)  # a trace left running would write its dump by now
    kept = _complete_traces(work)
    assert 3 <= kept < 12
    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=environment)
    assert second.returncode == 0, second.stderr[-2000:]
    totals = re.findall(r"calibrating \d+ of (\d+) traces", second.stderr)
    assert totals and int(totals[0]) == 12 - kept, second.stderr[-2000:]
    assert _complete_traces(work) == 12
    assert "best plan" in second.stdout
