"""Mappers: hand-derived latencies on TX8 and invariants of the cost model and the searches.

TX8 numbers used by hand (hardware/data/tx8.toml): 16 tiles, 8e12 FLOP/s GEMM and 62.5e9 op/s
vector per tile, DRAM 1e11 B/s shared, DRAM latency 0.1 us, NoC 128e9 B/s per link, hop 0.01 us,
SRAM 3 MiB per tile, double buffering (stages = 2), granule 16. Latency = the longest of the four
chains of hardware/kernel_mapping.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from hardware.flash_attention_mapper import flashatten_mapper
from hardware.gemm_mapper import (
    GemmPreset,
    gemm_auto_opt_mapper,
    gemm_candidate_cost,
    gemm_exhaustive_search,
)
from hardware.kernel_mapping import GemmTiling
from hardware.ops import Op, OpType
from hardware.spec import load_chip
from hardware.vector_mapper import MappingError, vector_mapper

#: TX8 without its tiled GEMM model: the tile mappers' search (the bound), which these tests derive.
TX8 = dataclasses.replace(load_chip("tx8"), tiled_model=None)
US = 1e-6


def gemm(m: int, k: int, n: int, batch: int = 1) -> Op:
    return Op(f"gemm_{m}x{k}x{n}", OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * batch * m * k * n,
              batch=batch)


def attention(batch: int, heads: int, s_q: int, s_kv: int, head_dim: int) -> Op:
    scores = batch * heads * s_q * s_kv
    return Op(
        "attn", OpType.FLASH_ATTENTION,
        ((batch, heads, s_q, head_dim), (batch, heads, s_kv, head_dim), (batch, heads, s_kv, head_dim)),
        None, (batch, heads, s_q, head_dim), 4 * scores * head_dim, vector_flops=6 * scores,
    )


def residual_add(rows: int, width: int) -> Op:
    return Op("res", OpType.VECTOR, ((rows, width), (rows, width)), (1, width), (rows, width), 2 * rows * width)


def test_gemm_that_fits_one_tile():
    """128x128x128 bf16 on one tile, one block (A, B, C = 32 KiB each; SRAM need 224 KiB).

    compute = 2*128^3 / 8e12 = 0.524288 us; DRAM = 3*32768 B / 1e11 = 0.98304 us;
    fill = 0.1 us + 65536 B / 1e11 = 0.75536 us; drain = 0.1 us + 32768 B / 1e11 = 0.42768 us.
    compute chain = 0.75536 + 0.524288 + 0.42768 = 1.707328 us
    DRAM chain    = 0.1 + 0.98304 + 0.524288 + 0.1 = 1.707328 us  (no NoC, 1 step)
    """
    preset = GemmPreset(tm=128, tk=128, tn=128, pm=1, pn=1, pk=1, loop_order="mnk")
    mapping = gemm_auto_opt_mapper(gemm(128, 128, 128), TX8, preset=preset)
    assert mapping.tiling == GemmTiling(1, 1, 1, 128, 128, 128, "mnk")
    assert mapping.latency_s == pytest.approx(1.707328 * US, rel=1e-9)
    assert mapping.compute_s == pytest.approx(0.524288 * US, rel=1e-9)
    assert mapping.dram_s == pytest.approx(0.98304 * US, rel=1e-9)
    assert mapping.noc_s == 0
    assert mapping.utilization == pytest.approx(4_194_304 / (1.707328 * US) / 128e12, rel=1e-9)


def test_gemm_that_streams_from_dram():
    """4096^3 on a 4x4 placement, 256^3 blocks, loop mnk: each tile owns 1024 x 4096 x 1024.

    mb = nb = 4, kb = 16, 256 steps. A read nb = 4 times, B mb = 4 times:
    DRAM = 4 A slices * 1024*4096*2 B * 4 + 4 B slices * 4096*1024*2 B * 4 + 16 * 1024*1024*2 B
         = 134217728 + 134217728 + 33554432 = 301989888 B -> 3019.89888 us at 1e11 B/s.
    compute per tile = 2*1024*4096*1024 / 8e12 = 1073.741824 us, per step 4.194304 us.
    transfer latency = 0.1 us + 3 hops * 0.01 us = 0.13 us.
    DRAM chain = 0.13 + 3019.89888 + 4.194304 + 0.1 = 3024.323184 us (compute chain ~1105 us,
    NoC chain ~288 us, latency chain ~59 us): DRAM bound.
    """
    preset = GemmPreset(tm=256, tk=256, tn=256, pm=4, pn=4, pk=1, loop_order="mnk")
    mapping = gemm_auto_opt_mapper(gemm(4096, 4096, 4096), TX8, preset=preset)
    assert mapping.dram_bytes == 301_989_888
    assert mapping.latency_s == pytest.approx(3024.323184 * US, rel=1e-9)
    assert mapping.bound == "dram"
    assert mapping.noc_s == pytest.approx(4 * 1024 * 4096 * 2 / 128e9, rel=1e-12)


def test_vector_op_limited_by_dram_bandwidth():
    """Gated residual add over 16384 x 1024 bf16: reads x and y (4096 B/row), writes 2048 B/row.

    16 tiles x 1024 rows. DRAM = 16*1024*6144 + 2048 (gate) = 100665344 B -> 1006.65344 us;
    vector compute = 2*1024*1024 / 62.5e9 = 33.554432 us per tile: 30x below DRAM.
    DRAM chain = 0.1 + 1006.65344 + compute/chunks + 0.1, smallest with 1-row chunks (1024 steps,
    latency chain only ~103 us): 1006.65344 + 0.2 + 0.032768 = 1006.886208 us.
    """
    mapping = vector_mapper(residual_add(16384, 1024), TX8)
    assert mapping.tiling.tiles == 16 and mapping.tiling.rows_per_tile == 1024
    assert mapping.tiling.chunk_rows == 1
    assert mapping.bound == "dram"
    assert mapping.latency_s == pytest.approx(1006.886208 * US, rel=1e-9)
    assert mapping.utilization == pytest.approx(2 * 16384 * 1024 / (1006.886208 * US) / 1e12, rel=1e-9)


def test_flash_attention_whose_kv_fit_sram():
    """One head, 512 queries and keys, head dim 64, one tile, one 512 x 512 block (K, V: 128 KiB).

    GEMM = 4*512*512*64 / 8e12 = 8.388608 us; softmax = 6*512*512 / 62.5e9 = 25.165824 us
    (vector bound). DRAM: K, V, Q once, O once = 4*65536 B -> 2.62144 us.
    fill = 0.1 + (K+V+Q = 196608 B)/1e11 = 2.06608 us; drain = 0.1 + 65536/1e11 = 0.75536 us.
    compute chain = 2.06608 + 25.165824 + 0.75536 = 27.987264 us (= DRAM chain).
    """
    mapping = flashatten_mapper(attention(1, 1, 512, 512, 64), TX8, tx_ty=(512, 512), q_split=1)
    assert (mapping.tiling.tx, mapping.tiling.ty, mapping.tiling.tiles) == (512, 512, 1)
    assert mapping.dram_bytes == 4 * 65536
    assert mapping.latency_s == pytest.approx(27.987264 * US, rel=1e-9)
    assert mapping.compute_s == pytest.approx(25.165824 * US, rel=1e-9)
    searched = flashatten_mapper(attention(1, 1, 512, 512, 64), TX8)
    assert searched.latency_s <= mapping.latency_s


GEMM_SHAPES = [(128, 128, 128), (1200, 72, 72), (6900, 1152, 288), (4096, 4096, 4096), (600, 1152, 2304), (16, 64, 4608)]


@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_gemm_invariants(shape):
    op = gemm(*shape)
    best = gemm_auto_opt_mapper(op, TX8)
    assert 0 < best.utilization <= 1
    assert best.latency_s >= best.compute_s > 0
    preset = gemm_auto_opt_mapper(op, TX8, preset=GemmPreset(tm=256, tn=32))
    assert best.latency_s <= preset.latency_s
    bigger = gemm_auto_opt_mapper(gemm(shape[0] * 2, shape[1], shape[2]), TX8)
    assert bigger.latency_s >= best.latency_s


@pytest.mark.parametrize("shape", [(128, 128, 128), (1200, 72, 72), (600, 1152, 2304), (6900, 1152, 288),
                                   (64, 32, 64, 16), (128, 72, 128, 3), (600, 72, 600, 17)])
def test_branch_and_bound_matches_exhaustive_in_any_order(shape):
    op = gemm(*shape)
    exhaustive = gemm_exhaustive_search(op, TX8)
    searched = gemm_auto_opt_mapper(op, TX8)
    assert (searched.latency_s, searched.tiling) == (exhaustive.latency_s, exhaustive.tiling)
    assert searched.candidates_visited < exhaustive.candidates_visited
    for seed in (1, 2):
        assert gemm_auto_opt_mapper(op, TX8, shuffle_seed=seed).tiling == searched.tiling
        assert gemm_exhaustive_search(op, TX8, shuffle_seed=seed).tiling == exhaustive.tiling


def test_the_loop_orders_cost_alike_when_k_takes_several_blocks():
    """The search costs only mnk when K is cut in several blocks (each tile then reads its A and
    B slices once per block in either order): 600x1152x288 on one tile, blocks 128x128x64.
    K in 18 blocks: A (600x1152) and B (1152x288) are read ceil(288/64) = 5 and ceil(600/128) = 5
    times in both orders; K in one block (tk = 1152): mnk keeps A resident (read once), nmk B."""
    op = gemm(600, 1152, 288)

    def cost(tk: int, order: str):
        return gemm_candidate_cost(op, TX8, GemmTiling(1, 1, 1, 128, tk, 64, order))

    several = [cost(64, order) for order in ("mnk", "nmk")]
    assert several[0].latency_s == several[1].latency_s
    assert several[0].dram_bytes == several[1].dram_bytes == 2 * (600 * 1152 * 5 + 1152 * 288 * 5 + 600 * 288)
    one = [cost(1152, order) for order in ("mnk", "nmk")]
    assert [m.dram_bytes for m in one] == [2 * (600 * 1152 * 1 + 1152 * 288 * 5 + 600 * 288),
                                           2 * (600 * 1152 * 5 + 1152 * 288 * 1 + 600 * 288)]


def test_fused_gelu_epilogue_costs_vector_time_but_saves_a_pass():
    fc1 = gemm(6900, 1152, 288)
    gelu = Op("gelu", OpType.VECTOR, ((6900, 288),), None, (6900, 288), 8 * 6900 * 288)
    plain = gemm_auto_opt_mapper(fc1, TX8)
    fused = gemm_auto_opt_mapper(fc1, TX8, epilogue=gelu)
    separate = vector_mapper(gelu, TX8)
    assert fused.op_name == f"{fc1.name}+gelu"
    assert plain.latency_s <= fused.latency_s < plain.latency_s + separate.latency_s
    with pytest.raises(ValueError, match="epilogue"):
        gemm_auto_opt_mapper(fc1, TX8, epilogue=gemm(6900, 288, 288))


def test_a_batched_gemm_of_small_heads_is_one_kernel_that_fills_the_chip():
    """16 heads of 16x16x16 bf16 (A, B, C = 512 B each per head) on TX8.

    One head alone, one tile, one block: compute 2*16^3 / 8e12 = 1.024 ns; fill = 0.1 us + 1024 B
    / 1e11 = 0.11024 us; drain = 0.1 us + 512 B / 1e11 = 0.10512 us; compute chain = DRAM chain
    (0.1 + 1536 B / 1e11 + 0.001024 + 0.1) = 0.216384 us. Back to back: 16 x that = 3.462144 us.
    One kernel, each of 16 tiles one head (pb = 16, one step): DRAM = 16 x 1536 B = 24576 B ->
    0.24576 us; fill = 0.1 + 16 x 1024 B / 1e11 = 0.26384 us; drain = 0.1 + 16 x 512 B / 1e11 =
    0.18192 us; compute chain = 0.26384 + 0.001024 + 0.18192 = 0.446784 us = DRAM chain
    (0.1 + 0.24576 + 0.001024 + 0.1); latency chain 0.1 + 0.001024 + 0.18192 below. The search
    finds that optimum (8 tiles of 2 heads tie: DRAM bound either way).
    """
    heads = gemm(16, 16, 16, batch=16)
    assert gemm_auto_opt_mapper(gemm(16, 16, 16), TX8).latency_s == pytest.approx(0.216384 * US, rel=1e-9)
    spread = gemm_auto_opt_mapper(heads, TX8, preset=GemmPreset(pm=1, pn=1, pk=1, pb=16))
    assert spread.tiling == GemmTiling(1, 1, 1, 16, 16, 16, "mnk", pb=16) and spread.tiling.tiles == 16
    assert spread.latency_s == pytest.approx(0.446784 * US, rel=1e-9)
    assert spread.dram_bytes == 24576 and spread.flops == 16 * 2 * 16**3
    searched = gemm_auto_opt_mapper(heads, TX8)
    assert searched.latency_s == pytest.approx(0.446784 * US, rel=1e-9) and searched.tiling.pb > 1


BATCHED_SHAPES = [(16, 16, 16, 16), (128, 72, 128, 3), (600, 72, 600, 17), (2048, 128, 256, 24), (1200, 72, 72, 2)]


@pytest.mark.parametrize("chip", ["tx8", "a100-sxm"])
@pytest.mark.parametrize("shape", BATCHED_SHAPES)
def test_a_batched_gemm_costs_no_more_than_its_instances_one_by_one(chip, shape):
    """Each instance alone, run back to back (batch x its latency), is one candidate of the
    batched search on a tiled chip (pb = 1) and an upper bound of the one GPU kernel (no more
    waves, one overhead); the batch is at least as slow as one instance."""
    spec = load_chip(chip)
    *dims, batch = shape
    single = gemm_auto_opt_mapper(gemm(*dims), spec)
    batched = gemm_auto_opt_mapper(gemm(*dims, batch=batch), spec)
    assert single.latency_s <= batched.latency_s <= batch * single.latency_s
    assert batched.flops == batch * single.flops
    assert 0 < batched.utilization <= 1
    if spec.kernel_model is not None:  # one kernel: one overhead, however many instances
        overhead, floor = spec.kernel_model.kernel_overhead_s, spec.kernel_model.launch_floor_s
        assert batched.latency_s == pytest.approx(max(floor, overhead + max(batched.compute_s, batched.dram_s)), rel=1e-12)
        assert batched.latency_s <= batch * single.latency_s - (batch - 1) * overhead + 1e-15


def _faster(chip, field):
    return dataclasses.replace(chip, **{field: getattr(chip, field) * 2})


@pytest.mark.parametrize("chip", ["tx8", "a100-sxm"])
@pytest.mark.parametrize("shape", [(128, 128, 128, 1), (16, 16, 16, 16), (600, 72, 600, 17)])
@pytest.mark.parametrize("field", ["dram_bandwidth_bytes_per_s", "noc_bandwidth_bytes_per_s_per_link",
                                   "gemm_flops_per_s_per_tile", "vector_flops_per_s_per_tile"])
def test_gemm_latency_never_grows_when_a_bandwidth_or_throughput_grows(chip, shape, field):
    spec = load_chip(chip)
    *dims, batch = shape
    op, gelu = gemm(*dims, batch=batch), None
    if batch == 1:
        m, _, n = dims
        gelu = Op("gelu", OpType.VECTOR, ((m, n),), None, (m, n), 8 * m * n)
    base = gemm_auto_opt_mapper(op, spec, epilogue=gelu)
    assert gemm_auto_opt_mapper(op, _faster(spec, field), epilogue=gelu).latency_s <= base.latency_s


@pytest.mark.parametrize("rows", [1, 15, 920, 16384])
def test_vector_invariants(rows):
    small, large = vector_mapper(residual_add(rows, 1152), TX8), vector_mapper(residual_add(rows * 2, 1152), TX8)
    assert 0 < small.utilization <= 1 and 0 < large.utilization <= 1
    assert large.latency_s >= small.latency_s


def test_vector_row_too_long_for_sram():
    with pytest.raises(MappingError, match="SRAM"):
        vector_mapper(residual_add(4, 2**20), TX8)


@pytest.mark.parametrize("dims", [(2, 4, 64, 64, 16), (120, 16, 920, 920, 72), (1, 16, 4416, 600, 72)])
def test_flash_attention_invariants(dims):
    base = flashatten_mapper(attention(*dims), TX8)
    assert 0 < base.utilization <= 1
    b, h, sq, skv, d = dims
    assert flashatten_mapper(attention(b, h, sq * 2, skv, d), TX8).latency_s >= base.latency_s
    assert flashatten_mapper(attention(b, h, sq, skv * 2, d), TX8).latency_s >= base.latency_s
    preset = flashatten_mapper(attention(*dims), TX8, tx_ty=(256, 256))
    assert base.latency_s <= preset.latency_s
    assert flashatten_mapper(attention(*dims), TX8, shuffle_seed=3).tiling == base.tiling
    unfused = flashatten_mapper(attention(*dims), TX8, fuse_heads=False)
    assert unfused.tiling.heads_per_block == 1 and base.latency_s <= unfused.latency_s


def test_gpu_predicts_the_full_fc1_gemm():
    """bf16 fc1 of STDiT3 at 204_640_360: M = 2*55200, K = 1152, N = 4608: 1.172 TFLOP.

    At 989.4 TFLOPS the H100 needs >= 1.185 ms; C alone (1.02 GB) needs 0.30 ms of HBM. The
    model must land between the compute roofline and twice it.
    """
    h100 = load_chip("h100-sxm")
    mapping = gemm_auto_opt_mapper(gemm(110400, 1152, 4608), h100)
    ideal_s = 2 * 110400 * 1152 * 4608 / 989.4e12
    assert ideal_s <= mapping.latency_s < 2 * ideal_s
