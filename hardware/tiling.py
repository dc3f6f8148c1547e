"""Small tiling helpers shared by the GEMM and flash-attention mappers."""

from __future__ import annotations

import functools
import math


def round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


@functools.lru_cache(maxsize=1 << 16)
def padded_extent(extent: int, block: int, granule: int) -> int:
    """Sum of the block edges of ``extent`` cut in ``block``s, each rounded up to the granule
    (remembered: a tiling search asks for the same few dozen a hundred thousand times)."""
    full, rest = divmod(extent, block)
    return full * round_up(block, granule) + (round_up(rest, granule) if rest else 0)


#: Divisors are found by trial division up to this bound (and paired with their cofactors), so a
#: search never walks a count linearly: every divisor of a count up to ``SMALL_DIVISOR_BOUND**2``
#: is found, and for larger counts the small ones and their cofactors.
SMALL_DIVISOR_BOUND = 1024
#: Tile factors: every divisor of the tile count up to this bound, and their cofactors.
TILE_DIVISOR_BOUND = 32


def small_divisors(count: int, bound: int = SMALL_DIVISOR_BOUND) -> list[int]:
    """The divisors ``d`` of ``count`` with ``d <= bound`` and their cofactors ``count // d``:
    every divisor when ``count <= bound**2``; at most ``2 * bound`` values, in
    ``O(min(bound, sqrt(count)))`` steps."""
    found: set[int] = set()
    for d in range(1, min(bound, math.isqrt(count)) + 1):
        if count % d == 0:
            found.update((d, count // d))
    return sorted(found)


def tile_factors(tile_count: int) -> list[int]:
    """Tile counts worth trying along one loop: the powers of two up to ``tile_count``, its
    divisors up to ``TILE_DIVISOR_BOUND`` and their cofactors (every divisor of a count up to
    1024, so every bundled chip's full set; at most ~100 values for any count)."""
    powers = {1 << i for i in range(tile_count.bit_length()) if (1 << i) <= tile_count}
    return sorted(powers | set(small_divisors(tile_count, TILE_DIVISOR_BOUND)))


def block_candidates(extent: int, granule: int, forced: int | None) -> list[int]:
    """Block sizes to search along ``extent``: the granule doubled up to it, and ``extent``
    itself; only ``forced`` (clipped to ``extent``) when a preset fixes it."""
    if forced is not None:
        return [min(forced, extent)]
    sizes = {extent}
    size = granule
    while size < extent:
        sizes.add(size)
        size *= 2
    return sorted(sizes)
