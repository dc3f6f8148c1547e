"""analyze-pipeline: PipeFusion latencies derived by hand for both schedules, their closed
forms and properties, transfers between submeshes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware import load_system
from hardware.pipeline import (
    flow_shop_makespan_s,
    pipefusion_step,
    pipelined_steps_s,
    transfer_time_s,
)
from hlo_analyzer.mapping.pipeline import analyze_pipeline, load_plan
from hlo_analyzer.pipeline_cli import pipeline_command
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError, UsageError

PLAN = "dumps/pipeline/tiny_2x2_stages.toml"
DUMPS = ["dumps/pipeline/tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
         "dumps/pipeline/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]


def closed_form_s(chain, back, patches, steps, schedule):
    """The closed forms of hardware.pipeline's module doc (longest paths of the recurrence)."""
    if steps == 0:
        return 0.0
    loop = [*chain, back]
    total, total_fwd, top, top_fwd = sum(loop), sum(chain), max(loop), max(chain)
    if schedule == "per-step":
        return (steps - 1) * (total + (patches - 1) * top) + total_fwd + (patches - 1) * top_fwd
    return max([total_fwd + (steps * patches - 1) * top_fwd]
               + [w * total + total_fwd + ((steps - w) * patches - 1) * top
                  for w in range(1, steps)])


def test_per_step_schedule_by_hand():
    # Stage times per patch 3 and 5, transfer 1, M = 2, nothing sent back: patch 0 leaves
    # stage 0 at 3, arrives at 4, leaves stage 1 at 9; patch 1 leaves stage 0 at 6, arrives at 7,
    # waits for stage 1 until 9, leaves at 14. Warm-up (full latent): 6 + 2 + 10 = 18. 4 steps,
    # each starting empty: 18 + 3 * 14 = 60.
    step = pipefusion_step([3.0, 5.0], [1.0], [6.0, 10.0], [2.0], patches=2, steps=4,
                           schedule="per-step")
    assert (step.step_s, step.warmup_step_s, step.inference_s) == (14.0, 18.0, 60.0)
    # P equal stages, free transfers: (M + P - 1) stage times.
    assert flow_shop_makespan_s([2.0, 0.0, 2.0, 0.0, 2.0], 4) == (4 + 3 - 1) * 2.0


def test_both_schedules_by_hand_with_a_return():
    # Elements: stage 0 = 3, transfer = 1, stage 1 = 5, return 1 -> 0 = 2; M = 2, 2 pipelined
    # steps. Step 0 (both schedules): patch 0 on stage 0 0-3, link 3-4, stage 1 4-9, back 9-11;
    # patch 1 on stage 0 3-6, link 6-7, stage 1 9-14, back 14-16.
    # Overlapped step 1: patch 0 on stage 0 from 11 (back) to 14, link 14-15, stage 1 15-20;
    # patch 1 on stage 0 from 16 to 19, link 19-20, stage 1 20-25 -> 25.
    # Per step, step 1 waits for all of step 0 (16): patch 0 16-19, 19-20, stage 1 20-25;
    # patch 1 19-22, 22-23, stage 1 25-30 -> 30.
    chain = [3.0, 1.0, 5.0]
    assert pipelined_steps_s(chain, 2.0, patches=2, steps=2, schedule="overlapped") == 25.0
    assert pipelined_steps_s(chain, 2.0, patches=2, steps=2, schedule="per-step") == 30.0
    # One warm-up step on the full latent (6 + 2 + 10 = 18) and its return (4) come first.
    for schedule, pipelined, period in (("overlapped", 25.0, 11.0), ("per-step", 30.0, 16.0)):
        step = pipefusion_step([3.0, 5.0], [1.0], [6.0, 10.0], [2.0], patches=2, steps=3,
                               return_patch_s=2.0, return_full_s=4.0, schedule=schedule)
        assert (step.warmup_step_s, step.inference_s) == (18.0, 18.0 + 4.0 + pipelined)
        # Steady state: the loop 3 + 1 + 5 + 2 = 11 against M x 5 overlapped; 11 + 5 per step.
        assert step.step_s == period
    # Only warm-up steps: nothing sent back after the last one.
    only = pipefusion_step([3.0, 5.0], [1.0], [6.0, 10.0], [2.0], patches=2, steps=2,
                           warmup_steps=2, return_patch_s=2.0, return_full_s=4.0)
    assert only.inference_s == 18.0 + 4.0 + 18.0


def test_overlapped_bottleneck_case_pays_fill_and_drain_once():
    # Stages 2 and 1, free links, M = 2, 2 steps. Step 0: patch 0 on stage 0 0-2, stage 1 2-3;
    # patch 1 2-4, 4-5. Overlapped step 1: patch 0 (back at 3) waits for stage 0 until 4, 4-6,
    # stage 1 6-7; patch 1 6-8, 8-9 -> 9 = fill 0 + S*M*2 + drain 1. Per step: 2 x (3 + 2) = 10.
    chain = [2.0, 0.0, 1.0]
    assert pipelined_steps_s(chain, 0.0, patches=2, steps=2) == 9.0
    assert pipelined_steps_s(chain, 0.0, patches=2, steps=2, schedule="per-step") == 10.0
    # More stages than patches (4 stages of 1, M = 2): a patch is back after a whole loop of 4,
    # so each step after the first adds 4 rather than M x 1 = 2: 3 x 4 + (4 + 1) = 17.
    four = [1.0, 0.0] * 3 + [1.0]
    assert pipelined_steps_s(four, 0.0, patches=2, steps=4) == 17.0
    with pytest.raises(ValueError, match="schedule"):
        pipelined_steps_s(chain, 0.0, patches=2, steps=2, schedule="async")


_TIMES = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)
_CHAINS = st.integers(min_value=1, max_value=5).flatmap(
    lambda stages: st.lists(_TIMES, min_size=2 * stages - 1, max_size=2 * stages - 1))


@settings(max_examples=200, deadline=None)
@given(chain=_CHAINS, back=_TIMES, patches=st.integers(1, 6), steps=st.integers(0, 6))
def test_recurrence_matches_the_closed_forms_and_overlap_never_loses(chain, back, patches,
                                                                      steps):
    overlapped = pipelined_steps_s(chain, back, patches=patches, steps=steps)
    per_step = pipelined_steps_s(chain, back, patches=patches, steps=steps, schedule="per-step")
    assert overlapped == pytest.approx(closed_form_s(chain, back, patches, steps, "overlapped"))
    assert per_step == pytest.approx(closed_form_s(chain, back, patches, steps, "per-step"))
    assert overlapped <= per_step + 1e-9
    if back == 0.0:  # nothing to send back: the old figure, every step a flow shop from empty
        assert per_step == pytest.approx(steps * flow_shop_makespan_s(chain, patches))


@settings(max_examples=200, deadline=None)
@given(chain=_CHAINS, back=_TIMES, patches=st.integers(1, 6), steps=st.integers(1, 6),
       pick=st.integers(0, 100), cut=st.floats(0.0, 1.0))
def test_latency_never_grows_when_an_element_gets_faster(chain, back, patches, steps, pick, cut):
    loop = [*chain, back]
    faster = list(loop)
    faster[pick % len(loop)] *= cut
    for schedule in ("overlapped", "per-step"):
        before = pipelined_steps_s(loop[:-1], loop[-1], patches=patches, steps=steps,
                                   schedule=schedule)
        after = pipelined_steps_s(faster[:-1], faster[-1], patches=patches, steps=steps,
                                  schedule=schedule)
        assert after <= before + 1e-9


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
    # The last stage sends stage 0 its latent z (2, 4, 8, 8, 8) f32 = 16384 B, per patch 8192
    # B, from chips 2,3,6,7 back to 0,1,4,5: 2048 per pair, 2 hops.
    assert (analysis.return_full_bytes, analysis.return_patch_bytes) == (16384, 8192)
    back, back_full = 2048 / 50e9 + 2e-6, 4096 / 50e9 + 2e-6
    assert analysis.step.return_patch_s == pytest.approx(back)
    # Overlapped steady state: the loop stage 0, transfer, stage 1, return against M x slowest.
    p0, p1 = first.patch_s, second.patch_s
    chain = [p0, transfer, p1]
    assert analysis.step.schedule == "overlapped"
    assert analysis.step.step_s == pytest.approx(max(p0 + transfer + p1 + back, 2 * max(p0, p1)))
    # Warm-up: full stages one after the other, full transfer (36608 B: 9152 per pair).
    warmup = first.full_s + second.full_s + 9152 / 50e9 + 2e-6
    assert analysis.step.warmup_step_s == pytest.approx(warmup)
    assert analysis.step.inference_s == pytest.approx(
        warmup + back_full + closed_form_s(chain, back, 2, 29, "overlapped"))
    # Per step: every step a flow shop from empty, the loop + 1 x the slowest element.
    per_step = analyze_pipeline(load_plan(PLAN), DUMPS, "tx8-16", schedule="per-step").step
    assert per_step.step_s == pytest.approx(p0 + transfer + p1 + back + max(p0, p1))
    assert per_step.inference_s == pytest.approx(
        warmup + back_full + closed_form_s(chain, back, 2, 29, "per-step"))
    assert analysis.step.inference_s < per_step.inference_s
    # Stale K/V per device with M = 2: one spatial attention, K and V of B_spt 16 x S 16 x
    # 1 head x 16 (megatron: 4 heads over 4 devices) x 2 bytes = 2 * 8192.
    assert first.memory.stale_kv_bytes == 2 * 16 * 16 * 1 * 16 * 2


def test_cli_json_and_errors(capsys, tmp_path):
    assert run_click(pipeline_command, [PLAN, *DUMPS, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["patches"] == 2 and len(document["stages"]) == 2
    assert document["schedule"] == "overlapped" and document["return"]["patch_bytes"] == 8192
    assert run_click(pipeline_command, [PLAN, *DUMPS, "--schedule", "per-step"]) == 0
    assert "per-step schedule" in capsys.readouterr().out
    assert run_click(pipeline_command, [PLAN, DUMPS[0]]) == 2
    assert "2 stages but 1 dumps" in capsys.readouterr().err
    wrong = tmp_path / "p.toml"
    wrong.write_text('stage_ids = [[0, 0], [1, 1]]\nstrategy = ["megatron", "ds_ulysses"]\n')
    with pytest.raises(UsageError, match="strategy ds_ulysses"):
        analyze_pipeline(load_plan(wrong), DUMPS, "tx8-16")
    wrong.write_text('stage_ids = [[0, 0]]\npatches = 0\n')
    with pytest.raises(InputFileError, match="patches"):
        load_plan(wrong)
    wrong.write_text('stage_ids = [[0, 0]]\nschedule = "async"\n')
    with pytest.raises(InputFileError, match="schedule = 'async'"):
        load_plan(wrong)
    wrong.write_text('stage_ids = [[0, 0]]\nschedule = "per-step"\n')
    assert load_plan(wrong).schedule == "per-step"
