"""No input kills, hangs or tracebacks the CLIs: one regression test per crash class found by
fuzzing (issue 11): jaxlib parser crashes, path-as-text, FIFOs and devices, non-integer device
counts, non-finite options and hardware values, unbounded tile counts, full disk, bad
trace-stage TOMLs, click's own errors, and Ctrl-C in the sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.fuzz import nested_module
from hlo_analyzer import load_module, load_module_text
from hlo_analyzer.cli import analyze_command, check_numbers
from hlo_analyzer.report import analyze
from hlo_trace.atomic import atomic_write
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError, UsageError
from hlo_trace.examples import example_dump

REPO_ROOT = Path(__file__).resolve().parent.parent
DUMPS = REPO_ROOT / "dumps"
EXAMPLE = example_dump()
EXAMPLE_HLO = example_dump("example_mlp_megatron_2x2.hlo.txt")
TINY = DUMPS / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"

ADD_MODULE = """module attributes {{mhlo.num_partitions = {partitions}}} {{
  func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {{
    %0 = stablehlo.add %arg0, %arg0 : tensor<4x8xf32> loc("{name}")
    return %0 : tensor<4x8xf32>
  }}
}}
"""


def analyze_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = run_click(analyze_command, [str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- jaxlib crashes become one line ---------------------------------------------------------------


def test_empty_replica_groups_of_all_to_all_sigfpe_is_one_line(tmp_path, capsys):
    # jaxlib's verifier divides by the group size of a 0x4 replica_groups tensor (SIGFPE).
    dump = tmp_path / "a2a.mlir"
    dump.write_text(textwrap.dedent("""\
        module attributes {mhlo.num_partitions = 4 : i32} {
          func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
            %0 = "stablehlo.all_to_all"(%arg0) {split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = 4 : i64, replica_groups = dense<> : tensor<0x4xi64>} : (tensor<4x8xf32>) -> tensor<4x8xf32>
            return %0 : tensor<4x8xf32>
          }
        }
        """))
    code, out, err = analyze_cli(capsys, dump)
    assert_one_line(code, err, str(dump), "SIGFPE")
    assert out == ""


@pytest.mark.parametrize("old, new, fragments", [
    # XLA's HLO parser CHECK-fails (SIGABRT) on a reshape whose element counts differ.
    ("%reshape.1 = f32[4,16]{1,0} reshape", "%reshape.1 = f32[4,15]{1,0} reshape",
     ("SIGABRT", "f32[4,15]")),
    # XLA's HLO lexer logs "E... Failed unescaping string" on stderr before its error.
    ('op_name="aten__view"', 'op_name="\\AFaten__view"', ("does not parse",)),
    # A layout index out of range passes XLA's parser; the StableHLO converter then raised
    # JaxRuntimeError, an internal error (fuzz case #2701, seed 1).
    ("%dot = f32[4,32]{1,0}", "%dot = f32[4,32]{9223372036854775807,0}",
     ("does not convert", "minor_to_major")),
])
def test_malformed_hlo_text_is_one_line(tmp_path, capsys, old, new, fragments):
    text = EXAMPLE_HLO.read_text()
    assert old in text
    dump = tmp_path / "bad.hlo.txt"
    dump.write_text(text.replace(old, new, 1))
    code, _, err = analyze_cli(capsys, dump)
    assert_one_line(code, err, str(dump), *fragments)


def test_regions_nested_thousands_deep_are_one_line_or_measured(tmp_path, capsys):
    # 3,000 nested regions overflow the MLIR parser's stack (SIGSEGV): one line, never a death.
    dump = tmp_path / "deep.mlir"
    dump.write_text(nested_module(3000))
    code, _, err = analyze_cli(capsys, dump)
    assert code in (0, 2), err
    if code == 2:
        assert_one_line(code, err, str(dump))


def test_non_utf8_string_escape_is_refused_before_the_bindings_abort(tmp_path, capsys):
    # loc("\AF") parses, but reading the name back as str aborts inside nanobind.
    dump = tmp_path / "loc.mlir"
    dump.write_text(ADD_MODULE.format(partitions="4 : i32", name="\\AF"))
    code, _, err = analyze_cli(capsys, dump)
    assert_one_line(code, err, str(dump), "line 3", "\\AF", "UTF-8")


def test_valid_utf8_escapes_and_escaped_backslashes_still_parse():
    # \C3\A9 is UTF-8 for e-acute; \\AF is a backslash followed by the letters AF.
    for name in ("\\C3\\A9", "\\\\AF"):
        module = load_module_text(ADD_MODULE.format(partitions="4 : i32", name=name))
        assert module.operation.name == "builtin.module"


@pytest.mark.parametrize("value", ["true", "1 : i1", "4.5 : f32", '"4"', "0 : i32", "-3 : i32"])
def test_num_partitions_must_be_a_positive_integer(tmp_path, capsys, value):
    # `true` read as an integer was -1 and gave negative mesh totals with exit 0.
    dump = tmp_path / "np.mlir"
    dump.write_text(ADD_MODULE.format(partitions=value, name="x"))
    code, out, err = analyze_cli(capsys, dump, "--format", "json")
    assert_one_line(code, err, "mhlo.num_partitions", "positive integer")
    assert out == ""


# -- a path is always a path; FIFOs and devices are refused ---------------------------------------


def test_xla_dump_names_starting_with_module_are_paths(tmp_path, capsys, monkeypatch):
    name = "module_0003.SyncTensorsGraph.42.after_spmd-partitioning.txt"
    shutil.copy(EXAMPLE_HLO, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    code, out, err = analyze_cli(capsys, name, "--format", "json")
    assert code == 0, err
    assert '"gemm_flops"' in out
    with pytest.raises(InputFileError, match="module { }: no such file"):
        load_module("module { }")
    assert load_module(b"module {}").operation.name == "builtin.module"  # bytes are content
    assert load_module_text("module {}").operation.name == "builtin.module"


def test_fifo_and_device_are_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "pipe.mlir"
    os.mkfifo(fifo)  # opening it for reading would block forever: stat first
    code, _, err = analyze_cli(capsys, fifo)
    assert_one_line(code, err, str(fifo), "not a regular file")
    code, _, err = analyze_cli(capsys, "/dev/null")
    assert_one_line(code, err, "/dev/null", "not a regular file")


def test_output_never_replaces_a_fifo_or_device(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        atomic_write(fifo, "x", force=True)
    assert fifo.is_fifo()


# -- options: finite, bounded; full disk ----------------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--link-bandwidth", "nan"], "--link-bandwidth"),
    (["--link-bandwidth", "inf"], "--link-bandwidth"),
    (["--link-bandwidth", "-1"], "--link-bandwidth"),
    (["--link-bandwidth", "0"], "--link-bandwidth"),
    (["--link-bandwidth", "100", "--hop-latency", "nan"], "--hop-latency"),
    (["--steps", "9" * 400], "--steps"),  # OverflowError in the latency totals before
    (["--blocks", "9" * 40], "--blocks"),
    (["--bogus"], "--bogus"),  # click's own error: one line, not usage + hint + error
])
def test_bad_options_are_one_line(capsys, args, fragment):
    code, _, err = analyze_cli(capsys, EXAMPLE, *args)
    assert_one_line(code, err, fragment)


def test_full_disk_on_output_is_one_line(tmp_path):
    # RLIMIT_FSIZE makes the write fail with EFBIG, as a full disk fails with ENOSPC.
    output = tmp_path / "report.json"
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        from hlo_analyzer.cli import main
        main([{str(EXAMPLE)!r}, "--format", "json", "-o", {str(output)!r}])
    """)
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert_one_line(completed.returncode, completed.stderr, str(output), "cannot write")
    assert not output.exists() and list(tmp_path.iterdir()) == []  # no partial file left


def test_report_with_a_negative_or_infinite_number_is_refused():
    report = analyze(EXAMPLE)
    check_numbers(report)  # the real report passes
    first = report.rows[0]
    for bad in (first._replace(flops=-1), first._replace(comm_latency_s=float("inf")),
                first._replace(comm_bytes_per_device=float("nan"))):
        report.rows[0] = bad
        with pytest.raises(UsageError, match="out of range"):
            check_numbers(report)


# -- hardware TOML: finite, plausible, bounded ----------------------------------------------------


def _hardware_variant(tmp_path: Path, key: str, value: str) -> Path:
    chip = tmp_path / "chip.toml"
    lines = [f"{key} = {value}" if line.startswith(f"{key} =") else line
             for line in (REPO_ROOT / "hardware" / "data" / "tx8.toml").read_text().splitlines()]
    chip.write_text("\n".join(lines) + "\n")
    system = tmp_path / "system.toml"
    system.write_text((REPO_ROOT / "hardware" / "data" / "tx8-16.toml").read_text()
                      .replace('chip = "tx8"', f'chip = "{chip}"'))
    return system


@pytest.mark.parametrize("key, value, fragment", [
    ("dram_bandwidth", '"1e400 GB/s"', "finite"),  # float('1e400') is inf
    ("dram_bandwidth", '"1e-320 GB/s"', "plausible range"),  # a denormal
    ("gemm_throughput_per_tile", '"1e30 TFLOPS"', "plausible range"),
    ("dram_bandwidth", "nan", "expected a string"),
    ("tile_count", "1099511627776", "at most"),  # 2**40: the divisor loop never ended
])
def test_bad_hardware_values_are_one_line(tmp_path, capsys, key, value, fragment):
    system = _hardware_variant(tmp_path, key, value)
    code, _, err = analyze_cli(capsys, TINY, "--hw", system)
    assert_one_line(code, err, key, fragment)


def test_no_tiling_fits_is_a_usage_error(tmp_path, capsys):
    # MappingError (a ValueError of the hardware model) used to end as an internal error.
    system = _hardware_variant(tmp_path, "sram_per_tile", '"1 KiB"')
    code, _, err = analyze_cli(capsys, TINY, "--hw", system)
    assert_one_line(code, err, "cannot be mapped", "no tiling fits")


# -- trace-stage: one line for every bad TOML value, no truncation --------------------------------

MODEL_TOML = "hidden_size = 64\ndepth = 2\nnum_heads = 4\ncaption_channels = 32\nmodel_max_length = 8\n"


@pytest.mark.parametrize("line, fragment", [
    ("num_heads = 0", "num_heads=0"),  # ZeroDivisionError before
    ('mlp_ratio = "x"', "mlp_ratio"),
    ("patch_size = 5", "patch_size"),
    ("depth = 2.5", "depth=2.5"),  # truncated to 2 before
    ("depth = true", "depth=True"),
    ("qk_norm = 3", "qk_norm"),
    ("norm_eps = nan", "norm_eps"),
    ("hidden_size = 99999999999999999999", "hidden_size"),
])
def test_bad_model_toml_is_one_line(tmp_path, line, fragment):
    key = line.split(" = ")[0]
    model = tmp_path / "model.toml"
    model.write_text("".join(kept + "\n" for kept in MODEL_TOML.splitlines()
                             if not kept.startswith(key + " ")) + line + "\n")
    from tracing.cli import main

    result = CliRunner().invoke(main, ["--config", str(model), "--mesh", "2x2", "-o", str(tmp_path)])
    assert_one_line(result.exit_code, result.output, fragment)


@pytest.mark.parametrize("line, fragment", [
    ("stage_ids = 5", "stage_ids"),
    ('strategy = ["megatron"]', "strategy"),
    ("batch = 2.5", "batch = 2.5"),  # truncated to 2 before
    ("batch = true", "batch"),
    ("mesh_shape = [2.5, 2]", "mesh_shape"),  # truncated to [2, 2] before
    ("submeshes = 5", "submeshes"),
    ('stage_ids = [[0, "x"]]', "stage_ids"),
    ("mesh_shape = [1000, 1000]", "more than"),
    ("batch = 99999999999999999999", "batch"),
])
def test_bad_pipeline_toml_is_one_line(tmp_path, line, fragment):
    pipeline = tmp_path / "pipeline.toml"
    base = 'config = "tiny"\nmesh_shape = [2, 2]\n'
    key = line.split(" = ")[0]
    pipeline.write_text("".join(kept + "\n" for kept in base.splitlines() if not kept.startswith(key))
                        + line + "\n")
    from tracing.cli import main

    result = CliRunner().invoke(main, ["--pipeline", str(pipeline), "-o", str(tmp_path)])
    assert_one_line(result.exit_code, result.output, fragment)


def test_trace_stage_click_errors_are_one_line():
    from tracing.cli import main

    for args in (["--bogus"], ["--stage", "x"]):
        result = CliRunner().invoke(main, args)
        assert_one_line(result.exit_code, result.output)


# -- the sweep: Ctrl-C never records a failure ----------------------------------------------------


def _sweep_with_step(tmp_path: Path, step: list[str]):
    from planning import runner
    from scripts import sweep as sweep_module

    case = runner.Case("tiny", "28_64_64", "megatron", "1x4", "0-0,1-1")
    paths = runner.Paths(work=tmp_path)
    settings = runner.Settings(stage_ids="0-0,1-1", num_stages=2, hardware="tx8-16",
                               steps=30, dialect="stablehlo")

    def run_stage(case, stage, paths, settings, progress):
        runner._run(step, f"trace stage {stage}")

    return sweep_module, runner, case, paths, settings, run_stage


def test_sweep_interrupted_step_is_not_recorded_as_failed(tmp_path, monkeypatch):
    # The step dies of SIGINT, as a traced stage does when Ctrl-C reaches its process group
    # (Python's own handler set first: a test run started in the background, where the shell
    # ignores SIGINT, hands that on to its children).
    step = [sys.executable, "-c", "import os, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "os.kill(os.getpid(), signal.SIGINT)"]
    sweep_module, runner, case, paths, settings, run_stage = _sweep_with_step(tmp_path, step)
    monkeypatch.setattr(runner, "_run_stage", run_stage)
    monkeypatch.setattr(runner, "STEPS", runner._Steps())
    with pytest.raises(KeyboardInterrupt):
        sweep_module.sweep([case], paths, settings, jobs=1, retry_failed=False,
                           progress=runner.Progress(2, stream=open(os.devnull, "w")))
    assert list(paths.failures.iterdir()) == []


def test_sweep_failed_step_is_recorded(tmp_path, monkeypatch):
    # The control: a step that fails with a usage error is recorded and skipped next time.
    step = [sys.executable, "-c", "import sys; print('Error: no fit', file=sys.stderr); sys.exit(2)"]
    sweep_module, runner, case, paths, settings, run_stage = _sweep_with_step(tmp_path, step)
    monkeypatch.setattr(runner, "_run_stage", run_stage)
    monkeypatch.setattr(runner, "STEPS", runner._Steps())
    monkeypatch.setattr(sweep_module, "load_case", lambda *args: None)
    sweep_module.sweep([case], paths, settings, jobs=1, retry_failed=False,
                       progress=runner.Progress(2, stream=open(os.devnull, "w")))
    assert paths.failure(case).read_text() == "trace stage 0: no fit\n"


def test_sweep_stop_interrupts_a_running_step(tmp_path):
    # Ctrl-C delivered to the sweep alone: stop() sends SIGINT to the running step and waits.
    from planning import runner

    steps = runner._Steps()
    outcome = []

    def run():
        try:
            steps.run([sys.executable, "-c", "import time; time.sleep(60)"])
        except runner.Interrupted:
            outcome.append("interrupted")

    worker = threading.Thread(target=run)
    worker.start()
    while not steps._running:
        pass
    steps.stop(grace_s=10)
    worker.join(timeout=20)
    assert outcome == ["interrupted"]
