"""torch-xla's ``nn.MaxPool2d``: ``max_pool2d_with_indices`` lowers to a ``while`` loop over the
output elements whose bound is a loop variable carried unchanged from a constant outside the loop
(``ComputeMaxPoolIndices``). Its trip count is found, so its body (a ``select_and_scatter`` on one
window per iteration) is counted once per output element.

One process (torch-xla fixes its device count per process) traces the pool on the XLA device with
``tracing.capture`` and writes the program; the analysis runs here. The hand-written StableHLO
form of the same loop pattern: ``tests/test_dump_forms.py`` (runs without torch).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hlo_analyzer import analyze, load_module

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import sys
from tracing import capture

session = capture.prepare_process(1)
import torch
import torch_xla

x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8).to(torch_xla.device())
y = torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)(x)
hlo = capture.capture_partitioned_hlo(session, [y])
with open(sys.argv[1], "w") as handle:
    handle.write(hlo)
capture.end_process(session)
"""

#: Input 2x3x8x8, kernel 3, stride 2, padding 1: floor((8 + 2 - 3) / 2) + 1 = 4 outputs per
#: spatial dimension, 2 * 3 * 4 * 4 = 96 output elements: one iteration each.
OUTPUTS = 2 * 3 * 4 * 4
#: Each iteration's select_and_scatter: one 3x3 window (9 FLOPs: 8 selects, 1 scatter).
WINDOW = 3 * 3


@pytest.mark.trace
@pytest.mark.slow
def test_max_pool_loop_runs_once_per_output_element(tmp_path):
    dump = tmp_path / "max_pool.hlo.txt"
    completed = subprocess.run([sys.executable, "-c", SCRIPT, str(dump)], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = analyze(load_module(dump))
    [loop] = report.loops
    assert (loop.trip_count, loop.source) == (OUTPUTS, "counter")
    assert not report.notes  # no loop counted once for want of a trip count
    assert report.unhandled == {}
    [scatter] = [row for row in report.rows if row.op.endswith("select_and_scatter")]
    assert (scatter.flops, scatter.count) == (WINDOW, OUTPUTS)
