"""Small tiling helpers shared by the GEMM and flash-attention mappers."""

from __future__ import annotations


def round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def padded_extent(extent: int, block: int, granule: int) -> int:
    """Sum of the block edges of ``extent`` cut in ``block``s, each rounded up to the granule."""
    full, rest = divmod(extent, block)
    return full * round_up(block, granule) + (round_up(rest, granule) if rest else 0)


def tile_factors(tile_count: int) -> list[int]:
    """Tile counts worth trying along one loop: the powers of two and divisors of ``tile_count``."""
    powers = {1 << i for i in range(tile_count.bit_length()) if (1 << i) <= tile_count}
    divisors = {d for d in range(1, tile_count + 1) if tile_count % d == 0}
    return sorted(powers | divisors)


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
