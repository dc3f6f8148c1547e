"""Memory with fused attention (hlo_analyzer.attention_memory): an attention written out holds
its (heads x S_Q x S_KV) scores; flash-attention's tiling holds none of them. Peaks derived by
hand on small programs (f32: 4 bytes an element; arguments are weights without a sidecar, so
the live activations are the ops' results only)."""

from hlo_analyzer.attention_memory import flash_memory
from hlo_analyzer.memory import measure_memory
from hlo_analyzer.mlir import load_module_text

HEADS, S, D = 2, 64, 8
SCORES = HEADS * S * S * 4      # one (heads, S, S) f32 tensor: 32 KiB
OUTPUT = HEADS * S * D * 4      # the attention's output: 4 KiB

_QKV = f"tensor<{HEADS}x{S}x{D}xf32>"
_SS = f"tensor<{HEADS}x{S}x{S}xf32>"
_ROW = f"tensor<{HEADS}x{S}xf32>"

#: softmax(q k^T) v written out: max, subtract, exp, sum, divide between the two GEMMs.
ATTENTION = f"""module {{
  func.func @main(%q: {_QKV}, %k: {_QKV}, %v: {_QKV}) -> {_QKV} {{
    %s = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : ({_QKV}, {_QKV}) -> {_SS}
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%s init: %ninf) applies stablehlo.maximum across dimensions = [2] : ({_SS}, tensor<f32>) -> {_ROW}
    %mb = stablehlo.broadcast_in_dim %m, dims = [0, 1] : ({_ROW}) -> {_SS}
    %d = stablehlo.subtract %s, %mb : {_SS}
    %e = stablehlo.exponential %d : {_SS}
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %t = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [2] : ({_SS}, tensor<f32>) -> {_ROW}
    %tb = stablehlo.broadcast_in_dim %t, dims = [0, 1] : ({_ROW}) -> {_SS}
    %p = stablehlo.divide %e, %tb : {_SS}
    %o = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : ({_SS}, {_QKV}) -> {_QKV}
    return %o : {_QKV}
  }}
}}
"""


def test_flash_memory_holds_no_scores():
    module = load_module_text(ATTENTION)
    # written out: at the subtract, the scores, the broadcast maximum and the difference
    assert measure_memory(module).peak_live_bytes == 3 * SCORES
    # fused: scores and softmax in tiles; the peak is the output, at the value GEMM
    fused = flash_memory(module)
    assert fused.peak_live_bytes == OUTPUT
    assert fused.peak_op == "stablehlo.dot_general"


def test_a_product_without_softmax_is_not_fused():
    """Two GEMMs with a tanh between them (no exponential): nothing is held in tiles."""
    program = ATTENTION.replace("stablehlo.exponential", "stablehlo.tanh")
    module = load_module_text(program)
    assert flash_memory(module).peak_live_bytes == measure_memory(module).peak_live_bytes == 3 * SCORES
