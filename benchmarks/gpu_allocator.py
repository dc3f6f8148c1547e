"""The caching-allocator model (models/cuda_runtime.py) against PyTorch's own allocator on a
CUDA GPU: the same synthetic allocation sequences replayed on both, the state compared at every
mark. A check of the model, never a fit (it has no constant to fit: its rules are PyTorch's).

    python3 benchmarks/gpu_allocator.py [--events 200000] [--traces 3]
    python3 benchmarks/gpu_allocator.py --quick     # CI: 5,000 events, on the GPU if there is one

Each trace is ``benchmarks/cuda_allocator.py``'s synthetic sequence (512 B - 200 MiB, freed
mostly in reverse order, 50-600 tensors live), with a mark every ``--every`` events and an
``empty_cache`` at the middle one. On the GPU an allocation is ``torch.empty(n, dtype=uint8)``
and a free drops it; at each mark the script reads ``torch.cuda.memory_stats()`` (allocated,
reserved, segments, inactive split bytes, and their peaks) and the model's state at the same
event. It prints, per trace, how many marks agree to the byte and the largest difference, with
the device, driver and versions. Without CUDA it says so and replays the model alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_allocator import synthetic_events  # noqa: E402  (the sibling benchmark's sequence)

from models.cuda_runtime import AllocationTrace, Mark, PhaseMemory, replay  # noqa: E402

#: The statistics compared, as (PhaseMemory field, torch.cuda.memory_stats key).
STATS = (("allocated", "allocated_bytes.all.current"), ("reserved", "reserved_bytes.all.current"),
         ("segments", "segment.all.current"), ("peak_allocated", "allocated_bytes.all.peak"),
         ("peak_reserved", "reserved_bytes.all.peak"), ("peak_inactive_split", "inactive_split_bytes.all.peak"))


def marked_trace(events: list[int], every: int) -> AllocationTrace:
    """``events`` with a mark every ``every`` events; the middle mark empties the cache."""
    ats = list(range(every, len(events) + 1, every))
    middle = ats[len(ats) // 2] if ats else -1
    return AllocationTrace(tuple(events), tuple(Mark(f"event {at}", at, empty_cache=at == middle) for at in ats))


def run_on_device(torch, trace: AllocationTrace) -> list[dict[str, int]]:  # noqa: ANN001
    """The trace on the GPU's caching allocator: the statistics at each mark (the cache emptied and
    the peaks reset after a mark that says so, as the model does)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    live: dict[int, object] = {}
    allocations, observed = 0, []
    marks = iter(trace.marks)
    mark = next(marks, None)
    for index in range(len(trace.events) + 1):
        while mark is not None and mark.at == index:
            stats = torch.cuda.memory_stats()
            observed.append({field: stats.get(key, 0) for field, key in STATS})
            if mark.empty_cache:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            mark = next(marks, None)
        if index == len(trace.events):
            break
        event = trace.events[index]
        if event > 0:
            live[allocations] = torch.empty(event, dtype=torch.uint8, device="cuda")
            allocations += 1
        else:
            del live[-event - 1]
    live.clear()
    torch.cuda.empty_cache()
    return observed


def compare(modelled: tuple[PhaseMemory, ...], observed: list[dict[str, int]]) -> tuple[int, str]:
    """(marks that agree on every statistic, the largest difference as text)."""
    agree, worst, text = 0, 0.0, "none"
    for phase, stats in zip(modelled, observed, strict=True):
        same = True
        for field, _ in STATS:
            mine, theirs = getattr(phase, field), stats[field]
            if mine != theirs:
                same = False
                difference = abs(mine - theirs) / max(1, theirs)
                if difference > worst:
                    worst, text = difference, f"{field} at {phase.name}: model {mine:,}, device {theirs:,}"
        agree += same
    return agree, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per trace")
    parser.add_argument("--traces", type=int, default=3, help="traces (seeds 0, 1, ...)")
    parser.add_argument("--every", type=int, default=5_000, help="events between two marks")
    parser.add_argument("--quick", action="store_true", help="one 5,000-event trace (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.traces, args.every = 5_000, 1, 500
    if min(args.events, args.traces, args.every) < 1:
        print("Error: --events, --traces and --every: expected positive numbers", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        torch = None
    on_gpu = torch is not None and torch.cuda.is_available()
    if on_gpu:
        print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
              "PYTORCH_CUDA_ALLOC_CONF must be unset (the model is the default configuration)")
    else:
        print("gpu_allocator: no CUDA device here; the model's replay alone (nothing to compare)")
    for seed in range(args.traces):
        trace = marked_trace(synthetic_events(args.events, seed), args.every)
        modelled = replay(trace)
        line = (f"trace {seed}: {len(trace.events):,} events, {len(trace.marks)} marks, model's peak reserve "
                f"{max(p.peak_reserved for p in modelled) / 2**20:,.0f} MiB")
        if on_gpu:
            agree, worst = compare(modelled, run_on_device(torch, trace))
            line += f"; marks agreeing to the byte: {agree}/{len(trace.marks)}; largest difference: {worst}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
