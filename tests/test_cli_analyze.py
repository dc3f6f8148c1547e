"""analyze-hlo: output formats, determinism, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest
from analyzer_samples import COLLECTIVES, DYNAMIC, GEMM_AND_VECTOR

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "sample.mlir"
    path.write_text(GEMM_AND_VECTOR)
    return path


def run(args, capsys):
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_has_totals_ops_and_unhandled(sample, capsys):
    code, out, _ = run([sample, "--format", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["totals"]["gemm_flops"] == 240 + 1024 + 7776 + 1536
    assert document["totals"]["vector_flops"] == 188
    assert document["totals"]["comm_bytes_per_device"] == 0
    assert document["unhandled"] == {}
    first = document["ops"][0]
    assert (first["op"], first["category"], first["flops"]) == ("stablehlo.dot_general", "gemm", 240)
    assert {"comm_bytes_per_device", "group_size"} <= set(first)


def test_output_is_deterministic(tmp_path, capsys):
    path = tmp_path / "c.mlir"
    path.write_text(COLLECTIVES)
    outputs = {run([path, "--format", fmt], capsys)[1] for fmt in ["json"] * 3}
    assert len(outputs) == 1


def test_csv_by_category(sample, capsys):
    code, out, _ = run([sample, "--format", "csv", "--by", "category"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "category,ops,flops,comm_bytes_per_device"
    assert lines[1] == "gemm,4,10576,0"


def test_table_names_units_and_unhandled(sample, capsys):
    code, out, _ = run([sample], capsys)
    assert code == 0
    assert "10.58 kFLOP" in out and "Unhandled ops: none" in out


def test_default_table_is_the_summary_and_by_op_adds_the_rows(sample, capsys):
    _, summary, _ = run([sample], capsys)
    _, per_op, _ = run([sample, "--by", "op"], capsys)
    # The sample holds 4 GEMMs (a dot_general, a dot and two convolutions), one per op row.
    assert summary.count("stablehlo.") == 0 and "(one row per op: --by op)" in summary
    assert per_op.count("stablehlo.convolution") == 2 and per_op.count("gemm ") >= 4
    # both open with the headline (the work, without --hw), then the op rows, then the summary
    assert per_op.endswith(summary.split("\n\n", 2)[2].replace("(one row per op: --by op)\n", ""))


def test_output_file_is_written_once_and_not_overwritten(sample, tmp_path, capsys):
    target = tmp_path / "report.json"
    assert run([sample, "--format", "json", "-o", target], capsys)[0] == 0
    first = target.read_text()
    code, _, err = run([sample, "--format", "csv", "-o", target], capsys)
    assert code == 2 and "already exists" in err
    assert target.read_text() == first
    assert run([sample, "--format", "csv", "--by", "op", "-o", target, "--force"], capsys)[0] == 0
    assert target.read_text().startswith("position,")


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("", "file is empty"),
    ("this is not a dump\n", "neither MLIR"),
    (DYNAMIC, "dynamic shape"),
    ("module {\n  func.func @main() {\n    stablehlo.bogus\n  }\n}\n", "does not parse"),
    ("HloModule m\n\nENTRY e { ROOT x = f32[2] nonsense() }\n", "HLO text does not parse"),
])
def test_bad_input_gets_one_line_and_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "dump.mlir"
    if content is not None:
        path.write_text(content)
    code, out, err = run([path], capsys)
    assert code == 2, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("Error: ") and message in err and str(path) in err


def test_unknown_format_is_a_usage_error(sample, capsys):
    code, _, err = run([sample, "--format", "xml"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "'xml'" in err


def test_console_entry_point_prints_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "missing")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "no such file" in result.stderr


def test_a_one_device_dump_on_one_chip_has_no_network_and_valid_json(capsys):
    # A single chip has no chip-to-chip link: its bandwidth is infinite, written as null (JSON
    # has no inf) instead of refusing the whole report.
    dump = "dumps/stablehlo/tiny_28_64_64_none_1x1_stage1_pairs1-1.mlir"
    assert run_click(analyze_command, [dump, "--hw", "tx8", "--format", "json"]) == 0
    system = json.loads(capsys.readouterr().out)["mapping"]["system"]
    assert (system["chips"], system["link_bandwidth_bytes_per_s"]) == (1, None)


@pytest.mark.parametrize("redirect", [">", ">>"])
def test_a_report_redirected_to_the_dumps_sidecar_name_is_no_sidecar(sample, redirect):
    """``analyze-hlo x.mlir --format json > x.json``: the shell makes x.json (empty; under ``>>``
    it may hold an earlier report) before the command runs, and x.json is the name of x.mlir's
    sidecar. The file stdout writes is no sidecar: the command ignores it, with no error, and its
    report is the same as without the file."""
    import shlex

    target = sample.with_suffix(".json")
    earlier = '{"earlier": "report"}\n' if redirect == ">>" else ""
    target.write_text(earlier)
    command = f"{shlex.quote(sys.executable)} -m hlo_analyzer.cli {shlex.quote(str(sample))} --format json " \
              f"{redirect} {shlex.quote(str(target))}"
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(target.read_text()[len(earlier):])["totals"]["gemm_flops"] == 240 + 1024 + 7776 + 1536


def test_an_empty_file_at_the_sidecars_name_is_no_sidecar(sample, capsys):
    sample.with_suffix(".json").write_text("")
    code, out, err = run([sample, "--format", "json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["totals"]["vector_flops"] == 188
