"""harness/reporting/trace.py: events become Chrome trace complete events, one track per
worker, in microseconds from the first event."""

from __future__ import annotations

import json

import pytest

from harness.reporting.trace import chrome_trace, spans_by_worker


def test_events_become_one_track_per_worker() -> None:
    events = {0: [("F", 100.0, 0.010, True), ("RB", 100.010, 0.005, False),
                  ("B", 100.015, 0.020, True)],
              1: [("RF", 100.0, 0.012, False), ("F", 100.012, 0.008, True)]}
    trace = json.loads(json.dumps(chrome_trace(events, {0: (0, 0), 1: (1, 0)})))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 5
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "worker 0: stage 0 replica 0", 1: "worker 1: stage 1 replica 0"}
    first = min(e["ts"] for e in complete)
    assert first == 0.0
    busy = {t: sum(e["dur"] for e in complete if e["tid"] == t and e["cat"] == "busy")
            for t in (0, 1)}
    assert busy[0] == pytest.approx(30_000.0) and busy[1] == pytest.approx(8_000.0)
    b = next(e for e in complete if e["args"]["kind"] == "B")
    assert b["name"] == "backward" and b["ts"] == pytest.approx(15_000.0)
    rows = spans_by_worker(trace)
    assert rows[1][0] == (0.0, pytest.approx(12.0), "RF", False)
