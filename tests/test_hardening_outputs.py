"""Hardening (issue 34): outputs and other endpoints. Outputs that cannot be written are found
before the work, two writers of one new file never both succeed, an output is never one of the
inputs, and a ``--scheduler`` that is no Dask scheduler is one line within seconds."""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest
from test_hardening_inputs import PIPELINE_TOML, REPO_ROOT, STAGES, TINY
from test_robustness import analyze_cli, assert_one_line

from benchmarks.fuzz import listener
from hlo_trace.cli import run_click
from hlo_trace.errors import UsageError


def plan_search(capsys, monkeypatch, tmp_path, *args) -> tuple[int, str]:
    """plan-search on the tiny config, refused before its search: the search must never start."""
    import planning.plan_search
    import planning.plan_search_cli as cli

    def no_search(*_args, **_kwargs):
        raise AssertionError("the search started")

    monkeypatch.setattr(planning.plan_search, "search", no_search)  # the command imports it when it runs
    code = run_click(cli.plan_search_command, ["--config", "tiny", "--devices", "4", "--strategies",
                                               "megatron", "--stages", "1", "--budget", "1",
                                               "--work-dir", str(tmp_path / "work"), *map(str, args)])
    return code, capsys.readouterr().err


# -- 11. outputs and extras are checked before the work -------------------------------------------


@pytest.mark.parametrize("option", ["-o", "--json", "--plot"])
def test_plan_search_outputs_in_an_unwritable_place_fail_before_the_search(tmp_path, capsys, monkeypatch,
                                                                           option):
    if not Path("/proc").is_dir():
        pytest.skip("no /proc")
    args = (option, "/proc/hlo-trace-out") if option == "-o" else (
        "-o", tmp_path / "best.toml", option, "/proc/hlo-trace-out")
    code, err = plan_search(capsys, monkeypatch, tmp_path, *args)
    assert_one_line(code, err, "/proc/hlo-trace-out", "cannot write there")
    assert not (tmp_path / "work").exists()


def test_plan_search_without_the_plot_extra_fails_before_the_search(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    code, err = plan_search(capsys, monkeypatch, tmp_path, "-o", tmp_path / "best.toml",
                                     "--plot", tmp_path / "front.png")
    assert_one_line(code, err, "--plot needs matplotlib")
    assert not (tmp_path / "work").exists()


def test_plan_search_over_an_existing_plan_fails_before_the_search(tmp_path, capsys, monkeypatch):
    existing = tmp_path / "best.toml"
    existing.write_text("kept\n")
    code, err = plan_search(capsys, monkeypatch, tmp_path, "-o", existing)
    assert_one_line(code, err, "already exists", "--force")
    assert existing.read_text() == "kept\n"


def test_trace_stage_shape_cache_on_a_device_fails_before_the_trace(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import tracing.cli
    from tracing.cli import main

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")

    def no_trace(*_args, **_kwargs):
        raise AssertionError("the trace started")

    monkeypatch.setattr(tracing.cli, "require_trace_extra", no_trace)  # the first step of a trace after its checks
    result = CliRunner().invoke(main, ["--config", "tiny", "--mesh", "2x2", "--shape-cache",
                                       "/dev/full", "-o", str(tmp_path / "out")])
    assert_one_line(result.exit_code, result.output, "/dev/full", "not a regular file")
    assert list((tmp_path / "out").iterdir()) == []


def test_analyze_pipeline_output_is_checked_before_the_analysis(tmp_path, capsys):
    from hlo_analyzer.pipeline_cli import pipeline_command

    existing = tmp_path / "report.txt"
    existing.write_text("kept\n")
    code = run_click(pipeline_command, [str(PIPELINE_TOML), *map(str, STAGES), "-o", str(existing)])
    assert_one_line(code, capsys.readouterr().err, "already exists")
    assert existing.read_text() == "kept\n"


# -- 13. races and overwrites ---------------------------------------------------------------------


def test_a_new_file_written_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    import hlo_trace.atomic as atomic

    target = tmp_path / "report.json"
    real_check = atomic.check_target

    def check_then_lose_the_race(path, *, force=False):
        checked = real_check(path, force=force)
        target.write_text("the other process's report\n")  # between the check and the rename
        return checked

    monkeypatch.setattr(atomic, "check_target", check_then_lose_the_race)
    with pytest.raises(UsageError, match="already exists \\(written meanwhile"):
        atomic.atomic_write(target, "this report\n")
    assert target.read_text() == "the other process's report\n"
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"]  # no temporary left


def test_of_two_writers_of_one_new_file_exactly_one_succeeds(tmp_path):
    from hlo_trace.atomic import atomic_write

    for round_ in range(20):
        target = tmp_path / f"report{round_}.json"
        barrier, outcomes = threading.Barrier(2), []

        def write(text: str) -> None:
            barrier.wait()
            try:
                atomic_write(target, text)
                outcomes.append(text)
            except UsageError:
                pass

        threads = [threading.Thread(target=write, args=(f"writer {i}\n",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outcomes) == 1 and target.read_text() == outcomes[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        f"report{i}.json" for i in range(20))


@pytest.mark.parametrize("output", ["dump", "sidecar", "hardware"])
def test_an_output_that_is_an_input_is_refused_even_with_force(tmp_path, capsys, output):
    dump = tmp_path / "stage.mlir"
    shutil.copy(TINY, dump)
    shutil.copy(TINY.with_suffix(".json"), tmp_path / "stage.json")
    hardware = tmp_path / "chip.toml"
    shutil.copy(REPO_ROOT / "hardware" / "data" / "tx8.toml", hardware)
    target = {"dump": dump, "sidecar": tmp_path / "stage.json", "hardware": hardware}[output]
    before = target.read_bytes()
    code, _, err = analyze_cli(capsys, dump, "--hw", hardware, "-o", target, "--force")
    assert_one_line(code, err, f"is the {'hardware file' if output == 'hardware' else output}")
    assert target.read_bytes() == before


def test_analyze_pipeline_output_on_a_stage_dump_is_refused(tmp_path, capsys):
    from hlo_analyzer.pipeline_cli import pipeline_command

    stages = []
    for stage in STAGES:
        for suffix in (".mlir", ".json"):
            shutil.copy(stage.with_suffix(suffix), tmp_path / stage.with_suffix(suffix).name)
        stages.append(tmp_path / stage.name)
    before = stages[1].read_bytes()
    code = run_click(pipeline_command, [str(PIPELINE_TOML), *map(str, stages),
                                        "-o", str(stages[1]), "--force"])
    assert_one_line(code, capsys.readouterr().err, "is the stage 1 dump")
    assert stages[1].read_bytes() == before


# -- 12. a --scheduler that is no Dask scheduler --------------------------------------------------


@pytest.mark.parametrize("reply, fragment", [
    (None, "still running after"),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "no Dask scheduler answered"),
])
def test_a_listener_that_is_no_scheduler_is_one_line_within_seconds(monkeypatch, reply, fragment):
    pytest.importorskip("distributed")
    import planning.runner as runner

    monkeypatch.setattr(runner, "SCHEDULER_TIMEOUT_S", 1)
    server = listener(reply)
    port = server.getsockname()[1]
    try:
        with pytest.raises(UsageError, match=fragment) as caught:
            runner.check_scheduler(f"tcp://127.0.0.1:{port}")
    finally:
        server.close()
    assert "\n" not in str(caught.value) and f"127.0.0.1:{port}" in str(caught.value)


@pytest.mark.parametrize("address", ["ucx://127.0.0.1:8786", "tls://127.0.0.1:8786", "nonsense",
                                     "tcp://host:port", "tcp://" + "h" * 5000 + ":1"])
def test_scheduler_addresses_of_other_kinds_are_one_line_at_once(capsys, monkeypatch, tmp_path, address):
    code, err = plan_search(capsys, monkeypatch, tmp_path, "-o", tmp_path / "best.toml",
                                     "--scheduler", address)
    assert_one_line(code, err, "--scheduler", "expected a Dask scheduler address tcp://HOST:PORT")
    assert len(err) < 400


# -- 14. no path of the tracing machine in a dump -------------------------------------------------

#: The committed results that are text (a PNG's bytes can spell anything; results/.cache holds the
#: local, uncommitted traces of the study).
TEXT_SUFFIXES = frozenset({".md", ".csv", ".json", ".toml", ".txt", ".mlir"})
ABSOLUTE_PATH = re.compile(r'(?:loc\(|source_file=|")(/(?:[^"/\s]+/)+[^"/\s]+)"')


def test_no_bundled_dump_or_committed_result_holds_an_absolute_path():
    from scripts.portable_dumps import bundled_dumps

    files = [*bundled_dumps(), *(REPO_ROOT / "dumps").glob("*/*.json"),
             *(REPO_ROOT / "hlo_trace" / "examples").glob("*.json"),
             *(path for path in (REPO_ROOT / "results").rglob("*")
               if path.is_file() and path.suffix in TEXT_SUFFIXES and ".cache" not in path.parts)]
    assert len(files) > 100
    found = {}
    for path in files:
        text = path.read_text(errors="replace")
        match = ABSOLUTE_PATH.search(text)
        if match:
            found[str(path.relative_to(REPO_ROOT))] = match.group(1)
    assert found == {}


def test_locations_are_written_relative_to_the_repository_and_the_packages(tmp_path):
    from tracing.cli import REPO_ROOT as TRACING_ROOT
    from tracing.cli import portable_locations, write_dump

    text = (f'#loc1 = loc("{TRACING_ROOT}/models/opensora/stdit3.py":12:0)\n'
            '#loc2 = loc("/elsewhere/checkout/tracing/strategies/kernels.py":3:0)\n'
            '#loc3 = loc("/opt/py/lib/python3.11/site-packages/torch/nn/functional.py":9:0)\n'
            '#loc4 = loc("/opt/py/lib/python3.11/contextlib.py":80:0)\n'
            '#loc5 = loc("aten__mm"("/home/u/tool.py":1:0))\n'
            '%0 = stablehlo.constant {note = "/not/a/location"} dense<1> : tensor<i32>\n'
            'metadata={op_type="aten__mm" source_file="/home/u/x/models/opensora/stdit3.py" '
            'source_line=4}\n')
    portable = portable_locations(text)
    assert portable == (
        '#loc1 = loc("models/opensora/stdit3.py":12:0)\n'
        '#loc2 = loc("tracing/strategies/kernels.py":3:0)\n'
        '#loc3 = loc("site-packages/torch/nn/functional.py":9:0)\n'
        '#loc4 = loc("python3.11/contextlib.py":80:0)\n'
        '#loc5 = loc("aten__mm"("tool.py":1:0))\n'
        '%0 = stablehlo.constant {note = "/not/a/location"} dense<1> : tensor<i32>\n'
        'metadata={op_type="aten__mm" source_file="models/opensora/stdit3.py" source_line=4}\n')
    assert portable_locations(portable) == portable  # idempotent
    written = write_dump(tmp_path / "d.mlir", text, {"mlir_bytes": len(text)}, force=False)
    assert written[0].read_text() == portable
    assert json.loads(written[1].read_text())["mlir_bytes"] == len(portable.encode())


def test_relocating_a_dump_keeps_its_program_and_its_analysis(tmp_path):
    from hlo_analyzer import analyze
    from scripts.portable_dumps import relocate

    dump = tmp_path / "stage.mlir"
    text = TINY.read_text()
    absolute = text.replace('loc("models/', 'loc("/some/machine/checkout/models/')
    assert absolute != text
    dump.write_text(absolute)
    assert relocate(dump) > 0
    assert dump.read_text() == text
    assert relocate(dump) == 0
    before, after = analyze(TINY), analyze(dump)
    assert (before.gemm_flops, before.comm_bytes_per_device) == (after.gemm_flops,
                                                                 after.comm_bytes_per_device)
