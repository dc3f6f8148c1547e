"""Every trace command removes XLA's temporary dump folder (``hlo_trace_xla_dump_*``, made by
``tracing.capture.prepare_process``) however it ends: a finished trace, and one stopped by SIGTERM
or SIGINT while it traces (the folder then exists; the command's trace child is killed, so no
``finally`` of it runs). A finished trace also leaves no folder of torch's (its atexit handler
never runs in a trace process, which ends by ``os._exit``). Each command runs with its own ``TMPDIR``, so the folders counted are its
own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_until

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent
DUMP_GLOB = "hlo_trace_xla_dump_*"
#: Seconds within which the folder of an ended command must be gone (its watcher deletes it
#: once the trace process has ended: milliseconds).
GONE_WITHIN_S = 10.0

COMMANDS = {
    "trace-module": ("tracing.module_cli", "models.zoo.gpt2:gpt2", "--input", "ids=4x16:int64",
                     "--strategy", "megatron", "--mesh", "2x2", "-o", "{out}", "--force"),
    "trace-stage": ("tracing.cli", "--config", "tiny", "--mesh", "2x2", "--stage-ids", "0-0,1-1",
                    "--stage", "1", "-o", "{out}", "--force"),
    "trace-vae-decode": ("tracing.vae_decode", "--part", "spatial", "--shape", "17_64_64",
                         "--config", "tiny", "-o", "{out}", "--force"),
}


def start(command: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    temp = tmp_path / "tmp"
    temp.mkdir()
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(temp)}
    environment.pop("HLO_TRACE_PARENT_PID", None)
    module, *args = (arg.format(out=tmp_path / "out") for arg in COMMANDS[command])
    process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=tmp_path, env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    return process, temp


def left_behind(temp: Path) -> list[str]:
    """The dump folders still in ``temp`` once they had time to go."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while list(temp.glob(DUMP_GLOB)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(path.name for path in temp.glob(DUMP_GLOB))


def test_a_finished_trace_module_leaves_no_dump_folder(tmp_path):
    process, temp = start("trace-module", tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert left_behind(temp) == []
    assert sorted(path.name for path in temp.iterdir()) == []  # torch's own folder too


@pytest.mark.parametrize("command", [
    "trace-module", pytest.param("trace-stage", marks=pytest.mark.slow),
    pytest.param("trace-vae-decode", marks=pytest.mark.slow)])
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_trace_leaves_no_dump_folder(tmp_path, command, number):
    process, temp = start(command, tmp_path)
    try:
        wait_until(lambda: bool(list(temp.glob(DUMP_GLOB))), "the dump folder",
                   still_running=lambda: process.poll() is None)
        os.kill(process.pid, number)  # the command alone, as `kill` does
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert left_behind(temp) == []

