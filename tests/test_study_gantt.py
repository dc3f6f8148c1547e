"""The study's Gantt charts: a chart read from a real timeline (rows, bars, times in ms) and drawn
as a PNG; the tiny sweep caches a pair-0 timeline per case and draws one chart per strategy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_events import check_trace_events

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click
from scripts.study_gantt import GanttCase, gantt_chart, write_gantt_plots

REPO_ROOT = Path(__file__).resolve().parent.parent
DUMP = REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRACK_OF_KIND = {"gemm": "GEMM", "vector": "vector", "flash_attention": "flash-attention",
                 "collective": "chip-to-chip network"}


def pair0_timeline(capsys, tmp_path) -> tuple[dict, dict]:
    path = tmp_path / "pair0.json"
    code = run_click(analyze_command, [str(DUMP), "--hw", "tx8", "--format", "json", "--timeline", str(path),
                                       "--timeline-pair", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(path.read_text()), json.loads(captured.out)


def test_chart_rows_are_the_timeline_tracks_in_ms(capsys, tmp_path):
    trace, report = pair0_timeline(capsys, tmp_path)
    chart = gantt_chart(trace)
    assert [row.track for row in chart.rows] == ["GEMM", "vector", "flash-attention", "DRAM", "NoC",
                                                 "chip-to-chip network"]
    assert chart.hardware.startswith("tx8 (fused)")
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sum(len(row.bars) for row in chart.rows) == len(complete)
    # every kernel of pair 0 is a bar of its kind's row; a row's bars add up to the pair's seconds
    # of that kind (ms = s * 1e3)
    [pair0] = [p for p in report["mapping"]["pairs"] if p["pair"] == 0]
    rows = {row.track: row for row in chart.rows}
    for kind, seconds in pair0["seconds_by_kind"].items():
        assert sum(b.duration_ms for b in rows[TRACK_OF_KIND[kind]].bars) == pytest.approx(seconds * 1e3, rel=1e-9)
    compute = sum(pair0["seconds_by_kind"].values())
    assert chart.span_ms == pytest.approx(compute * 1e3, rel=1e-9)  # one kernel after another


def test_a_chart_needs_a_trace_event_document():
    with pytest.raises(ValueError, match="no traceEvents list"):
        gantt_chart({"events": []})
    with pytest.raises(ValueError, match="without a thread_name: \\[7\\]"):
        gantt_chart({"traceEvents": [{"name": "k", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 7}]})


def test_png_per_case(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    pair0_timeline(capsys, tmp_path)
    case = GanttCase("28_64_64", "megatron", "2x2", tmp_path / "pair0.json")
    [written] = write_gantt_plots([case], tmp_path / "plots")
    assert written == tmp_path / "plots" / "gantt_28_64_64_megatron.png"
    assert written.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
def test_tiny_sweep_draws_a_gantt_chart_per_strategy_from_cached_timelines(tmp_path):
    pytest.importorskip("torch_xla")
    pytest.importorskip("matplotlib")
    command = [sys.executable, "scripts/sweep.py", "--config", "tiny", "--shapes", "28_64_64",
               "--strategies", "megatron,none", "--devices", "4", "-o", str(tmp_path)]
    first = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    cache = tmp_path / ".cache"
    timelines = {}
    for strategy, mesh in (("megatron", "1x4"), ("none", "1x1")):
        png = tmp_path / "plots" / f"gantt_28_64_64_{strategy}.png"
        assert png.read_bytes().startswith(PNG_MAGIC)
        # timelines are cached per hardware (the sweep's default: tx8-16)
        timeline = cache / "timelines" / "tx8-16" / f"tiny_28_64_64_{strategy}_{mesh}_stage0_pairs0-0.pair0.json"
        trace = json.loads(timeline.read_text())
        check_trace_events(trace)
        # what the chart draws is the timeline, and it is block pair 0 of the stage-0 analysis
        analysis = json.loads((cache / "analyses" / "tx8-16" / timeline.name.replace(".pair0", "")).read_text())
        [pair0] = [p for p in analysis["mapping"]["pairs"] if p["pair"] == 0]
        assert gantt_chart(trace).span_ms == pytest.approx(pair0["latency_s"] * 1e3, rel=1e-9)
        timelines[timeline] = timeline.stat().st_mtime_ns

    # cached: a rerun redoes neither analyses nor timelines; a missing timeline alone is redone
    analyses = {path: path.stat().st_mtime_ns for path in (cache / "analyses" / "tx8-16").iterdir()}
    missing = next(iter(timelines))
    missing.unlink()
    again = subprocess.run(command + ["--force"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert {path: path.stat().st_mtime_ns for path in (cache / "analyses" / "tx8-16").iterdir()} == analyses
    assert missing.exists()
    assert [(p, p.stat().st_mtime_ns) for p in timelines if p != missing] == \
        [(p, stamp) for p, stamp in timelines.items() if p != missing]
    assert again.stderr.count("timeline of pair 0") == 1


# -- the command: a Gantt chart of any --timeline JSON --------------------------------------------


def gantt_cli(capsys, *args) -> tuple[int, str, str]:
    from scripts.study_gantt import main

    code = run_click(main, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_script_explains_itself():
    done = subprocess.run([sys.executable, "scripts/study_gantt.py", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for words in ("--timeline", "-o, --output", "analyze-hlo", "--timeline-pair", "PNG"):
        assert words in done.stdout, words


def test_the_script_draws_the_chart_of_a_timeline_and_keeps_an_existing_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    pair0_timeline(capsys, tmp_path)
    png = tmp_path / "pair0.png"
    code, _, err = gantt_cli(capsys, "--timeline", tmp_path / "pair0.json", "-o", png)
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    chart = gantt_chart(json.loads((tmp_path / "pair0.json").read_text()))
    assert f"{sum(len(row.bars) for row in chart.rows)} kernels on {len(chart.rows)} tracks" in err
    before = png.read_bytes()
    code, _, err = gantt_cli(capsys, "--timeline", tmp_path / "pair0.json", "-o", png)
    assert code == 2 and err.startswith("Error: ") and "--force" in err and err.count("\n") == 1
    assert png.read_bytes() == before
    code, _, err = gantt_cli(capsys, "--timeline", tmp_path / "pair0.json", "-o", png, "--force",
                             "--title", "mine")
    assert code == 0, err


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"),
    ("", "not JSON"),
    ("{not json", "not JSON"),
    ('{"events": []}', "no traceEvents list"),
    ('{"traceEvents": [{"ph": "X", "name": "k", "tid": 1}]}', "trace event 0"),
    ('{"traceEvents": [{"ph": "X", "name": "k", "tid": 1, "ts": "soon", "dur": 1}]}', "trace event 0"),
    ('{"traceEvents": [7]}', "trace event 0"),
    ('{"traceEvents": []}', "no kernels"),
    ("DIRECTORY", "not a regular file"),
])
def test_the_script_refuses_what_is_not_a_timeline_in_one_line(capsys, tmp_path, content, fragment):
    timeline = tmp_path / "timeline.json"
    if content == "DIRECTORY":
        timeline.mkdir()
    elif content is not None:
        timeline.write_text(content)
    code, out, err = gantt_cli(capsys, "--timeline", timeline, "-o", tmp_path / "out.png")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: "), err
    assert fragment in err and str(timeline) in err, err
    assert not (tmp_path / "out.png").exists()


def test_the_script_needs_both_files(capsys, tmp_path):
    code, _, err = gantt_cli(capsys, "-o", tmp_path / "out.png")
    assert code == 2 and err.startswith("Error: ") and "--timeline" in err
