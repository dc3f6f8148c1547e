"""A JAX training step (value_and_grad + Adam, data-parallel on 8 virtual CPU devices, made by
tests/jax_training_program.py in a subprocess) gets the same memory classes and communication
split from ``analyze-hlo`` as a traced STDiT3 step.

Hand counts (fp32, 8 devices, batch 32 split 4 rows per device; w1 (64, 128), w2 (128, 64)):
P = G = (8192 + 8192) * 4 = 65536 bytes (replicated); OS = m + v = 131072 (an fp32 model has no
master copy). Act, what the forward keeps for the backward, per device: x (4, 64) for dw1,
tanh(x w1) (4, 128) for dw2, its derivative 1 - tanh^2 (4, 128, JAX linearizes in the forward)
and the residual (4, 64) of the MSE: (256 + 512 + 512 + 256) * 4 = 6144 bytes.
Collectives: the loss's mean sums a scalar over 8 devices (forward, activation: 2*4*7/8 = 7 B)
and each weight gradient is summed (backward, param_grad: 2 all-reduces of 32768 B,
2 * 2 * 32768 * 7/8 = 114688 B).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def jax_step(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jax_training")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "jax_training_program.py"),
                             str(out)], capture_output=True, text=True, timeout=300)
    if result.returncode == 3:
        pytest.skip("jax cannot make 8 CPU devices here")
    assert result.returncode == 0, result.stderr[-2000:]
    return out / "step.spmd.hlo.txt"


def test_analyze_hlo_splits_a_jax_training_step(jax_step):
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(jax_step), "--format",
                             "json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    training = json.loads(result.stdout)["training"]
    assert training["memory_bytes"] == {"param": 65536, "grad": 65536, "optimizer_state": 131072,
                                        "activation": 6144, "input": 2 * 4 * 64 * 4}
    comm = {(row["phase"], row["traffic"], row["kind"]): (row["count"], row["bytes_per_device"])
            for row in training["comm"]}
    assert comm == {("forward", "activation", "all_reduce"): (1, 7.0),
                    ("backward", "param_grad", "all_reduce"): (2, 114688.0)}


def test_without_the_backward_marker_jax_backward_ops_look_like_forward_ones(jax_step, tmp_path):
    """JAX names the backward of a scope transpose(jvp(scope)): without the sidecar's backward
    marker the gradient sums would count as forward traffic (the marker is what tells them)."""
    from hlo_analyzer import load_module
    from hlo_analyzer.training import measure_training, read_training_layout

    sidecar = json.loads(jax_step.with_suffix(".json").read_text())
    del sidecar["training"]["scopes"]["backward"]
    unmarked = tmp_path / "step.json"
    unmarked.write_text(json.dumps(sidecar))
    split = measure_training(load_module(jax_step), read_training_layout(unmarked))
    assert split.comm_count(phase="backward") == 0
    assert split.comm_count(phase="forward", traffic="param_grad") == 2


def test_the_memory_section_of_a_training_step_does_not_call_its_arguments_weights(jax_step):
    # its sidecar names no stage inputs, so the resident arguments are P (65536 B) + OS
    # (131072 B) + the inputs x, y (2 * 4 * 64 * 4 = 2048 B) = 198656 B = 194 KiB: not "weights"
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(jax_step)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    memory = result.stdout.split("Memory per device:\n", 1)[1].split("\n\n", 1)[0]
    assert "weight" not in memory, memory
    [resident] = [line for line in memory.splitlines() if "(resident)" in line]
    assert resident.split()[:4] == ["arguments", "(resident)", "194.00", "KiB"], resident
    assert "P, OS and stage inputs, split below" in resident


def test_the_analysis_holds_the_training_step_typed(jax_step):
    """``analyze_dump`` (what analyze-hlo prints from) gives the split as a TrainingSplit and the
    memory as a MemorySection: the hand counts of the module docstring, read as fields."""
    from hlo_analyzer import analyze_dump
    from hlo_analyzer.memory import MemorySection
    from hlo_analyzer.training import TrainingSplit

    analysis = analyze_dump(str(jax_step), None)
    assert isinstance(analysis.training, TrainingSplit) and isinstance(analysis.memory, MemorySection)
    assert analysis.training.memory["optimizer_state"] == 131072
    assert analysis.training.memory["activation"] == 6144
    assert analysis.training.comm_bytes(phase="backward", traffic="param_grad") == 114688.0
    # no stage inputs in its sidecar: every argument resident, P + OS + x, y = 198656 B
    assert analysis.memory.usage.weight_bytes == 65536 + 131072 + 2048
    assert analysis.memory.sidecar == str(jax_step.with_suffix(".json"))
    # read back from analyze-hlo's JSON (another process): the same split but the positions
    printed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(jax_step), "--format",
                              "json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    read = TrainingSplit.from_dict(json.loads(printed.stdout)["training"], "stdout")
    assert (read.memory, read.comm) == (analysis.training.memory, analysis.training.comm)
