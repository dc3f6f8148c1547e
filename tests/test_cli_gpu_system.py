"""analyze-hlo --hw 8xa100 on an 8-device DS-Ulysses dump: communication timed on the NVSwitch model.

The dump (tiny config, 28x64x64, one block pair, mesh 2x4) was made with
``python3 -m tracing.cli --config tiny --strategy ds_ulysses --mesh 2x4 --stage-ids 0-0,1-1 --stage 1 -o dumps/stablehlo``.
"""

import json
from pathlib import Path

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click

DUMP = Path(__file__).resolve().parent.parent / "dumps" / "stablehlo" / "tiny_28_64_64_ds_ulysses_2x4_stage1_pairs1-1.mlir"

#: 8xa100.toml: 300 GB/s per GPU port each way into NVSwitch, 2 us per ring step.
PORT_BYTES_PER_S = 300e9
STEP_S = 2e-6


def test_ds_ulysses_on_8xa100_uses_the_switch(capsys):
    code = run_click(analyze_command, [str(DUMP), "--hw", "8xa100", "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    mapping = report["mapping"]
    assert mapping["chips"] == 8 and mapping["model"]["collective_algorithm"] == "switch"
    assert mapping["model"]["execution"] == "gpu_kernels"
    comm = [op for op in report["ops"] if op.get("category") == "comm" and op["group_size"] > 1]
    assert comm and {op["comm_kind"] for op in comm} <= {"all_gather", "all_to_all", "all_reduce", "reduce_scatter"}
    # By hand, per collective on the switch: each GPU pushes its ring volume through its port
    # (all-gather / all-to-all: M(n-1)/n, all-reduce 2M(n-1)/n) and pays one step per ring step
    # (n-1, or 2(n-1) for all-reduce); an all-to-all of n = 4 on 8 ports is under its bisection
    # bound (M/4 each way over 4 ports).
    expected = 0.0
    for op in comm:
        n, m = op["group_size"], op["comm_bytes"]
        factor, steps = (2, 2 * (n - 1)) if op["comm_kind"] == "all_reduce" else (1, n - 1)
        expected += factor * m * (n - 1) / n / PORT_BYTES_PER_S + steps * STEP_S
    assert report["totals"]["comm_latency_s"] == pytest.approx(expected)
    assert mapping["totals"]["inference_comm_s"] == pytest.approx(30 * expected)


def test_table_names_the_model_and_algorithm(capsys):
    code = run_click(analyze_command, [str(DUMP), "--hw", "8xh100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "model: gpu_kernels" in out and "collectives: switch on switch" in out
