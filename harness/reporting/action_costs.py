"""What each kind of action cost a run's workers, per minibatch: wall time, the main
thread's CPU time, the time it was off its core, its involuntary context switches and its
minor page faults.

Why: "our runtime is slower than torch's engine on the same schedule and split" (issue 24)
is a claim about actions, not about throughput: the same F on the same layers either takes
longer on one engine (more CPU time: more work, or slower work), or the thread is off its
core for part of it (preempted by another thread, or woken late after a wait). A run of our
runtime's pipelines or torch's logs both per worker and kind (``metrics.ACTION_TIME``,
``ACTION_CPU``, ``ACTION_PREEMPTIONS``, ``ACTION_FAULTS``; actions timed on the host's
clock, not a GPU's device clock); ``per_action`` reads them back out of a run's metrics, per
minibatch of the run (a replicated stage's worker takes every r-th minibatch, so its figures
are about 1/r of its own per minibatch). A suite keeps each cell's medians over its repeats
(``median_costs``: the result's ``actions``), which ``scripts/action_costs.py`` (cell by
cell) and ``scripts/env_ab.py`` (a setting against the default) read.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from harness import metrics
from pipedream_impl.runtime.faults import COMPUTE_KINDS  # F, B, I, W, U: not waits or sends

__all__ = ["FIGURES", "GROUPS", "grouped", "median_costs", "per_action"]

# per kind and worker: wall ms, CPU ms, off core ms (wall above CPU), preemptions, minor
# page faults (memory touched for the first time; results kept before it have no faults)
FIGURES = ("wall ms", "CPU ms", "off core ms", "preemptions", "faults")
# the kinds that add up to a group (waits and receives belong to none: off their core
# by design)
GROUPS = {f"compute ({', '.join(COMPUTE_KINDS)})": COMPUTE_KINDS,
          "sends (SF, SB, ST)": ("SF", "SB", "ST")}


def per_action(run_metrics: Mapping[str, float], minibatches: int) \
        -> dict[int, dict[str, dict[str, float]]]:
    """``{worker: {kind: {figure: value per minibatch}}}`` (``FIGURES``) of the kinds whose
    thread use the run logged (our runtime's pipelines and torch's; none for the others)."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    wall = {(int(f["worker"]), f["kind"]): v
            for f, v in metrics.select(run_metrics, metrics.ACTION_TIME)}
    switched = {(int(f["worker"]), f["kind"]): v
                for f, v in metrics.select(run_metrics, metrics.ACTION_PREEMPTIONS)}
    faults = {(int(f["worker"]), f["kind"]): v
              for f, v in metrics.select(run_metrics, metrics.ACTION_FAULTS)}
    for f, cpu in metrics.select(run_metrics, metrics.ACTION_CPU):
        at = (int(f["worker"]), f["kind"])
        w = wall.get(at, 0.0)
        out.setdefault(at[0], {})[at[1]] = dict(zip(FIGURES, (
            1e3 * w / minibatches, 1e3 * cpu / minibatches, 1e3 * (w - cpu) / minibatches,
            switched.get(at, 0.0) / minibatches, faults.get(at, 0.0) / minibatches),
            strict=True))
    return dict(sorted(out.items()))


def grouped(costs: Mapping[int, Mapping[str, Mapping[str, float]]],
            groups: Mapping[str, Iterable[str]] = GROUPS) \
        -> dict[int, dict[str, dict[str, float]]]:
    """``per_action``'s kinds summed into ``groups``: ``{worker: {group: {figure: value}}}``
    (a group none of whose kinds ran is left out, a figure a kept result lacks too)."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for w, kinds in costs.items():
        for name, members in groups.items():
            ran = [kinds[k] for k in members if k in kinds]
            if ran:
                out.setdefault(w, {})[name] = {f: sum(k[f] for k in ran) for f in FIGURES
                                               if all(f in k for k in ran)}
    return out


def median_costs(repeats: Sequence[Mapping[int, Mapping[str, Mapping[str, float]]]]) \
        -> dict[str, dict[str, dict[str, float]]]:
    """Each (worker, kind, figure)'s median over ``repeats`` (``per_action`` of each run),
    as a suite result keeps it: ``{"worker": {kind: {figure: value}}}`` (JSON keys). The
    time off the core is the medians' difference (wall above CPU), so that a row adds up."""
    got: dict[tuple[int, str, str], list[float]] = {}
    off = FIGURES[2]  # derived below from the other two medians, not a median of its own
    for costs in repeats:
        for w, kinds in costs.items():
            for kind, figures in kinds.items():
                for f, v in figures.items():
                    if f != off:
                        got.setdefault((int(w), kind, f), []).append(v)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (w, kind, f), values in sorted(got.items()):
        out.setdefault(str(w), {}).setdefault(kind, {})[f] = statistics.median(values)
    for kinds in out.values():
        for figures in kinds.values():
            figures[off] = figures[FIGURES[0]] - figures[FIGURES[1]]
    return out
