"""Measure a full-size trace: stage 0 of --stage-ids 0-13,14-27, megatron, 2x8 mesh, 204_640_360.

Runs ``python3 -m tracing.cli`` in a fresh process (torch-xla's device count is fixed per
process) into a temporary directory and prints the wall time and peak RSS of that process, plus
the per-step seconds its sidecar records.  Baseline: the 24 GiB of the reference machine
(the printed ratio is peak RSS / 24 GiB).  Never run two of these at once.

    python3 benchmarks/trace_full.py [--keep DIR]
    python3 benchmarks/trace_full.py --quick     # the tiny config (seconds): what CI runs

The dump's name comes from the tracer's own naming (``PipelineConfig.dump_name``), so a rename
there breaks CI's quick run, not the next manual one.
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
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tracing.config import build_config  # noqa: E402  (imports no torch)

MACHINE_BYTES = 24 * 2**30
#: The measured case, and the quick one CI runs (the tiny config: a few seconds).
FULL = {"config": "full", "shape": "204_640_360", "strategy": "megatron", "mesh": "2x8",
        "stage_ids": "0-13,14-27", "stage": 0}
QUICK = {"config": "tiny", "shape": "28_64_64", "strategy": "megatron", "mesh": "2x2",
         "stage_ids": "0-0,1-1", "stage": 0}


def trace_arguments(case: dict) -> list[str]:
    """``trace-stage`` options of ``case``."""
    return [word for key, value in case.items() for word in (f"--{key.replace('_', '-')}", str(value))]


def dump_name(case: dict) -> str:
    """The file name (no suffix) ``trace-stage`` gives the dump of ``case``, from the tracer's own
    naming (``PipelineConfig.dump_name``): a rename there cannot leave this script behind."""
    options = {key: value for key, value in case.items() if key != "stage"}
    return build_config(**options).dump_name(case["stage"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", help="write the dump into this directory instead of a temp one")
    parser.add_argument("--dialect", default="stablehlo", choices=["stablehlo", "mhlo"])
    parser.add_argument("--quick", action="store_true",
                        help="trace the tiny config instead (seconds; CI checks that the script runs)")
    args = parser.parse_args()
    case = QUICK if args.quick else FULL
    name = dump_name(case)
    with tempfile.TemporaryDirectory(prefix="trace_full_") as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        command = [sys.executable, "-m", "tracing.cli", *trace_arguments(case),
                   "--dialect", args.dialect, "-o", str(out), "--force"]
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ))
        wall = time.perf_counter() - started
        # ru_maxrss of waited-for children: the trace process (KiB on Linux).
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if completed.returncode:
            print(f"trace failed with exit code {completed.returncode}", file=sys.stderr)
            return completed.returncode
        sidecar_path = out / f"{name}.json"
        if not sidecar_path.is_file():
            found = ", ".join(sorted(path.name for path in out.glob("*.json"))) or "none"
            print(f"trace wrote no {sidecar_path.name} (sidecars found: {found})", file=sys.stderr)
            return 1
        sidecar = json.loads(sidecar_path.read_text())
        print(f"{case['config']}-size trace, stage {case['stage']} of {case['stage_ids']}, "
              f"{case['strategy']} {case['mesh']}, {case['shape']}: {name}")
        print(f"wall seconds: {wall:.1f}  (sidecar steps: {sidecar['seconds']})")
        print(f"peak RSS: {peak / 2**30:.2f} GiB = {peak / MACHINE_BYTES:.2f} x the 24 GiB machine "
              f"(sidecar: {sidecar['peak_rss_bytes'] / 2**30:.2f} GiB)")
        print(f"dump size: {sidecar['mlir_bytes'] / 2**20:.1f} MiB")
        if args.quick:
            print("(--quick: the tiny config; these figures are no measurement of the full size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
