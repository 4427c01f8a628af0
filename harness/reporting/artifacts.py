"""What a training run logs to MLflow beyond params and metrics, in MLflow's own terms.

Why: a dashboard or a person opening the MLflow UI should see a run's curves, its
per-worker and per-stage numbers as tables, when each worker was busy, and the layout it
ran, without re-running it. ``log_artifacts`` is called by the runner at the end of a run:

- ``curves.png`` (``log_figure``): quality against wall-clock time, the target dashed;
- ``workers.json`` / ``stages.json`` (``log_table``): per-worker busy, idle, bubble, peak
  memory, stashed bytes; per-stage layers, replicas and ranks (multi-process systems);
- ``trace.json`` (``log_dict``): the Chrome/Perfetto trace of every worker's actions
  (``harness.reporting.trace``) and ``timeline.png``, its picture;
- ``plan.json`` (the plan the run was given) or ``layout.json`` (replicas and layer range
  per stage, however chosen).
"""

from __future__ import annotations

from pathlib import Path

from harness import metrics
from harness.reporting.figures import curves_figure, timeline_figure
from harness.reporting.trace import chrome_trace, spans_by_worker

__all__ = ["log_artifacts", "worker_table"]


def worker_table(final: dict[str, float], placement: dict[int, tuple[int, int]]) \
        -> dict[str, list]:
    """Per-worker columns read off the run's final metrics."""
    cols: dict[str, list] = {"rank": [], "stage": [], "replica": []}
    keys = (metrics.BUSY, metrics.IDLE, metrics.BUBBLE_FRACTION, metrics.PEAK_MEMORY,
            metrics.STASH_WEIGHTS, metrics.STASH_ACTIVATIONS)  # per-worker metrics
    for k in keys:
        cols[k] = []
    for rank in sorted(placement):
        stage, replica = placement[rank]
        cols["rank"].append(rank)
        cols["stage"].append(stage)
        cols["replica"].append(replica)
        for k in keys:
            cols[k].append(final.get(metrics.key(k, worker=rank)))
    return {k: v for k, v in cols.items() if any(x is not None for x in v)}


def _stage_table(layout: dict, placement: dict[int, tuple[int, int]]) -> dict[str, list]:
    stages = layout.get("stages") or []
    cols: dict[str, list] = {"stage": [], "first_layer": [], "end_layer": [], "replicas": [],
                             "ranks": []}
    for s, (a, b) in enumerate(stages):
        ranks = sorted(r for r, (st, _) in placement.items() if st == s)
        cols["stage"].append(s)
        cols["first_layer"].append(a)
        cols["end_layer"].append(b)
        cols["replicas"].append(len(ranks))
        cols["ranks"].append(",".join(map(str, ranks)))
    return cols


def log_artifacts(tracker, cfg, summary, trainer, workload) -> None:  # noqa: ANN001
    """Log the figures, tables, trace and plan of a finished run (see the module doc)."""
    tracker.figure(curves_figure({cfg.system: (summary.elapsed_s, summary.qualities)},
                                 workload.metric, summary.target,
                                 f"{cfg.system} on {workload.name} ({cfg.scale})"),
                   "curves.png")
    measured = getattr(trainer, "metrics", None)  # a PipelineMetrics
    if measured is None or not measured.events:
        return
    placement = measured.placement or {}
    trace = chrome_trace(measured.events, placement,
                         f"{cfg.system} {workload.name} {summary.layout_params.get('config')}")
    tracker.json(trace, "trace.json")
    labels = {r: f"w{r} s{st}" for r, (st, _) in placement.items()}
    tracker.figure(timeline_figure(spans_by_worker(trace), labels,
                                   f"{cfg.system}: measured timeline"), "timeline.png")
    tracker.table(worker_table(summary.final_metrics, placement), "workers.json")
    tracker.table(_stage_table(summary.layout_params, placement), "stages.json")
    if cfg.pipeline.plan:
        tracker.text(Path(cfg.pipeline.plan).read_text(), "plan.json")
    else:
        tracker.json({k: summary.layout_params.get(k) for k in ("config", "stages",
                                                                 "layout_source")},
                     "layout.json")
