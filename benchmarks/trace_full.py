"""Measure a full-size trace: stage 0 of --stage-ids 0-13,14-27, megatron, 2x8 mesh, 204_640_360.

Runs ``python3 -m tracing.cli`` in a fresh process (torch-xla's device count is fixed per
process) into a temporary directory and prints the wall time and peak RSS of that process, plus
the per-step seconds its sidecar records.  Baseline: the 24 GiB of the reference machine
(the printed ratio is peak RSS / 24 GiB).  Never run two of these at once.

    python3 benchmarks/trace_full.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MACHINE_BYTES = 24 * 2**30
ARGS = ["--config", "full", "--shape", "204_640_360", "--strategy", "megatron", "--mesh", "2x8",
        "--stage-ids", "0-13,14-27", "--stage", "0"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", help="write the dump into this directory instead of a temp one")
    parser.add_argument("--dialect", default="stablehlo", choices=["stablehlo", "mhlo"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trace_full_") as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        command = [sys.executable, "-m", "tracing.cli", *ARGS, "--dialect", args.dialect,
                   "-o", str(out), "--force"]
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ))
        wall = time.perf_counter() - started
        # ru_maxrss of waited-for children: the trace process (KiB on Linux).
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if completed.returncode:
            print(f"trace failed with exit code {completed.returncode}", file=sys.stderr)
            return completed.returncode
        sidecar = json.loads(next(out.glob("full_204_640_360_megatron_2x8_stage0.json")).read_text())
        print("full-size trace, stage 0 (embeddings + blocks 0-13), megatron 2x8, 204_640_360")
        print(f"wall seconds: {wall:.1f}  (sidecar steps: {sidecar['seconds']})")
        print(f"peak RSS: {peak / 2**30:.2f} GiB = {peak / MACHINE_BYTES:.2f} x the 24 GiB machine "
              f"(sidecar: {sidecar['peak_rss_bytes'] / 2**30:.2f} GiB)")
        print(f"dump size: {sidecar['mlir_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
