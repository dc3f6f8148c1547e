"""Speed of the caching-allocator model's replay (models/cuda_runtime.py) against a naive
linear-scan best fit, measured in the same run on the same synthetic trace.

The trace stands in for an eager generation's (up to ~2 million events): allocations of sizes
from 512 B to 200 MiB (most small, as an eager run's are), freed mostly in reverse order (the
temporaries of one op after another) and partly at random (tensors that outlive several ops),
with the number of live tensors wandering between 50 and 600, which leaves many free blocks
in the pools: the case where a best fit by bisection pays off. The model's pools are
``SortedFreeBlocks`` (bisection over (size, address) keys); the baseline is the same model with
``LinearFreeBlocks`` (every best fit scans the pool). Both replay the whole trace and must
report the same memory at every mark; the ratio is of their events per second. It grows with
the number of free blocks a pool holds (printed: the mean over the allocations).

    python3 benchmarks/cuda_allocator.py              # 2,000,000 events (~10 s)
    python3 benchmarks/cuda_allocator.py --quick      # 20,000 events (~1 s)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.cuda_runtime import (
    AllocationTrace,
    CachingAllocator,
    LinearFreeBlocks,
    Mark,
    SortedFreeBlocks,
    replay,
)

MiB = 2**20


def synthetic_events(count: int, seed: int = 0) -> list[int]:
    """``count`` events (allocations > 0, frees < 0 by allocation id), as the docstring says."""
    rng = random.Random(seed)
    events: list[int] = []
    live: list[int] = []
    allocations = 0
    target = 200
    while len(events) < count:
        if rng.random() < 0.001:
            target = rng.randint(50, 600)
        if live and (len(live) > target or rng.random() < 0.45):
            position = len(live) - 1 if rng.random() < 0.7 else rng.randrange(len(live))
            events.append(-live.pop(position) - 1)
            continue
        kind = rng.random()
        if kind < 0.6:
            size = int(2 ** rng.uniform(9, 20))  # 512 B - 1 MiB
        elif kind < 0.9:
            size = int(2 ** rng.uniform(20, 23.3))  # 1 - 10 MiB
        else:
            size = int(2 ** rng.uniform(23.3, 27.6))  # 10 - 200 MiB
        events.append(size)
        live.append(allocations)
        allocations += 1
    return events


def _trace(events: list[int]) -> AllocationTrace:
    quarter = len(events) // 4
    return AllocationTrace(tuple(events), tuple(Mark(f"q{i}", i * quarter, empty_cache=i == 2)
                                                for i in range(1, 4)) + (Mark("end", len(events)),))


def _timed(trace: AllocationTrace, free_blocks: type) -> tuple[float, tuple]:
    allocator = CachingAllocator(free_blocks)
    start = time.perf_counter()
    phases = replay(trace, allocator)
    return time.perf_counter() - start, phases


class _CountingFreeBlocks(SortedFreeBlocks):
    """The model's pool, counting the free blocks it holds at each best fit."""

    __slots__ = ("searched",)

    def __init__(self) -> None:
        super().__init__()
        self.searched: list[int] = []

    def take_best_fit(self, size: int):  # noqa: ANN201
        self.searched.append(len(self))
        return super().take_best_fit(size)


def _mean_free_blocks(trace: AllocationTrace) -> float:
    pools: list[_CountingFreeBlocks] = []

    def pool() -> _CountingFreeBlocks:
        pools.append(_CountingFreeBlocks())
        return pools[-1]

    replay(trace, CachingAllocator(pool))
    counts = [count for made in pools for count in made.searched]
    return sum(counts) / max(1, len(counts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="events of the trace")
    parser.add_argument("--quick", action="store_true",
                        help="20,000 events (CI checks that the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.events = 20_000
    events = synthetic_events(args.events)
    trace = _trace(events)

    model_s, phases = _timed(trace, SortedFreeBlocks)
    linear_s, linear_phases = _timed(trace, LinearFreeBlocks)
    if linear_phases != phases:
        print("the linear-scan baseline disagrees with the model:", linear_phases, phases,
              file=sys.stderr)
        return 1

    end = phases[-1]
    print(f"synthetic trace: {len(events):,} events, {trace.allocations:,} allocations; "
          f"at the end {end.allocated / MiB:.0f} MiB allocated, {end.reserved / MiB:.0f} MiB "
          f"reserved in {end.segments} segments (peak {end.peak_reserved / MiB:.0f} MiB since "
          f"the mark {phases[1].name}'s empty_cache)")
    print(f"  free blocks in the request's pool, mean over the allocations: "
          f"{_mean_free_blocks(trace):.0f}")
    print(f"  model (bisection)   : {len(events) / model_s:12,.0f} events/s  ({model_s:.2f} s)")
    print(f"  linear-scan baseline: {len(events) / linear_s:12,.0f} events/s  ({linear_s:.2f} s)")
    print(f"  ratio               : {linear_s / model_s:.1f}x the baseline's speed "
          f"(same memory at every mark: {linear_phases == phases})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
