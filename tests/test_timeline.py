"""--timeline: Chrome trace-event JSON checked against the format and against the report's totals."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from trace_events import check_trace_events

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click

DUMP = Path(__file__).resolve().parent.parent / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
TRACK_OF_KIND = {"gemm": "GEMM", "vector": "vector", "flash_attention": "flash-attention",
                 "collective": "chip-to-chip network"}


def run(capsys, *args) -> tuple[int, str, str]:
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def timeline(capsys, tmp_path, *extra) -> tuple[dict, dict]:
    path = tmp_path / "trace.json"
    code, out, err = run(capsys, DUMP, "--hw", "tx8", "--format", "json", "--timeline", path, *extra)
    assert code == 0, err
    return json.loads(path.read_text()), json.loads(out)


def durations_by_track(trace: dict) -> dict[str, float]:
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    totals: dict[str, float] = defaultdict(float)
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            totals[names[event["tid"]]] += event["dur"]
    return totals


def test_trace_event_format_and_no_overlap_on_a_track(capsys, tmp_path):
    trace, _ = timeline(capsys, tmp_path)
    check_trace_events(trace)


def test_track_durations_are_the_report_totals(capsys, tmp_path):
    trace, report = timeline(capsys, tmp_path)
    per_track = durations_by_track(trace)
    for kind, seconds in report["mapping"]["totals"]["seconds_by_kind"].items():
        assert per_track.get(TRACK_OF_KIND[kind], 0.0) == pytest.approx(seconds * 1e6, rel=1e-9, abs=1e-9)
    assert per_track["chip-to-chip network"] == pytest.approx(report["totals"]["comm_latency_s"] * 1e6, rel=1e-9)
    kernels = report["mapping"]["kernels"]
    assert per_track["DRAM"] == pytest.approx(sum(min(k["dram_s"], k["latency_s"]) for k in kernels) * 1e6,
                                              rel=1e-9)


def test_one_pair_timeline(capsys, tmp_path):
    trace, report = timeline(capsys, tmp_path, "--timeline-pair", "0")
    [pair0] = [p for p in report["mapping"]["pairs"] if p["pair"] == 0]
    compute_tracks = {"GEMM", "vector", "flash-attention", "chip-to-chip network"}
    total = sum(v for track, v in durations_by_track(trace).items() if track in compute_tracks)
    assert total == pytest.approx(pair0["latency_s"] * 1e6, rel=1e-9)
    code, _, err = run(capsys, DUMP, "--hw", "tx8", "--timeline", tmp_path / "t2.json", "--timeline-pair", "5")
    assert code == 2 and "--timeline-pair 5: no such block pair (pairs 0..0)" in err
    assert len(err.strip().splitlines()) == 1
