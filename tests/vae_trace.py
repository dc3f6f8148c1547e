"""Trace one VAE decode call with trace-module on one device and analyze it with analyze-hlo: the
analyzer's per-op rows, from which the VAE tests sum convolution and attention FLOPs to compare
with their hand counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def traced_report(tmp_path: Path, factory: str, kwargs: dict, inputs: list[str], dtype: str) -> dict:
    """``analyze-hlo --format json``'s report of ``factory(**kwargs)`` traced on ``inputs``
    (``NAME=SHAPE:DTYPE`` each) with weights in ``dtype``; the dump and the keyword file go to
    ``tmp_path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    path = tmp_path / "kwargs.toml"
    path.write_text("".join(f"{k} = {json.dumps(list(v) if isinstance(v, tuple) else v)}\n" for k, v in kwargs.items()))
    traced = subprocess.run([sys.executable, "-m", "tracing.module_cli", factory,
                             *[arg for spec in inputs for arg in ("--input", spec)],
                             "--dtype", dtype, "--kwargs", str(path),
                             "--strategy", "dp", "--mesh", "1x1", "--name", "vae", "-o", str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert traced.returncode == 0, traced.stderr[-2000:]
    analysis = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "vae.mlir"),
                               "--hw", "h100-sxm", "--format", "json"],
                              env=env, capture_output=True, text=True, timeout=300)
    assert analysis.returncode == 0, analysis.stderr
    return json.loads(analysis.stdout)


def traced_ops(tmp_path: Path, factory: str, kwargs: dict, latent: str, dtype: str) -> list[dict]:
    """The analyzer's per-op rows of ``factory(**kwargs)`` traced on one ``latent``
    (``1xCxTxHxW``) in ``dtype``."""
    return traced_report(tmp_path, factory, kwargs, [f"latent={latent}:{dtype}"], dtype)["ops"]


def flops(ops: list[dict], op: str, location: str = "") -> int:
    """FLOPs of the ops of kind ``op`` whose source location holds ``location``."""
    return sum(o["flops"] * o["count"] for o in ops if o["op"] == op and location in o["location"])
