"""Hardening (issue 34): interrupts. SIGTERM to a command leaves no process of it running and
no output written after it; Ctrl-C at any moment, start-up included, is the one line
``Interrupted.`` and exit code 130, never a traceback or a death by the signal."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_hardening_inputs import PIPELINE_TOML, REPO_ROOT, STAGES, TINY
from waiting import wait_until

from benchmarks.fuzz import group_members as _group_members

HAS_TRACE_EXTRA = importlib.util.find_spec("torch_xla") is not None
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def start(module: str, *args, cwd: Path = REPO_ROOT) -> subprocess.Popen:
    """``python -m module args`` in its own process group (so that all of its processes are
    found by the group, and a signal to it reaches the command alone)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    environment.pop("HLO_TRACE_PARENT_PID", None)
    return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=environment, start_new_session=True)


def command_lines(group: int) -> list[str]:
    lines = []
    for pid in _group_members(group):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return lines


def kill_group(group: int) -> None:
    for pid in _group_members(group):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def files_under(directory: Path) -> set[Path]:
    return {path for path in directory.rglob("*") if path.is_file()} if directory.exists() else set()


# -- SIGTERM: the children end with the command ------------------------------------------------------


@pytest.mark.skipif(not HAS_TRACE_EXTRA,
                    reason="the plans' stages are traced: needs the trace extra (torch, torch_xla)")
def test_sigterm_to_plan_search_ends_its_trace_steps(tmp_path):
    work = tmp_path / "work"
    process = start("planning.plan_search_cli", "--config", "tiny", "--hw", "tx8-16", "--devices", "8",
                    "--strategies", "ds_ulysses,ring_attention", "--stages", "1", "--budget", "2",
                    "--jobs", "2", "--estimate", "ideal",  # no calibration traces: the plans' own
                    "--work-dir", work, "-o", tmp_path / "best.toml")
    try:
        # the plans' stages trace in one tracing process, a forked child a stage
        wait_until(lambda: sum("tracing.calibrate" in line for line in command_lines(process.pid)) >= 2,
                   "the tracing process and a stage it traces", still_running=lambda: process.poll() is None)
        before = files_under(work / "dumps")
        process.send_signal(signal.SIGTERM)  # the command alone, not its group
        process.wait(timeout=10)
        time.sleep(1.0)
        assert command_lines(process.pid) == []
        time.sleep(4.0)  # a step left running would write its dump by now
        assert files_under(work / "dumps") == before
        assert not (tmp_path / "best.toml").exists()
    finally:
        kill_group(process.pid)


def test_sigterm_to_trace_stage_all_stages_ends_the_stage_process(tmp_path):
    out = tmp_path / "out"
    process = start("tracing.cli", "--pipeline", PIPELINE_TOML, "--all-stages", "-o", out)
    try:
        wait_until(lambda: any("--stage 0" in line for line in command_lines(process.pid)),
                   "the stage process", still_running=lambda: process.poll() is None)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        time.sleep(1.0)
        assert command_lines(process.pid) == []
        time.sleep(4.0)  # the tiny stage traces in a few seconds: it must not write its dump
        assert not any(path.suffix == ".mlir" for path in files_under(out))
    finally:
        kill_group(process.pid)


def test_a_command_started_by_a_command_ends_with_it():
    from hlo_trace.isolate import PARENT_ENV, child_environment

    environment = child_environment()
    assert environment[PARENT_ENV] == str(os.getpid())
    # a parent that is already gone: the command ends at once
    gone = subprocess.run([sys.executable, "-c", "from hlo_trace.cli import run_click; "
                           "run_click(None)"], cwd=REPO_ROOT,
                          env={**environment, PARENT_ENV: "1"}, capture_output=True, text=True,
                          timeout=60)
    assert gone.returncode == 128 + signal.SIGTERM, gone.stderr


# -- Ctrl-C at any moment --------------------------------------------------------------------------


COMMANDS = {
    "analyze-hlo": ("hlo_analyzer.cli", TINY, "--hw", "tx8"),
    "analyze-pipeline": ("hlo_analyzer.pipeline_cli", PIPELINE_TOML, *STAGES),
    "trace-stage": ("tracing.cli", "--config", "tiny", "--mesh", "2x2", "--stage-ids", "0-0,1-1",
                    "--stage", "1"),
    "plan-search": ("planning.plan_search_cli", "--config", "tiny", "--devices", "4",
                    "--strategies", "megatron",
                    "--stages", "1", "--budget", "1"),
    "trace-vae-decode": ("tracing.vae_decode", "--part", "spatial", "--shape", "17_64_64",
                         "--config", "tiny"),
}


#: Commands that trace: without the trace extra they refuse at once (one line, exit 2), before
#: any signal could reach them.
TRACING_COMMANDS = frozenset({"trace-stage", "plan-search", "trace-vae-decode"})


def skip_without_the_trace_extra(name: str) -> None:
    if name in TRACING_COMMANDS and not HAS_TRACE_EXTRA:
        pytest.skip(f"{name} needs the trace extra (torch, torch_xla)")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_ctrl_c_at_start_up_and_later_is_one_line(tmp_path, name):
    skip_without_the_trace_extra(name)
    module, *args = COMMANDS[name]
    if name in ("trace-stage", "trace-vae-decode"):
        args += ["-o", tmp_path / "out", "--force"]
    if name == "plan-search":
        args += ["--work-dir", tmp_path / "work", "-o", tmp_path / "best.toml", "--force"]
    for delay in (0.1, 0.3, 0.6, 1.0, 1.6):
        process = start(module, *args, cwd=tmp_path)
        try:
            time.sleep(delay)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
            if "init_import_site" in err:  # the interpreter's own start-up, before any command
                continue                   # code (an editable install's site hook): not ours
            assert "Traceback" not in err and "Exception ignored" not in err, (delay, err)
            if process.returncode != 0:  # else it had finished: nothing to interrupt
                assert (process.returncode, err.strip().splitlines()[-1:]) == (130, ["Interrupted."]), \
                    (delay, process.returncode, err)
            time.sleep(0.5)
            assert command_lines(process.pid) == [], delay
        finally:
            kill_group(process.pid)


LOST_INTERRUPT = """
import sys, time, weakref
import hlo_trace
from hlo_trace.cli import run_click
import click

class Thing:
    pass

def lose_the_interrupt(reference):  # as Ctrl-C landing in the import system's module-lock cb
    raise {kind}

@click.command()
def command():
    thing = Thing()
    reference = weakref.ref(thing, lose_the_interrupt)
    del thing
    time.sleep({sleep})
    print("not interrupted")

sys.exit(run_click(command, []))
"""


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN])  # as the shell left it
@pytest.mark.parametrize("kind, sleep, code, last_line", [
    ("KeyboardInterrupt", 30, 130, "Interrupted."),
    ("ValueError('a bug')", 0.5, 0, "not interrupted"),
])
def test_an_interrupt_lost_in_a_callback_still_interrupts(kind, sleep, code, last_line, sigint):
    """Python prints an exception raised in a weakref callback as "Exception ignored" and goes
    on: a Ctrl-C that lands there would be lost. It is sent again; other exceptions are shown as
    Python shows them, and the program goes on."""
    done = subprocess.run([sys.executable, "-c", LOST_INTERRUPT.format(kind=kind, sleep=sleep)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    output = (done.stderr + done.stdout).strip().splitlines()
    assert (done.returncode, output[-1:]) == (code, [last_line]), done
    if kind == "KeyboardInterrupt":  # rc 130 before the 30 s sleep ends: the interrupt came
        assert "Exception ignored" not in done.stderr
    else:
        assert "Exception ignored" in done.stderr and "ValueError: a bug" in done.stderr


# -- out of memory is one line ---------------------------------------------------------------------

BAD_ALLOC = ("terminate called after throwing an instance of 'std::bad_alloc'\n"
             "  what():  std::bad_alloc\n")


def abort_with_bad_alloc() -> None:
    os.write(2, b"[stage 0] trace: progress shown as it comes\n")
    os.write(2, BAD_ALLOC.encode())
    os.abort()


@pytest.mark.parametrize("live", [False, True])
def test_a_child_aborted_by_bad_alloc_is_out_of_memory(capfd, live):
    from hlo_trace.errors import OutOfMemory
    from hlo_trace.isolate import call_in_child

    with pytest.raises(OutOfMemory, match=r"stage0: out of memory \(bad_alloc\); free memory"):
        call_in_child(abort_with_bad_alloc, origin="stage0", what="tracing it", live_stderr=live)
    err = capfd.readouterr().err
    assert "terminate called" not in err and "what():" not in err
    assert ("progress shown as it comes" in err) == live


def test_a_child_near_its_address_space_limit_fails_as_out_of_memory():
    import resource

    from hlo_trace.errors import OutOfMemory
    from hlo_trace.isolate import call_in_child

    def fail_near_the_limit() -> None:
        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (64 << 20), resource.RLIM_INFINITY))
        try:
            bytearray(256 << 20)
        except MemoryError:
            pass
        # what torch_xla said under a 6 GB limit: an import that failed half-way
        raise AttributeError("partially initialized module 'jax' has no attribute 'version'")

    with pytest.raises(OutOfMemory, match="address space it may use"):
        call_in_child(fail_near_the_limit, origin="stage0")


@pytest.mark.parametrize("message", [
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12884901888 bytes.",
    "can't start new thread: Resource temporarily unavailable",
])
def test_an_out_of_memory_exception_is_one_line(capsys, message):
    import click

    from hlo_trace.cli import run_click

    @click.command()
    def command() -> None:
        raise RuntimeError(message)

    assert run_click(command, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("Error: out of memory (") and "--jobs" in err


def test_trace_stage_reports_a_native_out_of_memory_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import tracing.cli

    def crash(*args) -> None:
        abort_with_bad_alloc()

    monkeypatch.setattr(tracing.cli, "_trace_in_child", crash)
    result = CliRunner().invoke(tracing.cli.main, ["--config", "tiny", "--mesh", "2x2",
                                                   "-o", str(tmp_path / "out")])
    lines = [line for line in result.output.splitlines() if not line.startswith("[stage")]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "out of memory (bad_alloc)" in lines[0], result.output
    assert list((tmp_path / "out").glob("*.mlir")) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_sigterm_at_start_up_and_later_leaves_nothing(tmp_path, name):
    skip_without_the_trace_extra(name)
    module, *args = COMMANDS[name]
    out = tmp_path / "out"
    if name in ("trace-stage", "trace-vae-decode"):
        args += ["-o", out, "--force"]
    if name == "plan-search":
        args += ["--work-dir", out, "-o", tmp_path / "best.toml", "--force"]
    for delay in (0.2, 0.8, 2.0):
        process = start(module, *args, cwd=tmp_path)
        try:
            time.sleep(delay)
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=60)
            assert "Traceback" not in err, (delay, err)
            assert process.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), \
                (delay, process.returncode, err)
            time.sleep(1.0)
            assert command_lines(process.pid) == [], delay
            if process.returncode != 0:  # stopped: nothing of it may appear later
                before = files_under(out)
                time.sleep(2.0)
                assert files_under(out) == before, delay
        finally:
            kill_group(process.pid)


def test_native_imports_leave_an_ignored_sigint_ignored():
    """A command started in the background (SIGINT ignored) keeps ignoring Ctrl-C while it loads
    its native libraries; in the foreground Ctrl-C ends the load, and the handler is put back."""
    from hlo_trace.cli import native_imports

    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with native_imports():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with native_imports():
            assert signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
