"""Generic transformer blocks (hlo_analyzer.transformer_blocks) in a program nobody here traced
with torch: a Llama-style decoder written in JAX (tests/jax_decoder_program.py: RMSNorm,
grouped-query attention whose score and value products XLA lays out with k and v first, causal
mask, SwiGLU), tensor parallel over 4 devices, read from XLA's own after-SPMD-partitioning dump.
Runs without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax_decoder_program import (
    BATCH,
    DEVICES,
    FFN,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    SEQ,
    WIDTH,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_decoder")
    dump = out / "decoder.hlo.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "jax_decoder_program.py"), str(dump)],
                   check=True, env=env, capture_output=True, timeout=300)
    completed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw",
                                "h100-sxm", "--format", "json"], env=env, capture_output=True,
                               text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    table = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", "h100-sxm",
                            "--by", "block"], env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    return json.loads(completed.stdout), table.stdout


def test_the_decoder_blocks_are_found_and_labelled(analysis):
    document, _ = analysis
    transformer = document["transformer"]
    assert transformer["blocks"] == LAYERS and transformer["consistent"]
    labels = {"q", "k", "v", "scores", "values", "proj", "gate", "up", "down"}
    assert [set(block["ops"]) for block in transformer["labels"]] == [labels] * LAYERS
    assert {block["kind"] for block in transformer["labels"]} == {"attention (GQA) + SwiGLU MLP"}
    rows = {row["position"]: row for row in document["ops"]}
    block = transformer["labels"][0]["ops"]
    # per device: 2 of the 8 query heads, 1 of the 4 key/value heads, a quarter of the MLP
    tokens = BATCH * SEQ
    assert rows[block["q"][0]]["flops"] == 2 * tokens * WIDTH * HEADS * HEAD_DIM // DEVICES
    assert rows[block["k"][0]]["flops"] == 2 * tokens * WIDTH * KV_HEADS * HEAD_DIM // DEVICES
    assert rows[block["v"][0]]["flops"] == 2 * tokens * WIDTH * KV_HEADS * HEAD_DIM // DEVICES
    assert rows[block["scores"][0]]["flops"] == 2 * BATCH * (HEADS // DEVICES) * SEQ * SEQ * HEAD_DIM
    assert rows[block["values"][0]]["flops"] == 2 * BATCH * (HEADS // DEVICES) * SEQ * SEQ * HEAD_DIM
    for label in ("gate", "up", "down"):
        assert rows[block[label][0]]["flops"] == 2 * tokens * WIDTH * FFN // DEVICES
    shapes = transformer["shapes"][0]
    assert (shapes["q_features"], shapes["kv_features"], shapes["head_dim"]) == (
        HEADS * HEAD_DIM // DEVICES, KV_HEADS * HEAD_DIM // DEVICES, HEAD_DIM)


def test_every_kernel_is_timed_in_one_block(analysis):
    document, table = analysis
    mapping = document["mapping"]
    times = {group["block"]: group["latency_s"] for group in mapping["blocks"]}
    assert set(times) - {None} == set(range(LAYERS))
    assert sum(times.values()) == pytest.approx(mapping["totals"]["step_latency_s"])
    assert times[0] > 0 and times[0] == pytest.approx(times[1])
    # each block holds its layer's two all-reduces (o and down projections' partial sums)
    collectives = [k for k in mapping["kernels"] if k["kind"] == "collective"]
    assert sorted(k["block"] for k in collectives) == [0, 0, 1, 1]
    assert f"Time per block ({LAYERS} blocks" in table
