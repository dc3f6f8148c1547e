"""The typed readers of the JSON this project writes and reads back in another process: the
sidecar's trace statistics, ``analyze-hlo``'s report (``JsonReport`` and its sections),
``analyze-pipeline``'s report (``PipelineReport``) and the training study's cache. Each reads
back what the writer wrote (a round trip on the bundled dumps) and turns a bad document into one
error line naming the file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("jaxlib")

from hlo_analyzer import AnalysisOptions, analyze_dump  # noqa: E402
from hlo_analyzer.mapping.json_report import JsonReport  # noqa: E402
from hlo_analyzer.mapping.pipeline import (  # noqa: E402
    PipelineReport,
    PipelineTotals,
    StageAnalysis,
    analyze_pipeline,
    load_plan,
)
from hlo_analyzer.mapping.render import kernel_records, mapping_dict  # noqa: E402
from hlo_analyzer.mapping.sections import BlockLabels, KernelRecord, MappingTotals  # noqa: E402
from hlo_analyzer.report import CollectiveTotal, ReportTotals  # noqa: E402
from hlo_analyzer.sidecar import read_sidecar  # noqa: E402
from hlo_analyzer.training import TrainingSplit  # noqa: E402
from hlo_trace.errors import InputFileError  # noqa: E402
from scripts.training_study import RowAnalysis  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "dumps" / "pipeline"
STAGE0 = FOLDER / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir"


@pytest.fixture(scope="module")
def analysis():
    return analyze_dump(str(STAGE0), "tx8", AnalysisOptions(steps=3))


@pytest.fixture(scope="module")
def written(analysis):
    """The report as ``analyze-hlo --hw tx8 --format json`` writes it."""
    return json.loads(analysis.report.to_json())


def _same(read: MappingTotals, made: MappingTotals) -> bool:
    """Equal totals (the JSON writer may sort the kinds of ``seconds_by_kind``)."""
    return dataclasses.replace(read, seconds_by_kind=tuple(sorted(read.seconds_by_kind))) == \
        dataclasses.replace(made, seconds_by_kind=tuple(sorted(made.seconds_by_kind)))


def _labels(blocks) -> list:
    """The blocks' labels, each block's as a dict (the JSON writer may sort them)."""
    return [(block.index, block.kind, dict(block.ops)) for block in blocks]


def _one_line(error: pytest.ExceptionInfo, origin: str) -> str:
    text = str(error.value)
    assert "\n" not in text and text.startswith(origin), text
    return text


def test_the_trace_statistics_are_typed_fields_of_the_sidecar(tmp_path):
    document = json.loads(STAGE0.with_suffix(".json").read_text())
    statistics = read_sidecar(STAGE0.with_suffix(".json")).statistics
    assert statistics.seconds_total == document["seconds_total"]
    assert statistics.peak_rss_bytes == document["peak_rss_bytes"]
    assert statistics.mlir_bytes == document["mlir_bytes"] == len(STAGE0.read_bytes())
    assert dict(statistics.seconds) == document["seconds"]
    # The steps' peaks travel too where recorded; a sidecar without statistics has none.
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document | {"peak_rss_bytes_after": {"trace": 5}}))
    assert dict(read_sidecar(path).statistics.peak_rss_bytes_after) == {"trace": 5}
    path.write_text(json.dumps({"stage": 0}))
    assert read_sidecar(path).statistics is None


@pytest.mark.parametrize("change, field", [
    ({"seconds_total": "4 s"}, "seconds_total"),
    ({"peak_rss_bytes": -1}, "peak_rss_bytes"),
    ({"seconds": {"trace": "long"}}, "seconds"),
    ({"mlir_bytes": 1.5}, "mlir_bytes"),
    ({"peak_rss_bytes_after": [1]}, "peak_rss_bytes_after"),
])
def test_a_bad_trace_statistic_is_one_error_naming_the_file_and_field(tmp_path, change, field):
    document = json.loads(STAGE0.with_suffix(".json").read_text()) | change
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError) as error:
        read_sidecar(path)
    assert f"field {field} = " in _one_line(error, str(path))
    del document["peak_rss_bytes"]
    path.write_text(json.dumps(document | {field: 1} if field == "seconds_total" else document))
    with pytest.raises(InputFileError, match="field peak_rss_bytes is missing"):
        read_sidecar(path)


def test_the_report_sections_read_back_equal_what_was_written(analysis, written):
    report = analysis.report
    assert ReportTotals.from_dict(written["totals"], "r").to_dict() == report.totals()
    assert written["totals"]["mesh"]["devices"] == 4  # the mesh's totals travel too
    assert {kind: dataclasses.asdict(CollectiveTotal.from_dict(entry, "r"))
            for kind, entry in written["comm_by_kind"].items()} == report.comm_by_kind
    mapping = analysis.mapping
    assert _same(MappingTotals.from_dict(written["mapping"]["totals"], "r"), mapping.totals)
    assert mapping_dict(mapping, kernels=False)["totals"] == mapping.totals.to_dict()
    records = kernel_records(mapping)
    assert [dataclasses.asdict(KernelRecord.from_dict(record, "r")) for record in records] == [
        record | {"hlo_positions": tuple(record["hlo_positions"])} for record in records]
    assert _labels(BlockLabels.from_dict(block, "r") for block in written["blocks"]["labels"]) == \
        _labels(analysis.blocks.blocks)


def test_an_analyze_hlo_report_is_read_back_typed(tmp_path, analysis, written):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(written))
    read = JsonReport.read(path, required=("memory", "mapping"))
    assert read.totals.gemm_flops == analysis.report.gemm_flops
    assert read.memory == analysis.memory
    assert read.training is None  # an inference stage
    assert _same(read.mapping.totals, analysis.mapping.totals)
    assert read.mapping.system == analysis.mapping.system.system.name and read.mapping.chip == analysis.mapping.program.chip
    assert sum(k.latency_s for k in read.mapping.kernels) == pytest.approx(
        analysis.mapping.program.latency_s, rel=1e-12)
    assert _labels(read.block_labels) == _labels(analysis.blocks.blocks)


@pytest.mark.parametrize("document, expected", [
    ([1, 2], "a JSON list; expected an analyze-hlo JSON report"),
    ("drop totals", "not an analyze-hlo JSON report (KeyError('totals'))"),
    ("drop mapping", "no mapping section; expected an analyze-hlo JSON report that has it"),
    ("kernel latency", "mapping: not a kernel record"),
    ("memory", "not a memory section"),
])
def test_a_bad_analyze_hlo_report_is_one_error_naming_the_file(tmp_path, written, document,
                                                                expected):
    if document in ("drop mapping", "drop totals"):
        document = {key: value for key, value in written.items() if key != document[5:]}
    elif document == "kernel latency":
        document = json.loads(json.dumps(written))
        del document["mapping"]["kernels"][3]["latency_s"]
    elif document == "memory":
        document = written | {"memory": {"weight_bytes": 1}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError) as error:
        JsonReport.read(path, required=("memory", "mapping"))
    assert expected in _one_line(error, str(path))
    path.write_text("{")
    with pytest.raises(InputFileError) as error:
        JsonReport.read(path)
    assert "not valid JSON" in _one_line(error, str(path))


def test_a_pipeline_report_is_read_back_typed(tmp_path):
    dumps = [str(path) for path in sorted(FOLDER.glob("*.mlir"))]
    analysis = analyze_pipeline(load_plan(FOLDER / "tiny_2x2_stages.toml"), dumps, "tx8-16")
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(analysis.to_dict(), indent=1, sort_keys=True))
    read = PipelineReport.read(path)
    assert read.stages == analysis.stages and read.totals == analysis.totals
    assert read.schedule == analysis.step.schedule
    assert read.largest_stage_memory.total_bytes == analysis.memory_per_device_bytes
    assert PipelineTotals.from_json(path.read_text(), str(path)) == analysis.totals
    document = analysis.to_dict()
    del document["stages"][1]["patch_s"]
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError) as error:
        PipelineReport.read(path)
    assert "stage 1: not a pipeline stage (KeyError('patch_s'))" in _one_line(error, str(path))
    with pytest.raises(InputFileError, match="x.json: stage 0: not a memory section"):
        StageAnalysis.from_dict(document["stages"][0] | {"memory": {}}, "x.json: stage 0")


def test_the_training_study_cache_is_read_back_typed(tmp_path, analysis, written):
    split = TrainingSplit(memory={"param": 4, "grad": 4, "optimizer_state": 24, "activation": 8,
                                  "input": 2},
                          comm={("backward", "param_grad", "all_reduce"): (3, 1.5e6),
                                ("forward", "activation", "all_gather"): (2, 1e3)})
    row = RowAnalysis("v1", ReportTotals.from_dict(written["totals"], "r"), split,
                      {"tx8-16": analysis.mapping.totals})
    path = tmp_path / "row.analysis.json"
    path.write_text(json.dumps(row.to_dict(), indent=1, sort_keys=True))
    read = RowAnalysis.from_dict(json.loads(path.read_text()), str(path))
    assert (read.analyzer, read.totals, read.training) == ("v1", row.totals, split)
    assert _same(read.latency["tx8-16"], analysis.mapping.totals)
    document = row.to_dict()
    del document["latency"]["tx8-16"]["total_basis"]
    with pytest.raises(InputFileError) as error:
        RowAnalysis.from_dict(document, str(path))
    assert "latency.tx8-16: not a mapping's totals" in _one_line(error, str(path))
