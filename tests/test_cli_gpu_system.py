"""analyze-hlo --hw 8xa100 on an 8-device DS-Ulysses dump: communication timed on the NVSwitch
system's measured NCCL table, or its port model when the link figures are replaced.

The dump (tiny config, 28x64x64, one block pair, mesh 2x4) was made with
``python3 -m tracing.cli --config tiny --strategy ds_ulysses --mesh 2x4 --stage-ids 0-0,1-1 --stage 1 -o dumps/stablehlo``.
"""

import json
from pathlib import Path

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click

DUMP = Path(__file__).resolve().parent.parent / "dumps" / "stablehlo" / "tiny_28_64_64_ds_ulysses_2x4_stage1_pairs1-1.mlir"

#: 8xa100.toml's port model (used when --link-bandwidth / --hop-latency replace its figures):
#: 300 GB/s per GPU port each way into NVSwitch, 2 us per ring step.
PORT_BYTES_PER_S = 300e9
STEP_S = 2e-6
#: The first rows of hardware/data/nccl/8xa100-40gb.toml (8 GPUs): all-to-all 131072 B at
#: 1.31 GB/s busbw, all-gather 65536 B at 1.58 GB/s. A smaller message takes the first row's
#: time, size x (n-1)/n / busbw with n = 8, whatever its group size.
ALL_TO_ALL_FLOOR_S = 131072 * 7 / 8 / 1.31e9  # 87.55 us
ALL_GATHER_FLOOR_S = 65536 * 7 / 8 / 1.58e9  # 36.29 us


def _comm(capsys, *options):
    code = run_click(analyze_command, [str(DUMP), "--hw", "8xa100", "--format", "json", *options])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    comm = [op for op in report["ops"] if op.get("category") == "comm" and op["group_size"] > 1]
    return report, comm


def test_ds_ulysses_on_8xa100_uses_the_nccl_table(capsys):
    report, comm = _comm(capsys)
    mapping = report["mapping"]
    assert mapping["chips"] == 8 and mapping["model"]["collective_algorithm"] == "switch"
    assert mapping["model"]["execution"] == "gpu_kernels"
    assert mapping["model"]["nccl_table"]["name"] == "8xa100-40gb"
    # The tiny dump moves 4 KiB all-to-alls and 16 KiB all-gathers over groups of 4: below the
    # table's first rows, so each costs the measured small-message floor.
    assert sorted({(op["comm_kind"], op["group_size"], op["comm_bytes"]) for op in comm}) == [
        ("all_gather", 4, 16384), ("all_to_all", 4, 4096)]
    floor = {"all_to_all": ALL_TO_ALL_FLOOR_S, "all_gather": ALL_GATHER_FLOOR_S}
    expected = sum(floor[op["comm_kind"]] for op in comm)
    assert report["totals"]["comm_latency_s"] == pytest.approx(expected)
    assert mapping["totals"]["inference_comm_s"] == pytest.approx(30 * expected)


def test_new_link_figures_drop_the_table_for_the_port_model(capsys):
    report, comm = _comm(capsys, "--link-bandwidth", "300", "--hop-latency", "2")
    assert report["mapping"]["model"]["nccl_table"] is None
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


def test_table_names_the_model_and_algorithm(capsys):
    code = run_click(analyze_command, [str(DUMP), "--hw", "8xh100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "model: gpu_kernels" in out and "collectives: switch on switch" in out
    # the scaled table of another system is labelled an assumption, in so many words
    assert ("all-reduce, all-gather, reduce-scatter, all-to-all from the NCCL table 8xa100-40gb "
            "(an assumption: the nccl-tests table measured on 8xa100-40gb with every bus bandwidth "
            "x1.5; no measurement of this system is bundled)") in out
