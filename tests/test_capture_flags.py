"""The XLA flags a trace starts with (tracing/capture.py), read in a fresh process: no torch
is needed to set them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import os, sys
from tracing import capture
session = capture.prepare_process(2, dump_root=sys.argv[1], keep_every_op=sys.argv[2] == "keep")
print(os.environ["XLA_FLAGS"])
"""


def test_the_partitioned_dump_keeps_every_op_of_the_traced_program(tmp_path):
    """The SPMD partitioner's clean-up CSE would merge identical computations (the official
    path's two ``norm1(x)`` of a block) in every partitioned dump, never in a one-device one:
    it is disabled, the user's own disabled passes kept, and the dump flags are ours."""
    flags = xla_flags(tmp_path, "--xla_disable_hlo_passes=foo,bar --xla_dump_to=/elsewhere --xla_cpu_flag")
    assert [f for f in flags if f.startswith("--xla_disable_hlo_passes")] == ["--xla_disable_hlo_passes=foo,bar,cse"]
    assert "--xla_cpu_flag" in flags
    dumps = [f for f in flags if f.startswith("--xla_dump_to=")]
    assert len(dumps) == 1 and dumps[0].startswith(f"--xla_dump_to={tmp_path / 'hlo_trace_xla_dump_'}")


def test_a_training_step_keeps_xlas_merges(tmp_path):
    """The training memory accounting counts the merged program (tracing/capture.py)."""
    assert not [f for f in xla_flags(tmp_path, "", keep="merge") if f.startswith("--xla_disable_hlo_passes")]
    assert "--xla_disable_hlo_passes=foo" in xla_flags(tmp_path, "--xla_disable_hlo_passes=foo", keep="merge")


def xla_flags(tmp_path: Path, inherited: str, keep: str = "keep") -> list[str]:
    env = {**os.environ, "XLA_FLAGS": inherited}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), keep], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, check=True)
    return result.stdout.split()
