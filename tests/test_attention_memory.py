"""Memory with fused attention (hlo_analyzer.attention_memory): an attention written out holds
its (heads x S_Q x S_KV) scores; flash-attention's tiling holds none of them. Peaks derived by
hand on small programs (f32: 4 bytes an element; arguments are weights without a sidecar, so
the live activations are the ops' results only)."""

import json

import pytest

from hlo_analyzer.attention_memory import flash_memory
from hlo_analyzer.cli import analyze_command
from hlo_analyzer.memory import measure_memory
from hlo_analyzer.mlir import load_module_text
from hlo_trace.cli import run_click

HEADS, D = 2, 8
#: a short sequence, and HunyuanVideo's joint sequence at 129 x 720 x 1280 (118,800 video tokens
#: and 256 text tokens): only shapes are read, nothing is allocated
LENGTHS = (64, 119_056)


def attention(s: int) -> str:
    """softmax(q k^T) v written out over ``s`` tokens: max, subtract, exp, sum, divide between
    the two GEMMs."""
    qkv, ss, row = f"tensor<{HEADS}x{s}x{D}xf32>", f"tensor<{HEADS}x{s}x{s}xf32>", f"tensor<{HEADS}x{s}xf32>"
    return f"""module {{
  func.func @main(%q: {qkv}, %k: {qkv}, %v: {qkv}) -> {qkv} {{
    %s = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : ({qkv}, {qkv}) -> {ss}
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%s init: %ninf) applies stablehlo.maximum across dimensions = [2] : ({ss}, tensor<f32>) -> {row}
    %mb = stablehlo.broadcast_in_dim %m, dims = [0, 1] : ({row}) -> {ss}
    %d = stablehlo.subtract %s, %mb : {ss}
    %e = stablehlo.exponential %d : {ss}
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %t = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [2] : ({ss}, tensor<f32>) -> {row}
    %tb = stablehlo.broadcast_in_dim %t, dims = [0, 1] : ({row}) -> {ss}
    %p = stablehlo.divide %e, %tb : {ss}
    %o = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : ({ss}, {qkv}) -> {qkv}
    return %o : {qkv}
  }}
}}
"""


@pytest.mark.parametrize("s", LENGTHS)
def test_flash_memory_holds_no_scores(s):
    scores = HEADS * s * s * 4      # one (heads, S, S) f32 tensor (at 119,056 tokens: 113 GB)
    output = HEADS * s * D * 4      # the attention's output
    module = load_module_text(attention(s))
    # written out: at the subtract, the scores, the broadcast maximum and the difference
    assert measure_memory(module).peak_live_bytes == 3 * scores
    # fused: scores and softmax in tiles; the peak is the output, at the value GEMM
    fused = flash_memory(module)
    assert fused.peak_live_bytes == output
    assert fused.peak_op == "stablehlo.dot_general"


def test_a_product_without_softmax_is_not_fused():
    """Two GEMMs with a tanh between them (no exponential): nothing is held in tiles."""
    module = load_module_text(attention(64).replace("stablehlo.exponential", "stablehlo.tanh"))
    assert flash_memory(module).peak_live_bytes == measure_memory(module).peak_live_bytes == 3 * HEADS * 64 * 64 * 4


@pytest.mark.parametrize("hw", [None, "h100-sxm"])
def test_analyze_hlo_reports_the_fused_memory(tmp_path, capsys, hw):
    """``analyze-hlo --attention-memory fused`` (without --hw, and with it, on the mapping's
    dataflow graph): the memory section is the fused one and says so; written is the default."""
    dump = tmp_path / "attention.mlir"
    dump.write_text(attention(64))
    extra = [] if hw is None else ["--hw", hw]
    assert run_click(analyze_command, [str(dump), "--format", "json", *extra]) == 0
    written = json.loads(capsys.readouterr().out)["memory"]
    assert written["peak_live_bytes"] == 3 * HEADS * 64 * 64 * 4 and "attention" not in written
    assert run_click(analyze_command, [str(dump), "--format", "json", "--attention-memory", "fused",
                                       *extra]) == 0
    fused = json.loads(capsys.readouterr().out)["memory"]
    assert fused["peak_live_bytes"] == HEADS * 64 * D * 4 and fused["attention"] == "fused"


def test_the_fused_section_reads_back_and_a_bad_attention_is_one_line():
    """The report's memory section, written with ``attention: fused``, reads back typed
    (``MemorySection.from_dict``); an attention that is neither way is the file's error."""
    from hlo_analyzer.memory import MemorySection
    from hlo_trace.errors import InputFileError

    section = MemorySection(flash_memory(load_module_text(attention(64))), None, attention="fused")
    document = json.loads(json.dumps(section.to_dict()))
    assert document["attention"] == "fused"
    assert MemorySection.from_dict(document, "report.json") == section
    with pytest.raises(InputFileError, match=r"^report.json: memory.attention is 'tiled'"):
        MemorySection.from_dict(document | {"attention": "tiled"}, "report.json")
