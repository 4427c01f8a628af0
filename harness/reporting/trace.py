"""Chrome/Perfetto trace JSON of a multi-process run: one track per worker.

Why: busy, idle and per-action totals say how much time went where, not when; a timeline
shows the pipeline filling, the bubbles and the waits. Every executor books its timed
spans through ``Executor.record`` (``pipedream_impl.runtime.contract``), so the trace of
a run is exactly the spans its ``busy_s_worker_<r>``/``idle_s_worker_<r>`` metrics sum.

Format: the Trace Event Format's JSON object form (``{"traceEvents": [...]}``), complete
events (``"ph": "X"``) with ``ts``/``dur`` in microseconds from the run's first event,
``pid`` 0 and ``tid`` = the worker's rank, a ``thread_name`` metadata event per worker;
``cat`` is ``busy`` or ``idle`` and ``args.kind`` the action kind (F, B, RF, ..., or
``step`` for engines that expose only whole steps). Open it in https://ui.perfetto.dev
or chrome://tracing.
"""

from __future__ import annotations

from pipedream_impl.schedule import ACTION_NAMES

__all__ = ["chrome_trace", "spans_by_worker"]


def chrome_trace(events: dict[int, list], placement: dict[int, tuple[int, int]] | None = None,
                 title: str = "pipebench run") -> dict:
    """``events``: rank -> [(kind, start wall s, duration s, busy), ...]."""
    starts = [e[1] for evs in events.values() for e in evs]
    t0 = min(starts) if starts else 0.0
    out: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for rank in sorted(events):
        where = ""
        if placement and rank in placement:
            stage, replica = placement[rank]
            where = f": stage {stage} replica {replica}"
        out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                    "args": {"name": f"worker {rank}{where}"}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": rank,
                    "args": {"sort_index": rank}})
        for kind, start, dur, busy in events[rank]:
            out.append({"name": ACTION_NAMES.get(kind, kind), "cat": "busy" if busy else "idle",
                        "ph": "X", "pid": 0, "tid": rank, "ts": (start - t0) * 1e6,
                        "dur": dur * 1e6, "args": {"kind": kind}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def spans_by_worker(trace: dict) -> dict[int, list[tuple[float, float, str, bool]]]:
    """The trace's complete events per worker as (start ms, duration ms, kind, busy): what
    the timeline figures draw."""
    rows: dict[int, list] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X":
            rows.setdefault(int(e["tid"]), []).append(
                (e["ts"] / 1e3, e["dur"] / 1e3, e.get("args", {}).get("kind", e["name"]),
                 e.get("cat") == "busy"))
    return rows
