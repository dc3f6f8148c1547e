"""analyze-pipeline: PipeFusion step latency derived by hand, transfers between submeshes."""

import json

import pytest

from hardware import load_system
from hardware.pipeline import flow_shop_makespan_s, pipefusion_step, transfer_time_s
from hlo_analyzer.pipeline import analyze_pipeline, load_plan
from hlo_analyzer.pipeline_cli import pipeline_command
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError, UsageError

PLAN = "dumps/pipeline/tiny_2x2_stages.toml"
DUMPS = ["dumps/pipeline/tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
         "dumps/pipeline/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]


def test_schedule_by_hand():
    # Stage times per patch 3 and 5, transfer 1, M = 2: patch 0 leaves stage 0 at 3, arrives at
    # 4, leaves stage 1 at 9; patch 1 leaves stage 0 at 6, arrives at 7, waits for stage 1 until
    # 9, leaves at 14. Warm-up (full latent): 6 + 2 + 10 = 18. 4 steps: 18 + 3 * 14 = 60.
    step = pipefusion_step([3.0, 5.0], [1.0], [6.0, 10.0], [2.0], patches=2, steps=4)
    assert (step.step_s, step.warmup_step_s, step.inference_s) == (14.0, 18.0, 60.0)
    # P equal stages, free transfers: (M + P - 1) stage times.
    assert flow_shop_makespan_s([2.0, 0.0, 2.0, 0.0, 2.0], 4) == (4 + 3 - 1) * 2.0


def test_transfer_between_submeshes():
    system = load_system("tx8-16")  # 4x4 mesh2d, 50 GB/s per link, 1 us per hop
    # 4 pairs 0->2, 1->3, 4->6, 5->7 are 2 hops apart each; 4000 B -> 1000 B per pair.
    assert transfer_time_s(4000, [0, 1, 4, 5], [2, 3, 6, 7], system) == pytest.approx(
        1000 / 50e9 + 2 * 1e-6)
    assert transfer_time_s(4000, [0, 1], [0, 1], system) == 0.0  # same chips


def test_two_stage_two_patch_pipeline_latency():
    analysis = analyze_pipeline(load_plan(PLAN), DUMPS, "tx8-16")
    first, second = analysis.stages
    assert (first.devices, second.devices) == ((0, 1, 4, 5), (2, 3, 6, 7))
    # Traced on the full latent: a patch takes half the stage's compute + collectives.
    for stage in analysis.stages:
        assert stage.patch_s == pytest.approx((stage.compute_s + stage.comm_s) / 2)
    # Sent per patch (bf16): half of x 2*128*64*2 / 2 = 16384, t 2*64*2 = 256,
    # t_mlp 2*384*2 = 1536, y 16*64*2 = 2048 -> 20224 B over 4 chip pairs 2 hops apart:
    # 5056 / 50e9 + 2 us.
    assert first.transfer_patch_bytes == 20224
    transfer = 5056 / 50e9 + 2e-6
    assert first.transfer_patch_s == pytest.approx(transfer)
    # Step: chain stage 0, transfer, stage 1 with M = 2 -> sum + 1 x the slowest element.
    p0, p1 = first.patch_s, second.patch_s
    assert analysis.step.step_s == pytest.approx(p0 + transfer + p1 + max(p0, transfer, p1))
    # Warm-up: full stages one after the other, full transfer (36608 B: 9152 per pair).
    assert analysis.step.warmup_step_s == pytest.approx(
        first.full_s + second.full_s + 9152 / 50e9 + 2e-6)
    assert analysis.step.inference_s == pytest.approx(
        analysis.step.warmup_step_s + 29 * analysis.step.step_s)
    # Stale K/V per device with M = 2: one spatial attention, K and V of B_spt 16 x S 16 x
    # 1 head x 16 (megatron: 4 heads over 4 devices) x 2 bytes = 2 * 8192.
    assert first.memory.stale_kv_bytes == 2 * 16 * 16 * 1 * 16 * 2


def test_cli_json_and_errors(capsys, tmp_path):
    assert run_click(pipeline_command, [PLAN, *DUMPS, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["patches"] == 2 and len(document["stages"]) == 2
    assert run_click(pipeline_command, [PLAN, DUMPS[0]]) == 2
    assert "2 stages but 1 dumps" in capsys.readouterr().err
    wrong = tmp_path / "p.toml"
    wrong.write_text('stage_ids = [[0, 0], [1, 1]]\nstrategy = ["megatron", "ds_ulysses"]\n')
    with pytest.raises(UsageError, match="strategy ds_ulysses"):
        analyze_pipeline(load_plan(wrong), DUMPS, "tx8-16")
    wrong.write_text('stage_ids = [[0, 0]]\npatches = 0\n')
    with pytest.raises(InputFileError, match="patches"):
        load_plan(wrong)
