"""trace-stage's two processes: the trace (torch, torch-xla) hands the partitioned program to the
conversion, which needs no torch.

The trace's process is a fresh interpreter here (torch-xla's device count is fixed per process),
run on the tiny config (hidden 64) at 28_64_64 on a 2x2 mesh, stage 0 of 0-0,1-1; what it
hands over is unpickled and converted in a second fresh interpreter where torch cannot be
imported at all.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("torch_xla")

TRACE = """
import os, pickle, sys
from pathlib import Path
from tracing.cli import _trace_in_child
from plans.config import build_config

out = Path(sys.argv[1])
config = build_config(config="tiny", shape="28_64_64", strategy="megatron", mesh="2x2",
                      stage_ids="0-0,1-1")
send = os.open(out / "captured.pickle", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
_trace_in_child(config, 0, out, False, out / "stage_shapes.json", None, send)
loaded = [name for name in ("jax", "torchax", "triton") if sys.modules.get(name) is not None]
(out / "loaded.pickle").write_bytes(pickle.dumps(loaded))
os._exit(0)  # as the CLI's child leaves: XLA's compile may still run
"""

CONVERT = """
import json, pickle, sys
from pathlib import Path
sys.modules["torch"] = None  # any import of torch fails here
from tracing.cli import write_captured

out = Path(sys.argv[1])
captured = pickle.loads((out / "captured.pickle").read_bytes())  # what the pipe carries
loaded = pickle.loads((out / "loaded.pickle").read_bytes())
written = write_captured(captured, "stablehlo", force=False)
print(json.dumps({"loaded": loaded, "written": [str(path) for path in written],
                  "torch": sys.modules.get("torch") is not None}))
"""


def _run(script: str, out: Path) -> str:
    result = subprocess.run([sys.executable, "-c", script, str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace_processes")
    _run(TRACE, out)
    return json.loads(_run(CONVERT, out).strip().splitlines()[-1])


def test_the_trace_process_loads_neither_jax_torchax_nor_triton(converted):
    # torch-xla's mark_sharding imported torchax and JAX (1.5 s, 140 MiB) before
    assert converted["loaded"] == []


def test_the_captured_stage_converts_in_a_process_without_torch(converted):
    # torch's version string is a TorchVersion: left in the sidecar, unpickling it imported torch
    assert converted["torch"] is False
    mlir, sidecar = (Path(path) for path in converted["written"])
    assert mlir.suffix == ".mlir" and sidecar.suffix == ".json"
    text = mlir.read_text()
    assert text.startswith("#loc") or text.startswith("module"), text[:80]
    assert "stablehlo.all_reduce" in text  # megatron on 2 devices of y: partitioned
    data = json.loads(sidecar.read_text())
    assert data["mlir_bytes"] == mlir.stat().st_size
    assert data["dialect"] == "stablehlo" and data["versions"]["torch"].startswith("2.")
    # the steps of both processes, each with its peak
    steps = {"build", "shard", "trace", "compile", "convert"}
    assert set(data["seconds"]) == steps and set(data["peak_rss_bytes_after"]) == steps
    assert data["peak_rss_bytes"] >= max(data["peak_rss_bytes_after"].values())
    assert data["seconds_total"] >= sum(data["seconds"].values())


def test_no_location_keeps_a_path_of_this_machine(converted):
    mlir, _ = (Path(path) for path in converted["written"])
    text = mlir.read_text()
    assert f'"{REPO}/' not in text
    assert re.search(r'loc\("models/opensora/stdit3\.py":\d+:\d+\)', text)
