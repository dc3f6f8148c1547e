"""``analyze-hlo --exec torch`` on a tiny traced stage: one kernel per PyTorch library call.

The stage is the tiny STDiT3 (hidden 64, 4 heads, MLP 256) at 28_64_64 with batch 2: the latent
is 8 frames of 4x4 patches, so T = 8, S = 16 and N = 128 tokens per sample. Stage 0 of the split
0-0,1-1 holds the embeddings and pair 0 (one spatial and one temporal block). By hand, per block
of the official code: four LayerNorms (the text-to-video path computes norm1(x) and norm2(x)
twice, for the modulation by t and by t0), one GELU, seven biased linear layers (qkv,
proj, cross-attention q, kv and proj, fc1, fc2), one xformers cross-attention. The self-attention
is flash only when the sequence is longer than its batch: spatial L = S = 16 against B*T = 16,
temporal L = T = 8 against B*S = 32, so both run the plain product with a float32 softmax.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("torch_xla")

from pinned_cards import PINNED_H100  # noqa: E402

from hlo_analyzer.cli import analyze_command  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402

BATCH, TOKENS, HIDDEN = 2, 128, 64
H100_BANDWIDTH = 3.35e12
LAYER_NORM_EFFICIENCY = 0.55  # tests/data/h100-sxm-pinned.toml [kernel_model.vector_efficiency]
TRANSPOSE_COPY_EFFICIENCY, STRIDED_EFFICIENCY = 0.15, 0.21  # the same table


@pytest.fixture(scope="module")
def mapping(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_exec")
    subprocess.run([sys.executable, "-m", "tracing.cli", "--config", "tiny", "--strategy", "none",
                    "--mesh", "1x1", "--stage", "0", "--stage-ids", "0-0,1-1", "-o", str(out)],
                   check=True, capture_output=True)
    dump = next(out.glob("*.mlir"))
    report = out / "report.json"
    assert run_click(analyze_command, [str(dump), "--hw", PINNED_H100, "--format", "json",
                                       "-o", str(report)]) == 0
    mapping = json.loads(report.read_text())["mapping"]
    assert mapping["execution"] == "torch"  # the default for a traced model on a GPU
    return mapping


@pytest.fixture(scope="module")
def kernels(mapping):
    return [k for k in mapping["kernels"] if k["pair"] == 0]


def test_each_layer_norm_is_one_kernel(kernels):
    norms = [k for k in kernels if k["name"] == "layer_norm"]
    assert len(norms) == 8
    # reads x (B, N, h) in bfloat16 and writes it once (2 x 2*128*64*2 bytes), plus eps (a
    # float32 scalar argument, read as one element), at 0.58 of 3.35 TB/s
    expected = (2 * BATCH * TOKENS * HIDDEN * 2 + 4) / (H100_BANDWIDTH * LAYER_NORM_EFFICIENCY)
    for kernel in norms:
        assert kernel["dram_s"] == pytest.approx(expected, rel=1e-9)


def test_each_gelu_is_one_kernel(kernels):
    assert Counter(k["name"] for k in kernels)["gelu(tanh_gelu)"] == 2


def test_each_biased_linear_is_one_gemm_with_the_bias_in_its_epilogue(kernels):
    linears = [k for k in kernels if k["kind"] == "gemm" and k["name"].endswith("+linear")]
    assert len(linears) == 14
    plain = [k for k in kernels if k["kind"] == "gemm" and not k["name"].endswith("+linear")]
    assert len(plain) == 4  # the score and value products of the two plain self-attentions


def test_attention_dispatch_follows_the_official_code(kernels):
    names = Counter(k["name"] for k in kernels)
    assert names["softmax"] == 2  # both self-attentions: the plain path
    assert sum(n for name, n in names.items() if name.startswith("flash_attention")) == 2  # cross
    # the plain path's output transpose + reshape, and the temporal block's two rearranges
    assert names["copy"] == 4


def test_the_official_residual_stream_keeps_its_channel_major_layout(kernels):
    """The patch embedding's ``x.flatten(2).transpose(1, 2)`` leaves x channel-major, and PyTorch
    keeps that layout through every residual add (TensorIterator follows the first input, x).
    By hand, per block: the four LayerNorms and the cross-attention's q linear read x and copy
    it first (5 copies), and the three residual adds mix x with a contiguous update (strided):
    10 copies and 6 strided adds per pair, each copy moving x (B, N, h) bf16 twice at 0.15 of
    3.35 TB/s, each add reading two and writing one at 0.21."""
    names = Counter(k["name"] for k in kernels)
    assert names["transpose_copy(transposed input)"] == 10
    assert names["strided(add)"] == 6
    x_bytes = BATCH * TOKENS * HIDDEN * 2
    for kernel in kernels:
        if kernel["name"].startswith("transpose_copy"):
            assert kernel["dram_s"] == pytest.approx(2 * x_bytes / (H100_BANDWIDTH * TRANSPOSE_COPY_EFFICIENCY), rel=1e-9)
        if kernel["name"] == "strided(add)":
            assert kernel["dram_s"] == pytest.approx(3 * x_bytes / (H100_BANDWIDTH * STRIDED_EFFICIENCY), rel=1e-9)


def test_the_plain_attention_copies_its_permuted_operands(kernels):
    """``torch.matmul`` folds the batch axes (B', heads) of q, k and v, which the head split
    permuted: one copy of each before the score and value products of both plain
    self-attentions (6 a pair); the transpose of k for its product is no copy."""
    assert Counter(k["name"] for k in kernels)["copy(permuted input)"] == 6


def test_kernel_classes_against_their_first_principles_bound(mapping):
    """The eight LayerNorms (the stage has no final layer) by hand: each moves 65,540 bytes, whose
    bound is that at the datasheet 3.35 TB/s; the model charges them at 0.55 of it plus the 3 us
    kernel overhead of h100-sxm.toml."""
    classes = {c["class"]: c for c in mapping["classes"]}
    norms = classes["layer_norm"]
    moved = 2 * BATCH * TOKENS * HIDDEN * 2 + 4
    assert norms["kernels"] == 8
    assert norms["bound_seconds"] == pytest.approx(8 * moved / H100_BANDWIDTH, rel=1e-9)
    assert norms["seconds"] == pytest.approx(8 * (moved / (H100_BANDWIDTH * LAYER_NORM_EFFICIENCY) + 3e-6))
    assert sum(c["seconds"] for c in mapping["classes"]) == pytest.approx(mapping["totals"]["step_latency_s"])


def test_a_strategys_own_attention_code_keeps_the_official_dispatch(tmp_path):
    """ds_ulysses swaps in its einsum attention: the two cross-attentions of a pair are still the
    fused kernels OpenSora calls (the merge of their heads is the declared flash_attention call),
    the self-attentions (L <= B' on the tiny shape) still the plain product, and its 14 biased
    linears one GEMM each, even where XLA shares a broadcast between two of them."""
    subprocess.run([sys.executable, "-m", "tracing.cli", "--config", "tiny", "--strategy", "ds_ulysses",
                    "--mesh", "2x2", "--stage", "1", "--stage-ids", "0-0,1-1", "-o", str(tmp_path)],
                   check=True, capture_output=True)
    dump = next(tmp_path.glob("*.mlir"))
    report = tmp_path / "report.json"
    assert run_click(analyze_command, [str(dump), "--hw", "8xh100", "--format", "json", "-o", str(report)]) == 0
    mapping = json.loads(report.read_text())["mapping"]
    names = Counter(k["name"] for k in mapping["kernels"] if k["pair"] == 0)  # the dump's one pair
    assert sum(n for name, n in names.items() if name.startswith("flash_attention")) == 2
    assert names["softmax"] == 2
    assert sum(n for name, n in names.items() if name.endswith("+linear")) == 14
    assert names["all_to_all"] == 8
