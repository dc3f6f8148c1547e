"""The mission's commands, literally, from an empty directory (needs the trace extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import code_blocks, python_env

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent


def _command(tool: str, *args: str) -> list[str]:
    module = {"trace-stage": "tracing.cli", "analyze-hlo": "hlo_analyzer.cli"}[tool]
    return [sys.executable, "-m", module, *args]


@pytest.mark.slow
def test_trace_then_analyze_from_an_empty_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    traced = subprocess.run(
        _command("trace-stage", "--stage", "0", "--strategy", "megatron", "--config", "tiny",
                 "--mesh", "2x2"),
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert traced.returncode == 0, traced.stderr
    dumps = sorted((tmp_path / "dumps").glob("*.mlir"))  # ./dumps/ was created
    # tiny has depth 2; one stage holds both pairs, 0 to 1.
    assert [p.name for p in dumps] == ["tiny_28_64_64_megatron_2x2_stage0_pairs0-1.mlir"]

    analyzed = subprocess.run(
        _command("analyze-hlo", str(dumps[0]), "--hw", "tx8", "--format", "json"),
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert analyzed.returncode == 0, analyzed.stderr
    report = json.loads(analyzed.stdout)
    assert report["mapping"]["totals"]["inference_latency_s"] > 0
    assert report["mapping"]["chips"] == 4 and "4 tx8 chips" in report["mapping"]["system"]["assumed"]

    # Issue 26: then the README's Python example, in the same directory (its ./dumps/ must not
    # hide the bundled example).
    body = next(body for language, body in code_blocks() if language == "python")
    example = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=python_env(),
                             capture_output=True, text=True, timeout=300)
    assert example.returncode == 0, example.stderr
    assert "GEMM ops: 3" in example.stdout
