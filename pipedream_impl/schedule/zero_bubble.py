"""Zero-bubble ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1):
1F1B with the backward split in two, on one stage per worker, with a flush per minibatch.

Each backward runs as I (the gradient of the stage's input, which the previous stage waits
for) and W (the gradient of its weights, which nobody waits for). Stage s of p runs 1F1B's
warm-up of min(M, p - s) forwards, then for each microbatch its I, its oldest deferred W
once s W's are deferred, and the next forward; the s deferred W's fill the drain. Stage s
therefore holds at most p microbatches' activations (1F1B's peak, on stage 0), and with
equal F, I and W times a minibatch takes 3M + p - 1 time units on every stage: a bubble of
(p - 1) / (3M) of the work, a third of 1F1B's (p - 1) / M. Every microbatch of minibatch k
uses version k, so the weights equal whole-minibatch training (one update per minibatch,
after its last W).
"""

from __future__ import annotations

from pipedream_impl.schedule.actions import Layout, Schedule, check_size, require_unreplicated
from pipedream_impl.schedule.successors import steps
from pipedream_impl.schedule.validate import validate

__all__ = ["zb_h1"]


def _order(units: list[int], stage: int, stages: int) -> list[tuple[str, int]]:
    """One minibatch's compute order on ``stage``: warm-up forwards, then I, a deferred W
    (once ``stage`` of them wait) and the next forward, then the deferred W's."""
    warm = min(len(units), stages - stage)
    seq = [("F", u) for u in units[:warm]]
    deferred: list[int] = []
    for j, u in enumerate(units):
        seq.append(("I", u))
        deferred.append(u)
        if len(deferred) > stage:
            seq.append(("W", deferred.pop(0)))
        if warm + j < len(units):
            seq.append(("F", units[warm + j]))
    return seq + [("W", u) for u in deferred]


def zb_h1(layout: Layout, minibatches: int, microbatches: int) -> Schedule:
    """ZB-H1 over ``microbatches`` per minibatch, one update per minibatch (a flush)."""
    n = require_unreplicated(layout, "ZB-H1")
    check_size(layout, minibatches, microbatches)
    m = microbatches
    version = {k * m + j: k for k in range(minibatches) for j in range(m)}
    actions = tuple(
        steps([x for k in range(minibatches)
               for x in _order(list(range(k * m, (k + 1) * m)), s, n)], s, n, m, version)
        for s in range(n))
    sched = Schedule(layout, minibatches, "stash", actions, m)
    validate(sched)
    return sched
