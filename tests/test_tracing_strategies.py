"""Trace every strategy on the tiny config (2x2 mesh) and count the collectives in the dump.

Each trace runs ``python3 -m tracing.cli`` in its own process (torch-xla fixes its device count
per process); the dumps are made once per session.  The stage traced is stage 1 of
``--stage-ids 0-0,1-1``: one block pair (block 1: a spatial and a temporal block) plus the final
layer, so the counts below are per block pair unless said otherwise.

Expected counts come from each strategy's design; what GSPMD adds beyond it is listed with the
reason (EXTRAS), so a change in either shows up here.

The default shape 28_64_64 has T = 8 and S = 16, so the sequence-parallel strategies split T
(frame-major tokens).  17_64_64 has T = 5, which 2 does not divide, and S = 16: there they split S
(space-major tokens), and the exchange moves from the temporal to the spatial attention.
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
TINY = ["--config", "tiny", "--mesh", "2x2", "--stage-ids", "0-0,1-1", "--stage", "1"]
STRATEGY_ARGS = {
    "megatron": [], "two_dimension": [], "ds_ulysses": [], "ring_attention": [],
    "dp": ["--batch", "4"],  # the batch must split over the 4 devices
    "none": ["--mesh", "1x1"],
}

# What each strategy must produce in one block pair (2 self-attentions, 2 cross-attentions,
# 2 MLPs), from its design.
INTENDED = {
    # one all-reduce after each self-attention, cross-attention and MLP: 3 per block
    "megatron": {"all_reduce": 6},
    # an all-gather of the hidden features before each column-split linear (qkv, cross q, fc1)
    # and a reduce-scatter after each row-split one (proj, cross proj, fc2): 3 + 3 per block.
    # The CPU backend of XLA never forms reduce-scatter ops: GSPMD writes each one as an
    # all-reduce followed by a dynamic-slice of the device's part (checked below).
    "two_dimension": {"all_gather": 6, "all_reduce": 6},
    # the temporal attention's sequence is split: q, k, v go sequence -> heads and the output
    # heads -> sequence (4 all-to-alls); the spatial and cross attentions are local
    "ds_ulysses": {"all_to_all": 4},
    # ring of 2 on y: ring-1 = 1 rotation of K and 1 of V in the temporal attention
    "ring_attention": {"collective_permute": 2},
    "dp": {},
    "none": {},
}

# What GSPMD inserts beyond the design, and why.
EXTRAS = {
    "megatron": {
        # OpenSora's fused qkv weight orders its rows (3, heads, head_dim): a contiguous column
        # split gives a device q/k/v rows of different heads, so after the (local) qkv matmul
        # GSPMD all-gathers the (B', L, 3h) output and slices out the device's heads; 1 per
        # self-attention.
        "all_gather": 2,
        # the same for the cross-attention's fused kv (rows ordered (2, heads, head_dim)): GSPMD
        # reshards the kv output with one all-to-all plus one collective-permute per
        # cross-attention.
        "all_to_all": 2, "collective_permute": 2,
    },
    "two_dimension": {
        # the fused qkv row order, as for megatron (1 per self-attention) ...
        "all_gather": 2,
        # ... and the fused kv row order (1 all-to-all per cross-attention)
        "all_to_all": 2,
        # LayerNorm over hidden features split on y: mean and variance are each summed with an
        # f32 all-reduce of (B*N/x, 1): 2 per norm, 2 norms per block, plus the final layer's
        # norm (2) and its linear, whose input features are split (1 partial-sum all-reduce).
        "all_reduce": 2 * 2 * 2 + 2 + 1,
    },
    "ds_ulysses": {
        # the temporal block's qkv and proj linears flatten (B*S, T, h) to (B*S*T, h); T split
        # under an unsplit S is not a contiguous tile of that axis, so GSPMD all-gathers T and
        # runs these two linears on the whole sequence: 2 per temporal block.
        "all_gather": 2,
    },
    "ring_attention": {"all_gather": 2},  # the same two linears as ds_ulysses
    "dp": {},
    "none": {},
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
def tiny_dumps(tmp_path_factory) -> dict[str, Path]:
    """One StableHLO dump per strategy (traced once per test session)."""
    out = tmp_path_factory.mktemp("tiny_dumps")
    dumps = {}
    for strategy, extra in STRATEGY_ARGS.items():
        result = trace([*TINY, "--strategy", strategy, *extra, "-o", str(out)])
        assert result.returncode == 0, result.stderr[-2000:]
        mlir = sorted(out.glob(f"tiny_28_64_64_{strategy}_*_stage1_pairs1-1.mlir"))
        assert len(mlir) == 1, result.stderr[-2000:]
        dumps[strategy] = mlir[0]
    return dumps


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGY_ARGS))
def test_collectives_match_the_strategy(tiny_dumps, strategy):
    counts = count_ops(load_module(tiny_dumps[strategy]))
    expected = Counter(INTENDED[strategy]) + Counter(EXTRAS[strategy])
    found = {kind: counts[kind] for kind in COLLECTIVES if counts[kind]}
    assert found == dict(expected), f"{strategy}: found {found}, expected {dict(expected)}"


@pytest.mark.trace
@pytest.mark.slow
def test_two_dimension_reduce_scatters_are_all_reduce_plus_slice(tiny_dumps):
    """Each of the 6 bf16 all-reduces after a row-split linear feeds a dynamic-slice (the
    reduce-scatter pattern); the 11 others (f32 norm statistics, final linear) are plain sums."""
    module = load_module(tiny_dumps["two_dimension"])
    sliced = 0
    main = next(op for op in module.body.operations if "main" in str(op.attributes["sym_name"]))
    for op in main.regions[0].blocks[0].operations:
        if op.operation.name.endswith("all_reduce"):
            users = {use.owner.name for use in op.result.uses}
            sliced += any(name.endswith("dynamic_slice") for name in users)
    assert sliced == INTENDED["two_dimension"]["all_reduce"]


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
@pytest.mark.parametrize("strategy", list(STRATEGY_ARGS))
def test_check_passes(strategy):
    result = trace([*TINY, "--strategy", strategy, *STRATEGY_ARGS[strategy], "--check",
                    "--dtype", "float32"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "check PASS" in result.stderr


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
    ("ds_ulysses", "2x2"): {"all_to_all": 4, "all_gather": 1},
    ("ring_attention", "2x2"): {"collective_permute": 2 * (2 - 1), "all_gather": 1},
    ("ring_attention", "2x4"): {"collective_permute": 2 * (4 - 1), "all_gather": 1},
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
@pytest.mark.parametrize("strategy, mesh", SPACE_MAJOR_CASES)
def test_space_major_exchange_is_in_the_spatial_attention(space_major_dumps, strategy, mesh):
    """17_64_64 (T = 5, S = 16): each device holds whole time series of S/y spatial positions,
    so the temporal attention's (B*S, T, h) is a local reshape with no collective, and the
    spatial attention's sequence S is the split one."""
    module = load_module(space_major_dumps[strategy, mesh])
    assert self_attention_collectives(module) == {"spatial": SPLIT_ATTENTION[strategy, mesh],
                                                  "temporal": {}}
    # As many of each kind in the whole stage as frame-major: the same exchange, moved to the
    # spatial attention, and the same two EXTRAS all-gathers, now around the spatial qkv and proj.
    counts = count_ops(module)
    found = {kind: counts[kind] for kind in COLLECTIVES if counts[kind]}
    expected = dict(SPLIT_ATTENTION[strategy, mesh], all_gather=EXTRAS[strategy]["all_gather"])
    assert found == expected


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy, mesh, stage", [
    ("ds_ulysses", "2x2", "0"),  # the embeddings reorder frame-major patches to space-major
    ("ds_ulysses", "2x2", "1"),  # the final layer returns them to frame-major
    ("ring_attention", "2x2", "1"),
    ("ring_attention", "2x4", "1"),
])
def test_space_major_check_passes(strategy, mesh, stage):
    result = trace([*TINY, "--shape", SPACE_MAJOR_SHAPE, "--mesh", mesh, "--stage", stage,
                    "--strategy", strategy, "--check", "--dtype", "float32"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "check PASS" in result.stderr
