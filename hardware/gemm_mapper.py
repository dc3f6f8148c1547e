"""``gemm_auto_opt_mapper``: tiling search for one GEMM ``(M, K) x (K, N)`` on a tiled chip, or
for a batched GEMM (``Op.batch`` independent instances) as one kernel.

Search space
    * placement ``pm x pn x pk``: M, N and K are cut into ``pm``, ``pn``, ``pk`` slices and each
      tile owns one (M slice, N slice, K slice); ``pm*pn*pk <= tile_count``, factors drawn from
      the powers of two and the divisors of ``tile_count``; a dimension is never cut finer than
      the GEMM granule.
    * batch split ``pb`` (batched GEMMs): the instances are dealt over ``pb`` groups of
      ``pm*pn*pk`` tiles (``pb*pm*pn*pk <= tile_count``, ``pb <= batch``), so each tile runs
      ``bt = ceil(batch/pb)`` instances of its slice one after another: a small per-head GEMM
      fills the chip with heads instead of thin slices. ``pb = 1`` runs the instances back to
      back on the whole placement, so a batched GEMM never costs more than its instances mapped
      one by one.
    * per-tile blocks ``tm, tk, tn``: powers of two from the granule up, and the slice itself;
    * loop order ``mnk`` / ``nmk`` (output stationary, K innermost).

Cost of one candidate (every tile is charged the largest slice, ``mt = ceil(M/pm)`` etc., and
the most instances, ``bt``; the per-tile terms below are per instance and count ``bt`` times,
the chip's DRAM bytes ``batch`` times)
    * compute: ``2 * pad(mt) * pad(kt) * pad(nt) / gemm_flops_per_s_per_tile``, where ``pad``
      rounds every block edge up to ``gemm_granule_elements``; a fused epilogue (GELU, SiLU) runs
      on the vector unit, overlapped with the GEMM engine (it works on block i while the engine
      computes block i+1), so compute is the larger of the two.
    * DRAM: A is read ``nb`` times (once per N block) unless K fits one block and the loop order
      keeps the A block resident (``mnk``); symmetrically for B; C is written once, in
      ``bytes_per_element``. Tiles that share an A slice (the ``pn`` tiles of a row) get it from
      one DRAM read forwarded over the NoC; likewise B down the ``pm`` tiles; so the chip reads
      ``pm*pk`` A slices and ``pk*pn`` B slices.
    * NoC (``mesh``): forwarded A and B streams use different links (row vs column), so the NoC
      time is the larger stream plus the split-K reduction of fp32 partial sums
      (``mt*nt*ACCUMULATOR_BYTES``) along the ``pk`` chain; a forwarded block crosses up to
      ``max(pm, pn, pk) - 1`` hops. (``crossbar``, GPUs: each tile pulls A and B through its one
      cache port; no forwarding, one hop.)
    * SRAM: ``stages * (tm*tk + tk*tn) * bytes + tm*tn*(ACCUMULATOR_BYTES + bytes)`` (multi-
      buffered operand blocks, an fp32 accumulator and an output staging block) must fit.
    * latency: the chain model of :mod:`hardware.kernel_mapping` over ``bt*mb*nb*kb`` steps.

Search (branch and bound, exact)
    The exhaustive loop (:func:`gemm_exhaustive_search`) visits every candidate. The mapper
    instead orders placements by a lower bound (unpadded compute; compulsory DRAM traffic: each of
    A, B, C moved once; NoC likewise) and stops at the first whose bound exceeds the best latency
    found; inside a placement it bounds each ``(tm, tn)`` pair (padding of M and N, the cheaper of
    the two A-or-B-resident traffic patterns, at least ``mb*nb`` steps of transfer latency) and
    only expands ``tk`` and the loop order under pairs that can still win. Every bound is
    <= the exact cost of every candidate below it, so the optimum is the exhaustive one; ties are
    broken by the tiling's natural order, so neither search depends on candidate order. When K
    takes several blocks the two loop orders read A and B alike (``_reuse``), so they cost the
    same and ``mnk`` wins the tie: only ``mnk`` is costed there.

Limits
    Tile factors are bounded (:func:`hardware.tiling.tile_factors`: every divisor of a count up
    to 1024, else the powers of two, the divisors up to 32 and their cofactors). Of the
    placements, the ``MAX_PLACEMENTS`` that use the most tiles are searched; the search stops
    once it has bounded or costed ``MAX_SEARCH_STEPS`` block candidates and has a tiling. Both
    limits are above what any chip of up to 1024 tiles needs on the bundled dumps, where the
    result is the exact optimum; past them (a chip of 720,720 tiles, a GEMM of 2**20 huge
    instances) the result is the best tiling found in the lowest-bound placements, and the
    search takes about a second instead of minutes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from hardware.kernel_mapping import ChainTimes, GemmTiling, Mapping, chain_seconds
from hardware.kernel_model import gpu_gemm_mapping
from hardware.ops import Op, OpType, check_epilogue, gemm_dims
from hardware.spec import ChipSpec
from hardware.tiled_gemm import tiled_gemm_mapping
from hardware.tiling import block_candidates, padded_extent, tile_factors
from hardware.vector_mapper import MappingError

__all__ = [
    "ACCUMULATOR_BYTES",
    "LOOP_ORDERS",
    "GemmPreset",
    "forget_searches",
    "gemm_auto_opt_mapper",
    "gemm_candidate_cost",
    "gemm_exhaustive_search",
]

#: Partial sums are accumulated in fp32 (4 bytes), as bf16 GEMM engines do.
ACCUMULATOR_BYTES = 4
LOOP_ORDERS = ("mnk", "nmk")
#: A bound prunes only when it exceeds the best latency by this relative margin, so rounding in
#: the last bit can never prune a candidate that the exhaustive loop would pick.
_PRUNE_MARGIN = 1e-9
#: Search limits (module docstring, "Limits"): the placements searched, and the candidate
#: blocks costed or bounded, per GEMM. Above every bundled chip's need (a chip of up to 1024
#: tiles has at most 19,663 placements; the bundled dumps cost at most ~15,000 candidates),
#: they keep a chip of 720,720 tiles or a GEMM of 2**20 instances to about a second.
MAX_PLACEMENTS = 20_000
MAX_SEARCH_STEPS = 100_000


@dataclass(frozen=True)
class GemmPreset:
    """Forces part of the tiling (None = searched). The reference toolchain forced ``tm, tn = 256, 32``."""

    tm: int | None = None
    tk: int | None = None
    tn: int | None = None
    pm: int | None = None
    pn: int | None = None
    pk: int | None = None
    loop_order: str | None = None
    pb: int | None = None


@dataclass(frozen=True)
class _Problem:
    name: str
    m: int
    k: int
    n: int
    bytes_per_element: int
    flops: int
    epilogue_ops_per_element: float
    batch: int = 1


#: A placement: ``(pm, pn, pk, pb)`` (module docstring).
Placement = tuple[int, int, int, int]


def _placements(chip: ChipSpec, problem: _Problem, preset: GemmPreset) -> list[Placement]:
    """Every ``(pm, pn, pk, pb)`` of tile factors within the tile count and the dimensions'
    limits, in nested factor order. The loops stop at the first factor past a limit (the
    factors are sorted), so the work is the number of placements, not factors**4."""
    granule = chip.gemm_granule_elements
    limit_m, limit_n, limit_k = (max(1, math.ceil(d / granule)) for d in (problem.m, problem.n, problem.k))
    tiles = chip.tile_count
    factors = tile_factors(tiles)

    def options(limit: int, budget: int, wanted: int | None) -> list[int]:
        bound = min(limit, budget)
        if wanted is not None:
            return [wanted] if wanted in factors and wanted <= bound else []
        return list(itertools.takewhile(lambda f: f <= bound, factors))

    result = [
        (pm, pn, pk, pb)
        for pb in options(problem.batch, tiles, preset.pb)
        for pm in options(limit_m, tiles // pb, preset.pm)
        for pn in options(limit_n, tiles // (pb * pm), preset.pn)
        for pk in options(limit_k, tiles // (pb * pm * pn), preset.pk)
    ]
    if len(result) > MAX_PLACEMENTS:  # the ones that use the most tiles (a stable sort)
        result = sorted(result, key=lambda p: -(p[0] * p[1] * p[2] * p[3]))[:MAX_PLACEMENTS]
    return result


def _tiling(placement: Placement, tm: int, tk: int, tn: int, order: str) -> GemmTiling:
    pm, pn, pk, pb = placement
    return GemmTiling(pm, pn, pk, tm, tk, tn, order, pb)


def _sram_bytes(tm: int, tk: int, tn: int, q: int, stages: int) -> int:
    return stages * (tm * tk + tk * tn) * q + tm * tn * (ACCUMULATOR_BYTES + q)


def _reuse(order: str, mb: int, nb: int, kb: int) -> tuple[int, int]:
    """How many times each tile reads its A slice and its B slice."""
    if order == "mnk":
        return (1 if kb == 1 else nb), mb
    return nb, (1 if kb == 1 else mb)


def _noc_bytes(chip: ChipSpec, pm: int, pn: int, pk: int, a_tile: float, b_tile: float, reduce_tile: float) -> float:
    if chip.noc_topology == "mesh":
        a_forward = a_tile if pn > 1 else 0.0
        b_forward = b_tile if pm > 1 else 0.0
        return max(a_forward, b_forward) + reduce_tile
    return a_tile + b_tile + reduce_tile


def _hops(chip: ChipSpec, pm: int, pn: int, pk: int) -> int:
    if chip.noc_topology == "mesh":
        return max(pm, pn, pk) - 1
    return 1 if pm * pn * pk > 1 else 0


class _Placed(NamedTuple):
    """A placement's figures, shared by every block candidate under it (:func:`_placed`)."""

    pm: int
    pn: int
    pk: int
    pb: int
    mt: int
    kt: int
    nt: int
    bt: int
    epilogue_s: float
    reduce_tile: float
    transfer_latency_s: float


def _placed(problem: _Problem, chip: ChipSpec, placement: Placement) -> _Placed:
    pm, pn, pk, pb = placement
    mt, kt, nt = math.ceil(problem.m / pm), math.ceil(problem.k / pk), math.ceil(problem.n / pn)
    return _Placed(pm, pn, pk, pb, mt, kt, nt, math.ceil(problem.batch / pb),
                   problem.epilogue_ops_per_element * mt * nt / chip.vector_flops_per_s_per_tile,
                   mt * nt * ACCUMULATOR_BYTES if pk > 1 else 0.0,
                   chip.dram_latency_s + _hops(chip, pm, pn, pk) * chip.hop_latency_s)


class _Costed(NamedTuple):
    """A tiling's figures (:func:`_costed`), before a :class:`Mapping` is made of them."""

    latency_s: float
    compute_s: float
    dram_bytes: float
    noc_s: float
    chains: tuple[float, float, float, float]  # hardware.kernel_mapping.chain_seconds


def _costed(problem: _Problem, chip: ChipSpec, placed: _Placed, tm: int, tk: int, tn: int,
            order: str) -> _Costed:
    q = problem.bytes_per_element
    granule = chip.gemm_granule_elements
    pm, pn, pk, pb, mt, kt, nt, bt, epilogue_s, reduce_tile, transfer_latency_s = placed
    mb, kb, nb = math.ceil(mt / tm), math.ceil(kt / tk), math.ceil(nt / tn)
    steps = bt * mb * nb * kb

    padded_flops = 2 * padded_extent(mt, tm, granule) * padded_extent(kt, tk, granule) * padded_extent(nt, tn, granule)
    gemm_s = padded_flops / chip.gemm_flops_per_s_per_tile
    compute_s = bt * max(gemm_s, epilogue_s)

    a_reads, b_reads = _reuse(order, mb, nb, kb)
    a_tile, b_tile, c_tile = mt * kt * q * a_reads, kt * nt * q * b_reads, mt * nt * q
    dram_bytes = problem.batch * (pm * pk * a_tile + pk * pn * b_tile + pm * pn * c_tile)
    noc_s = bt * _noc_bytes(chip, pm, pn, pk, a_tile, b_tile, reduce_tile) / chip.noc_bandwidth_bytes_per_s_per_link

    chains = chain_seconds(steps, compute_s, dram_bytes / chip.dram_bandwidth_bytes_per_s, noc_s,
                           pb * (pm * pk * tm * tk + pk * pn * tk * tn) * q, pb * pm * pn * tm * tn * q,
                           transfer_latency_s, chip)
    return _Costed(max(chains), compute_s, dram_bytes, noc_s, chains)


def _mapping_of(problem: _Problem, chip: ChipSpec, tiling: GemmTiling, costed: _Costed) -> Mapping:
    return Mapping(
        op_name=problem.name,
        op_type=OpType.GEMM.value,
        mapper="gemm_auto_opt_mapper",
        latency_s=costed.latency_s,
        compute_s=costed.compute_s,
        dram_s=costed.dram_bytes / chip.dram_bandwidth_bytes_per_s,
        noc_s=costed.noc_s,
        utilization=min(1.0, problem.flops / costed.latency_s / chip.gemm_flops_per_s),
        flops=problem.flops,
        dram_bytes=costed.dram_bytes,
        tiling=tiling,
        bound=ChainTimes(*costed.chains).bound,
    )


def _cost(problem: _Problem, chip: ChipSpec, tiling: GemmTiling) -> Mapping:
    placed = _placed(problem, chip, (tiling.pm, tiling.pn, tiling.pk, tiling.pb))
    costed = _costed(problem, chip, placed, tiling.tm, tiling.tk, tiling.tn, tiling.loop_order)
    return _mapping_of(problem, chip, tiling, costed)


def _problem(op: Op, epilogue: Op | None) -> _Problem:
    if op.op_type is not OpType.GEMM:
        raise ValueError(f"op {op.name}: gemm_auto_opt_mapper takes GEMM ops, got {op.op_type.value}")
    m, k, n = gemm_dims(op)
    epilogue_ops = 0.0
    name = op.name
    if epilogue is not None:
        check_epilogue(op, epilogue)
        epilogue_ops = epilogue.flops / op.output_elements
        name = f"{op.name}+{epilogue.name}"
    return _Problem(name, m, k, n, op.bytes_per_element, op.flops, epilogue_ops, op.batch)


def _candidates_of_placement(
    problem: _Problem, chip: ChipSpec, placement: Placement, preset: GemmPreset
) -> tuple[list[int], list[int], list[int], list[str]]:
    pm, pn, pk, _ = placement
    granule = chip.gemm_granule_elements
    mt, kt, nt = math.ceil(problem.m / pm), math.ceil(problem.k / pk), math.ceil(problem.n / pn)
    orders = [preset.loop_order] if preset.loop_order else list(LOOP_ORDERS)
    return (
        block_candidates(mt, granule, preset.tm),
        block_candidates(kt, granule, preset.tk),
        block_candidates(nt, granule, preset.tn),
        orders,
    )


def _fits(chip: ChipSpec, problem: _Problem, tm: int, tk: int, tn: int) -> bool:
    return _sram_bytes(tm, tk, tn, problem.bytes_per_element, chip.sram_buffering_stages) <= chip.sram_bytes_per_tile


def _better(candidate: Mapping, best: Mapping | None) -> bool:
    return best is None or (candidate.latency_s, candidate.tiling) < (best.latency_s, best.tiling)


def _no_fit(problem: _Problem, chip: ChipSpec) -> MappingError:
    return MappingError(f"op {problem.name}: no tiling fits {chip.name}'s SRAM of {chip.sram_bytes_per_tile:.0f} bytes per tile")


def _shuffled(items: list, rng: random.Random | None) -> list:
    if rng is not None:
        items = list(items)
        rng.shuffle(items)
    return items


def _all_candidates(problem: _Problem, chip: ChipSpec, preset: GemmPreset, rng: random.Random | None) -> Iterator[GemmTiling]:
    for placement in _shuffled(_placements(chip, problem, preset), rng):
        tms, tks, tns, orders = (_shuffled(c, rng) for c in _candidates_of_placement(problem, chip, placement, preset))
        for tm in tms:
            for tn in tns:
                for tk in tks:
                    if not _fits(chip, problem, tm, tk, tn):
                        continue
                    for order in orders:
                        yield _tiling(placement, tm, tk, tn, order)


def gemm_exhaustive_search(
    op: Op, chip: ChipSpec, *, preset: GemmPreset | None = None, epilogue: Op | None = None, shuffle_seed: int | None = None
) -> Mapping:
    """The plain loop over every candidate: the reference that :func:`gemm_auto_opt_mapper` must match."""
    problem = _problem(op, epilogue)
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    best: Mapping | None = None
    visited = 0
    for tiling in _all_candidates(problem, chip, preset or GemmPreset(), rng):
        visited += 1
        mapping = _cost(problem, chip, tiling)
        if _better(mapping, best):
            best = mapping
    if best is None:
        raise _no_fit(problem, chip)
    return replace(best, candidates_visited=visited)


def gemm_candidate_cost(op: Op, chip: ChipSpec, tiling: GemmTiling, *, epilogue: Op | None = None) -> Mapping:
    """Cost of one fully specified tiling (no search); raises MappingError if it does not fit SRAM."""
    problem = _problem(op, epilogue)
    if not _fits(chip, problem, tiling.tm, tiling.tk, tiling.tn):
        raise MappingError(f"op {problem.name}: tiling {tiling} does not fit {chip.name}'s SRAM")
    return _cost(problem, chip, tiling)


def _placement_bound(problem: _Problem, chip: ChipSpec, placement: Placement) -> float:
    pm, pn, pk, pb = placement
    q = problem.bytes_per_element
    mt, kt, nt = math.ceil(problem.m / pm), math.ceil(problem.k / pk), math.ceil(problem.n / pn)
    bt = math.ceil(problem.batch / pb)
    compute_s = bt * max(
        2 * mt * kt * nt / chip.gemm_flops_per_s_per_tile,
        problem.epilogue_ops_per_element * mt * nt / chip.vector_flops_per_s_per_tile,
    )
    dram_bytes = problem.batch * (pm * pk * mt * kt + pk * pn * kt * nt + pm * pn * mt * nt) * q
    reduce_tile = mt * nt * ACCUMULATOR_BYTES if pk > 1 else 0.0
    noc_s = bt * _noc_bytes(chip, pm, pn, pk, mt * kt * q, kt * nt * q, reduce_tile) / chip.noc_bandwidth_bytes_per_s_per_link
    return 2 * chip.dram_latency_s + max(compute_s, dram_bytes / chip.dram_bandwidth_bytes_per_s, noc_s)


def _pair_bound(problem: _Problem, chip: ChipSpec, placed: _Placed, tm: int, tn: int) -> float:
    """Lower bound over every ``tk`` and loop order under the block pair ``(tm, tn)``."""
    pm, pn, pk, pb, mt, kt, nt, bt, epilogue_s, reduce_tile, transfer_latency_s = placed
    q = problem.bytes_per_element
    granule = chip.gemm_granule_elements
    mb, nb = math.ceil(mt / tm), math.ceil(nt / tn)
    compute_s = bt * max(
        2 * padded_extent(mt, tm, granule) * kt * padded_extent(nt, tn, granule) / chip.gemm_flops_per_s_per_tile,
        epilogue_s,
    )
    a_once, b_once = mt * kt * q, kt * nt * q
    # Cheapest traffic any tk / order can reach: A resident (mnk, kb = 1) or B resident (nmk, kb = 1).
    dram_bytes = min(pm * pk * a_once + pk * pn * b_once * mb, pm * pk * a_once * nb + pk * pn * b_once)
    dram_bytes = problem.batch * (dram_bytes + pm * pn * mt * nt * q)
    noc_bytes = bt * min(
        _noc_bytes(chip, pm, pn, pk, a_once, b_once * mb, reduce_tile),
        _noc_bytes(chip, pm, pn, pk, a_once * nb, b_once, reduce_tile),
    )
    latency_chain_s = bt * mb * nb * transfer_latency_s / (chip.sram_buffering_stages - 1) + chip.dram_latency_s
    resource_s = max(compute_s, dram_bytes / chip.dram_bandwidth_bytes_per_s, noc_bytes / chip.noc_bandwidth_bytes_per_s_per_link)
    return max(2 * chip.dram_latency_s + resource_s, latency_chain_s)


def gemm_auto_opt_mapper(
    op: Op,
    chip: ChipSpec,
    *,
    preset: GemmPreset | None = None,
    epilogue: Op | None = None,
    shuffle_seed: int | None = None,
) -> Mapping:
    """Best tiling of GEMM ``op`` on ``chip`` by branch and bound (same optimum as the exhaustive loop).

    ``preset`` forces some tiling parameters (e.g. ``GemmPreset(tm=256, tn=32)``); ``epilogue`` is
    a Vector op over the GEMM output (GELU, SiLU; over every instance's of a batched GEMM) fused
    into it; ``shuffle_seed`` permutes the
    candidate lists before the search (for tests: the result must not change).
    ``candidates_visited`` on the result counts the fully costed candidates.

    A chip with a ``kernel_model`` (the bundled GPUs) is costed as one library kernel by
    :func:`hardware.kernel_model.gpu_gemm_mapping`, and one with a ``tiled_model`` (n150, p150)
    by :func:`hardware.tiled_gemm.tiled_gemm_mapping`, unless ``preset`` asks for the tiled search.
    """
    if chip.kernel_model is not None and preset is None:
        return gpu_gemm_mapping(op, chip, epilogue=epilogue)
    if chip.tiled_model is not None and preset is None:
        return tiled_gemm_mapping(op, chip, epilogue=epilogue)
    preset = preset or GemmPreset()
    problem = _problem(op, epilogue)
    if shuffle_seed is None:  # the same search again (a program's GEMM and its ideal block's): its result
        key = (dataclasses.replace(problem, name=""), chip, preset)
        known = _SEARCHED.get(key)
        if known is None:
            known = _SEARCHED[key] = _search(problem, chip, preset, None)
            if len(_SEARCHED) > MAX_SEARCHES_KEPT:
                del _SEARCHED[next(iter(_SEARCHED))]
        return replace(known, op_name=problem.name)
    return _search(problem, chip, preset, shuffle_seed)


#: Searches kept (a process maps a few dozen distinct GEMMs per program).
MAX_SEARCHES_KEPT = 4096
_SEARCHED: dict[tuple, Mapping] = {}


def forget_searches() -> None:
    """Forget the searches done (a benchmark times the search itself)."""
    _SEARCHED.clear()


def _search(problem: _Problem, chip: ChipSpec, preset: GemmPreset, shuffle_seed: int | None) -> Mapping:
    """The branch and bound of :func:`gemm_auto_opt_mapper`."""
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    placements = _shuffled(_placements(chip, problem, preset), rng)
    bounded = sorted((_placement_bound(problem, chip, p), p) for p in placements)
    best: Mapping | None = None
    visited = steps = 0

    def beaten(bound: float) -> bool:
        return best is not None and bound > best.latency_s * (1 + _PRUNE_MARGIN)

    for placement_bound, placement in bounded:
        if beaten(placement_bound) or (best is not None and steps >= MAX_SEARCH_STEPS):
            break
        tms, tks, tns, orders = (_shuffled(c, rng) for c in _candidates_of_placement(problem, chip, placement, preset))
        tks_descending = sorted(tks, reverse=True)
        placed = _placed(problem, chip, placement)
        pairs = sorted(
            (_pair_bound(problem, chip, placed, tm, tn), tm, tn)
            for tm in tms
            for tn in tns
            if _fits(chip, problem, tm, min(tks), tn)
        )
        steps += len(tms) * len(tns)
        for pair_bound, tm, tn in pairs:
            if beaten(pair_bound) or (best is not None and steps >= MAX_SEARCH_STEPS):
                break
            for tk in tks_descending:
                if not _fits(chip, problem, tm, tk, tn):
                    continue
                # K in several blocks: each tile reads A and B once per block in either loop
                # order, so nmk costs what mnk costs and, a larger tiling, never wins the tie
                same_cost = "mnk" in orders and math.ceil(placed.kt / tk) > 1
                for order in orders:
                    if same_cost and order != "mnk":
                        continue
                    visited += 1
                    # the Mapping is made only for a candidate that may win (ties: by tiling)
                    costed = _costed(problem, chip, placed, tm, tk, tn, order)
                    if best is None or costed.latency_s <= best.latency_s:
                        mapping = _mapping_of(problem, chip, _tiling(placement, tm, tk, tn, order), costed)
                        if _better(mapping, best):
                            best = mapping
            steps += len(tks) * len(orders)
    if best is None:
        raise _no_fit(problem, chip)
    return replace(best, candidates_visited=visited)
