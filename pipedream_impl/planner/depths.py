"""Minibatches in flight per stage, deep enough for a plan's transfers.

Why: PipeDream's warm-up (per stage, the workers from that stage on over its replicas;
NOAM at the input) keeps a pipeline full when transfers take no time, and the planner
counts transfers as overlapped with compute (``optimizer``: a cut costs 2 a / B beside
the stages, not after them). But a minibatch stage s forwards comes back as a gradient
only after stage s+1 has run it forward and backward and the cut carried it each way.
Under 1F1B a replica of stage s runs the backward of a minibatch (D_s / r_s - 1) of its
periods (r_s P, P the plan's time per minibatch) after its forward; so in steady state,
with every stage starting a forward as its input arrives, it never waits if

    D_s - r_s >= D_{s+1} - r_{s+1} + (C_{s+1} + 2 t_s) / P

(C_{s+1}: a replica's forward and backward of one minibatch; t_s: the cut's activation
bytes over the bandwidth of the link it crosses). With no transfer time this never asks
more than the schedule's own rule (``schedule.actions.stage_depths``, which covers uneven
replica counts); the excess, max(0, (C_{s+1} + 2 t_s) / P - r_{s+1}), is added to it per
stage (``deepest``). That is enough, not the least: a stage with slack in its period
absorbs part of the wait. So the plan runs both depths on the schedule's event engine
under the planner's own costs (``engine_period``) and keeps the deeper ones only where
the default runs more than ``WORTH`` slower. Found by ``harness.sim.planner_gap``: S2VT's
1-1-1-1 plan on Cluster-C simulated at 1.22x its planned time with the default depths
(4, 3, 2, 1); with (5, 4, 2, 1), this rule's, 1.00x. The cost is memory: stashed weight
versions and activations grow with the depth (``plan_profile`` keeps the default where a
memory limit would break).

A plan records the result (``Plan.depths``); the runtime and the simulator build their
1F1B(-RR) schedule with it (``schedule.actions.Layout.depths``).
"""

from __future__ import annotations

import math

from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.schedule.actions import Action, Layout, stage_depths
from pipedream_impl.schedule.builders import one_f_one_b
from pipedream_impl.schedule.engine import simulate

__all__ = ["WORTH", "cut_seconds", "deepest", "engine_period", "transfer_depths"]

_SLACK = 1e-9  # an excess a hair over a whole number from rounding is that whole number
# a deeper warm-up stashes one more weight version and set of activations per step of
# depth, and that costs time too: PipeDream with depths (3, 1) ran at 0.976x (2, 1)'s
# samples/s on tiny VGG-16 here (6 interleaved pairs of 16-epoch runs, 5 below 1), where
# the plan's nominal link made (2, 1) 1.6% slower on the engine; so a plan deepens only
# where the default runs more than this much slower than the deeper depths on the engine
WORTH = 0.02


def transfer_depths(replicas: tuple[int, ...], forward_s: list[float], backward_s: list[float],
                    transfer_s: list[float], period_s: float) -> tuple[int, ...]:
    """Minibatches in flight per stage: ``deepest``'s where the default warm-up runs
    more than ``WORTH`` slower on the event engine (``engine_period``), else the
    default (``stage_depths``)."""
    default = stage_depths(replicas)
    compute = [f + b for f, b in zip(forward_s, backward_s, strict=True)]
    deep = deepest(replicas, compute, transfer_s, period_s)
    if deep == default:
        return default
    times = (forward_s, backward_s, transfer_s)
    slow = engine_period(replicas, default, *times) > \
        engine_period(replicas, deep, *times) * (1.0 + WORTH)
    return deep if slow else default


def deepest(replicas: tuple[int, ...], compute_s: list[float], transfer_s: list[float],
            period_s: float) -> tuple[int, ...]:
    """The rule above: ``stage_depths``' plus, on each stage but the last, what the next
    stage's compute (``compute_s``, per replica and minibatch) and the cut's two transfers
    (``transfer_s[s]``: the cut after stage s) take beyond the next stage's own share of
    the period ``period_s``. Enough, not the least: it waits on no stage's slack."""
    if len(replicas) < 2 or not (period_s > 0 and math.isfinite(period_s)):
        return stage_depths(replicas)
    extra = tuple(max(0.0, (compute_s[s + 1] + 2.0 * transfer_s[s]) / period_s
                      - replicas[s + 1]) * (1.0 - _SLACK)
                  for s in range(len(replicas) - 1)) + (0.0,)
    return stage_depths(replicas, extra)


class _PlanCosts:
    """The planner's view of a schedule for the event engine: each stage's forward and
    backward per minibatch, a transfer across a cut arriving its time after the send (the
    sender free at once), all-reduces free (``stage_depths`` keeps rounds apart)."""

    def __init__(self, layout: Layout, forward_s: list[float], backward_s: list[float],
                 transfer_s: list[float]) -> None:
        self.layout, self.f, self.b, self.t = layout, forward_s, backward_s, transfer_s

    def compute(self, rank: int, a: Action) -> float:
        s = self.layout.stage_of(rank)[0]
        return self.f[s] if a.kind == "F" else self.b[s] if a.kind == "B" else 0.0

    def send(self, src: int, dst: int, a: Action, t: float) -> tuple[float, float]:
        cut = min(self.layout.stage_of(src)[0], self.layout.stage_of(dst)[0])
        return t, t + self.t[cut]

    def receive(self, src: int, dst: int, a: Action, token: float, posted: float) -> float:
        return token

    def allreduce(self, stage: int, ranks: tuple[int, ...], t: float) -> float:
        return 0.0


def engine_period(replicas: tuple[int, ...], depths: tuple[int, ...], forward_s: list[float],
                  backward_s: list[float], transfer_s: list[float]) -> float:
    """Seconds per minibatch of 1F1B(-RR) at ``depths`` on the event engine with
    ``_PlanCosts``: between the input stage's backwards a quarter and three quarters in."""
    layout = Layout(replicas, depths)
    rnd = math.lcm(*replicas)
    n = rnd * max(4, math.ceil(8 * max(depths) / rnd))
    sched = one_f_one_b(layout, n)
    timeline = simulate(sched, costs=_PlanCosts(layout, forward_s, backward_s, transfer_s))
    done = sorted(e for r in range(replicas[0]) for _, e, a in timeline[r] if a.kind == "B")
    lo, hi = n // 4 // rnd * rnd, 3 * n // 4 // rnd * rnd
    return (done[hi - 1] - done[lo - 1]) / (hi - lo)


def cut_seconds(cluster: Cluster, nbytes: float, ranks: tuple[int, ...],
                nxt: tuple[int, ...]) -> float:
    """One transfer of ``nbytes`` across a cut, on the slowest link a minibatch may take
    (minibatch k goes from replica k mod r of one stage to k mod r' of the next)."""
    pairs = math.lcm(len(ranks), len(nxt))
    bw = min(cluster.levels[cluster.link_level(ranks[k % len(ranks)],
                                               nxt[k % len(nxt)])].bandwidth
             for k in range(pairs))
    return nbytes / bw
