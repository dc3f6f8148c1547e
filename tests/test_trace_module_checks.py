"""trace-module as a new user meets it: a model in the current directory, and plans that split
less than their name says (a shorthand whose rules match none of the model's names, a head count
the devices do not divide), which must be an error or a warning with the redundancy factor
(devices x per-device GEMM FLOPs / one-device GEMM FLOPs).

The one-device GEMM FLOPs are written here from the models' dimensions; the per-device ones are
analyze-hlo's count of the dump (an independent walk of the partitioned program).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent
N = 4  # devices of every mesh here

#: A decoder whose layers have names no shorthand knows, but for ``q_proj`` when ``known``.
DECODER = '''
from torch import nn


class Attention(nn.Module):
    def __init__(self, d, known):
        super().__init__()
        setattr(self, "q_proj" if known else "q", nn.Linear(d, d))
        self.o = nn.Linear(d, d)
        self.known = known

    def forward(self, x):
        return self.o((self.q_proj if self.known else self.q)(x))


class Decoder(nn.Module):
    def __init__(self, d=64, known=False):
        super().__init__()
        self.attn = Attention(d, known)
        self.gate = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.out(self.gate(self.attn(x)))


def make(known=False):
    return Decoder(known=known)
'''
B, S, D = 4, 16, 64


def _trace_module(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """trace-module run as its console script is: ``-P`` keeps the current directory off the
    import path (a console script's path starts at its own directory)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-P", "-m", "tracing.module_cli", *args, "--mesh",
                           "2x2", "-o", str(cwd / "out")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _gemm_flops_per_device(dump: Path) -> int:
    completed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--format",
                                "json"], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)["totals"]["gemm_flops"]


def _factor(stderr: str) -> float:
    warnings = [line for line in stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1, stderr
    return float(re.search(r"redundancy factor ([0-9.]+)", warnings[0]).group(1))


def test_a_model_in_the_current_directory_is_imported(tmp_path):
    (tmp_path / "mydecoder.py").write_text(DECODER)
    completed = _trace_module(tmp_path, "mydecoder:make", "--input", f"x={B}x{S}x{D}:float32",
                              "--strategy", "dp")
    assert completed.returncode == 0, completed.stderr
    assert (tmp_path / "out" / "mydecoder_make_dp_2x2.mlir").is_file()


def test_a_shorthand_that_matches_none_of_the_names_is_an_error(tmp_path):
    (tmp_path / "mydecoder.py").write_text(DECODER)
    completed = _trace_module(tmp_path, "mydecoder:make", "--input", f"x={B}x{S}x{D}:float32",
                              "--strategy", "megatron")
    errors = [line for line in completed.stderr.splitlines() if line.startswith("Error:")]
    assert completed.returncode == 2 and len(errors) == 1, completed.stderr
    assert "strategy megatron shards nothing" in errors[0] and "attn.q.weight" in errors[0]
    assert "Traceback" not in completed.stderr and not list(tmp_path.glob("out/*"))


def test_rules_that_match_part_of_the_model_warn_with_the_redundancy_factor(tmp_path):
    """q_proj is split by columns; o, gate and out are whole on every device."""
    (tmp_path / "mydecoder.py").write_text(DECODER)
    (tmp_path / "kwargs.toml").write_text("known = true\n")
    completed = _trace_module(tmp_path, "mydecoder:make", "--kwargs", "kwargs.toml", "--input",
                              f"x={B}x{S}x{D}:float32", "--strategy", "megatron", "--name", "d")
    assert completed.returncode == 0, completed.stderr
    tokens = B * S
    one_device = 2 * tokens * D * D * 2 + 2 * 2 * tokens * D * 4 * D
    per_device = _gemm_flops_per_device(tmp_path / "out" / "d.mlir")
    assert _factor(completed.stderr) == pytest.approx(N * per_device / one_device, abs=1e-3)
    assert _factor(completed.stderr) > 3  # three of the four linears are computed 4 times
    assert "row-parallel names (o_proj" in completed.stderr
    assert "linear layers no rule splits: attn.o, gate, out" in completed.stderr
    sidecar = json.loads((tmp_path / "out" / "d.json").read_text())
    assert sidecar["redundancy"]["one_device_gemm_flops"] == one_device
    # analyze-hlo says it too, from the sidecar
    completed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "out" / "d.mlir")],
                               capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert completed.returncode == 0, completed.stderr
    assert sidecar["redundancy"]["warning"].startswith("redundancy factor")
    assert f"Note: trace-module warned: {sidecar['redundancy']['warning']}\n" in completed.stdout


@pytest.mark.slow
def test_a_head_count_the_devices_do_not_divide_is_named_with_its_factor(tmp_path):
    """Llama (zoo) with 2 key/value heads on 4 devices: GSPMD splits the head dimension (here
    without repeating a GEMM: the factor is lm_head's, whole on every device)."""
    (tmp_path / "kwargs.toml").write_text("kv_heads = 2\n")
    completed = _trace_module(tmp_path, "models.zoo.llama:llama", "--kwargs", "kwargs.toml",
                              "--input", f"ids={B}x{S}:int64", "--strategy", "megatron",
                              "--name", "l")
    assert completed.returncode == 0, completed.stderr
    tokens, d, kv, ffn, vocab = B * S, 128, 2 * 16, 256, 256
    layer = (2 * tokens * d * (d + 2 * kv) + 2 * tokens * d * d + 3 * 2 * tokens * d * ffn
             + 2 * 2 * B * S * S * d)
    one_device = 2 * layer + 2 * tokens * d * vocab
    per_device = _gemm_flops_per_device(tmp_path / "out" / "l.mlir")
    assert _factor(completed.stderr) == pytest.approx(N * per_device / one_device, abs=1e-3)
    assert "head counts the 4 devices do not divide: layers.0.self_attn.kv_heads=2" in completed.stderr
