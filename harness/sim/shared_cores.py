"""Workers that share fewer CPU cores than they are: compute time-shared among them.

Why: the validation runs 4 workers on this machine's 2 cores. Charging every rank its
compute at full speed and then bounding the run by all ranks' busy time over the cores
(the capacity bound, ``harness.sim.simulator``) packs the work perfectly: it lets one
rank's all-reduce or receive wait run beside two others' compute. A real run cannot pack
it so. Data parallelism's ranks compute in lockstep, all four at once, each at half speed,
and then all wait in the all-reduce with the cores idle; a pipeline's stages compute
together as often as the schedule lets them.

The model here is processor sharing. While n ranks compute on c cores (n > c), each
computes at c / n of its speed. The event engine gives every action its duration when it
starts, before it knows what the other ranks will do, so the sharing is found as a fixed
point (``stretch``):
1. Simulate at full speed.
2. Over each compute action's span, integrate the share of a core it got, min(1, c / n)
   with n the ranks computing at each moment; its span over that is how many times its own
   time it needs at the shares it met: its factor.
3. Simulate again, and repeat, each round averaged with the last so that it settles
   (until no factor moves by more than ``SETTLED``, at most ``ROUNDS`` times).

At the fixed point every action got exactly its own time of a core over its span, which
is processor sharing. Receives, sends and waits take no core here. Their own CPU time stays
in the capacity bound, which still applies.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from pipedream_impl.schedule import COMPUTE, Action

__all__ = ["ROUNDS", "SETTLED", "Timeline", "stretch"]

Timeline = list[list[tuple[float, float, Action]]]
ROUNDS = 40  # at most this many fixed-point rounds (each a whole simulation)
SETTLED = 1e-4  # ... ending once no factor would move by more than this
_KINDS = (*COMPUTE, "U")  # what occupies a core


def _shares(timeline: Timeline, cores: int) -> dict[tuple[int, Action], float]:
    """Each compute action's span over the core time it got in it: its share of a core,
    min(1, cores / ranks computing), integrated over the span (from the timeline's compute
    spans, itself counted). An action whose span is that factor times its own time got
    exactly its own time of a core: the fixed point."""
    spans = [(s, e) for row in timeline for s, e, a in row if a.kind in _KINDS and e > s]
    edges = sorted({t for span in spans for t in span})
    if not edges:
        return {}
    delta = [0] * len(edges)
    for s, e in spans:
        delta[bisect.bisect_left(edges, s)] += 1
        delta[bisect.bisect_left(edges, e)] -= 1
    got, count = [0.0], 0  # got[i]: one computing rank's core time from edges[0] to [i]
    for i in range(1, len(edges)):
        count += delta[i - 1]
        got.append(got[-1] + min(1.0, cores / max(count, 1)) * (edges[i] - edges[i - 1]))
    index = {t: i for i, t in enumerate(edges)}
    return {(rank, a): (e - s) / (got[index[e]] - got[index[s]])
            for rank, row in enumerate(timeline) for s, e, a in row
            if a.kind in _KINDS and e > s}


def stretch(run: Callable[[dict[tuple[int, Action], float]], Timeline], cores: int,
            rounds: int = ROUNDS) -> tuple[Timeline, dict[tuple[int, Action], float]]:
    """The timeline with compute time-shared on ``cores``, and each compute action's
    stretch factor: ``run(factors)`` simulates with each (rank, action)'s compute
    multiplied by its factor (missing: 1)."""
    factors: dict[tuple[int, Action], float] = {}
    timeline = run(factors)
    for _ in range(rounds):
        target = _shares(timeline, cores)
        if all(abs(f - factors.get(key, 1.0)) <= SETTLED for key, f in target.items()):
            break
        factors = {key: (factors.get(key, 1.0) + f) / 2 for key, f in target.items()}
        timeline = run(factors)
    return timeline, factors
