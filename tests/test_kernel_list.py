"""Kernel lists (``analyze-hlo --kernels``, ``hlo_analyzer.mapping.kernel_list``): written, read back and
costed again, they give the report's totals on the description they were found on and
``analyze-hlo --hw Y``'s on another GPU description; the committed lists of
``results/gpu_validation/kernels`` read back to the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_analyzer.mapping import kernel_list as kernel_list
from hlo_trace.cli import run_click

REPO_ROOT = Path(__file__).resolve().parent.parent
#: A one-device tiny STDiT3 stage (one block pair) and an 8-device one (collectives).
DUMP = REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_none_1x1_stage1_pairs1-1.mlir"
MULTI_DEVICE_DUMP = REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_ds_ulysses_2x4_stage1_pairs1-1.mlir"
COMMITTED = REPO_ROOT / "results" / "gpu_validation" / "kernels"


def _analyze(tmp_path: Path, hardware: str, *extra: str) -> dict:
    report = tmp_path / f"report_{hardware}.json"
    assert run_click(analyze_command, [str(DUMP), "--hw", hardware, "--pairs", "28", "--format", "json",
                                       "-o", str(report), *extra]) == 0
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def listed(tmp_path_factory) -> tuple[kernel_list.KernelList, dict]:
    tmp_path = tmp_path_factory.mktemp("kernel_list")
    target = tmp_path / "kernels.json"
    report = _analyze(tmp_path, "h100-sxm", "--kernels", str(target))
    return kernel_list.read(target), report


def test_a_kernel_list_costs_what_the_report_says(listed):
    kernels, report = listed
    totals = report["mapping"]["totals"]
    assert len(kernels.kernels) == len(report["mapping"]["kernels"])
    assert (kernels.steps, kernels.pairs_found, kernels.pairs_total) == (30, 1, 28)
    assert kernels.peak_live_bytes == report["memory"]["peak_live_bytes"]
    again = kernel_list.cost(kernels, "h100-sxm")
    assert again.step_latency_s == totals["step_latency_s"]
    assert again.inference_latency_s == totals["inference_latency_s"]


@pytest.mark.parametrize("hardware", ["a100-sxm", "h200-sxm"])
def test_kernels_found_on_one_gpu_cost_on_another_as_analyze_hlo_does(listed, tmp_path, hardware):
    kernels, _ = listed
    report = _analyze(tmp_path, hardware)
    assert kernel_list.cost(kernels, hardware).inference_latency_s == \
        pytest.approx(report["mapping"]["totals"]["inference_latency_s"], rel=1e-12)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_kernel_list_round_trips(listed, tmp_path, suffix):
    kernels, _ = listed
    assert kernel_list.from_dict(json.loads(json.dumps(kernel_list.to_dict(kernels)))) == kernels
    path = tmp_path / f"kernels{suffix}"
    kernel_list.write(kernels, path)
    assert kernel_list.read(path) == kernels


def test_the_committed_kernel_lists_round_trip_to_the_same_bytes():
    files = sorted(COMMITTED.glob("*.json"))
    assert len(files) == 12 + 6  # a loop per video shape, two decoder calls per resolution
    for path in files:
        kernels = kernel_list.read(path)
        assert kernel_list.dumps(kernels) == path.read_text(), path.name
        assert kernels.execution == "torch" and kernels.kernels


def test_a_multi_device_program_has_no_kernel_list(tmp_path, capsys):
    code = run_click(analyze_command, [str(MULTI_DEVICE_DUMP), "--hw", "8xh100", "--kernels",
                                       str(tmp_path / "k.json")])
    assert code == 2 and not (tmp_path / "k.json").exists()
    assert "collectives" in capsys.readouterr().err


def test_kernels_needs_hw(tmp_path, capsys):
    assert run_click(analyze_command, [str(DUMP), "--kernels", str(tmp_path / "k.json")]) == 2
    assert "--kernels needs --hw" in capsys.readouterr().err


@pytest.mark.parametrize("document, message", [
    ({"format": "other"}, "not a kernel list"),
    ({"format": kernel_list.FORMAT, "version": 99}, "version 99"),
    ({"format": kernel_list.FORMAT, "version": kernel_list.VERSION}, "malformed"),
])
def test_anything_else_is_refused(document, message):
    with pytest.raises(ValueError, match=message):
        kernel_list.from_dict(document)
