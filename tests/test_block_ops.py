"""STDiT3 block op builder, the shape dictionary, block mapping and inference totals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hardware.block import comm_latency_s, inference_totals, map_block
from hardware.ops import OpType
from hardware.spec import load_chip, load_system
from models.opensora.block_ops import (
    BLOCK_SHAPE_KEYS,
    BlockShapes,
    block_shapes_for,
    build_stdit_block_ops,
)

# The brief's tiny config: hidden 64, 4 heads of 16, TOKEN 8; B = 2. Geometry T = 4, S = 16.
TINY = SimpleNamespace(hidden_size=64, num_heads=4, mlp_ratio=4.0, model_max_length=8, depth=2)
B, H, TOKEN, T, S = 2, 64, 8, 4, 16
N = T * S


def matrix_flops(ops) -> int:
    return sum(op.flops for op in ops if op.op_type is not OpType.VECTOR)


def test_keys_are_the_briefs_in_order():
    assert BLOCK_SHAPE_KEYS == ["B_spt", "S_Q_spt", "S_KV_spt", "D_QKV", "H_QKV", "N_A", "H_A", "D_O_spt", "H_O_spt", "B_tmp", "S_Q_tmp", "S_KV_tmp", "D_O_tmp", "H_O_tmp", "B_cro", "S_Q_cro", "S_KV_cro", "D_O_cro", "H_O_cro", "D_FU", "H_FU", "D_FD", "H_FD", "L", "Q"]
    shapes = block_shapes_for(TINY, frames=T, spatial_tokens=S)
    assert list(shapes.as_dict()) == BLOCK_SHAPE_KEYS
    assert BlockShapes.from_dict(shapes.as_dict()) == shapes


def test_single_device_dictionary_by_hand():
    assert block_shapes_for(TINY, frames=T, spatial_tokens=S).as_dict() == {
        "B_spt": B * T, "S_Q_spt": S, "S_KV_spt": S, "D_QKV": H, "H_QKV": 3 * H, "N_A": 4, "H_A": 16,
        "D_O_spt": H, "H_O_spt": H, "B_tmp": B * S, "S_Q_tmp": T, "S_KV_tmp": T, "D_O_tmp": H, "H_O_tmp": H,
        "B_cro": 1, "S_Q_cro": B * N, "S_KV_cro": B * TOKEN, "D_O_cro": H, "H_O_cro": H,
        "D_FU": H, "H_FU": 4 * H, "D_FD": 4 * H, "H_FD": H, "L": 2, "Q": 2,
    }


def test_megatron_and_two_dimension_dictionaries_by_hand():
    megatron = block_shapes_for(TINY, frames=T, spatial_tokens=S, strategy="megatron", mesh=(1, 4))
    assert (megatron.H_QKV, megatron.N_A, megatron.D_O_spt, megatron.H_O_spt, megatron.H_FU, megatron.D_FD) == (48, 1, 16, 64, 64, 64)
    assert (megatron.B_spt, megatron.S_Q_cro, megatron.S_KV_cro) == (B * T, B * N, B * TOKEN)
    two_d = block_shapes_for(TINY, frames=T, spatial_tokens=S, strategy="two_dimension", mesh=(2, 2))
    assert (two_d.B_spt, two_d.B_tmp, two_d.S_Q_cro, two_d.N_A, two_d.H_QKV) == (T, S, N, 2, 96)


def test_dictionary_errors():
    values = block_shapes_for(TINY, frames=T, spatial_tokens=S).as_dict()
    del values["L"]
    with pytest.raises(ValueError, match="missing keys \\['L'\\]"):
        BlockShapes.from_dict(values)
    with pytest.raises(ValueError, match="positive integer"):
        BlockShapes.from_dict({**block_shapes_for(TINY, frames=T, spatial_tokens=S).as_dict(), "N_A": 0})
    with pytest.raises(ValueError, match="split evenly"):
        block_shapes_for(TINY, frames=T, spatial_tokens=S, strategy="megatron", mesh=(1, 8))
    with pytest.raises(ValueError, match="unknown strategy"):
        block_shapes_for(TINY, frames=T, spatial_tokens=S, strategy="pipeline")


def test_tiny_block_gemm_flops_equal_the_hand_count():
    ops = build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S))
    hand = 56 * B * N * H**2 + 8 * B * TOKEN * H**2 + 4 * B * N * H * (S + T) + 4 * 2 * (B * N) * (B * TOKEN) * H
    assert matrix_flops(ops) == hand


def test_op_list_structure():
    ops = build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S))
    names = [op.name for op in ops]
    assert len(names) == len(set(names))
    kinds = [op.op_type for op in ops]
    assert kinds.count(OpType.GEMM) == 14 and kinds.count(OpType.FLASH_ATTENTION) == 4
    assert "temporal_RoPE_Q" in names and "spatial_RoPE_Q" not in names
    by_name = {op.name: op for op in ops}
    qkv = by_name["spatial_QKV_proj"]
    assert (qkv.input_shape, qkv.weight_shape, qkv.output_shape) == ((B * N, H), (H, 3 * H), (B * N, 3 * H))
    cross = by_name["temporal_cross_FlashAttention"]
    assert cross.input_shapes[0] == (1, 4, B * N, 16) and cross.input_shapes[1] == (1, 4, B * TOKEN, 16)
    assert cross.vector_flops == 7 * (B * N) * (B * TOKEN) * 4  # softmax 6 + mask add 1 per score
    assert by_name["spatial_mlp_GELU"].fuse_into == "spatial_mlp_FC1"
    assert by_name["spatial_Gate_ResAdd"].flops == 2 * B * N * H


@pytest.mark.parametrize(("strategy", "mesh"), [("megatron", (1, 4)), ("ds_ulysses", (1, 4)), ("dp", (2, 1))])
def test_per_device_matrix_flops_add_up_to_the_single_device_block(strategy, mesh):
    single = matrix_flops(build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S)))
    per_device = build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S, strategy=strategy, mesh=mesh))
    extra = 0
    if strategy == "dp":
        # Each of the 2 devices attends its own N queries to all B*TOKEN caption keys (together
        # exactly the flattened single-device cross attention), but each also projects all
        # B*TOKEN caption tokens to k, v: one redundant copy of the 2 cross kv projections,
        # 2 * (2 * B*TOKEN * H * 2H) FLOPs.
        extra = 2 * (2 * B * TOKEN * H * 2 * H)
    assert matrix_flops(per_device) * mesh[0] * mesh[1] == single + extra


def test_map_block_fuses_gelu_and_totals():
    chip = load_chip("tx8")
    ops = build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S))
    block = map_block(ops, chip)
    names = [m.op_name for m in block.mappings]
    assert "spatial_mlp_FC1+spatial_mlp_GELU" in names and "spatial_mlp_GELU" not in names
    assert len(names) == len(ops) - 2
    assert block.latency_s == pytest.approx(sum(m.latency_s for m in block.mappings))
    assert sum(block.time_share_by_type.values()) == pytest.approx(1.0)
    assert 0 < block.gemm_utilization <= 1
    assert all(0 < m.utilization <= 1 for m in block.mappings)
    unfused = map_block(ops, chip, fuse_epilogues=False)
    assert len(unfused.mappings) == len(ops)


def test_inference_totals_by_hand():
    chip = load_chip("tx8")
    system = load_system("tx8-16")
    block = map_block(build_stdit_block_ops(block_shapes_for(TINY, frames=T, spatial_tokens=S)), chip)
    totals = inference_totals(block, blocks=28, steps=30, comm_bytes_per_device=5e9, system=system)
    # 5 GB per step at 50 GB/s = 0.1 s per step, 3 s over 30 steps.
    assert totals.comm_latency_s == pytest.approx(3.0)
    assert totals.compute_latency_s == pytest.approx(block.latency_s * 28 * 30)
    assert totals.inference_latency_s == pytest.approx(totals.compute_latency_s + 3.0)
    per_step = comm_latency_s([("all_reduce", 16, 1e9), ("all_gather", 2, 1e6, [0, 8])], system)
    # 37.5 ms + 30 us (all-reduce) + 10 us + 2 us (all-gather over 2 hops)
    assert per_step == pytest.approx(0.0375 + 30e-6 + 12e-6)
    assert inference_totals(block, 28, comm_latency_s_per_step=per_step).comm_latency_s == pytest.approx(30 * per_step)
    with pytest.raises(ValueError, match="needs a system"):
        inference_totals(block, 28, comm_bytes_per_device=1.0)
