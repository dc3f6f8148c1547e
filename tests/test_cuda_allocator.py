"""The model of PyTorch's CUDA caching allocator (models/cuda_runtime.py).

Every expected figure is derived by hand in the test from the allocator's rules (the module
docstring; docs/sources.md says where each comes from): request rounding to 512 B, the small
(<= 1 MiB) and large pools, the segment sizes (2 MiB, 20 MiB, or the request rounded to 2 MiB
from 10 MiB on), best fit, the split thresholds, merging on free and ``empty_cache``.
"""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_trace.errors import InputFileError, UsageError
from models.cuda_runtime import (
    AllocationTrace,
    CachingAllocator,
    LinearFreeBlocks,
    Mark,
    PhaseMemory,
    read_trace,
    replay,
    round_size,
    write_trace,
)

KiB = 2**10
MiB = 2**20


def _allocated_blocks(allocator: CachingAllocator) -> list[tuple[int, int]]:
    """(segment address, block size) of every handed-out block."""
    return [(segment.address, block.size) for segment in allocator.snapshot()
            for block in segment.blocks if block.allocated]


# -- sizes and segments -----------------------------------------------------------------------


def test_a_request_is_rounded_to_512_bytes():
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 1024, 1024, 1536]
    allocator = CachingAllocator()
    allocator.malloc(1)
    # 1 B -> a 512 B block in a fresh 2 MiB small segment, whose rest stays free (split)
    assert (allocator.allocated, allocator.reserved, allocator.segments) == (512, 2 * MiB, 1)
    assert allocator.inactive_split == 2 * MiB - 512


def test_one_mib_is_small_and_one_byte_more_is_large():
    small = CachingAllocator()
    small.malloc(MiB)  # rounded 1 MiB <= 1 MiB: the small pool, a 2 MiB segment, split 1 + 1
    assert (small.allocated, small.reserved, small.inactive_split) == (MiB, 2 * MiB, MiB)
    large = CachingAllocator()
    large.malloc(MiB + 1)  # rounded 1 MiB + 512: large, under 10 MiB: a 20 MiB segment
    assert (large.allocated, large.reserved) == (MiB + 512, 20 * MiB)
    assert large.inactive_split == 20 * MiB - (MiB + 512)  # 19 MiB - 512 > 1 MiB: split


def test_a_small_segment_packs_four_half_mib_blocks():
    allocator = CachingAllocator()
    for count in range(1, 5):
        allocator.malloc(512 * KiB)
        assert (allocator.allocated, allocator.reserved) == (count * 512 * KiB, 2 * MiB)
        assert allocator.inactive_split == (4 - count) * 512 * KiB
    assert allocator.segments == 1
    assert [block.size for block in allocator.snapshot()[0].blocks] == [512 * KiB] * 4
    allocator.malloc(512 * KiB)  # the segment is full: a second one
    assert (allocator.reserved, allocator.segments) == (4 * MiB, 2)


def test_from_ten_mib_a_request_gets_a_segment_of_its_own_size():
    exact = CachingAllocator()
    exact.malloc(12 * MiB)
    assert (exact.allocated, exact.reserved, exact.inactive_split) == (12 * MiB, 12 * MiB, 0)
    odd = CachingAllocator()
    odd.malloc(11 * MiB + 1)
    # rounded 11 MiB + 512, segment rounded up to 12 MiB; the remainder 1 MiB - 512 is not more
    # than 1 MiB, so the block is handed out whole and counts whole
    assert (odd.allocated, odd.reserved, odd.inactive_split) == (12 * MiB, 12 * MiB, 0)
    below = CachingAllocator()
    below.malloc(10 * MiB - 512)  # under 10 MiB: a 20 MiB segment, split (10 MiB + 512 over)
    assert (below.allocated, below.reserved) == (10 * MiB - 512, 20 * MiB)


def test_a_large_remainder_of_exactly_one_mib_is_not_split():
    allocator = CachingAllocator()
    allocator.malloc(19 * MiB)  # a 20 MiB segment; 1 MiB over is not more than 1 MiB
    assert (allocator.allocated, allocator.inactive_split) == (20 * MiB, 0)
    allocator.malloc(2 * MiB - 512)  # needs a new segment: nothing was left free
    assert allocator.segments == 2


def test_small_and_large_pools_do_not_share_memory():
    allocator = CachingAllocator()
    big = allocator.malloc(4 * MiB)  # 20 MiB large segment, 16 MiB left free in it
    allocator.malloc(4 * KiB)  # small: a 2 MiB segment of its own, not the large free 16 MiB
    assert (allocator.reserved, allocator.segments) == (22 * MiB, 2)
    allocator.free(big)
    assert allocator.reserved == 22 * MiB


# -- best fit, merging, fragmentation ---------------------------------------------------------


def test_best_fit_takes_the_smaller_of_two_free_blocks():
    allocator = CachingAllocator()
    first = allocator.malloc(16 * MiB)  # segment at 0
    second = allocator.malloc(12 * MiB)  # segment at 16 MiB
    allocator.free(first)
    allocator.free(second)
    allocator.malloc(11 * MiB)  # fits both: the 12 MiB block (remainder 1 MiB: not split)
    assert _allocated_blocks(allocator) == [(16 * MiB, 12 * MiB)]
    assert (allocator.allocated, allocator.reserved) == (12 * MiB, 28 * MiB)


def test_equal_free_blocks_go_lowest_address_first():
    allocator = CachingAllocator()
    handles = [allocator.malloc(12 * MiB) for _ in range(3)]  # segments at 0, 12, 24 MiB
    allocator.free(handles[2])
    allocator.free(handles[1])
    allocator.malloc(12 * MiB)
    assert _allocated_blocks(allocator) == [(0, 12 * MiB), (12 * MiB, 12 * MiB)]


def test_freed_neighbours_merge_into_a_block_that_serves_a_larger_request():
    allocator = CachingAllocator()
    a = allocator.malloc(4 * MiB)  # a 20 MiB segment split 4 | 16: 16 MiB inactive
    b, c = allocator.malloc(4 * MiB), allocator.malloc(4 * MiB)  # 4 4 4 | 8
    d = allocator.malloc(8 * MiB)  # the 8 MiB rest, whole (remainder 0)
    assert (allocator.reserved, allocator.inactive_split) == (20 * MiB, 0)
    assert allocator.peak_inactive_split == 16 * MiB
    allocator.free(b)
    assert allocator.inactive_split == 4 * MiB
    allocator.free(c)  # merges with b: one free 8 MiB block at 4 MiB
    assert [(block.size, block.allocated) for block in allocator.snapshot()[0].blocks] == [
        (4 * MiB, True), (8 * MiB, False), (8 * MiB, True)]
    assert allocator.inactive_split == 8 * MiB
    allocator.malloc(6 * MiB)  # neither 4 MiB half could; the merged block can (2 MiB left, split)
    assert (allocator.reserved, allocator.segments) == (20 * MiB, 1)
    assert (allocator.inactive_split, allocator.peak_inactive_split) == (2 * MiB, 16 * MiB)
    allocator.free(a)
    allocator.free(d)
    assert allocator.allocated == 6 * MiB
    assert [block.size for block in allocator.snapshot()[0].blocks] == [4 * MiB, 6 * MiB, 10 * MiB]


def test_free_blocks_in_two_segments_cannot_serve_one_request_their_sum():
    allocator = CachingAllocator()
    x = allocator.malloc(10 * MiB)  # a 10 MiB segment
    y = allocator.malloc(10 * MiB)  # another
    allocator.free(x)
    allocator.free(y)
    assert (allocator.allocated, allocator.reserved) == (0, 20 * MiB)
    allocator.malloc(20 * MiB)  # 20 MiB free, but in two segments: a third segment
    assert (allocator.allocated, allocator.reserved, allocator.segments) == (20 * MiB, 40 * MiB, 3)
    assert allocator.peak_reserved == 40 * MiB
    allocator.empty_cache()  # the two wholly free segments go
    assert (allocator.reserved, allocator.segments, allocator.peak_reserved) == (20 * MiB, 1, 40 * MiB)


def test_empty_cache_releases_only_wholly_free_segments():
    allocator = CachingAllocator()
    allocator.malloc(512 * KiB)  # a small segment, 1.5 MiB of it free
    kept = allocator.malloc(4 * MiB)  # a 20 MiB large segment, 16 MiB free
    gone = allocator.malloc(24 * MiB)  # more than the 16 MiB free: a 24 MiB segment
    allocator.free(gone)
    assert allocator.reserved == 46 * MiB
    allocator.empty_cache()
    assert (allocator.reserved, allocator.segments) == (22 * MiB, 2)
    assert allocator.inactive_split == 1536 * KiB + 16 * MiB
    allocator.free(kept)  # its segment is wholly free now: the next empty_cache returns it
    assert allocator.inactive_split == 1536 * KiB
    allocator.empty_cache()
    assert (allocator.reserved, allocator.segments) == (2 * MiB, 1)


def test_reset_peaks_makes_each_peak_the_current_value():
    allocator = CachingAllocator()
    handle = allocator.malloc(30 * MiB)
    allocator.malloc(MiB + 1)
    allocator.free(handle)
    assert (allocator.peak_allocated, allocator.peak_reserved) == (31 * MiB + 512, 50 * MiB)
    allocator.reset_peaks()
    assert (allocator.peak_allocated, allocator.peak_reserved) == (MiB + 512, 50 * MiB)
    assert allocator.peak_inactive_split == 20 * MiB - (MiB + 512)


def test_bad_calls_are_refused():
    allocator = CachingAllocator()
    for nbytes in (0, -5, 1.5, True, 2**60):
        with pytest.raises(ValueError, match="positive number of bytes under 1 EiB"):
            allocator.malloc(nbytes)
    handle = allocator.malloc(100)
    allocator.free(handle)
    with pytest.raises(ValueError, match="not the handle of a live allocation"):
        allocator.free(handle)


# -- traces -----------------------------------------------------------------------------------


def _phases_trace(*, empty_cache: bool) -> AllocationTrace:
    # ids: 0 = 12 MiB, 1 = 4 MiB, 2 = 20 MiB
    return AllocationTrace((12 * MiB, 4 * MiB, -1, -2, 20 * MiB),
                           (Mark("loaded", 2), Mark("freed", 4, empty_cache=empty_cache),
                            Mark("end", 5)))


def test_replay_reports_each_mark_and_empties_the_cache_where_asked():
    loaded, freed, end = replay(_phases_trace(empty_cache=True))
    # 12 MiB: a 12 MiB segment; 4 MiB: a 20 MiB segment split 4 + 16
    assert loaded == PhaseMemory("loaded", allocated=16 * MiB, reserved=32 * MiB, segments=2,
                                 peak_allocated=16 * MiB, peak_reserved=32 * MiB,
                                 peak_inactive_split=16 * MiB)
    assert freed == PhaseMemory("freed", 0, 32 * MiB, 2, 16 * MiB, 32 * MiB, 16 * MiB)
    # then emptied and reset: the 20 MiB request gets a segment of its own
    assert end == PhaseMemory("end", 20 * MiB, 20 * MiB, 1, 20 * MiB, 20 * MiB, 0)


def test_without_empty_cache_the_cached_segment_serves_the_next_phase():
    *_, end = replay(_phases_trace(empty_cache=False))
    # the 20 MiB request takes the merged free 20 MiB segment; the 12 MiB one stays cached
    assert end == PhaseMemory("end", 20 * MiB, 32 * MiB, 2, 20 * MiB, 32 * MiB, 16 * MiB)


def test_replay_continues_a_given_allocator():
    allocator = CachingAllocator()
    allocator.malloc(10 * MiB)
    (end,) = replay(AllocationTrace((10 * MiB, -1), (Mark("end", 2),)), allocator)
    assert (end.allocated, end.reserved, end.peak_allocated) == (10 * MiB, 20 * MiB, 20 * MiB)


@pytest.mark.parametrize(("events", "marks", "message"), [
    ((0,), (), "event 0 is 0"),
    ((-1,), (), "event 0 frees allocation 0, which is not made before it"),
    ((5, -2, 7), (), "event 1 frees allocation 1"),
    ((5, -1, -1), (), "event 2 frees allocation 0, which is already freed"),
    ((5, 2.5), (), "event 1 is 2.5; expected an integer"),
    ((5,), (Mark("late", 2),), r"mark 0 \('late'\) is at 2; expected an event index from 0 to 1"),
    ((5,), (Mark("early", -1),), "is at -1"),
    ((5, 6), (Mark("b", 2), Mark("a", 1)), r"mark 1 \('a'\) is at 1, before the mark ahead"),
    ((5,), (Mark("two\nlines", 2),), r"mark 0 \('two\\nlines'\) is at 2"),
    ((2**60,), (), "event 0 allocates 1152921504606846976 bytes; expected less than 1 EiB"),
    ((5,), (Mark("x", 1, empty_cache="yes"),), "empty_cache is 'yes'"),
])
def test_bad_traces_are_a_usage_error(events, marks, message):
    with pytest.raises(UsageError, match=f"^allocation trace: .*{message}"):
        AllocationTrace(events, marks)


def test_a_trace_file_round_trips(tmp_path):
    trace = _phases_trace(empty_cache=True)
    path = tmp_path / "trace.json.gz"
    write_trace(path, trace)
    assert read_trace(path) == trace
    document = json.loads(gzip.decompress(path.read_bytes()))
    assert document["events"] == [12 * MiB, 4 * MiB, -1, -2, 20 * MiB]
    assert document["marks"][1] == {"name": "freed", "at": 4, "empty_cache": True}
    with pytest.raises(UsageError, match="already exists; pass --force"):
        write_trace(path, AllocationTrace((1,)))
    write_trace(path, AllocationTrace((1,)), force=True)
    assert read_trace(path) == AllocationTrace((1,), ())


def _gz(document: object) -> bytes:
    return gzip.compress(json.dumps(document).encode())


def _document(**changes: object) -> dict:
    return {"format": "hlo-trace allocation trace", "version": 1, "events": [4, -1],
            "marks": [{"name": "end", "at": 2, "empty_cache": False}], **changes}


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b'{"events": []}', "not gzip'd"),
    (_gz(_document())[:-12], "truncated or corrupt"),
    (gzip.compress(b"\xff\xfe"), "not UTF-8 text"),
    (gzip.compress(b"[1, 2"), "not valid JSON"),
    (_gz([1, 2]), "expected a gzip'd JSON allocation trace"),
    (_gz(_document(format="other")), "format 'other' version 1"),
    (_gz(_document(version=2)), "version 2"),
    (_gz(_document(events={"a": 1})), "events is dict"),
    (_gz(_document(marks=[{"name": "x"}])), "mark 0 is"),
    (_gz(_document(events=[4, -1, -1])), "event 2 frees allocation 0, which is already freed"),
    (_gz(_document(events=[4, True])), "event 1 is True"),
    (_gz(_document(events=[4, -1.0])), r"event 1 is -1\.0"),
    (gzip.compress(b'{"format": NaN}'), "not finite"),
])
def test_a_bad_trace_file_is_an_input_file_error_naming_it(tmp_path, content, message):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=f"^{path}: .*{message}"):
        read_trace(path)


def test_a_missing_or_odd_trace_path_is_an_input_file_error(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        read_trace(tmp_path / "absent.json.gz")
    with pytest.raises(InputFileError, match="is a directory"):
        read_trace(tmp_path)


# -- properties -------------------------------------------------------------------------------

#: A request: mostly small tensors and mid-size ones, some past 10 MiB, sizes not multiples of 512.
_SIZES = st.one_of(st.integers(1, 64 * KiB), st.integers(64 * KiB, 2 * MiB),
                   st.integers(2 * MiB, 12 * MiB), st.integers(12 * MiB, 48 * MiB))
#: An operation: allocate that many bytes, or free the live allocation at that position (mod).
_OPERATIONS = st.lists(st.one_of(_SIZES.map(lambda n: ("malloc", n)),
                                 st.integers(0, 10**6).map(lambda i: ("free", i)),
                                 st.just(("empty_cache", 0))), max_size=120)


def _check_invariants(allocator: CachingAllocator) -> None:
    segments = allocator.snapshot()
    assert allocator.allocated <= allocator.reserved
    assert allocator.reserved == sum(segment.size for segment in segments)
    assert allocator.segments == len(segments)
    allocated = inactive = 0
    for segment in segments:
        assert sum(block.size for block in segment.blocks) == segment.size
        address = segment.address
        for block in segment.blocks:  # contiguous, in address order
            assert block.address == address
            address += block.size
        for left, right in zip(segment.blocks, segment.blocks[1:]):
            assert left.allocated or right.allocated  # free neighbours are always merged
        allocated += sum(block.size for block in segment.blocks if block.allocated)
        if len(segment.blocks) > 1:
            inactive += sum(block.size for block in segment.blocks if not block.allocated)
    assert allocator.allocated == allocated
    assert allocator.inactive_split == inactive
    assert allocator.peak_allocated >= allocator.allocated
    assert allocator.peak_reserved >= allocator.reserved
    assert allocator.peak_inactive_split >= allocator.inactive_split


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_OPERATIONS)
def test_random_sequences_keep_the_invariants_and_agree_with_a_linear_scan(operations):
    sorted_model, linear_model = CachingAllocator(), CachingAllocator(LinearFreeBlocks)
    live: list[tuple[int, int]] = []  # (handle in the sorted model, handle in the linear one)
    for kind, value in operations:
        if kind == "malloc":
            live.append((sorted_model.malloc(value), linear_model.malloc(value)))
        elif kind == "free" and live:
            first, second = live.pop(value % len(live))
            sorted_model.free(first)
            linear_model.free(second)
        elif kind == "empty_cache":
            sorted_model.empty_cache()
            linear_model.empty_cache()
        _check_invariants(sorted_model)
    assert sorted_model.snapshot() == linear_model.snapshot()
    assert sorted_model.peak_reserved == linear_model.peak_reserved
    for first, second in live:
        sorted_model.free(first)
        linear_model.free(second)
    assert sorted_model.allocated == 0
    sorted_model.empty_cache()
    assert (sorted_model.reserved, sorted_model.segments, sorted_model.inactive_split) == (0, 0, 0)
