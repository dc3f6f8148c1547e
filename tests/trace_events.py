"""Checks of a Chrome trace-event document (the format Perfetto and chrome://tracing read), shared
by the timeline and the study's Gantt tests."""

from __future__ import annotations

from collections import defaultdict

#: Thread (track) names every timeline of ``hlo_analyzer/mapping/timeline.py`` declares.
TRACK_NAMES = {"GEMM", "vector", "flash-attention", "DRAM", "NoC", "chip-to-chip network"}


def check_trace_events(trace: dict) -> list[dict]:
    """Assert the format: every event has name, ph, ts, dur, pid, tid; complete events have
    non-negative times and shapes in their args; no two events overlap on one track; every track
    is named. Returns the complete events."""
    events = trace["traceEvents"]
    assert events and all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in events)
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert all("shapes" in e["args"] for e in complete)
    by_track = defaultdict(list)
    for event in complete:
        by_track[(event["pid"], event["tid"])].append(event)
    for track in by_track.values():
        track.sort(key=lambda e: e["ts"])
        for before, after in zip(track, track[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-6, (before["name"], after["name"])
    named = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert TRACK_NAMES <= named
    return complete
