"""Speed of the GEMM tiling search against a plain exhaustive loop, and a GPU prediction.

GEMM: the largest of STDiT3, fc1 of the full config at 204_640_360 on ONE device (no sharding):
M = B*N = 2*55200 = 110400 tokens, K = 1152, N = 4608 (1.17 TFLOP, bf16), mapped on TX8. The
exhaustive loop (``gemm_exhaustive_search``) and the branch-and-bound mapper
(``gemm_auto_opt_mapper``) run in the same process; the script prints candidates costed,
seconds, the speed-up, and checks that both return the same optimum.

Then it prints what the GPU descriptions (H100/H200/A100 SXM) predict for the same bf16 GEMM,
and times the search limits (``hardware.gemm_mapper``, "Limits"): a GEMM of 2**20 instances on a
chip of 720,720 tiles, which the limits keep to a few seconds instead of minutes (the tests bound
its evaluations, not its time: tests/test_hardening.py). ``--quick`` runs it with the limits
divided by 10.

    python3 benchmarks/mapper_speed.py [--repeats 3]
    python3 benchmarks/mapper_speed.py --quick      # one run of each search (~1 s): what CI runs
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware import gemm_mapper
from hardware.gemm_mapper import forget_searches, gemm_auto_opt_mapper, gemm_exhaustive_search
from hardware.ops import Op, OpType
from hardware.spec import load_chip

M, K, N = 2 * 55200, 1152, 4608


def _best_time(function, repeats: int):
    best_s, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best_s = min(best_s, time.perf_counter() - start)
    return best_s, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per search; the fastest is reported")
    parser.add_argument("--quick", action="store_true",
                        help="one run of each search (CI checks that the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1

    fc1 = Op("fc1", OpType.GEMM, ((M, K),), (K, N), (M, N), 2 * M * K * N)
    tx8 = dataclasses.replace(load_chip("tx8"), tiled_model=None)  # the search itself (the bound)
    exhaustive_s, exhaustive = _best_time(lambda: gemm_exhaustive_search(fc1, tx8), args.repeats)
    def searched_afresh():
        forget_searches()  # the search's memo: every run searches
        return gemm_auto_opt_mapper(fc1, tx8)

    searched_s, searched = _best_time(searched_afresh, args.repeats)
    same = (searched.latency_s, searched.tiling) == (exhaustive.latency_s, exhaustive.tiling)

    print(f"GEMM fc1 (full STDiT3, 204_640_360, one device): M={M} K={K} N={N}, bf16, on {tx8.name}")
    print(f"  exhaustive loop   : {exhaustive.candidates_visited:6d} candidates  {exhaustive_s * 1e3:8.1f} ms")
    print(f"  branch and bound  : {searched.candidates_visited:6d} candidates  {searched_s * 1e3:8.1f} ms")
    print(f"  speed-up          : {exhaustive_s / searched_s:.1f}x  (candidates {exhaustive.candidates_visited / searched.candidates_visited:.1f}x)")
    print(f"  same optimum      : {same}  {searched.tiling}")
    print(f"  latency {searched.latency_s * 1e3:.3f} ms, utilization {searched.utilization:.3f}, bound by {searched.bound}")

    print("GPU predictions for the same bf16 GEMM:")
    for name in ("h100-sxm", "h200-sxm", "a100-sxm"):
        gpu = load_chip(name)
        mapping = gemm_auto_opt_mapper(fc1, gpu)
        ideal_ms = fc1.flops / gpu.gemm_flops_per_s * 1e3
        print(
            f"  {name:9s}: predicted {mapping.latency_s * 1e3:.3f} ms ({fc1.flops / mapping.latency_s / 1e12:.0f} TFLOP/s, "
            f"utilization {mapping.utilization:.2f}, bound by {mapping.bound}); compute roofline {ideal_ms:.3f} ms"
        )
    _limits(quick=args.quick)
    return 0 if same else 1


def _limits(*, quick: bool) -> None:
    """The search limits' cost: a 2**20-instance GEMM on a 720,720-tile chip."""

    tx8 = dataclasses.replace(load_chip("tx8"), tiled_model=None)
    huge = dataclasses.replace(tx8, name="tx8-720720", tile_count=720720, tile_grid_rows=720,
                               tile_grid_cols=1001)
    batch, size = 2**20, 4096
    op = Op("g", OpType.GEMM, ((size, size),), (size, size), (size, size), 2 * batch * size**3,
            batch=batch)
    limits = (gemm_mapper.MAX_PLACEMENTS, gemm_mapper.MAX_SEARCH_STEPS)
    if quick:
        gemm_mapper.MAX_PLACEMENTS, gemm_mapper.MAX_SEARCH_STEPS = (limit // 10 for limit in limits)
    try:
        seconds, mapping = _best_time(lambda: gemm_auto_opt_mapper(op, huge), 1)
        print(f"Search limits (MAX_PLACEMENTS {gemm_mapper.MAX_PLACEMENTS}, MAX_SEARCH_STEPS "
              f"{gemm_mapper.MAX_SEARCH_STEPS}{', divided by 10: --quick' if quick else ''}): "
              f"{batch} x {size}^3 GEMM on {huge.tile_count} tiles: {seconds:.2f} s, "
              f"{mapping.candidates_visited} candidates costed, tiling {mapping.tiling}")
    finally:
        gemm_mapper.MAX_PLACEMENTS, gemm_mapper.MAX_SEARCH_STEPS = limits


if __name__ == "__main__":
    raise SystemExit(main())
