"""The study's pipeline cases: stage splits, submesh layout, the pipeline file, and the table
arithmetic of memory per device (hand-made analyses; the real tiny sweep is in test_sweep)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from hlo_analyzer.mapping.json_report import JsonReport, MappingSummary
from hlo_analyzer.mapping.pipeline import PipelineReport, PipelineTotals, StageAnalysis
from hlo_analyzer.mapping.sections import MappingTotals
from hlo_analyzer.memory import MemorySection, MemoryUsage
from hlo_analyzer.report import ReportTotals
from hlo_analyzer.sidecar import TraceStatistics
from hlo_trace.errors import UsageError
from plans.cases import (
    PipelineCase,
    PipelineShape,
    default_pipelines,
    parse_pipelines,
    split_pairs,
)
from scripts.study_tables import (
    CaseResult,
    PipelineResult,
    StageResult,
    latency_table,
    pipeline_table,
)


def test_split_pairs_is_even_with_the_longer_stages_first():
    assert split_pairs(28, 2) == ((0, 13), (14, 27))
    assert split_pairs(28, 4) == ((0, 6), (7, 13), (14, 20), (21, 27))
    # 28 = 12 x 2 + 4 x 1
    sixteen = split_pairs(28, 16)
    assert [last - first + 1 for first, last in sixteen] == [2] * 12 + [1] * 4
    assert sixteen[-1] == (27, 27)
    with pytest.raises(UsageError, match="3 pipeline stages for 2 block pairs"):
        split_pairs(2, 3)


def test_the_pipeline_file_puts_each_stage_on_its_strategy_mesh_side_by_side():
    case = PipelineCase("full", "204_640_360", PipelineShape(2, 8, "ds_ulysses"), 4, depth=28)
    data = tomllib.loads(case.toml())
    # ds_ulysses lays 8 chips out as 2 x 4 (batch on x); two stages along y: a 2 x 8 mesh.
    assert data["mesh_shape"] == [2, 8]
    assert data["submeshes"] == [[2, 4, 0, 0], [2, 4, 0, 4]]
    assert data["stage_ids"] == [[0, 13], [14, 27]]
    assert (data["patches"], data["warmup_steps"], data["strategy"]) == (4, 1, "ds_ulysses")
    assert data["schedule"] == "overlapped"  # steps overlap, as xDiT runs PipeFusion
    assert case.name == "full_204_640_360_pp2x8_ds_ulysses_M4"
    own = PipelineCase("models/mine.toml", "28_64_64", PipelineShape(2, 8, "ds_ulysses"), 2, 28)
    assert tomllib.loads(own.toml())["config"] == str(Path("models/mine.toml").resolve())
    pure = PipelineCase("full", "204_640_360", PipelineShape(16, 1, "none"), 2, depth=28)
    assert tomllib.loads(pure.toml())["submeshes"][15] == [1, 1, 0, 15]


def test_the_tracer_and_analyze_pipeline_both_read_the_study_file(tmp_path):
    from hlo_analyzer.mapping.pipeline import load_plan
    from plans.config import load_config_file

    path = tmp_path / "case.toml"
    path.write_text(PipelineCase("full", "204_640_360", PipelineShape(16, 1, "none"), 8, 28).toml())
    assert load_config_file(path).patches == 8  # the tracer ignores warmup_steps and schedule
    plan = load_plan(path)
    assert (plan.stage_count, plan.patches, plan.schedule) == (16, 8, "overlapped")


def test_pipeline_specs_are_checked():
    assert parse_pipelines("2x8:ds_ulysses, 16x1:none", 16) == (
        PipelineShape(2, 8, "ds_ulysses"), PipelineShape(16, 1, "none"))
    assert parse_pipelines("", 16) == ()
    with pytest.raises(UsageError, match="uses 8 chips; expected 16"):
        parse_pipelines("2x4:ds_ulysses", 16)
    with pytest.raises(UsageError, match="expected STAGESxCHIPS:STRATEGY"):
        parse_pipelines("2x8", 16)
    with pytest.raises(UsageError, match="none runs on 1 chip"):
        parse_pipelines("2x8:none", 16)
    with pytest.raises(UsageError, match="unknown strategy"):
        parse_pipelines("2x8:tp3d", 16)
    assert default_pipelines(16, 28) == "2x8:ds_ulysses,4x4:ds_ulysses,16x1:none"
    assert default_pipelines(4, 2) == "2x2:ds_ulysses"  # tiny: 2 pairs, no 4-stage pipeline


def _memory(weights: int, live: int, stale: int = 0) -> MemoryUsage:
    """One device's memory (total = the sum)."""
    return MemoryUsage(weight_bytes=weights, weight_arguments=1, input_bytes=0, input_arguments=0,
                       scalar_bytes=0, weights_source="sidecar", peak_live_bytes=live,
                       peak_position=0, peak_op="stablehlo.add", stale_kv_bytes=stale,
                       capacity_bytes=10e9)


def test_flat_memory_keeps_every_stage_weights_and_one_stage_live_values():
    def stage(weights, live):
        totals = MappingTotals(step_latency_s=2.0 / 30, seconds_by_kind=(), gemm_utilization=0.5,
                               steps=30, pairs_found=None, pairs_total=None,
                               inference_latency_s=2.0, inference_comm_s=0.5, basis="steps")
        return StageResult(
            TraceStatistics(seconds={}, seconds_total=1.0, peak_rss_bytes=1),
            JsonReport(ReportTotals(0, 0, 0, 0, None), {},
                       memory=MemorySection(_memory(weights, live), None),
                       mapping=MappingSummary("s", "c", "s", totals, ())))

    case = CaseResult("full", "s", "megatron", "1x16",
                      stages=[stage(3e9, 4e9), stage(2e9, 6e9)])
    # 3 + 2 GB of weights, the larger live set 6 GB: 11 GB, above the 10 GB chip.
    assert case.memory.total_bytes == pytest.approx(11e9)
    headers, rows = latency_table([case], steps=30)
    row = dict(zip(headers, rows[0]))
    assert row["memory GB/device"] == pytest.approx(11.0)
    assert row["fits in chip memory"] == "NO"


def test_pipeline_row_reads_the_stage_that_holds_the_most():
    def stage(index, patch_s, transfer_patch_bytes, memory):
        return StageAnalysis(index, "d.mlir", "ds_ulysses", (0, 1), 1, 1, 0.0, 0.0, 0.0, 0.0,
                             patch_s, 0, transfer_patch_bytes, 0.0, 0.0, memory)

    stages = (stage(0, 0.2, 5e6, _memory(1e9, 2e9, 1e9)), stage(1, 0.3, 0, _memory(1e9, 1e9, 1e9)))
    totals = PipelineTotals(inference_s=9.0, step_s=0.3, warmup_step_s=0.3,
                            memory_per_device_bytes=4e9, comm_bytes_per_device=2e9)
    result = PipelineResult("full", "s", 2, 8, "ds_ulysses", 2,
                            analysis=PipelineReport("overlapped", stages, totals))
    headers, rows = pipeline_table([result], steps=30)
    row = dict(zip(headers, rows[0]))
    assert (row["pipeline"], row["M"], row["schedule"]) == ("2x8:ds_ulysses", 2, "overlapped")
    assert row["slowest stage per patch ms"] == pytest.approx(300.0)
    assert row["send per patch MB (stage 0)"] == pytest.approx(5.0)
    assert (row["weights GB/device"], row["stale K/V GB/device"], row["peak live GB/device"]) == (
        pytest.approx(1.0), pytest.approx(1.0), pytest.approx(2.0))
    assert row["memory GB/device"] == pytest.approx(4.0) and row["fits in chip memory"] == "yes"
    failed = PipelineResult("full", "s", 2, 8, "ds_ulysses", 8, error="trace stage 0: no")
    failed_row = pipeline_table([failed], 30)[1][0]
    assert failed_row[-1] == "trace stage 0: no" and len(failed_row) == len(headers)
    # An analysis from before schedules were named ran every step from an empty pipeline.
    written = {"stages": [s.to_dict() for s in stages], "totals": dataclasses.asdict(totals)}
    result.analysis = PipelineReport.from_json(json.dumps(written), "p.json")
    assert pipeline_table([result], 30)[1][0][headers.index("schedule")] == "per-step"
