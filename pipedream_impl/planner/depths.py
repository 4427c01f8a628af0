"""Minibatches in flight per stage, deep enough for a plan's transfers.

Why: PipeDream's warm-up (per stage, the workers from that stage on over its replicas;
NOAM at the input) keeps a pipeline full when transfers take no time, and the planner
counts transfers as overlapped with compute (``optimizer``: a cut costs 2 a / B beside
the stages, not after them). But a minibatch stage s forwards comes back as a gradient
only after stage s+1 has run it forward and backward and the cut carried it each way.
Under 1F1B a replica of stage s runs the backward of a minibatch (D_s / r_s - 1) of its
periods (r_s P, P the plan's time per minibatch) after its forward; so in steady state,
with every stage starting a forward as its input arrives,

    D_s - r_s >= D_{s+1} - r_{s+1} + (C_{s+1} + 2 t_s) / P

(C_{s+1}: a replica's forward and backward of one minibatch; t_s: the cut's activation
bytes over the bandwidth of the link it crosses), or the stage waits for a gradient. With
no transfer time this never asks more than the schedule's own rule
(``schedule.actions.stage_depths``, which covers uneven replica counts); the excess,
max(0, (C_{s+1} + 2 t_s) / P - r_{s+1}), is added to it per stage. Found by
``harness.sim.planner_gap``: S2VT's 1-1-1-1 plan on Cluster-C simulated at 1.22x its
planned time with the default depths (4, 3, 2, 1); with (5, 4, 2, 1), this rule's, 1.00x.
The cost is memory: stashed weight versions and activations grow with the depth (the
planner's memory limit keeps the original's count, a lower bound, as for uneven replicas).

A plan records the result (``Plan.depths``); the runtime and the simulator build their
1F1B(-RR) schedule with it (``schedule.actions.Layout.depths``).
"""

from __future__ import annotations

import math

from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.schedule.actions import stage_depths

__all__ = ["cut_level", "cut_seconds", "transfer_depths"]

_SLACK = 1e-9  # an excess a hair over a whole number from rounding is that whole number


def transfer_depths(replicas: tuple[int, ...], compute_s: list[float],
                    transfer_s: list[float], period_s: float) -> tuple[int, ...]:
    """Minibatches in flight per stage: ``stage_depths``' rule plus, on each stage but the
    last, what the next stage's compute (``compute_s``, per replica and minibatch) and the
    cut's two transfers (``transfer_s[s]``: the cut after stage s) take beyond the next
    stage's own share of the period ``period_s``."""
    if len(replicas) < 2 or not (period_s > 0 and math.isfinite(period_s)):
        return stage_depths(replicas)
    extra = tuple(max(0.0, (compute_s[s + 1] + 2.0 * transfer_s[s]) / period_s
                      - replicas[s + 1]) * (1.0 - _SLACK)
                  for s in range(len(replicas) - 1)) + (0.0,)
    return stage_depths(replicas, extra)


def cut_level(cluster: Cluster, a: int, b: int) -> int:
    """The level of the link between worker ranks ``a`` and ``b``: the innermost level
    whose units hold both (0: the same server)."""
    size = 1
    for i, lv in enumerate(cluster.levels):
        size *= lv.workers
        if a // size == b // size:
            return i
    return len(cluster.levels) - 1


def cut_seconds(cluster: Cluster, nbytes: float, ranks: tuple[int, ...],
                nxt: tuple[int, ...]) -> float:
    """One transfer of ``nbytes`` across a cut, on the slowest link a minibatch may take
    (minibatch k goes from replica k mod r of one stage to k mod r' of the next)."""
    pairs = math.lcm(len(ranks), len(nxt))
    bw = min(cluster.levels[cut_level(cluster, ranks[k % len(ranks)],
                                      nxt[k % len(nxt)])].bandwidth for k in range(pairs))
    return nbytes / bw
