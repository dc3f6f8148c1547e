"""The allocation sequence recorded on the meta device (``tracing.allocations``): hand-derived
sequences of small programs, and a tiny generation's sequence against its own live bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from models.cuda_runtime import Mark, replay  # noqa: E402
from tracing.allocations import AllocationRecorder, record_generations  # noqa: E402


def test_allocations_and_frees_in_the_order_eager_pytorch_makes_them():
    recorder = AllocationRecorder()
    with recorder:
        a = torch.empty(1000, device="meta")              # id 0: 4000 B
        b = a + 1                                         # id 1: 4000 B
        view = b[2:10]                                    # a view: no allocation
        del a                                             # frees 0
        b.mul_(2)                                         # in place: no allocation
        del b                                             # the view still holds 1's storage
        c = view.to(torch.bfloat16)                       # id 2: 8 x 2 B
        del view                                          # frees 1
        recorder.mark("end")
        del c                                             # frees 2
    assert recorder.trace().events == (4000, 4000, -1, 16, -2, -3)
    assert recorder.trace().marks == (Mark("end", 5),)


def test_flash_attention_on_meta_allocates_its_output_and_log_sum_exp_only():
    from models.opensora.official import flash_attention_2_on_meta

    q = torch.empty(2, 16, 300, 72, device="meta", dtype=torch.bfloat16)
    recorder = AllocationRecorder()
    with flash_attention_2_on_meta(), recorder:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    sizes = sorted(e for e in recorder.trace().events if e > 0)
    # the output (2 x 16 x 300 x 72 bf16) and the float32 log-sum-exp (2 x 16 x 300); no scores
    assert 2 * 16 * 300 * 72 * 2 in sizes and 2 * 16 * 300 * 4 in sizes
    assert max(sizes) == 2 * 16 * 300 * 72 * 2
    assert out.shape == q.shape


def test_a_tiny_generation_frees_everything_it_allocates_after_the_weights():
    trace = record_generations(["51_64_64"], steps=2, config_name="tiny")
    names = [m.name for m in trace.marks]
    assert names == ["weights loaded", "51_64_64 begin", "51_64_64 weights", "51_64_64 loop",
                     "51_64_64 decode", "51_64_64 save"]
    allocated = [e for e in trace.events if e > 0]
    # the ids freed are exactly those allocated after "weights loaded": the weights stay
    loaded = trace.marks[0].at
    freed = {-e - 1 for e in trace.events if e < 0}
    weights = sum(1 for e in trace.events[:loaded] if e > 0)
    assert freed == set(range(weights, len(allocated)))
    phases = {p.name: p for p in replay(trace)}
    assert phases["51_64_64 save"].allocated == phases["weights loaded"].allocated


@pytest.mark.slow
def test_the_committed_sequence_is_what_the_code_records():
    """The committed file's first three generations, recorded again (5 s; the whole file is
    ``scripts/gpu_predictions.py --write-allocations``'s 41 s): the same events and marks."""
    from models.cuda_runtime import read_trace
    from scripts.gpu_predictions import ALLOCATION_SHAPES, ALLOCATION_STEPS, ALLOCATIONS

    shapes = ALLOCATION_SHAPES[:3]
    recorded = record_generations(shapes, ALLOCATION_STEPS)
    committed = read_trace(ALLOCATIONS)
    assert committed.events[:len(recorded.events)] == recorded.events
    kept = [m for m in committed.marks if m.name == "weights loaded" or m.name.split()[0] in shapes]
    assert tuple(kept) == recorded.marks


@pytest.mark.slow
def test_the_replay_counts_the_segments_of_the_measured_run():
    """The H100 run that counted its segments (results/gpu_validation/generation_allocator_default_*.json:
    three generations, two steps each), recorded here and replayed: the segments the allocator holds at
    each phase's end within 2 of the run's, and the peak reserve within 10% (docs/gpu.md)."""
    import json
    from pathlib import Path

    from models.cuda_runtime import replay

    path = Path(__file__).resolve().parent.parent / "results" / "gpu_validation" / \
        "generation_allocator_default_NVIDIA_H100_80GB_HBM3.json"
    measured = json.loads(path.read_text())["generations"]
    trace = record_generations([g["shape"] for g in measured], steps=measured[0]["steps"])
    phases = {p.name: p for p in replay(trace)}
    for generation in measured:
        for phase in generation["phases"]:
            mine = phases[f"{generation['shape']} {phase['phase']}"]
            assert abs(mine.segments - phase["segments"]) <= 2, (generation["shape"], phase["phase"])
            assert abs(mine.peak_reserved / phase["peak_reserved"] - 1) <= 0.10, (generation["shape"], phase["phase"])
