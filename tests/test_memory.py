"""MemoryVisitor: resident weights and peak live activations, derived by hand on small programs."""

import json

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_analyzer.memory import (
    ALL_ARGUMENTS,
    FROM_SIDECAR,
    InputSignature,
    global_shape,
    measure_memory,
    read_sidecar_inputs,
)
from hlo_analyzer.mlir import load_module, load_module_text
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError

# f32 everywhere: 4 bytes per element.
CHAIN = """module {
  func.func @main(%w: tensor<4x8xf32>, %x: tensor<2x4xf32>) -> tensor<1x2x8xf32> {
    %0 = stablehlo.dot %x, %w : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [1, 2] : (tensor<2x8xf32>) -> tensor<3x2x8xf32>
    %2 = stablehlo.tanh %1 : tensor<3x2x8xf32>
    %3 = stablehlo.slice %2 [0:1, 0:2, 0:8] : (tensor<3x2x8xf32>) -> tensor<1x2x8xf32>
    return %3 : tensor<1x2x8xf32>
  }
}
"""

DIAMOND = """module {
  func.func @main(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<2x4x4xf32> {
    %0 = stablehlo.tanh %x : tensor<4x4xf32>
    %1 = stablehlo.dot %0, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %2 = stablehlo.broadcast_in_dim %0, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<2x4x4xf32>
    %3 = stablehlo.broadcast_in_dim %1, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<2x4x4xf32>
    %4 = stablehlo.add %2, %3 : tensor<2x4x4xf32>
    return %4 : tensor<2x4x4xf32>
  }
}
"""

LONG_DISTANCE = """module {
  func.func @main(%x: tensor<8xf32>, %s: tensor<f32>) -> tensor<8xf32> {
    %0 = stablehlo.exponential %x : tensor<8xf32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %2 = stablehlo.tanh %1 : tensor<4x8xf32>
    %3 = stablehlo.slice %2 [0:1, 0:8] : (tensor<4x8xf32>) -> tensor<1x8xf32>
    %4 = stablehlo.reshape %3 : (tensor<1x8xf32>) -> tensor<8xf32>
    %5 = stablehlo.add %0, %4 : tensor<8xf32>
    return %5 : tensor<8xf32>
  }
}
"""

SHARDED_INPUT = """module {
  func.func @main(%x: tensor<4x2xf32> {mhlo.sharding = "{devices=[1,2]0,1}"},
                  %w: tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}) -> tensor<4x2xf32> {
    %0 = stablehlo.add %x, %x : tensor<4x2xf32>
    return %0 : tensor<4x2xf32>
  }
}
"""


def measure(text, inputs=None):
    return measure_memory(load_module_text(text), inputs)


def test_chain():
    usage = measure(CHAIN, [InputSignature("x", (2, 4), "f32")])
    # weights: w 4*8*4 = 128 B; input x 2*4*4 = 32 B. Sizes: %0 64, %1 192, %2 192, %3 64.
    # live per op: dot x32+%0 64 = 96; broadcast %0+%1 = 256; tanh %1+%2 = 384;
    # slice %2+%3 = 256; return %3 = 64 -> peak 384 at the tanh (position 2).
    assert (usage.weight_bytes, usage.input_bytes, usage.weights_source) == (128, 32, FROM_SIDECAR)
    assert (usage.peak_live_bytes, usage.peak_position, usage.peak_op) == (384, 2, "stablehlo.tanh")
    assert usage.total_bytes == 128 + 384


def test_diamond():
    usage = measure(DIAMOND, [InputSignature("x", (4, 4), "f32")])
    # weights: w 64 B; x 64 B (last used by the tanh). %0 64, %1 64, %2 128, %3 128, %4 128.
    # tanh x+%0 = 128; dot %0+%1 = 128 (%0 lives on to %2); broadcast %0+%1+%2 = 256;
    # broadcast %1+%2+%3 = 320; add %2+%3+%4 = 384; return %4 = 128 -> peak 384 at the add.
    assert (usage.weight_bytes, usage.input_bytes) == (64, 64)
    assert (usage.peak_live_bytes, usage.peak_position) == (384, 4)


def test_value_kept_alive_across_a_long_distance():
    usage = measure(LONG_DISTANCE, [InputSignature("x", (8,), "f32")])
    # %0 (32 B) is read at position 0's successor and again by the add at position 5, so it is
    # live through positions 0..5. %1 128, %2 128, %3 32, %4 32, %5 32.
    # exp x+%0 = 64; broadcast %0+%1 = 160; tanh %0+%1+%2 = 288; slice %0+%2+%3 = 192;
    # reshape %0+%3+%4 = 96; add %0+%4+%5 = 96 -> peak 288 at the tanh (256 if %0 died early).
    # The scalar %s (4 B) is resident but no weight.
    assert (usage.weight_bytes, usage.scalar_bytes, usage.input_bytes) == (0, 4, 32)
    assert (usage.peak_live_bytes, usage.peak_position) == (288, 2)
    assert usage.total_bytes == 4 + 288


def test_without_sidecar_every_argument_is_a_weight():
    usage = measure(CHAIN)
    # w 128 + x 32; x is no longer an activation: dot %0 = 64 ... tanh 384 as before.
    assert (usage.weight_bytes, usage.input_bytes, usage.weights_source) == (160, 0, ALL_ARGUMENTS)
    assert usage.peak_live_bytes == 384


def test_sharded_input_matched_by_its_global_shape():
    # x: local 4x2 split on dim 1 in 2 -> global 4x4; w: local 4x2 split on dim 0 -> global 8x2.
    assert global_shape((4, 2), "{devices=[1,2]0,1}") == (4, 4)
    assert global_shape((4, 2), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}") == (8, 2)
    assert global_shape((4, 2), "{replicated}") == (4, 2)
    usage = measure(SHARDED_INPUT, [InputSignature("x", (4, 4), "f32")])
    assert (usage.input_bytes, usage.weight_bytes) == (32, 32)


def test_tiny_dump_weights_are_the_stage_parameters():
    # Stage 1 of 0-0,1-1 on one device (strategy none), tiny config (hidden 64, 4 heads of 16,
    # mlp 256, caption 64, final out 1*2*2*8 = 32), bf16 = 2 bytes per parameter.
    # Per block: qkv 64*192+192 = 12480, proj 4160, q_norm + k_norm 16+16 = 32 (spatial and
    # temporal alike), cross q 4160, cross kv 64*128+128 = 8320, cross proj 4160,
    # fc1 64*256+256 = 16640, fc2 256*64+64 = 16448, scale_shift_table 6*64 = 384 -> 66784.
    # Two blocks (one pair) 133568 + final layer 64*32+32 + 2*64 = 2208 -> 135776 parameters.
    path = "dumps/stablehlo/tiny_28_64_64_none_1x1_stage1_pairs1-1.mlir"
    usage = measure_memory(load_module(path), read_sidecar_inputs(path.replace(".mlir", ".json")))
    assert usage.weight_bytes == 2 * 135776
    # Inputs: x 2*128*64, t 2*64, t_mlp 2*384, y 1*16*64 bf16.
    assert usage.input_bytes == 2 * (2 * 128 * 64 + 2 * 64 + 2 * 384 + 16 * 64)
    assert usage.peak_live_bytes > usage.input_bytes


def test_cli_reports_memory_and_flags_capacity(tmp_path, capsys):
    dump = tmp_path / "chain.mlir"
    dump.write_text(CHAIN)
    (tmp_path / "chain.json").write_text(json.dumps(
        {"inputs": {"x": {"dtype": "float32", "shape": [2, 4]}}}))
    assert run_click(analyze_command, [str(dump), "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert (memory["weight_bytes"], memory["peak_live_bytes"], memory["total_bytes"]) == (128, 384, 512)
    assert memory["exceeds_capacity"] is None


def test_capacity_flag():
    # total 128 + 384 = 512 B (test_chain).
    inputs = [InputSignature("x", (2, 4), "f32")]
    assert measure_memory(load_module_text(CHAIN), inputs, capacity_bytes=511).exceeds_capacity is True
    assert measure_memory(load_module_text(CHAIN), inputs, capacity_bytes=512).exceeds_capacity is False
    from hardware import load_chip

    assert load_chip("tx8").dram_capacity_bytes == 16 * 2**30


def test_bad_sidecar_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"inputs": {"x": {"dtype": "complex7", "shape": [2]}}}')
    with pytest.raises(InputFileError, match="inputs.x"):
        read_sidecar_inputs(bad)
