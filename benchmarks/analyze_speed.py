"""How fast is ``analyze-hlo --format json`` on a 100k-op module, against parse + walk alone?

Builds a synthetic StableHLO module shaped like a transformer dump (dot_general, element-wise
math, rsqrt norms, reductions, reshapes/transposes, all-reduces), then times in one process:

* baseline: ``ir.Module.parse`` + a recursive walk reading every op's name (the bindings' floor);
* the analysis: the ``analyze-hlo --format json -o FILE`` command, end to end in-process.

Prints seconds, ops/s, the ratio to the baseline and peak RSS. Targets (issue 11): ratio <= 2x.

``--million`` adds the 1M-op case (about 86 MB of text): ``analyze-hlo --format json`` run once in
a child process, timed end to end (process start, parse, analysis, JSON) with the child's peak
RSS; targets < 15 s and < 1.5 GiB. It needs a few GiB: run it under ``flock /tmp/heavy.lock``.

    python3 benchmarks/analyze_speed.py [--ops 100000] [--million]
    python3 benchmarks/analyze_speed.py --quick     # 2,000 ops once: what CI runs, no figure

Last measured (shared 2-core machine, noisy; best of 5 each): 100k ops 0.87-0.93 s against a
0.49 s baseline, 1.77-1.90x over 6 runs (2.1-2.4x before the session that trimmed the walks, 3.4x
before the memory walk moved to a second process); 1M ops 10.8-11.2 s (14.3-15.6 s before, 20.0 s
at first), 1.03-1.05 GiB of Pss for all processes. Where the time goes at 100k ops: the parse
(~0.37-0.44 s, the baseline's bulk), then, on two cores at once, the FLOPs/comm walk and the
memory walk (~0.38-0.40 s each inside the CLI; ~0.36 s alone), then ~0.03 s of checks and
~0.06 s of JSON. Each walk is mostly the bindings: iterating the ops and dispatching costs
~1 us an op, reading its operands ~0.9 us, a result's type ~0.45 us, its location ~0.45 us.
At 1M ops jaxlib's parser alone takes ~5.3-5.7 s (superlinear: 14x for 10x).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hlo_analyzer.cli import analyze_command
from hlo_analyzer.mlir import default_context
from hlo_trace.cli import run_click

# One "layer": 20 ops. %x is the running activation (8x64x128 bf16).
LAYER = """    %{p}a = stablehlo.dot_general %{x}, %w, contracting_dims = [2] x [0] : (tensor<8x64x128xbf16>, tensor<128x128xbf16>) -> tensor<8x64x128xbf16>
    %{p}b = stablehlo.multiply %{p}a, %{p}a : tensor<8x64x128xbf16>
    %{p}c = stablehlo.reduce(%{p}b init: %zero) applies stablehlo.add across dimensions = [2] : (tensor<8x64x128xbf16>, tensor<bf16>) -> tensor<8x64xbf16>
    %{p}d = stablehlo.broadcast_in_dim %{p}c, dims = [0, 1] : (tensor<8x64xbf16>) -> tensor<8x64x128xbf16>
    %{p}e = stablehlo.add %{p}d, %eps : tensor<8x64x128xbf16>
    %{p}f = stablehlo.rsqrt %{p}e : tensor<8x64x128xbf16>
    %{p}g = stablehlo.multiply %{p}a, %{p}f : tensor<8x64x128xbf16>
    %{p}h = stablehlo.reshape %{p}g : (tensor<8x64x128xbf16>) -> tensor<8x64x4x32xbf16>
    %{p}i = stablehlo.transpose %{p}h, dims = [0, 2, 1, 3] : (tensor<8x64x4x32xbf16>) -> tensor<8x4x64x32xbf16>
    %{p}j = stablehlo.dot_general %{p}i, %{p}i, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [3] : (tensor<8x4x64x32xbf16>, tensor<8x4x64x32xbf16>) -> tensor<8x4x64x64xbf16>
    %{p}k = stablehlo.exponential %{p}j : tensor<8x4x64x64xbf16>
    %{p}l = stablehlo.dot_general %{p}k, %{p}i, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [2] : (tensor<8x4x64x64xbf16>, tensor<8x4x64x32xbf16>) -> tensor<8x4x64x32xbf16>
    %{p}m = stablehlo.transpose %{p}l, dims = [0, 2, 1, 3] : (tensor<8x4x64x32xbf16>) -> tensor<8x64x4x32xbf16>
    %{p}n = stablehlo.reshape %{p}m : (tensor<8x64x4x32xbf16>) -> tensor<8x64x128xbf16>
    %{p}o = stablehlo.convert %{p}n : tensor<8x64x128xbf16>
    %{p}q = stablehlo.subtract %{p}o, %{x} : tensor<8x64x128xbf16>
    %{p}r = stablehlo.negate %{p}q : tensor<8x64x128xbf16>
    %{p}s = stablehlo.divide %{p}r, %eps : tensor<8x64x128xbf16>
    %{p}t = "stablehlo.all_reduce"(%{p}s) ({{
      ^bb0(%l: tensor<bf16>, %r: tensor<bf16>):
        %sum = stablehlo.add %l, %r : tensor<bf16>
        stablehlo.return %sum : tensor<bf16>
    }}) {{replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>}} : (tensor<8x64x128xbf16>) -> tensor<8x64x128xbf16>
"""
OPS_PER_LAYER = 22  # 19 ops + all_reduce with its two body ops


def with_locations(layer: str) -> str:
    """Give each op a torch-xla-like fused location (aten op name @ source line), shared by all
    layers as in a real dump, where every block's ops come from the same model source lines."""
    lines = []
    for number, line in enumerate(layer.splitlines()):
        if line.rstrip().endswith(("xbf16>", "}}")) and " = " in line and "^bb0" not in line:
            line = f"{line} loc(#loc{number % 12})"
        lines.append(line)
    return "\n".join(lines) + "\n"


LOCATION_ALIASES = "\n".join(
    f'#loc{i} = loc(fused["aten__op{i}", "model.py":{100 + i}:0])' for i in range(12))


def synthetic_module(target_ops: int) -> str:
    layers = max(1, target_ops // OPS_PER_LAYER)
    lines = [
        "module attributes {mhlo.num_partitions = 8 : i32} {",
        "  func.func @main(%x0: tensor<8x64x128xbf16>, %w: tensor<128x128xbf16>) -> tensor<8x64x128xbf16> {",
        "    %zero = stablehlo.constant dense<0.0> : tensor<bf16>",
        "    %eps = stablehlo.constant dense<1.0e-06> : tensor<8x64x128xbf16>",
    ]
    current = "x0"
    for index in range(layers):
        prefix = f"L{index}"
        lines.append(with_locations(LAYER.format(p=prefix, x=current)).rstrip("\n"))
        current = f"{prefix}t"
    lines += [f"    return %{current} : tensor<8x64x128xbf16>", "  }", "}", LOCATION_ALIASES]
    return "\n".join(lines) + "\n"


def parse_and_walk(text: str) -> int:
    from jaxlib.mlir import ir

    with default_context():
        module = ir.Module.parse(text)
    count = 0

    def walk(block) -> None:
        nonlocal count
        for op in block.operations:
            count += 1
            _ = op.operation.name
            for region in op.operation.regions:
                for inner in region.blocks:
                    walk(inner)

    walk(module.body)
    return count


MILLION_OPS = 1_000_000
MILLION_TARGET_S = 15.0
MILLION_TARGET_RSS_GIB = 1.5


def million_case(tmp: Path) -> None:
    """The 1M-op module through the real CLI in a child process: wall time and memory.

    The analysis runs in forked processes that share the parsed module (copy-on-write), so the
    largest process's peak RSS understates what the machine gives: the figure held against the
    target is the peak of the processes' proportional set sizes summed (``Pss`` of
    /proc/PID/smaps_rollup, shared pages split among their sharers), sampled every 250 ms (reading smaps costs CPU the analysis needs)."""
    text = synthetic_module(MILLION_OPS)
    dump = tmp / "million.mlir"
    dump.write_text(text)
    del text
    command = [sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--format", "json",
               "-o", str(tmp / "million.json")]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_pss = [0]
    sampler = threading.Thread(target=_sample_pss, args=(process, peak_pss), daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    elapsed = time.perf_counter() - start
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"analyze-hlo failed on the 1M-op module: {stderr.strip()}")
    rss_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2
    pss_gib = peak_pss[0] / 1024 ** 3
    print(f"1M-op module ({dump.stat().st_size / 1e6:.0f} MB): analyze-hlo --format json "
          f"{elapsed:.1f} s (target < {MILLION_TARGET_S:.0f} s); memory of all its processes "
          f"{pss_gib:.2f} GiB (target < {MILLION_TARGET_RSS_GIB} GiB; largest process's "
          f"peak RSS {rss_gib:.2f} GiB)")


def _sample_pss(process: subprocess.Popen, peak: list[int]) -> None:
    """Keep in ``peak[0]`` the largest sum of Pss bytes over ``process`` and its descendants."""
    while process.poll() is None:
        total = sum(_pss_bytes(pid) for pid in _process_tree(process.pid))
        peak[0] = max(peak[0], total)
        time.sleep(0.25)


def _process_tree(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        try:
            children = Path(f"/proc/{pids[index]}/task/{pids[index]}/children").read_text()
        except OSError:
            children = ""
        pids.extend(int(child) for child in children.split())
        index += 1
    return pids


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000, help="approximate op count")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is kept")
    parser.add_argument("--million", action="store_true",
                        help="also time the 1M-op case in a child process (run under flock)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds: 2,000 ops, one run each (CI checks that the script runs)")
    args = parser.parse_args()
    if args.quick:
        if args.million:
            parser.error("--quick runs the small case only; --million is a manual run")
        args.ops, args.repeat = 2_000, 1
    if args.million:
        with tempfile.TemporaryDirectory() as tmp:
            million_case(Path(tmp))

    text = synthetic_module(args.ops)
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "synthetic.mlir"
        dump.write_text(text)
        default_context()  # context creation is a one-off cost outside both timings

        baseline_times, ops = [], 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            ops = parse_and_walk(text)
            baseline_times.append(time.perf_counter() - start)

        analysis_times = []
        for run in range(args.repeat):
            output = Path(tmp) / f"report{run}.json"
            start = time.perf_counter()
            code = run_click(analyze_command, [str(dump), "--format", "json", "-o", str(output)])
            analysis_times.append(time.perf_counter() - start)
            if code != 0:
                raise SystemExit(f"analyze-hlo failed with exit code {code}")

    baseline, analysis = min(baseline_times), min(analysis_times)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"module: {ops:,} ops, {len(text) / 1e6:.1f} MB of StableHLO text")
    print(f"baseline parse+walk (bindings):  {baseline:.2f} s  ({ops / baseline:,.0f} ops/s)")
    print(f"analyze-hlo --format json:       {analysis:.2f} s  ({ops / analysis:,.0f} ops/s)")
    print(f"ratio to baseline:               {analysis / baseline:.2f}x  (target <= 2x)")
    print(f"peak RSS:                        {peak_rss_mib:.0f} MiB")
    if args.quick:
        print("(--quick: a small module run once; these figures are no measurement)")


if __name__ == "__main__":
    main()
