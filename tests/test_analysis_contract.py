"""The typed contract between the tracer's files and the analysis: ``Sidecar`` (one reader) and
``analyze_dump`` (the one recipe the commands share), on the bundled pipeline dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("jaxlib")

from hardware import load_hardware  # noqa: E402
from hardware.systems import Hardware  # noqa: E402
from hlo_analyzer import AnalysisOptions, analyze_dump  # noqa: E402
from hlo_analyzer.cli import main as analyze_main  # noqa: E402
from hlo_analyzer.sidecar import read_sidecar, stage_sidecar  # noqa: E402
from hlo_trace.errors import InputFileError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STAGE0 = ROOT / "dumps" / "pipeline" / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir"


def test_the_sidecar_is_read_into_typed_fields():
    sidecar = read_sidecar(STAGE0.with_suffix(".json"))
    assert sidecar is not None
    # The file: a 2x2 submesh of chips 0, 1, 4, 5; block pair 0 of stage 0, megatron.
    assert sidecar.devices == (0, 1, 4, 5)
    assert sidecar.blocks == (0, 0) and sidecar.stage == 0 and sidecar.strategy == "megatron"
    assert sidecar.patches == 1  # no pipefusion section: one patch
    outputs = {t.name: t.nbytes for t in sidecar.outputs}
    # bf16 = 2 bytes: x is 2*128*64 elements, t 2*64, t_mlp 2*384, y 1*16*64.
    assert outputs == {"t": 2 * 64 * 2, "t_mlp": 2 * 384 * 2, "x": 2 * 128 * 64 * 2, "y": 16 * 64 * 2}
    latent = sidecar.input("z")
    assert latent is not None and latent.nbytes == 2 * 4 * 8 * 8 * 8 * 4  # f32
    with pytest.raises(TypeError):  # read-only: a reader cannot change what the next one sees
        sidecar.document["stage"] = 3  # type: ignore[index]


def test_a_stage_without_a_sidecar_is_one_error_naming_the_command(tmp_path):
    dump = tmp_path / "stage.mlir"
    dump.write_text(STAGE0.read_text())
    with pytest.raises(InputFileError, match="plan-search needs the tracer's sidecar"):
        stage_sidecar(dump, "plan-search")


def test_analyze_dump_gives_what_the_command_prints(tmp_path):
    """The library's analysis and ``analyze-hlo --hw`` are one recipe: the same totals."""
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as ended:
        analyze_main([str(STAGE0), "--hw", "tx8", "--steps", "1", "--format", "json", "-o", str(out)])
    assert ended.value.code == 0
    printed = json.loads(out.read_text())["mapping"]["totals"]
    analysis = analyze_dump(str(STAGE0), "tx8", AnalysisOptions(steps=1))
    totals = analysis.mapping.totals
    assert totals.inference_latency_s == pytest.approx(printed["inference_latency_s"], rel=1e-12)
    assert analysis.options.caption_tokens == analysis.sidecar.caption_tokens  # from the sidecar
    assert analysis.blocks is not None and analysis.blocks.pairs == 1


@pytest.mark.parametrize("hardware", [None, "tx8"])
def test_the_command_prints_the_analysis_of_analyze_dump(tmp_path, hardware):
    """``analyze-hlo`` analyses through ``analyze_dump``, with or without ``--hw``: the JSON it
    writes is the Analysis' report, byte for byte, and the memory section is typed."""
    from hlo_analyzer.memory import MemorySection

    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as ended:
        analyze_main([str(STAGE0), *(["--hw", hardware] if hardware else []), "--format", "json",
                      "-o", str(out)])
    assert ended.value.code == 0
    analysis = analyze_dump(str(STAGE0), hardware)
    assert "".join(analysis.report.json_pieces()) == out.read_text()
    assert isinstance(analysis.memory, MemorySection)
    assert analysis.memory.sidecar == str(STAGE0.with_suffix(".json"))
    assert analysis.training is None  # an inference stage
    # the chip's capacity is the verdict's (tx8: 16 GiB per chip), none without a chip
    capacity = analysis.memory.usage.capacity_bytes
    assert capacity == (None if hardware is None else load_hardware("tx8").dram_capacity_bytes)
    # read back from the JSON in another process: the same section, field for field
    written = json.loads(out.read_text())["memory"]
    assert MemorySection.from_dict(written, str(out)) == analysis.memory
    del written["peak_live_bytes"]
    with pytest.raises(InputFileError, match=f"^{out}: not a memory section .*peak_live_bytes"):
        MemorySection.from_dict(written, str(out))


def test_the_hardware_is_the_one_loaded_not_reloaded_by_name(tmp_path):
    """A description loaded from a file whose name is no bundled name: the mapping uses the
    loaded one (loading it again by its name would fail)."""
    text = (ROOT / "hardware" / "data" / "tx8.toml").read_text()
    path = tmp_path / "my_chip.toml"
    path.write_text(text)
    spec = load_hardware(path)
    choice = Hardware("a name no loader knows", spec)
    analysis = analyze_dump(str(STAGE0), choice, AnalysisOptions(steps=1))
    assert analysis.mapping.hardware == "a name no loader knows"
    reference = analyze_dump(str(STAGE0), "tx8", AnalysisOptions(steps=1)).mapping.totals
    assert analysis.mapping.totals.inference_latency_s == reference.inference_latency_s


def test_a_pipeline_report_read_back_across_a_process_is_typed(tmp_path):
    """The plan search reads analyze-pipeline's JSON through PipelineTotals.from_json: every
    field the report prints comes back as the same number, and a report without them is one error."""
    from hlo_analyzer.mapping.pipeline import PipelineTotals
    from hlo_analyzer.pipeline_cli import main as pipeline_main

    folder = ROOT / "dumps" / "pipeline"
    out = tmp_path / "pipeline.json"
    with pytest.raises(SystemExit) as ended:
        pipeline_main([str(folder / "tiny_2x2_stages.toml"), *map(str, sorted(folder.glob("*.mlir"))),
                       "--format", "json", "-o", str(out)])
    assert ended.value.code == 0
    printed = json.loads(out.read_text())["totals"]
    totals = PipelineTotals.from_json(out.read_text(), str(out))
    assert printed == {name: getattr(totals, name) for name in printed}
    with pytest.raises(InputFileError, match="not an analyze-pipeline JSON report"):
        PipelineTotals.from_json('{"totals": {"step_s": 1}}', "x.json")
