"""Trace every strategy on tiny shapes and compare the collectives of one block pair with the
layout formula, derived by hand below.

Each trace runs ``python3 -m tracing.cli`` in its own process (torch-xla fixes its device count
per process); the dumps are made once per session.  The stage traced is stage 1 of
``--stage-ids 0-0,1-1,2-2`` of a 3-pair tiny model (hidden 64, 4 heads, TOKEN 8): exactly one
block pair, no embeddings, no final layer.

Shape 28_64_64: T = 8, S = 16, N = 128, B = 2, bf16.  A = q*B*N*h = 2*2*128*64 = 32768 bytes
(the whole (B, N, h) activation), C = q*B*TOKEN*h = 2*2*8*64 = 2048 bytes (one caption K or V).
The sequence-parallel strategies split T (frame-major tokens); 17_64_64 (T = 5, S = 16) makes
them split S (space-major), and the exchange moves from the temporal to the spatial attention.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

import networkx as nx

from hlo_analyzer import load_module  # noqa: E402
from hlo_analyzer.blocks import segment_blocks
from hlo_analyzer.dataflow import build_dataflow

REPO_ROOT = Path(__file__).resolve().parent.parent
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
TINY3_TOML = "hidden_size = 64\ndepth = 3\nnum_heads = 4\ncaption_channels = 32\nmodel_max_length = 8\n"
TINY = ["--config", "tiny", "--mesh", "2x2", "--stage-ids", "0-0,1-1", "--stage", "1"]
A, C = 32768, 2048  # bytes of the (B, N, h) activation and of one caption K or V (see above)

# name -> (strategy, trace-stage options, {kind: (count, bytes per device)} of one block pair).
# Ring volumes per device (hardware.collectives): all-reduce 2M(g-1)/g, all-gather and
# reduce-scatter M(g-1)/g of the full tensor M, all-to-all M(g-1)/g of the device's buffer M,
# collective-permute M, over a group of g devices.
CASES = {
    # 6 all-reduces (after proj, cross proj, fc2 of both blocks) of A over 4: 2*A*3/4 each.
    "megatron": ("megatron", ["--mesh", "2x2"], {"all_reduce": (6, 6 * 2 * A * 3 // 4)}),
    # 6 all-gathers (before qkv, cross q, fc1) + 6 reduce-scatters (after proj, cross proj, fc2)
    # of one batch group's A/2 over y = 2: A/2 * 1/2 each.
    "megatron_sp": ("megatron_sp", ["--mesh", "2x2"],
                    {"all_gather": (6, 6 * A // 4), "reduce_scatter": (6, 6 * A // 4)}),
    # The same, plus the LayerNorm statistics of the hidden-split residual: mean and variance of
    # norm1 and norm2 in both blocks, f32 (B/2, N, 1) = 512 bytes, all-reduced over 2: 512 each.
    "two_dimension": ("two_dimension", ["--mesh", "2x2"],
                      {"all_gather": (6, 6 * A // 4), "reduce_scatter": (6, 6 * A // 4),
                       "all_reduce": (8, 8 * 512)}),
    # q, k, v, out of the split (temporal) attention and q, out of both cross-attentions: 8
    # all-to-alls over y = 2 of the device's A/4: A/4 * 1/2 each.
    "ds_ulysses": ("ds_ulysses", ["--mesh", "2x2"], {"all_to_all": (8, 8 * A // 8)}),
    # The same 8 on 1 x 4: each device holds both samples (B/X = 2) and a quarter of the frames,
    # a buffer of A/4, all-to-all over 4: A/4 * 3/4 each.  Nothing else: the local attention and
    # the cross-attention queries keep the batch apart from the split frames (no resharding
    # over pieces of y).
    "ds_ulysses_1x4": ("ds_ulysses", ["--mesh", "1x4"], {"all_to_all": (8, 8 * A * 3 // 16)}),
    # OpenSora v1.2's sequence parallelism on 1 x 4, S split (16 / 4): only the spatial block
    # exchanges: its fused qkv (the device's 3*A/4) in one all-to-all, its attention output, its
    # cross-attention queries and output (A/4 each), over 4: (3 + 1 + 1 + 1) * A/4 * 3/4.  The
    # temporal block (every frame of the local positions) is local.
    "opensora_sp": ("opensora_sp", ["--mesh", "1x4"], {"all_to_all": (4, 6 * A * 3 // 16)}),
    # K and V once around the ring of 2: 2 permutes of A/4; caption K, V of both
    # cross-attentions all-gathered over 2: C/2 each.
    "ring_attention": ("ring_attention", ["--mesh", "2x2"],
                       {"collective_permute": (2, 2 * A // 4), "all_gather": (4, 4 * C // 2)}),
    # y = 4 = ring 2 x ulysses 2: 8 all-to-alls over 2 of A/8 (A/16 each); K, V once around the
    # ring: 2 permutes of A/8; caption K, V of the local heads (C/2) gathered over the ring: C/4.
    "usp": ("usp", ["--mesh", "2x4"],
            {"all_to_all": (8, 8 * A // 16), "collective_permute": (2, 2 * A // 8),
             "all_gather": (4, 4 * C // 4)}),
    "dp": ("dp", ["--mesh", "2x2", "--batch", "4"], {}),  # the batch must split over 4 devices
    "none": ("none", ["--mesh", "1x1"], {}),
}
# GEMM FLOPs of the pair (B = 2): 56*B*N*h^2 + 8*B*TOKEN*h^2 + 4*B*N*h*(S+T)
# + 8*(B*N)*(B*TOKEN)*h = 58720256 + 524288 + 1572864 + 2097152.
PAIR_FLOPS = 62914560
# The caption K/V projection, 4*B*TOKEN*h^2 per block, that the layouts split over y only.
CAPTION_PROJECTION = 2 * 4 * 2 * 8 * 64 * 64
#: devices x per-device GEMM FLOPs of each case (dp: batch 4 is another model size, not listed).
DEVICE_FLOPS = {
    "megatron": PAIR_FLOPS,
    "megatron_sp": PAIR_FLOPS + CAPTION_PROJECTION,  # split 2 of 4: repeated twice
    "two_dimension": PAIR_FLOPS + CAPTION_PROJECTION,
    "ds_ulysses": PAIR_FLOPS + CAPTION_PROJECTION,
    "ds_ulysses_1x4": PAIR_FLOPS,  # the caption projection split over all of y = n: no repeat
    # OpenSora projects the captions for all heads on every device: 3 of 4 devices repeat it.
    "opensora_sp": PAIR_FLOPS + 3 * CAPTION_PROJECTION,
    "ring_attention": PAIR_FLOPS + CAPTION_PROJECTION,
    "usp": PAIR_FLOPS + CAPTION_PROJECTION,  # split 4 of 8: repeated twice
    "none": PAIR_FLOPS,
}


def count_ops(module) -> Counter:
    """Op counts by short name (``stablehlo.all_reduce`` -> ``all_reduce``), walking every region."""
    counts: Counter = Counter()

    def walk(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    counts[op.operation.name.split(".", 1)[1]] += 1
                    walk(op.operation)

    walk(module.operation)
    return counts


def self_attention_collectives(module) -> dict[str, dict[str, int]]:
    """Collectives inside each self-attention, by block kind (``spatial``, ``temporal``): the ops
    that depend on its qkv projection and feed its output projection."""
    graph = build_dataflow(module)
    found = {}
    for block in segment_blocks(module).blocks:
        attention = block.self_attention
        inside = nx.descendants(graph, attention.q_proj) & nx.ancestors(graph, attention.out_proj)
        found[block.kind] = dict(Counter(
            graph.nodes[node]["name"] for node in inside if graph.nodes[node]["name"] in COLLECTIVES))
    return found


def trace(args: list[str], cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracing.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def pair_dumps(tmp_path_factory) -> dict[str, Path]:
    """One StableHLO dump of one block pair per case (traced once per test session)."""
    out = tmp_path_factory.mktemp("pair_dumps")
    config = out / "tiny3.toml"
    config.write_text(TINY3_TOML)
    dumps = {}
    for name, (strategy, options, _) in CASES.items():
        result = trace(["--config", str(config), "--shape", "28_64_64", "--stage-ids",
                        "0-0,1-1,2-2", "--stage", "1", "--strategy", strategy, *options,
                        "--path", "clean", "-o", str(out)])
        assert result.returncode == 0, result.stderr[-2000:]
        mesh = options[options.index("--mesh") + 1]
        mlir = sorted(out.glob(f"tiny3_28_64_64_{strategy}_{mesh}_stage1_pairs1-1_clean.mlir"))
        assert len(mlir) == 1, result.stderr[-2000:]
        dumps[name] = mlir[0]
    return dumps


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_pair_collectives_are_the_layout_formula(pair_dumps, name):
    """Count and bytes per kind of one pair equal the hand derivation, and the theory module's
    layout formula gives the same numbers."""
    from hlo_analyzer.report import analyze
    from models.opensora.config import STDiT3Config
    from models.opensora.theory import block_dims, layout_bytes_by_kind, layout_collectives

    strategy, options, expected = CASES[name]
    found = {kind: (entry["count"], entry["bytes_per_device"])
             for kind, entry in analyze(pair_dumps[name]).comm_by_kind.items()}
    assert found == expected, f"{name}: found {found}, expected {expected}"
    mesh = tuple(int(v) for v in options[options.index("--mesh") + 1].split("x"))
    batch = int(options[options.index("--batch") + 1]) if "--batch" in options else 2
    tiny3 = STDiT3Config(hidden_size=64, depth=3, num_heads=4, caption_channels=32,
                         model_max_length=8)
    dims = block_dims(tiny3, "28_64_64", batch=batch)
    assert layout_bytes_by_kind(strategy, dims, mesh) == {
        kind: float(volume) for kind, (_, volume) in expected.items()}
    counts: Counter = Counter()
    for term in layout_collectives(strategy, dims, mesh):
        counts[term.kind] += term.count
    assert dict(counts) == {kind: count for kind, (count, _) in expected.items()}


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEVICE_FLOPS))
def test_pair_gemm_flops_repeat_only_the_caption_projection(pair_dumps, name):
    from hlo_analyzer.report import analyze

    _, options, _ = CASES[name]
    x, y = (int(v) for v in options[options.index("--mesh") + 1].split("x"))
    assert x * y * analyze(pair_dumps[name]).totals()["gemm_flops"] == DEVICE_FLOPS[name]


@pytest.mark.trace
@pytest.mark.slow
def test_official_path_adds_only_the_collectives_of_the_recomputed_layer_norms(pair_dumps, tmp_path):
    """The pair dumps above are the clean path. OpenSora's official text-to-video path calls
    norm1(x) and norm2(x) twice in every block (STDiT3Block.forward): with the hidden axis split
    (two_dimension) every LayerNorm all-reduces its two statistics (mean, variance), so a pair has
    4 LayerNorms and 8 all-reduces more, of the same size; the projections' gathers and scatters
    and the GEMMs are unchanged."""
    from hlo_analyzer.report import analyze

    config = tmp_path / "tiny3.toml"
    config.write_text(TINY3_TOML)
    result = trace(["--config", str(config), "--shape", "28_64_64", "--stage-ids", "0-0,1-1,2-2",
                    "--stage", "1", "--strategy", "two_dimension", "--mesh", "2x2", "-o", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    official = analyze(next(tmp_path.glob("tiny3_28_64_64_two_dimension_2x2_stage1_pairs1-1.mlir")))
    clean = analyze(pair_dumps["two_dimension"])
    found = {kind: (e["count"], e["bytes_per_device"]) for kind, e in official.comm_by_kind.items()}
    expected = {kind: (e["count"], e["bytes_per_device"]) for kind, e in clean.comm_by_kind.items()}
    count, size = expected["all_reduce"]
    expected["all_reduce"] = (count + 8, size * (count + 8) // count)
    assert found == expected
    assert official.totals()["gemm_flops"] == clean.totals()["gemm_flops"]


@pytest.fixture(scope="session")
def tiny_dumps(tmp_path_factory) -> dict[str, Path]:
    """Stage-1 dumps of 0-0,1-1 on the tiny config (one pair and the final layer)."""
    out = tmp_path_factory.mktemp("tiny_dumps")
    dumps = {}
    for strategy in ("megatron", "ds_ulysses", "ring_attention", "opensora_sp"):
        result = trace([*TINY, "--strategy", strategy, "-o", str(out)])
        assert result.returncode == 0, result.stderr[-2000:]
        mlir = sorted(out.glob(f"tiny_28_64_64_{strategy}_*_stage1_pairs1-1.mlir"))
        assert len(mlir) == 1, result.stderr[-2000:]
        dumps[strategy] = mlir[0]
    return dumps


@pytest.mark.trace
@pytest.mark.slow
def test_sidecar_describes_the_dump(tiny_dumps):
    sidecar = json.loads(tiny_dumps["megatron"].with_suffix(".json").read_text())
    assert sidecar["stage"] == 1 and sidecar["blocks"] == [1, 1]
    assert sidecar["devices"] == 4 and sidecar["mesh"]["shape"] == [2, 2]
    assert sidecar["pipeline"]["strategy"] == "megatron"
    assert sidecar["dtype"] == "bfloat16"
    assert sidecar["inputs"]["x"]["shape"] == [2, 8 * 16, 64]  # (B, T*S, h) of 28_64_64
    assert sidecar["outputs"]["out"]["shape"] == [2, 8, 8, 8, 8]
    assert set(sidecar["versions"]) >= {"torch", "torch_xla", "jaxlib"}
    assert sidecar["peak_rss_bytes"] > 0 and sidecar["seconds"]["compile"] > 0
    peaks = sidecar["peak_rss_bytes_after"]  # the high-water mark at the end of each step
    assert set(peaks) == {"build", "shard", "trace", "compile", "convert"}
    # build to compile run in the trace's process: its high-water mark only rises. The
    # conversion runs in a process of its own, forked before torch loads, so its mark is its own.
    traced = [peaks[step] for step in ("build", "shard", "trace", "compile")]
    assert traced == sorted(traced)
    assert 0 < max(peaks.values()) <= sidecar["peak_rss_bytes"]


@pytest.mark.trace
@pytest.mark.slow
def test_opensora_sp_gathers_the_final_layer_input(tiny_dumps):
    """Stage 1 of 0-0,1-1 on tiny (h = 64, the shapes of A) on 2x2: the pair's 4 all-to-alls over
    y = 2 of the device's (3 + 1 + 1 + 1) * A/4 (A/4 * 1/2 per A/4), and once the final layer's
    input x (B/X, N, h) = A/2 all-gathered over y as OpenSora gathers S: A/2 * 1/2."""
    from hlo_analyzer.report import analyze
    from models.opensora.config import get_config
    from models.opensora.theory import block_dims, final_layer_collectives, layout_bytes_by_kind

    found = {kind: (entry["count"], entry["bytes_per_device"])
             for kind, entry in analyze(tiny_dumps["opensora_sp"]).comm_by_kind.items()}
    assert found == {"all_to_all": (4, 6 * A // 8), "all_gather": (1, A // 4)}
    tiny = get_config("tiny")
    dims = block_dims(tiny, "28_64_64")
    (final,) = final_layer_collectives("opensora_sp", dims, (2, 2), tiny.final_out_features)
    assert (final.kind, final.bytes_per_device) == ("all_gather", A // 4)
    assert layout_bytes_by_kind("opensora_sp", dims, (2, 2)) == {"all_to_all": 6 * A // 8}


@pytest.mark.trace
@pytest.mark.slow
def test_mhlo_dialect(tmp_path):
    result = trace([*TINY, "--strategy", "megatron", "--dialect", "mhlo", "-o", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    dump = tmp_path / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
    counts = count_ops(load_module(dump))
    assert counts["all_reduce"] == 6
    assert "mhlo.all_reduce" in dump.read_text()
    assert "[stage 1] compile:" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("wrote ")


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_check_passes(name, dtype):
    strategy, options, _ = CASES[name]
    result = trace([*TINY, "--strategy", strategy, *options, "--check", "--dtype", dtype])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "check PASS" in result.stderr


NEGATIVE_CONTROL = """
import sys
from tracing.check import run_check
from plans.config import build_config
config = build_config(config="tiny", strategy="megatron", mesh="2x2", stage_ids="0-0,1-1",
                      dtype="float32")
report = run_check(config, 1, reorder_weights=False)
print(max(report.errors.values()), report.passed)
"""


@pytest.mark.trace
@pytest.mark.slow
def test_check_fails_when_the_fused_weight_rows_are_not_reordered():
    """Negative control: the traced model reads its fused qkv / kv rows head-major; given the
    OpenSora-ordered weights unchanged, q, k and v get rows of the wrong parts and heads, and
    the check must see it (far above the 1e-4 tolerance)."""
    result = subprocess.run([sys.executable, "-c", NEGATIVE_CONTROL], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    error, passed = result.stdout.split()[-2:]
    assert passed == "False" and float(error) > 1e-2


# --- the sequence-parallel strategies in either token order ------------------------------------

SPACE_MAJOR_SHAPE = "17_64_64"  # T = 5 (2 and 4 do not divide it), S = 16
SPACE_MAJOR_CASES = [("ds_ulysses", "2x2"), ("ring_attention", "2x2"), ("ring_attention", "2x4")]


@pytest.fixture(scope="session")
def space_major_dumps(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Stage-1 dumps of the sequence-parallel strategies where they must split S."""
    out = tmp_path_factory.mktemp("space_major_dumps")
    dumps = {}
    for strategy, mesh in SPACE_MAJOR_CASES:
        result = trace([*TINY, "--shape", SPACE_MAJOR_SHAPE, "--mesh", mesh, "--strategy", strategy,
                        "-o", str(out)])
        assert result.returncode == 0, result.stderr[-2000:]
        dumps[strategy, mesh] = out / f"tiny_{SPACE_MAJOR_SHAPE}_{strategy}_{mesh}_stage1_pairs1-1.mlir"
    return dumps


# Collectives inside the split self-attention, by hand.  The exchange of the design, and one
# all-gather: the output projection flattens (B', L, h) with the sequence L split under the
# unsplit B' (B'= B*S with T split, B*T with S split), not a tile (the other EXTRAS all-gather
# is the qkv projection's, outside the attention).
# * ds_ulysses: q, k, v go sequence -> heads (3 all-to-alls), the output heads -> sequence (1).
# * ring_attention: ring-1 rotations of K and of V, one collective-permute each.
SPLIT_ATTENTION = {
    ("ds_ulysses", "2x2"): {"all_to_all": 4},
    ("ring_attention", "2x2"): {"collective_permute": 2 * (2 - 1)},
    ("ring_attention", "2x4"): {"collective_permute": 2 * (4 - 1)},
}


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ds_ulysses", "ring_attention"])
def test_frame_major_exchange_is_in_the_temporal_attention(tiny_dumps, strategy):
    """28_64_64 (T = 8): each device holds whole frames; the spatial attention is local."""
    found = self_attention_collectives(load_module(tiny_dumps[strategy]))
    assert found == {"spatial": {}, "temporal": SPLIT_ATTENTION[strategy, "2x2"]}


@pytest.mark.trace
@pytest.mark.slow
def test_opensora_sp_exchanges_only_in_the_spatial_attention(pair_dumps):
    """OpenSora's SeqParallelAttention in the spatial blocks: the fused qkv to heads and the
    output back, 2 all-to-alls; the temporal attention is plain Attention on local data."""
    found = self_attention_collectives(load_module(pair_dumps["opensora_sp"]))
    assert found == {"spatial": {"all_to_all": 2}, "temporal": {}}


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy, mesh", SPACE_MAJOR_CASES)
def test_space_major_exchange_is_in_the_spatial_attention(space_major_dumps, strategy, mesh):
    """17_64_64 (T = 5, S = 16): each device holds whole time series of S/y spatial positions,
    so the temporal attention's (B*S, T, h) is a local reshape with no collective, and the
    spatial attention's sequence S is the split one."""
    module = load_module(space_major_dumps[strategy, mesh])
    assert self_attention_collectives(module) == {"spatial": SPLIT_ATTENTION[strategy, mesh],
                                                  "temporal": {}}


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy, mesh, stage", [
    ("ds_ulysses", "2x2", "0"),  # the embeddings reorder frame-major patches to space-major
    ("ds_ulysses", "2x2", "1"),  # the final layer returns them to frame-major
    ("ring_attention", "2x2", "0"),  # the raw caption (B, 1, TOKEN, C) is a stage-0 input
    ("ring_attention", "2x2", "1"),
    ("ring_attention", "2x4", "1"),
])
def test_space_major_check_passes(strategy, mesh, stage):
    result = trace([*TINY, "--shape", SPACE_MAJOR_SHAPE, "--mesh", mesh, "--stage", stage,
                    "--strategy", strategy, "--check", "--dtype", "float32"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "check PASS" in result.stderr
