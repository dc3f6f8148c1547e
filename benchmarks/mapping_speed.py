"""How much does ``--hw`` add to ``analyze-hlo`` on a 100k-op module? Target: under 2 s.

Uses the synthetic transformer-shaped module of ``benchmarks/analyze_speed.py`` (dot_general,
attention-like exp between two batched GEMMs, norms, reductions, all-reduces; 8 partitions) and
times in one process, best of ``--repeat``:

* baseline: ``analyze-hlo DUMP --format json -o FILE`` (no mapping);
* with mapping: the same with ``--hw tx8`` (8 TX8 chips, fused execution, every op mapped);

and prints both, the overhead (difference) against the 2 s target and the ratio.

    python3 benchmarks/mapping_speed.py [--ops 100000] [--hw tx8] [--exec fused|eager]
    python3 benchmarks/mapping_speed.py --dump MISSION.mlir   # a real dump instead (issue 32)
    python3 benchmarks/mapping_speed.py --quick     # 2,000 ops once: what CI runs, no figure

The mission dump (issue 32: its mapping under 2 s) is the full-size mission trace,
``trace-stage --stage 0 --strategy megatron`` (the full model at 204_640_360 on 2x8, one stage of
all 28 pairs; under ``flock /tmp/fulltrace.lock``); ``--dump`` times it in place of the
synthetic module, with its sidecar (so the mapping is the one ``analyze-hlo --hw tx8`` does).

Last measured at 100k ops (shared machine, best of 3): main a62ce34 1.04 s -> 3.85 s, overhead
2.81 s (misses); branch mapspeed 1.06 s -> 2.31-2.44 s, overhead 1.26-1.39 s (meets): the
dataflow graph is built in the analysis walk (DataflowVisitor follower), Ops and mappings are
made once per op signature, the kernel list skips json's pure-Python encoder and its numbers are
checked by distinct value.

The mission dump (issue 32; the 2-core machine at a load of about 5, best of 2): main 38731ee
1.15 s -> 2.27 s, mapping 1.12 s; branch h-est 1.29 s -> 2.40 s, mapping 1.11 s (meets the 2 s
for the mapping; the whole command does not). The GEMM tiling search builds a Mapping only for a
candidate that may win (half the search's time on STDiT3's GEMMs) and runs once per process per
GEMM; the segmentation finds each block's next GEMM by a walk in position order that stops there;
the pairs' residual inputs are found once. In-process timing of the mapping alone (no fork, same
load) 8.9-10.3 s on main against 5.2-7.8 s on the branch; the command's figure, dominated by
other work at this load, did not move.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.analyze_speed import synthetic_module  # noqa: E402
from hlo_analyzer.cli import analyze_command  # noqa: E402
from hlo_analyzer.mlir import default_context  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402

TARGET_OVERHEAD_S = 2.0


def best_time(arguments: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        code = run_click(analyze_command, arguments)
        times.append(time.perf_counter() - start)
        if code != 0:
            raise SystemExit(f"analyze-hlo {' '.join(arguments)} failed with exit code {code}")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000, help="approximate op count")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the best is kept")
    parser.add_argument("--hw", default="tx8", help="hardware to map on")
    parser.add_argument("--exec", dest="execution", default="fused", choices=["fused", "eager"])
    parser.add_argument("--dump", default=None,
                        help="time this dump (with its sidecar) instead of the synthetic module")
    parser.add_argument("--quick", action="store_true",
                        help="seconds: 2,000 ops, one run each (CI checks that the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.repeat = 2_000, 1

    with tempfile.TemporaryDirectory() as tmp:
        if args.dump is None:
            dump = Path(tmp) / "synthetic.mlir"
            dump.write_text(synthetic_module(args.ops))
        else:
            dump = Path(args.dump)
        default_context()
        base = [str(dump), "--format", "json", "--force", "-o", str(Path(tmp) / "report.json")]
        baseline = best_time(base, args.repeat)
        mapped = best_time(base + ["--hw", args.hw, "--exec", args.execution], args.repeat)
    overhead = mapped - baseline
    verdict = "meets" if overhead < TARGET_OVERHEAD_S else "MISSES"
    print(f"module: {dump.name if args.dump else f'~{args.ops:,} ops'}")
    print(f"analyze-hlo --format json (baseline):  {baseline:.2f} s")
    print(f"... --hw {args.hw} --exec {args.execution}:        {mapped:.2f} s  (ratio {mapped / baseline:.2f})")
    print(f"--hw overhead: {overhead:.2f} s, target < {TARGET_OVERHEAD_S:.0f} s: {verdict}")
    if args.quick:
        print("(--quick: a small module run once; these figures are no measurement)")


if __name__ == "__main__":
    main()
