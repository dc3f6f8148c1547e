"""A stage traced on one PipeFusion patch: 1/M of the queries, full-length K/V, in the spatial
self-attention only (tiny config, megatron on 2x2 submeshes, M = 2).

Tiny latent 28_64_64: T = 8 frames, 4 x 4 = 16 patch tokens per frame, 4 heads of 16, batch 2,
caption 8 tokens per sample. Cut in M = 2 along the height, a patch holds 2 of the 4 rows:
S_patch = 8 tokens per frame.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from hlo_analyzer import load_module  # noqa: E402
from hlo_analyzer.blocks import segment_blocks  # noqa: E402
from hlo_analyzer.mapping.pipeline import analyze_pipeline, load_plan  # noqa: E402
from hlo_analyzer.memory import measure_memory, read_sidecar_inputs  # noqa: E402
from hlo_analyzer.report import analyze  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The bundled tiny two-stage pipeline with M = 2 (docs/pipeline.md).
PIPELINE = REPO_ROOT / "dumps" / "pipeline" / "tiny_2x2_stages.toml"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipefusion")
    plan = out / "pipeline.toml"
    plan.write_text(PIPELINE.read_text())
    subprocess.run([sys.executable, "-m", "tracing.cli", "--pipeline", str(plan), "--all-stages",
                    "-o", str(out)], cwd=REPO_ROOT, check=True, capture_output=True)
    dumps = [out / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0_patch1of2.mlir",
             out / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1_patch1of2.mlir"]
    return plan, dumps


def test_patch_has_a_fraction_of_the_queries_and_full_kv_in_the_spatial_attention(traced):
    _, dumps = traced
    for dump in dumps:
        config = segment_blocks(load_module(str(dump)), str(dump)).shapes.as_dict()
        # Spatial: batch B*T = 16, queries S/M = 8, keys/values the full frame S = 16.
        assert (config["B_spt"], config["S_Q_spt"], config["S_KV_spt"]) == (16, 8, 16)
        # Temporal: a height patch holds whole temporal columns: B*S_patch = 16 sequences of
        # T = 8 frames, queries and keys alike (no stale buffer needed).
        assert (config["B_tmp"], config["S_Q_tmp"], config["S_KV_tmp"]) == (16, 8, 8)
        # Cross: the patch's 2*8*8 = 128 tokens read the 2*8 = 16 caption tokens.
        assert (config["S_Q_cro"], config["S_KV_cro"]) == (128, 16)


def test_only_spatial_attentions_get_stale_buffers(traced):
    _, dumps = traced
    sidecar = json.loads(dumps[1].with_suffix(".json").read_text())
    stale = {name: entry["shape"] for name, entry in sidecar["inputs"].items()
             if name.startswith("stale_")}
    # One spatial block in stage 1 (block 1): its K and V, (B*T, heads, S, hd) = (16, 4, 16, 16).
    assert stale == {"stale_k.1": [16, 4, 16, 16], "stale_v.1": [16, 4, 16, 16]}
    assert sidecar["pipefusion"]["S_patch"] == 8 and sidecar["pipefusion"]["S_full"] == 16
    # x of a patch: (B, T*S_patch, h) = (2, 64, 64).
    assert sidecar["inputs"]["x"]["shape"] == [2, 64, 64]
    memory = measure_memory(load_module(str(dumps[1])), read_sidecar_inputs(
        dumps[1].with_suffix(".json")))
    # The buffers are traced replicated: 2 * 16*4*16*16 * 2 bytes on each device.
    assert memory.stale_kv_bytes == 2 * 16 * 4 * 16 * 16 * 2
    # The patch stage holds the same weights as the full stage (bundled megatron stage 1 dump:
    # 73024 B per device).
    assert memory.weight_bytes == 73024


def test_pipeline_of_patch_stages(traced):
    plan, dumps = traced
    analysis = analyze_pipeline(load_plan(plan), [str(d) for d in dumps], "tx8-16")
    for stage, dump in zip(analysis.stages, dumps):
        assert stage.traced_patches == 2
        assert stage.full_s == pytest.approx(2 * stage.patch_s)
        # The dump holds one patch's collectives; a step runs both patches.
        one_patch = analyze(load_module(str(dump))).comm_bytes_per_device
        assert one_patch > 0 and stage.comm_bytes_per_device == 2 * one_patch
    # Per patch stage 0 sends its x patch 2*64*64*2 = 16384 B + t 256 + t_mlp 1536 + y 2048,
    # and the official path's t0 256 + t0_mlp 1536 + x_mask (2 x 8 frames of one byte) 16.
    assert analysis.stages[0].transfer_patch_bytes == 16384 + 256 + 1536 + 2048 + 256 + 1536 + 16
