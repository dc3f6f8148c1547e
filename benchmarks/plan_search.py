"""Wall time of the tiny exhaustive plan space with ``--jobs 1`` and ``--jobs 2`` (issue 25).

Runs ``plan-search --exhaustive`` (every plan the tracer accepts is traced and analyzed) on the
tiny config at 28_64_64 on 8 devices of tx8-16, twice, each into a fresh work directory (no
cache), and prints both wall times and their ratio (baseline: ``--jobs 1``).  Both runs must
give the same answer; the script says so or fails.  Needs the trace extra (torch, torch-xla).

    python3 benchmarks/plan_search.py            # the whole tiny space (minutes)
    python3 benchmarks/plan_search.py --quick    # two flat plans (seconds): what CI runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

#: The tiny exhaustive space of issue 25: all strategies and meshes of 8 devices, flat and 2
#: stages, patches 1, 2, 4.
FULL = ["--config", "tiny", "--shape", "28_64_64", "--hw", "tx8-16", "--devices", "8"]
#: Two flat plans on 4 devices: ds_ulysses on 1x4 and 2x2 (the tracer refuses 4x1: the batch
#: of 2 on x).
QUICK = ["--config", "tiny", "--shape", "28_64_64", "--hw", "tx8-16", "--devices", "4",
         "--strategies", "ds_ulysses", "--stages", "1"]


def run(arguments: list[str], jobs: int, work: Path) -> tuple[float, dict]:
    """One exhaustive search with ``jobs`` parallel plans; (wall seconds, its JSON result)."""
    result = work / "result.json"
    command = [sys.executable, "-m", "tracing.plan_search_cli", *arguments, "--exhaustive",
               "--jobs", str(jobs), "--work-dir", str(work / "cache"), "-o",
               str(work / "best.toml"), "--json", str(result)]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    wall = time.perf_counter() - started
    if completed.returncode:
        sys.exit(f"plan-search --jobs {jobs} failed ({completed.returncode}): "
                 f"{completed.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(result.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="two flat plans instead of the whole space (seconds)")
    args = parser.parse_args()
    arguments = QUICK if args.quick else FULL
    walls, answers = {}, {}
    for jobs in (1, 2):
        with tempfile.TemporaryDirectory(prefix=f"plan_search_j{jobs}_") as tmp:
            walls[jobs], document = run(arguments, jobs, Path(tmp))
            answers[jobs] = (document["best"]["plan"], document["best"]["traced"])
            plans = sum(1 for plan in document["plans"] if plan["traced"])
    if answers[1] != answers[2]:
        sys.exit(f"--jobs 1 and --jobs 2 disagree: {answers[1]} vs {answers[2]}")
    print(f"plan-search --exhaustive, {' '.join(arguments)}: {plans} plans traced")
    print(f"  --jobs 1: {walls[1]:8.1f} s   (baseline)")
    print(f"  --jobs 2: {walls[2]:8.1f} s   ratio jobs 2 / jobs 1 = {walls[2] / walls[1]:.2f}")
    print(f"  same answer: {answers[1][0]} ({answers[1][1]['latency_s']:.6g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
