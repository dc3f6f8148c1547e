"""analyze-hlo --hw maps every op of any dump: a JAX transformer block, the bundled example and the
STDiT3 stage dumps; latencies derived by hand on TX8 (numbers of hardware/data/tx8.toml: 16 tiles,
8e12 FLOP/s GEMM and 62.5e9 op/s vector per tile, DRAM 1e11 B/s shared, DRAM latency 0.1 us, NoC
hop 0.01 us, double buffering; latency = the longest chain of hardware/kernel_mapping.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pinned_cards import PINNED_A100, tx8_bound_toml

from hardware import Op, OpType, gemm_auto_opt_mapper, load_chip, map_block
from hlo_analyzer.blocks import segment_blocks
from hlo_analyzer.cli import analyze_command
from hlo_analyzer.dataflow import build_dataflow
from hlo_analyzer.mlir import load_module
from hlo_analyzer.pairs import pair_owners
from hlo_trace.cli import run_click
from hlo_trace.examples import example_dump
from models.opensora.block_ops import build_stdit_block_ops

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = example_dump()
RING = ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_ring_attention_2x2_stage1_pairs1-1.mlir"
US = 1e-6


def analyze_json(capsys, *args) -> dict:
    code = run_click(analyze_command, [str(a) for a in args] + ["--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@pytest.fixture(scope="module")
def jax_block(tmp_path_factory) -> Path:
    pytest.importorskip("jax")
    path = tmp_path_factory.mktemp("jax") / "block_after_spmd.hlo.txt"
    subprocess.run([sys.executable, str(ROOT / "tests" / "jax_block_program.py"), str(path)], check=True,
                   capture_output=True, timeout=300)
    return path


def kernel_at(document: dict, position: int) -> dict:
    [kernel] = [k for k in document["mapping"]["kernels"] if k["position"] == position]
    return kernel


@pytest.mark.parametrize("hardware", ["tx8", "h100-sxm"])
@pytest.mark.parametrize("execution", ["eager", "fused"])
def test_every_gemm_and_vector_op_of_a_jax_block_gets_a_latency(capsys, jax_block, hardware, execution):
    document = analyze_json(capsys, jax_block, "--hw", hardware, "--exec", execution)
    measured = {op["position"] for op in document["ops"] if op["category"] in ("gemm", "vector")}
    assert len([op for op in document["ops"] if op["category"] == "gemm"]) == 6  # qkv, 2 attn, o, fc1, fc2
    kernels = document["mapping"]["kernels"]
    assert all(k["latency_s"] > 0 and math.isfinite(k["latency_s"]) for k in kernels)
    covered = set()
    for kernel in kernels:
        covered |= set(kernel["hlo_positions"])
    assert measured <= covered, sorted(measured - covered)
    system = document["mapping"]["system"]
    assert system["chips"] == 8 and system["chip"] == hardware and "8 " + hardware in system["assumed"]
    # the attention (two GEMMs and the softmax between them) is one flash-attention kernel
    assert [k["kind"] for k in kernels].count("flash_attention") == 1
    totals = document["mapping"]["totals"]
    assert totals["step_latency_s"] == pytest.approx(sum(k["latency_s"] for k in kernels), rel=1e-12)
    # A JAX transformer block is no STDiT3 stage: its total is one run, not 30 diffusion steps
    # (issue 26), and the report says so.
    assert "blocks" not in document
    assert (totals["steps"], totals["total_basis"], totals["pairs_total"]) == (1, "one-run", None)
    assert totals["inference_latency_s"] == pytest.approx(sum(k["latency_s"] for k in kernels), rel=1e-12)


@pytest.fixture
def tx8_bound(tmp_path):
    """TX8 whose GEMMs go to the tile mappers' search (the bound): tests/pinned_cards.py."""
    path = tmp_path / "tx8_bound.toml"
    path.write_text(tx8_bound_toml(), encoding="utf-8")
    return str(path)


def test_hand_derived_gemm_and_vector_latency_on_tx8(capsys, jax_block, tx8_bound):
    """Eager kernels of the f32 block on one TX8 chip (its share of the 8-way data parallel batch).

    qkv GEMM (64 x 128) @ (128 x 384), f32: A 32768 B + B 196608 B + C 98304 B = 327680 B, each read
    or written once: 3.2768 us at 1e11 B/s, far above the compute (6.29 MFLOP / 128e12 = 0.049 us),
    so DRAM bound. The search splits M and K over 2 x 2 tiles (one NoC hop) and streams N in 16-wide
    blocks: per tile 2*32*64*384 FLOP / 8e12 = 0.196608 us over 24 steps = 8.192 ns per step.
    DRAM chain = 0.1 (DRAM latency) + 0.01 (hop) + 3.2768 + 0.008192 + 0.1 = 3.494992 us; it can not
    be below 0.1 + 3.2768 + 0.1 = 3.4768 us on any tiling.

    Last residual add (1, 64, 128) f32 + (1, 64, 128): 64 rows over 16 tiles, 4 rows each; DRAM
    64 * (2 * 512 + 512) B = 98304 B -> 0.98304 us; vector 128 * 4 / 62.5e9 = 8.192 ns per tile.
    One-row chunks (4 steps): DRAM chain = 0.1 + 0.98304 + 0.002048 + 0.1 = 1.185088 us, above the
    compute chain (0.1 + 0.16384 + 0.008192 + 0.1 + 0.08192 = 0.45395 us) and the latency chain
    (4 * 0.1 + 0.002048 + 0.18192 = 0.58397 us); larger chunks only lengthen the DRAM chain.
    """
    document = analyze_json(capsys, jax_block, "--hw", tx8_bound, "--exec", "eager")
    rows = document["ops"]
    qkv = next(op for op in rows if op["category"] == "gemm" and op["result_shapes"] == [[1, 64, 384]])
    last_add = [op for op in rows if op["category"] == "vector"][-1]
    assert last_add["op"].endswith("add") and last_add["result_shapes"] == [[1, 64, 128]]
    gemm = kernel_at(document, qkv["position"])
    assert gemm["latency_s"] == pytest.approx(3.494992 * US, rel=1e-9)
    assert gemm["latency_s"] >= 3.4768 * US and gemm["bound"] == "dram"
    vector = kernel_at(document, last_add["position"])
    assert vector["latency_s"] == pytest.approx(1.185088 * US, rel=1e-9) and vector["bound"] == "dram"
    # half the DRAM bandwidth sustained: 0.2 + 1.96608 + 0.002048 = 2.168128 us
    slow = analyze_json(capsys, jax_block, "--hw", tx8_bound, "--exec", "eager", "--dram-efficiency", "0.5")
    assert kernel_at(slow, last_add["position"])["latency_s"] == pytest.approx(2.168128 * US, rel=1e-9)


def test_fused_execution_reads_a_layernorm_input_once(capsys, jax_block):
    """Fused: the first LayerNorm (reduce, divide, subtract, square, reduce, divide, add, rsqrt,
    multiply) is one kernel that reads x (64 x 128 f32 = 32 KiB) once and writes h once; eager runs
    nine kernels over the same ops, so fused vector time is below eager's."""
    fused = analyze_json(capsys, jax_block, "--hw", "tx8")
    eager = analyze_json(capsys, jax_block, "--hw", "tx8", "--exec", "eager")
    first_gemm = min(op["position"] for op in fused["ops"] if op["category"] == "gemm")
    before = [k for k in fused["mapping"]["kernels"] if k["position"] < first_gemm]
    assert len(before) == 1 and before[0]["kind"] == "vector"
    assert before[0]["shapes"] == "1x64x128->1x64x128"
    assert fused["mapping"]["execution"] == "fused" and eager["mapping"]["execution"] == "eager"
    assert fused["mapping"]["totals"]["seconds_by_kind"]["vector"] < \
        eager["mapping"]["totals"]["seconds_by_kind"]["vector"]


def test_chip_name_on_a_multi_device_dump_is_a_system_of_that_many_chips(capsys):
    document = analyze_json(capsys, EXAMPLE, "--hw", "tx8")
    system = document["mapping"]["system"]
    assert (system["chips"], system["dump_devices"], system["topology"], system["grid"]) == (4, 4, "mesh2d", "2x2")
    assert "4 tx8 chips" in system["assumed"]
    larger = analyze_json(capsys, EXAMPLE, "--hw", "tx8-16")["mapping"]["system"]
    assert larger["chips"] == 16 and "larger than the dump's 4 devices" in larger["assumed"]


def test_a_system_smaller_than_the_dump_is_a_one_line_error(capsys, tmp_path):
    small = tmp_path / "tx8-2.toml"
    small.write_text('kind = "system"\nname = "tx8-2"\nchip = "tx8"\nchip_count = 2\n'
                     'topology = "ring"\nlink_bandwidth = "50 GB/s"\nhop_latency = "1 us"\n')
    code = run_click(analyze_command, [str(EXAMPLE), "--hw", str(small)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "spans 4 devices but tx8-2 has 2 chip(s)" in err


def test_network_overrides_and_one_comm_latency_figure(capsys):
    """The example's one all-reduce: 4 x 16 f32 = 256 B over the group {0, 1} of a 2 x 2 mesh.
    Ring: each device sends 2 * 256 * (2-1)/2 = 256 B (and receives as much) in 2 steps of 1 hop.
    TX8's default network (tx8-16.toml) stages transfers through the chip's 1e11 B/s DRAM:
    (256 + 256) B / 1e11 = 5.12 ns, above the 100 GB/s links' 2.56 ns; with 0.5 us per hop:
    5.12 ns + 2 * 1 * 0.5 us = 1.00512 us."""
    document = analyze_json(capsys, EXAMPLE, "--hw", "tx8", "--link-bandwidth", "100", "--hop-latency", "0.5")
    system = document["mapping"]["system"]
    assert system["link_bandwidth_bytes_per_s"] == 100e9 and system["hop_latency_s"] == pytest.approx(0.5 * US)
    assert "network overridden: link bandwidth 100 GB/s, hop latency 0.5 us" in system["assumed"]
    assert document["totals"]["comm_latency_s"] == pytest.approx(1.00512 * US, rel=1e-9)
    [collective] = [k for k in document["mapping"]["kernels"] if k["kind"] == "collective"]
    assert collective["latency_s"] == document["totals"]["comm_latency_s"]
    assert document["mapping"]["totals"]["seconds_by_kind"]["collective"] == document["totals"]["comm_latency_s"]
    assert "comm_latency_s" not in document["mapping"]["totals"]


def test_pair_view_charges_the_traced_shapes_not_the_dictionary(capsys):
    """Ring attention stage, eager: every labelled GEMM of pair 0 is charged what the GEMM mapper
    gives for its traced (M, K, N); a hand-built "ideal" dictionary with a quarter of the tokens changes the
    reference pair but not the pair view, whose total is the sum of the traced kernels."""
    document = analyze_json(capsys, RING, "--hw", "tx8", "--exec", "eager")  # no epilogues
    chip = load_chip("tx8")
    rows = {op["position"]: op for op in document["ops"]}
    kernels = {k["position"]: k for k in document["mapping"]["kernels"]}
    for label in ("qkv", "proj", "cross_q", "cross_kv", "cross_proj", "fc2"):
        [position] = document["blocks"]["labels"][0]["ops"][label]
        lhs, rhs = rows[position]["operand_shapes"]
        # The block linears are einsums x (.., k) . W (n, k) -> (.., n); a square W reads alike.
        m, k = math.prod(lhs[:-1]), lhs[-1]
        n = rhs[0] if rhs[-1] == k else rhs[-1]
        expected = gemm_auto_opt_mapper(Op(label, OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * m * k * n), chip)
        assert kernels[position]["pair"] == 0
        assert kernels[position]["latency_s"] == pytest.approx(expected.latency_s, rel=1e-12)
    pair0 = next(p for p in document["mapping"]["pairs"] if p["pair"] == 0)
    assert pair0["latency_s"] == pytest.approx(
        sum(k["latency_s"] for k in document["mapping"]["kernels"] if k["pair"] == 0), rel=1e-12)

    module = load_module(RING)
    graph = build_dataflow(module)
    segmentation = segment_blocks(module, graph=graph)
    ideal = replace(segmentation.shapes, B_spt=segmentation.shapes.B_spt // 4)
    hand_built = replace(segmentation, shapes=ideal, per_pair_shapes=[ideal])
    assert pair_owners(graph, hand_built) == pair_owners(graph, segmentation)
    assert map_block(build_stdit_block_ops(ideal), chip).latency_s < \
        document["mapping"]["reference"]["pair_latency_s"]


@pytest.mark.parametrize("hardware", ["h100-sxm", "tx8"])
def test_a_program_that_is_no_stdit3_stage_totals_one_run(capsys, hardware):
    """Issue 26: by default the total of any program but an STDiT3 stage is one run of it, the
    sum of its kernels; --steps N asks for N runs; the text report names the total it prints."""
    mapping = analyze_json(capsys, EXAMPLE, "--hw", hardware)["mapping"]
    kernels_s = sum(kernel["latency_s"] for kernel in mapping["kernels"])
    totals = mapping["totals"]
    assert (totals["steps"], totals["total_basis"]) == (1, "one-run")
    assert totals["inference_latency_s"] == pytest.approx(kernels_s, rel=1e-12)
    assert totals["inference_comm_s"] == pytest.approx(
        sum(k["latency_s"] for k in mapping["kernels"] if k["kind"] == "collective"), rel=1e-12)
    assert totals["total"].startswith("one run of the program (not an STDiT3 stage")
    asked = analyze_json(capsys, EXAMPLE, "--hw", hardware, "--steps", "5")["mapping"]["totals"]
    assert (asked["steps"], asked["total_basis"]) == (5, "steps")
    assert asked["inference_latency_s"] == pytest.approx(5 * kernels_s, rel=1e-12)
    assert run_click(analyze_command, [str(EXAMPLE), "--hw", hardware]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  total, ")]
    assert line.startswith("  total, one run of the program (not an STDiT3 stage; --steps N totals N runs):")


def test_an_stdit3_stage_totals_a_diffusion_inference_by_default(capsys):
    totals = analyze_json(capsys, RING, "--hw", "tx8")["mapping"]["totals"]
    assert (totals["steps"], totals["total_basis"], totals["pairs_total"]) == (30, "diffusion", 1)
    assert totals["total"].startswith("diffusion inference, 1 pairs x 30 sampling steps (the STDiT3 default")
    asked = analyze_json(capsys, RING, "--hw", "tx8", "--steps", "1")["mapping"]["totals"]
    assert (asked["steps"], asked["total_basis"]) == (1, "steps")
    assert asked["inference_latency_s"] == pytest.approx(totals["inference_latency_s"] / 30, rel=1e-12)


def test_pairs_scale_the_inference(capsys):
    one = analyze_json(capsys, RING, "--hw", "tx8")["mapping"]
    many = analyze_json(capsys, RING, "--hw", "tx8", "--pairs", "28")["mapping"]
    outside = sum(p["latency_s"] for p in one["pairs"] if p["pair"] is None)
    inside = sum(p["latency_s"] for p in one["pairs"] if p["pair"] is not None)
    assert many["totals"]["pairs_total"] == 28 and one["totals"]["pairs_found"] == 1
    assert many["totals"]["inference_latency_s"] == pytest.approx(30 * (outside + 28 * inside), rel=1e-12)


SLICE_WRITE = """func.func @main(%stale: tensor<4x16x8xbf16>, %u: tensor<4x4x8xbf16>, %p: tensor<4x4x8xi1>)
    -> (tensor<4x8x16xbf16>, tensor<4x16x8xbf16>) {
  %t = stablehlo.constant dense<true> : tensor<i1>
  %f = stablehlo.constant dense<false> : tensor<i1>
  %z = stablehlo.constant dense<0.0> : tensor<bf16>
  %b = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<i1>) -> tensor<4x4x8xi1>
  %m = stablehlo.pad %b, %f, low = [0, 4, 0], high = [0, 8, 0], interior = [0, 0, 0] : (tensor<4x4x8xi1>, tensor<i1>) -> tensor<4x16x8xi1>
  %d = stablehlo.pad %u, %z, low = [0, 4, 0], high = [0, 8, 0], interior = [0, 0, 0] : (tensor<4x4x8xbf16>, tensor<bf16>) -> tensor<4x16x8xbf16>
  %w = stablehlo.select %m, %d, %stale : tensor<4x16x8xi1>, tensor<4x16x8xbf16>
  %r = stablehlo.transpose %w, dims = [0, 2, 1] : (tensor<4x16x8xbf16>) -> tensor<4x8x16xbf16>
  %pm = stablehlo.pad %p, %f, low = [0, 4, 0], high = [0, 8, 0], interior = [0, 0, 0] : (tensor<4x4x8xi1>, tensor<i1>) -> tensor<4x16x8xi1>
  %s = stablehlo.select %pm, %d, %stale : tensor<4x16x8xi1>, tensor<4x16x8xbf16>
  return %r, %s : tensor<4x8x16xbf16>, tensor<4x16x8xbf16>
}
"""


def test_fused_slice_write_touches_only_the_update(capsys, tmp_path):
    """torch's slice_scatter (the PipeFusion stale K/V write) lowers to select(pad(true),
    pad(update), buffer): fused, it writes the 4x4x8 bf16 update in place, reading 256 B and
    writing 256 B: 512 B / 1e11 B/s = 5.12 ns of DRAM, not the whole 4x16x8 buffer (nor its
    transpose, fused with it, as K's is for the score GEMM). The same select
    under a mask read from an argument (not a constant slice) reads and writes everything."""
    dump = tmp_path / "slice_write.mlir"
    dump.write_text(SLICE_WRITE)
    document = analyze_json(capsys, dump, "--hw", "tx8")
    write, masked = sorted(document["mapping"]["kernels"], key=lambda k: k["position"])
    assert write["shapes"] == "4x4x8->4x4x8"
    assert write["dram_s"] == pytest.approx(512 / 1e11, rel=1e-12)
    assert masked["dram_s"] > 4 * write["dram_s"]
    eager = analyze_json(capsys, dump, "--hw", "tx8", "--exec", "eager")
    assert min(k["dram_s"] for k in eager["mapping"]["kernels"]) > 4 * write["dram_s"]


BATCHED_DOT = """func.func @main(%a: tensor<16x16x16xbf16>, %b: tensor<16x16x16xbf16>) -> tensor<16x16x16xbf16> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1]
       : (tensor<16x16x16xbf16>, tensor<16x16x16xbf16>) -> tensor<16x16x16xbf16>
  return %0 : tensor<16x16x16xbf16>
}
"""


@pytest.mark.parametrize("execution", ["eager", "fused"])
def test_a_batched_dot_general_is_one_kernel_with_one_launch(capsys, tmp_path, execution, tx8_bound):
    """16 heads of 16x16x16 bf16 are one kernel. TX8 (tests/test_mappers.py derives it): 16 tiles
    each run one head, 0.446784 us (one after another: 16 x 0.216384 us). A100
    (tests/test_kernel_model.py): 16 CTAs in one wave of 64x64 tiles, 1.0424 us of L2 feed plus
    one kernel overhead of 3 us (instance by instance: 16 x 4.0424 us)."""
    dump = tmp_path / "batched.mlir"
    dump.write_text(BATCHED_DOT)
    feed = (64 + 64) * 272 * 2 / 66.8e9
    for hardware, latency in ((tx8_bound, 0.446784 * US), (PINNED_A100, 3 * US + feed)):
        [kernel] = analyze_json(capsys, dump, "--hw", hardware, "--exec", execution)["mapping"]["kernels"]
        assert kernel["kind"] == "gemm" and kernel["flops"] == 16 * 2 * 16**3
        assert kernel["latency_s"] == pytest.approx(latency, rel=1e-9)
        if hardware == PINNED_A100:  # exactly one overhead: the rest is the kernel's compute
            assert kernel["latency_s"] - kernel["compute_s"] == pytest.approx(3 * US, rel=1e-9)


USP = ROOT / "dumps" / "split" / "tiny_102_256_256_usp_2x4_stage0_pairs0-0.mlir"


@pytest.mark.parametrize(("hardware", "execution"), [("tx8", "fused"), ("8xh100", "torch")])
def test_each_block_of_a_ring_attention_is_one_fused_kernel(capsys, hardware, execution):
    """usp's spatial attention is a ring of 2 (the 2x4 mesh's x axis): each block's probabilities
    also depend on the earlier block's scores, through the running row maximum of the online
    softmax. Each block is one fused kernel over its own keys (as traced: 60 (batch x heads)
    instances of 128 queries against 128 keys, head dim 16), and the two share no op."""
    document = analyze_json(capsys, USP, "--hw", hardware, "--exec", execution)
    ring = [k for k in document["mapping"]["kernels"] if k["kind"] == "flash_attention" and k["pair"] == 0
            and k["shapes"].startswith("q 60x128x16, kv 60x128x16")]
    assert len(ring) == 2
    assert set(ring[0]["hlo_positions"]).isdisjoint(ring[1]["hlo_positions"])
