"""A model of PyTorch's CUDA caching allocator, to replay a recorded sequence of storage
allocations and frees and read off what the allocator would reserve.

OpenSora's published H100 "peak memory" is the device memory the process holds: the CUDA context
plus what the caching allocator reserves (``torch.cuda.max_memory_reserved()``), which exceeds
the live tensors by what the allocator caches and by its fragmentation (docs/gpu.md). This
module is that allocator's behaviour in its DEFAULT configuration (no ``PYTORCH_CUDA_ALLOC_CONF``):
no expandable segments, ``max_split_size`` unlimited, no power-of-two rounding, no garbage
collection threshold, one stream, no CUDA graphs, and an unlimited device (no out-of-memory
path: a segment is always obtained). Where each rule comes from: docs/sources.md ("PyTorch's
CUDA caching allocator").

The rules, as the allocator applies them to a request of ``n`` bytes (``n > 0``):

* the size is rounded up to a multiple of ``MIN_BLOCK_SIZE``; a rounded size of at most
  ``SMALL_SIZE`` is served from the small pool, a larger one from the large pool (the pools
  never exchange memory);
* the pool's best fit is taken: the smallest free block at least as large, the lowest address
  among equal sizes;
* when no free block fits, a new segment is obtained (``cudaMalloc``): ``SMALL_BUFFER`` for a
  small request, ``LARGE_BUFFER`` for a large one under ``MIN_LARGE_ALLOC``, else the size
  rounded up to ``ROUND_LARGE``;
* the block is split when the remainder is worth keeping (at least ``MIN_BLOCK_SIZE`` in the
  small pool, more than ``SMALL_SIZE`` in the large one); otherwise the whole block is handed
  out, and its size, not the request, counts as allocated;
* a freed block merges with its free neighbours in its segment;
* ``empty_cache`` returns every wholly free segment (``cudaFree``).

Segments get increasing addresses in the order they are created, so "lowest address" means
"oldest segment first". The statistics are the allocator's own: allocated bytes (handed-out
blocks), reserved bytes (segments), inactive-split bytes (free blocks in segments that also hold
a used block: memory that ``empty_cache`` cannot return), their peaks, and the segment count.

A trace (:class:`AllocationTrace`) is the sequence of allocations (their byte counts) and frees
(of an earlier allocation, by its ordinal), with named marks between events; :func:`replay`
returns the memory at each mark (:class:`PhaseMemory`). Traces are stored as gzip'd JSON
(:func:`write_trace`, :func:`read_trace`).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from hlo_trace.atomic import atomic_write
from hlo_trace.documents import check_input_file, loads_json
from hlo_trace.errors import InputFileError, UsageError, shown

__all__ = [
    "LARGE_BUFFER",
    "MIN_BLOCK_SIZE",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_BUFFER",
    "SMALL_SIZE",
    "AllocationTrace",
    "BlockState",
    "CachingAllocator",
    "FreeBlocks",
    "LinearFreeBlocks",
    "MAX_REQUEST",
    "Mark",
    "PhaseMemory",
    "SegmentState",
    "SortedFreeBlocks",
    "read_trace",
    "replay",
    "round_size",
    "segment_size",
    "should_split",
    "write_trace",
]

_MiB = 2**20

#: c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize: every request is rounded up to a multiple of it.
MIN_BLOCK_SIZE = 512
#: c10/cuda/CUDACachingAllocator.cpp, kSmallSize: the largest rounded request of the small pool.
SMALL_SIZE = 1 * _MiB
#: c10/cuda/CUDACachingAllocator.cpp, kSmallBuffer: the segment a small request's cudaMalloc gets.
SMALL_BUFFER = 2 * _MiB
#: c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer: the segment of a large request under MIN_LARGE_ALLOC.
LARGE_BUFFER = 20 * _MiB
#: c10/cuda/CUDACachingAllocator.cpp, kMinLargeAlloc: from this request on, a segment of its own size.
MIN_LARGE_ALLOC = 10 * _MiB
#: c10/cuda/CUDACachingAllocator.cpp, kRoundLarge: the granule a segment of its own size is rounded to.
ROUND_LARGE = 2 * _MiB

#: c10/cuda/CUDACachingAllocator.cpp, ``one_exa_bytes`` in ``allocate``: a request of 1 EiB or more is refused.
MAX_REQUEST = 2**60 - 1

#: Bits of an address in a free block's sort key (the size above them): room for 2**36 requests
#: of up to MAX_REQUEST bytes, each in a segment of its own.
_ADDRESS_BITS = 96
_ADDRESS_LIMIT = 1 << _ADDRESS_BITS


def round_size(nbytes: int) -> int:
    """The size the allocator serves a request of ``nbytes`` (> 0) with: a multiple of
    ``MIN_BLOCK_SIZE``, at least one."""
    return max(MIN_BLOCK_SIZE, -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """The size of the segment obtained for a rounded request of ``size`` bytes that no cached
    block can serve."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(small: bool, remaining: int) -> bool:
    """Whether a block that serves a request and has ``remaining`` bytes over is split (the
    remainder becomes a free block) rather than handed out whole."""
    return remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE


class _Block:
    """One block of a segment: a free or a handed-out range, linked to its neighbours."""

    __slots__ = ("address", "allocated", "next", "prev", "size", "small")

    def __init__(self, address: int, size: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class FreeBlocks(Protocol):
    """One pool's free blocks, as the allocator uses them: it adds, removes, takes best fits
    and (to empty the cache) walks them; ``len`` counts them."""

    def add(self, block: _Block) -> None: ...

    def remove(self, block: _Block) -> None: ...

    def take_best_fit(self, size: int) -> _Block | None:
        """Remove and return the smallest block of at least ``size`` bytes (the lowest address
        among equals), or None."""

    def __iter__(self) -> Iterator[_Block]: ...

    def __len__(self) -> int: ...


class SortedFreeBlocks:
    """Free blocks kept sorted by (size, address): the best fit is one bisection. The model's
    structure."""

    __slots__ = ("_blocks", "_keys")

    def __init__(self) -> None:
        self._keys: list[int] = []  # size << _ADDRESS_BITS | address, ascending
        self._blocks: dict[int, _Block] = {}

    def add(self, block: _Block) -> None:
        key = block.size << _ADDRESS_BITS | block.address
        insort(self._keys, key)
        self._blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = block.size << _ADDRESS_BITS | block.address
        del self._keys[bisect_left(self._keys, key)]
        del self._blocks[key]

    def take_best_fit(self, size: int) -> _Block | None:
        index = bisect_left(self._keys, size << _ADDRESS_BITS)
        if index == len(self._keys):
            return None
        return self._blocks.pop(self._keys.pop(index))

    def __iter__(self) -> Iterator[_Block]:
        return iter(list(self._blocks.values()))  # a copy: the caller may remove as it walks

    def __len__(self) -> int:
        return len(self._keys)


class LinearFreeBlocks:
    """Free blocks in a plain list, scanned whole for each best fit: the reference the sorted
    structure must agree with (tests/test_cuda_allocator.py) and the baseline it is timed
    against (benchmarks/cuda_allocator.py)."""

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: list[_Block] = []

    def add(self, block: _Block) -> None:
        self._blocks.append(block)

    def remove(self, block: _Block) -> None:
        self._blocks.remove(block)  # by identity: a block defines no equality

    def take_best_fit(self, size: int) -> _Block | None:
        best = None
        for block in self._blocks:
            if block.size >= size and (best is None or (block.size, block.address)
                                       < (best.size, best.address)):
                best = block
        if best is not None:
            self._blocks.remove(best)
        return best

    def __iter__(self) -> Iterator[_Block]:
        return iter(list(self._blocks))

    def __len__(self) -> int:
        return len(self._blocks)


@dataclass(frozen=True)
class BlockState:
    """One block of a segment in :meth:`CachingAllocator.snapshot`."""

    address: int
    size: int
    allocated: bool


@dataclass(frozen=True)
class SegmentState:
    """One segment (one cudaMalloc) in :meth:`CachingAllocator.snapshot`: its blocks in address
    order, as their links give them."""

    address: int
    size: int
    small: bool
    blocks: tuple[BlockState, ...]


class CachingAllocator:
    """The allocator's state: ``malloc(nbytes) -> handle``, ``free(handle)``, ``empty_cache()``,
    ``reset_peaks()``, and the statistics as read-only properties (bytes)."""

    def __init__(self, free_blocks: Callable[[], FreeBlocks] = SortedFreeBlocks) -> None:
        """``free_blocks`` makes the structure of each pool's free blocks (the results do not
        depend on it, only the speed)."""
        self._small_pool = free_blocks()
        self._large_pool = free_blocks()
        self._live: dict[int, _Block] = {}  # handle (the block's address) -> block
        self._segments: dict[int, int] = {}  # base address -> size, in creation order
        self._next_address = 0
        self._allocated = self._peak_allocated = 0
        self._reserved = self._peak_reserved = 0
        self._inactive_split = self._peak_inactive_split = 0

    # -- the allocator's operations ------------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        """Serve a request of ``nbytes`` (> 0; PyTorch never passes a zero-byte request to the
        allocator) and return its handle for :meth:`free`."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 < nbytes <= MAX_REQUEST:
            raise ValueError(f"malloc: expected a positive number of bytes under 1 EiB, got "
                             f"{nbytes!r:.60}")
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._small_pool if small else self._large_pool
        block = pool.take_best_fit(size)
        if block is None:
            block = self._new_segment(segment_size(size), small)
        was_split = block.is_split()
        remaining = block.size - size
        if should_split(small, remaining):
            rest = _Block(block.address + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
            # a split free block shrinks by what is handed out; a whole one leaves its remainder
            self._add_inactive_split(-size if was_split else remaining)
        elif was_split:
            self._add_inactive_split(-block.size)
        block.allocated = True
        self._live[block.address] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated
        return block.address

    def free(self, handle: int) -> None:
        """Return the block of ``handle`` to its pool, merged with its free neighbours."""
        block = self._live.pop(handle, None)
        if block is None:
            raise ValueError(f"free: {handle!r} is not the handle of a live allocation")
        block.allocated = False
        self._allocated -= block.size
        pool = self._small_pool if block.small else self._large_pool
        change = 0
        before = block.prev
        if before is not None and not before.allocated:
            pool.remove(before)
            change -= before.size
            block.address = before.address
            block.size += before.size
            block.prev = before.prev
            if block.prev is not None:
                block.prev.next = block
        after = block.next
        if after is not None and not after.allocated:
            pool.remove(after)
            change -= after.size
            block.size += after.size
            block.next = after.next
            if block.next is not None:
                block.next.prev = block
        pool.add(block)
        if block.is_split():
            change += block.size
        self._add_inactive_split(change)

    def empty_cache(self) -> None:
        """Return every wholly free segment (``torch.cuda.empty_cache()``)."""
        for pool in (self._large_pool, self._small_pool):
            for block in pool:
                if not block.is_split():
                    pool.remove(block)
                    self._reserved -= self._segments.pop(block.address)

    def reset_peaks(self) -> None:
        """Each peak becomes the current value (``torch.cuda.reset_peak_memory_stats()``)."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved
        self._peak_inactive_split = self._inactive_split

    def _new_segment(self, size: int, small: bool) -> _Block:
        address = self._next_address
        if address + size > _ADDRESS_LIMIT:
            raise UsageError(f"the allocator model's {_ADDRESS_BITS}-bit address space is used up")
        self._next_address = address + size
        self._segments[address] = size
        self._reserved += size
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved
        return _Block(address, size, small)

    def _add_inactive_split(self, change: int) -> None:
        self._inactive_split += change
        if self._inactive_split > self._peak_inactive_split:
            self._peak_inactive_split = self._inactive_split

    # -- the statistics ------------------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Bytes of the handed-out blocks (``torch.cuda.memory_allocated()``)."""
        return self._allocated

    @property
    def peak_allocated(self) -> int:
        """``torch.cuda.max_memory_allocated()``."""
        return self._peak_allocated

    @property
    def reserved(self) -> int:
        """Bytes of the segments held (``torch.cuda.memory_reserved()``)."""
        return self._reserved

    @property
    def peak_reserved(self) -> int:
        """``torch.cuda.max_memory_reserved()``."""
        return self._peak_reserved

    @property
    def inactive_split(self) -> int:
        """Bytes of the free blocks in segments that also hold a handed-out block
        (``inactive_split_bytes.all.current`` of ``torch.cuda.memory_stats()``)."""
        return self._inactive_split

    @property
    def peak_inactive_split(self) -> int:
        """``inactive_split_bytes.all.peak``."""
        return self._peak_inactive_split

    @property
    def segments(self) -> int:
        """Segments held (``segment.all.current``)."""
        return len(self._segments)

    def snapshot(self) -> tuple[SegmentState, ...]:
        """Every segment and its blocks, walked along the blocks' links (as
        ``torch.cuda.memory_snapshot()`` lists them), in address order."""
        blocks = [*self._live.values(), *self._small_pool, *self._large_pool]
        heads = sorted((block for block in blocks if block.prev is None), key=lambda b: b.address)
        states = []
        for head in heads:
            chain: list[BlockState] = []
            block: _Block | None = head
            while block is not None:
                chain.append(BlockState(block.address, block.size, block.allocated))
                block = block.next
            states.append(SegmentState(head.address, self._segments[head.address], head.small,
                                       tuple(chain)))
        return tuple(states)


# -- traces and their replay -------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """A named point of a trace: it falls before ``events[at]`` (``at == len(events)``: at the
    end). With ``empty_cache``, the replay empties the cache and resets the peaks after
    reporting the mark (as the OpenSora demo does between its phases)."""

    name: str
    at: int
    empty_cache: bool = False


@dataclass(frozen=True)
class AllocationTrace:
    """A recorded sequence: ``events[i] > 0`` allocates that many bytes (the allocation's id is
    its ordinal among the allocations: 0, 1, 2, ...); ``events[i] < 0`` frees allocation
    ``-events[i] - 1``. ``marks`` are in order of ``at``. Checked when made: a free of an
    allocation not yet made or already freed, a zero or non-integer event, a mark out of range
    or out of order are a :class:`~hlo_trace.errors.UsageError`."""

    events: tuple[int, ...]
    marks: tuple[Mark, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        object.__setattr__(self, "marks", tuple(self.marks))
        problem = _events_problem(self.events) or _marks_problem(self.marks, len(self.events))
        if problem is not None:
            raise UsageError(f"allocation trace: {problem}")

    @property
    def allocations(self) -> int:
        """How many allocations the trace makes."""
        return sum(1 for event in self.events if event > 0)


def _events_problem(events: tuple[int, ...]) -> str | None:
    allocations = 0
    freed: set[int] = set()
    for index, event in enumerate(events):
        if not isinstance(event, int) or isinstance(event, bool):
            return f"event {index} is {event!r:.60}; expected an integer"
        if event > MAX_REQUEST:
            return (f"event {index} allocates {event} bytes; expected less than 1 EiB (PyTorch "
                    "refuses more)")
        if event > 0:
            allocations += 1
        elif event < 0:
            ident = -event - 1
            if ident >= allocations:
                return (f"event {index} frees allocation {ident}, which is not made before it "
                        f"({allocations} allocations so far); expected a free of an earlier one")
            if ident in freed:
                return (f"event {index} frees allocation {ident}, which is already freed; "
                        "expected each allocation freed at most once")
            freed.add(ident)
        else:
            return (f"event {index} is 0; expected a positive allocation size or a negative "
                    "free (zero-byte requests never reach the allocator)")
    return None


def _marks_problem(marks: tuple[Mark, ...], events: int) -> str | None:
    previous = 0
    for number, mark in enumerate(marks):
        if not isinstance(mark, Mark):
            return f"mark {number} is {type(mark).__name__}; expected a Mark"
        if not isinstance(mark.name, str):
            return f"mark {number}'s name is {mark.name!r:.60}; expected text"
        label = f"mark {number} ({mark.name!r:.60})"
        if not isinstance(mark.empty_cache, bool):
            return f"{label}: empty_cache is {mark.empty_cache!r:.60}; expected true or false"
        if not isinstance(mark.at, int) or isinstance(mark.at, bool) or not 0 <= mark.at <= events:
            return f"{label} is at {mark.at!r:.60}; expected an event index from 0 to {events}"
        if mark.at < previous:
            return (f"{label} is at {mark.at}, before the mark ahead of it (at {previous}); "
                    "expected the marks in order")
        previous = mark.at
    return None


@dataclass(frozen=True)
class PhaseMemory:
    """The allocator at a mark: current values, and peaks since the last reset (bytes)."""

    name: str
    allocated: int
    reserved: int
    segments: int
    peak_allocated: int
    peak_reserved: int
    peak_inactive_split: int


def replay(trace: AllocationTrace,
           allocator: CachingAllocator | None = None) -> tuple[PhaseMemory, ...]:
    """Run ``trace`` through ``allocator`` (a fresh one if None): one :class:`PhaseMemory` per
    mark, after which a mark with ``empty_cache`` empties the cache and resets the peaks."""
    allocator = CachingAllocator() if allocator is None else allocator
    handles: list[int] = []
    phases = []
    start = 0
    for mark in trace.marks:
        _run(allocator, trace.events, start, mark.at, handles)
        start = mark.at
        phases.append(PhaseMemory(mark.name, allocator.allocated, allocator.reserved,
                                  allocator.segments, allocator.peak_allocated,
                                  allocator.peak_reserved, allocator.peak_inactive_split))
        if mark.empty_cache:
            allocator.empty_cache()
            allocator.reset_peaks()
    _run(allocator, trace.events, start, len(trace.events), handles)
    return tuple(phases)


def _run(allocator: CachingAllocator, events: tuple[int, ...], start: int, stop: int,
         handles: list[int]) -> None:
    malloc, free, keep = allocator.malloc, allocator.free, handles.append
    for index in range(start, stop):
        event = events[index]
        if event > 0:
            keep(malloc(event))
        else:
            free(handles[-event - 1])


# -- trace files -------------------------------------------------------------------------------

#: The ``format`` field of a trace file, and its ``version``.
TRACE_FORMAT = "hlo-trace allocation trace"
TRACE_VERSION = 1
#: The largest trace file read, compressed or not: ~10x the ~2 million events (~25 MB of JSON)
#: of a full OpenSora generation, far below what would strain memory.
MAX_TRACE_BYTES = 256 * _MiB
_WHAT = "a gzip'd JSON allocation trace (models.cuda_runtime.write_trace)"


def write_trace(path: str | os.PathLike, trace: AllocationTrace, *, force: bool = False) -> None:
    """Write ``trace`` to ``path`` as gzip'd JSON, atomically; an existing file only with
    ``force``."""
    document = {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "events": list(trace.events),
        "marks": [{"name": mark.name, "at": mark.at, "empty_cache": mark.empty_cache}
                  for mark in trace.marks],
    }
    text = json.dumps(document, separators=(",", ":"))
    atomic_write(path, gzip.compress(text.encode("utf-8"), mtime=0), force=force)


def read_trace(path: str | os.PathLike) -> AllocationTrace:
    """The trace in ``path`` (written by :func:`write_trace`); anything else is one
    :class:`~hlo_trace.errors.InputFileError` naming the file."""
    name = shown(path)
    if check_input_file(path, _WHAT, max_bytes=MAX_TRACE_BYTES) == 0:
        raise InputFileError(f"{name}: is empty; expected {_WHAT}")
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
    except gzip.BadGzipFile as exc:
        raise InputFileError(f"{name}: not gzip'd ({exc}); expected {_WHAT}") from None
    except (EOFError, zlib.error) as exc:
        raise InputFileError(f"{name}: truncated or corrupt gzip data ({exc or type(exc).__name__}); "
                             f"expected {_WHAT}") from None
    except OSError as exc:
        raise InputFileError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise InputFileError(f"{name}: more than {MAX_TRACE_BYTES // _MiB} MiB uncompressed; "
                             f"expected {_WHAT}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{name}: not UTF-8 text inside the gzip (byte {exc.start}); "
                             f"expected {_WHAT}") from None
    events, marks = _trace_fields(loads_json(text, name, _WHAT), name)
    try:
        return AllocationTrace(events, marks)
    except UsageError as exc:
        raise InputFileError(f"{name}: {exc}") from None


def _trace_fields(document: object, name: str) -> tuple[tuple[int, ...], tuple[Mark, ...]]:
    """The events and marks of a parsed trace file, their JSON types checked."""
    expected = {"format", "version", "events", "marks"}
    if not isinstance(document, dict) or set(document) != expected:
        keys = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise InputFileError(f"{name}: holds {keys}; expected {_WHAT}: an object with the keys "
                             f"{', '.join(sorted(expected))}")
    if document["format"] != TRACE_FORMAT or document["version"] != TRACE_VERSION:
        raise InputFileError(f"{name}: format {document['format']!r} version "
                             f"{document['version']!r}; expected {TRACE_FORMAT!r} version "
                             f"{TRACE_VERSION}")
    events = document["events"]
    if not isinstance(events, list):
        raise InputFileError(f"{name}: events is {type(events).__name__}; expected a list of integers")
    marks = document["marks"]
    if not isinstance(marks, list):
        raise InputFileError(f"{name}: marks is {type(marks).__name__}; expected a list of objects")
    parsed = []
    for number, mark in enumerate(marks):
        fields = {"name", "at", "empty_cache"}
        if not isinstance(mark, dict) or set(mark) != fields:
            raise InputFileError(f"{name}: mark {number} is {mark!r:.80}; expected an object with "
                                 "the keys name, at, empty_cache")
        parsed.append(Mark(mark["name"], mark["at"], mark["empty_cache"]))
    return tuple(events), tuple(parsed)
