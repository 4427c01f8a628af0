"""The planner's prediction against the runtime's schedule, simulated.

The planner predicts a plan's time per minibatch with a closed formula: the slowest stage's
compute over its replicas plus what its backward leaves of its all-reduce, or its transfers
where those are slower (``pipedream_impl.planner.optimizer``, ``sync_cost``). The runtime
runs that plan's 1F1B-RR schedule, and the simulator replays the schedule action by action:
fill and drain, the rounds of replicated stages that wait for each other, transfers sharing
links, and the all-reduce the runtime's gradient buckets start during the round's last
backward (``pipedream_impl.runtime.grad_buckets``), each stage warmed up to the plan's
depths (``pipedream_impl.planner.depths``). Where the two disagree, the planner
chooses among plans by a time the runtime does not run at, so every ``reproduce`` table
that shows a plan shows this comparison: the one tolerance (``TOLERANCE``), the ratio,
and, where a row misses, why, from the simulation's own numbers. The same plan is also
simulated with its all-reduce blocking after each round (``blocking_over_planned``): what
the overlap is worth, and the planner's charge for a plan made with ``overlap=False``.
"""

from __future__ import annotations

from dataclasses import replace

from harness.sim.simulator import SimOptions, SimResult, layout_for, simulate_system
from harness.systems import PAPER
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.planner.plan import Plan
from pipedream_impl.profiling.profile import Profile

__all__ = ["KEYS", "TOLERANCE", "gap", "label", "summary"]

TOLERANCE = 0.10  # the goal: simulated time per minibatch within 10% of the planner's
KEYS = ("planned_time_per_minibatch_s", "simulated_time_per_minibatch_s",
        "simulated_over_planned", "blocking_over_planned", "planner_gap")  # gap's, in order


def gap(profile: Profile, cluster: Cluster, plan: Plan, options: SimOptions,
        simulated: SimResult | None = None) -> dict:
    """The plan simulated against its prediction (``simulated``: the plan already simulated
    with ``options``, to reuse); JSON-ready: planned and simulated seconds per minibatch,
    simulated / planned with the all-reduce overlapped (the runtime's) and blocking after
    each round, and why the row misses ('' when within ``TOLERANCE``)."""
    sys_ = PAPER["planned"]
    layout = layout_for(profile, cluster, sys_, plan=plan)
    sim = simulated or simulate_system(profile, cluster, sys_, layout, options)
    blocking = simulate_system(profile, cluster, sys_, layout,
                               replace(options, pipeline_overlap=False))
    planned = plan.predicted["time_per_minibatch_s"]
    ratio = sim.time_per_minibatch_s / planned
    ratio_blocking = blocking.time_per_minibatch_s / planned
    return dict(zip(KEYS, (planned, sim.time_per_minibatch_s, ratio, ratio_blocking,
                           _why(ratio, ratio_blocking, sim,
                                plan.extra.get("overlap") is False)), strict=True))


def _why(ratio: float, blocking: float, sim: SimResult, summed: bool) -> str:
    if abs(ratio - 1) <= TOLERANCE:
        return ""
    if summed and abs(blocking - 1) <= TOLERANCE:
        return (f"{'faster' if ratio < 1 else 'slower'} than planned: the runtime starts the "
                "replicated stages' all-reduce during the round's last backward, which this "
                "plan (made with overlap off) charges in full; with it blocking, "
                f"{blocking:.2f}x")
    busiest = max(sim.utilisation.values(), default=0.0)
    return (f"the schedule itself: the busiest worker computes {busiest:.0%} of the time and "
            "waits on receives the rest (fill and drain, other rounds, or transfers its "
            "minibatches in flight do not cover: the planner counts transfers as overlapped "
            "with compute, and a plan without depths runs PipeDream's default warm-up)")


def label(row: dict) -> str:
    """One table cell: the ratio, and why where it misses."""
    x = f"{row['simulated_over_planned']:.2f}x"
    return x if not row["planner_gap"] else f"{x}: {row['planner_gap']}"


def summary(rows: list[dict], what: str) -> str:
    """One sentence: how many of ``rows`` (each holding ``gap``'s keys) are within the
    tolerance."""
    ok = sum(1 for r in rows if not r["planner_gap"])
    return (f"{what} simulated within {TOLERANCE:.0%} of the planner's predicted time per "
            f"minibatch: {ok} of {len(rows)} rows (`harness/sim/planner_gap.py`; the last "
            "column, with why where a row is outside).")
