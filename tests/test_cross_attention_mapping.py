"""--cross-attention per-sample|all: the cross-attention over flattened samples charged on one
sample's caption tokens (as OpenSora's block-diagonal kernel runs it) or on every traced key."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pinned_cards import PINNED_H100

from hlo_analyzer.cli import analyze_command
from hlo_analyzer.mapping.results import CROSS_ATTENTION_MODES, MappingOptions
from hlo_trace.cli import run_click

ROOT = Path(__file__).resolve().parent.parent
MEGATRON = ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
US = 1e-6


def analyze(capsys, *args) -> tuple[int, str, str]:
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def analyze_json(capsys, *args) -> dict:
    code, out, err = analyze(capsys, *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def flash_kernels(document: dict) -> list[dict]:
    return [k for k in document["mapping"]["kernels"] if k["kind"] == "flash_attention"]


@pytest.fixture(scope="module")
def cross_program(tmp_path_factory) -> Path:
    pytest.importorskip("jax")
    path = tmp_path_factory.mktemp("jax") / "cross_attention.stablehlo.mlir"
    subprocess.run([sys.executable, str(ROOT / "tests" / "jax_cross_attention_program.py"), str(path)],
                   check=True, capture_output=True, timeout=300)
    return path


def test_cross_attention_by_hand_in_both_modes(capsys, cross_program):
    """B = 2 samples of 1024 queries and 512 caption tokens, 2 heads of 32, f32, on one H100:
    one FlashAttention-2 kernel at the 32 kernel's 0.25 of 989.472 TFLOPS
    (132 SMs x 7.496 TFLOPS) = 247.368e12 FLOP/s, times s_kv / (s_kv + 112) for its s_kv keys
    (flash_kv_overhead), HBM at 0.78 x 3.35e12 = 2.613e12 B/s, plus the 3 us kernel overhead
    (tests/data/h100-sxm-pinned.toml):

    all: q 2 x 2048 x 32 against kv 2 x 1024 x 32: 4*2*2048*1024*32 = 536,870,912 FLOP at
        247.368e12 x 1024/1136 -> 2.407710 us; bytes 2*(2*2048 + 2*1024)*32*4 = 1,572,864 B ->
        0.601939 us; latency 5.407710 us.
    per-sample: 2 samples of q 2 x 1024 x 32 against their own kv 2 x 512 x 32:
        2*4*2*1024*512*32 = 268,435,456 FLOP at 247.368e12 x 512/624 -> 1.322545 us; bytes
        2*2*(2*1024 + 2*512)*32*4 = 1,572,864 B, the same; latency 4.322545 us.
    """
    peak = 132 * 7.496e12 * 0.25
    per_sample = analyze_json(capsys, cross_program, "--hw", PINNED_H100, "--caption-tokens", 512)
    every_key = analyze_json(capsys, cross_program, "--hw", PINNED_H100, "--caption-tokens", 512,
                             "--cross-attention", "all")
    [mine] = flash_kernels(per_sample)
    [traced] = flash_kernels(every_key)
    assert traced["flops"] == 536_870_912 and mine["flops"] == 268_435_456
    assert traced["latency_s"] == pytest.approx(3 * US + 536_870_912 / (peak * 1024 / 1136), rel=1e-9)
    assert traced["latency_s"] == pytest.approx(5.407710 * US, rel=1e-6)
    assert mine["latency_s"] == pytest.approx(3 * US + 268_435_456 / (peak * 512 / 624), rel=1e-9)
    assert mine["latency_s"] == pytest.approx(4.322545 * US, rel=1e-6)
    assert mine["dram_s"] == pytest.approx(traced["dram_s"]) == pytest.approx(1_572_864 / (3.35e12 * 0.78))
    assert "kv 2x512x32 per sample x 2" in mine["shapes"] and "kv 2x1024x32" in traced["shapes"]
    assert per_sample["mapping"]["options"] | {"dram_efficiency": None} == {
        "cross_attention": "per-sample", "caption_tokens": 512, "per_sample_attentions": 1,
        "exp_ops": 1, "dram_efficiency": None}
    assert every_key["mapping"]["options"]["cross_attention"] == "all"
    assert every_key["mapping"]["options"]["per_sample_attentions"] == 0


def test_per_sample_halves_the_cross_attention_on_tx8(capsys, cross_program):
    """On a TX8 chip the same attention is vector-bound (the f32 softmax over every score at
    1 TOPS): per sample it computes half the scores, so half the GEMM FLOPs and less time; the
    GEMM work alone bounds it below (268,435,456 FLOP / 128e12 = 2.097 us)."""
    per_sample = analyze_json(capsys, cross_program, "--hw", "tx8", "--caption-tokens", 512)
    every_key = analyze_json(capsys, cross_program, "--hw", "tx8", "--cross-attention", "all")
    [mine], [traced] = flash_kernels(per_sample), flash_kernels(every_key)
    assert mine["flops"] * 2 == traced["flops"] == 536_870_912
    assert 268_435_456 / 128e12 < mine["latency_s"] < traced["latency_s"]
    assert per_sample["mapping"]["totals"]["step_latency_s"] < every_key["mapping"]["totals"]["step_latency_s"]


def test_a_key_length_that_is_not_whole_samples_is_charged_as_traced(capsys, cross_program):
    # 1024 traced keys are not a multiple of 300: no per-sample split, the traced keys are charged
    document = analyze_json(capsys, cross_program, "--hw", PINNED_H100, "--caption-tokens", 300)
    [kernel] = flash_kernels(document)
    assert kernel["flops"] == 536_870_912 and kernel["name"] == "flash_attention"
    assert document["mapping"]["options"]["per_sample_attentions"] == 0


def test_caption_tokens_come_from_the_sidecar(capsys, tmp_path):
    """Tiny megatron stage on 4 devices: 1 local head of 16, B*N = 2*128 = 256 queries, B*TOKEN =
    2*8 = 16 traced keys; per sample 8 keys (the sidecar's model_max_length): each cross-attention
    4*1*256*8*16 = 131,072 FLOP instead of 4*1*256*16*16 = 262,144. The self-attentions keep theirs."""
    document = analyze_json(capsys, MEGATRON, "--hw", "tx8")
    options = document["mapping"]["options"]
    assert (options["cross_attention"], options["caption_tokens"], options["per_sample_attentions"]) == \
        ("per-sample", 8, 2)  # one cross-attention in each of the two blocks of the pair
    cross = [k for k in flash_kernels(document) if "per sample" in k["shapes"]]
    assert [k["flops"] for k in cross] == [131_072, 131_072]
    assert all("kv 1x8x16 per sample x 2 (traced kv 1x16x16)" in k["shapes"] for k in cross)
    traced = analyze_json(capsys, MEGATRON, "--hw", "tx8", "--cross-attention", "all")
    assert sorted(k["flops"] for k in flash_kernels(traced)) == sorted(
        [262_144, 262_144] + [k["flops"] for k in flash_kernels(document) if k not in cross])

    alone = tmp_path / MEGATRON.name
    shutil.copyfile(MEGATRON, alone)  # no sidecar next to it
    unknown = analyze_json(capsys, alone, "--hw", "tx8")
    assert unknown["mapping"]["options"]["cross_attention"] == "all"
    assert unknown["mapping"]["options"]["caption_tokens"] is None
    assert sorted(k["flops"] for k in flash_kernels(unknown)) == sorted(k["flops"] for k in flash_kernels(traced))
    code, out, _ = analyze(capsys, alone, "--hw", "tx8")
    assert code == 0 and "per-sample asked, but the caption length is unknown" in out
    given = analyze_json(capsys, alone, "--hw", "tx8", "--caption-tokens", 8)
    assert given["mapping"]["options"]["per_sample_attentions"] == 2


def test_the_default_is_what_the_docs_say():
    text = (ROOT / "docs" / "hardware.md").read_text()
    [documented] = re.findall(r"^\| `--cross-attention per-sample\\\|all` \| `([a-z-]+)` \|", text, re.MULTILINE)
    assert documented == MappingOptions().cross_attention == CROSS_ATTENTION_MODES[0] == "per-sample"
    [option] = [p for p in analyze_command.params if p.name == "cross_attention"]
    assert option.default == documented
    assert "default per-sample" in (ROOT / "docs" / "analyze_hlo.md").read_text()


def test_bad_cross_attention_options(capsys):
    with pytest.raises(ValueError, match="cross_attention must be one of per-sample, all"):
        MappingOptions(cross_attention="masked")
    with pytest.raises(ValueError, match="caption_tokens must be at least 1"):
        MappingOptions(caption_tokens=0)
    code, _, err = analyze(capsys, MEGATRON, "--hw", "tx8", "--caption-tokens", 0)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--caption-tokens" in err
