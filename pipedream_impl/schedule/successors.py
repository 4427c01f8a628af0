"""PipeDream's successors as schedules: PipeDream-Flush and PipeDream-2BW, on our runtime.

Both run over microbatches (unit ids ``k * M + j``, as ``schedule.gpipe``) on unreplicated
stages, with the same RF/F/SF/RB/B/SB/U actions the runtime already executes:

- ``one_f_one_b_flush`` (PipeDream-Flush; the schedule DeepSpeed's PipelineEngine and
  Megatron-LM's non-interleaved 1F1B run): per minibatch of M microbatches, stage s of p
  runs min(p - s, M) warm-up forwards, then alternates one backward and one forward, then
  drains the rest of the backwards, then makes one synchronous update (a flush). Every
  microbatch of minibatch k uses version k, so the weights equal whole-minibatch training;
  at most p - s microbatches are in flight on stage s (GPipe holds M).
- ``two_bw`` (PipeDream-2BW, Narayanan et al., ICML 2021, "Memory-Efficient
  Pipeline-Parallel DNN Training", section 3.1): 1F1B over the stream of microbatches with
  no flush between minibatches (warm-up p - s once per epoch), the gradients of a
  minibatch's M microbatches accumulated and applied in one update after its last
  backward; every microbatch of minibatch k runs its forward and its backward with
  version max(0, k - 1) on every stage (double buffering: a new version is made every M
  microbatches, microbatches already admitted keep the older one). Hence the paper's update
  rule with a delay of one on every stage: W(t+1) = W(t) - lr * grad f(W(t-1)), with
  W(-1) = W(0). Two versions are live at any time (W(k) and W(k-1)); version k - 1 is
  ready before minibatch k's first forward on every stage when M >= p - 1 (the paper asks
  M >= p, the pipeline depth; one less still works here: the version arrives just in
  time). The weight mode is ``"2bw"``; ``validate`` checks its versions.

An epoch's end drains the pipeline, as every schedule here does: the delay restarts with
each epoch (its first two minibatches use the weights it started with).
``steps`` turns a per-stage compute order (F, B, or the split I and W) into actions with
their messages and updates; the zero-bubble builder (``zero_bubble``) shares it.
"""

from __future__ import annotations

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import (
    Action,
    Layout,
    Schedule,
    check_size,
    require_unreplicated,
)
from pipedream_impl.schedule.validate import validate

__all__ = ["one_f_one_b_flush", "steps", "two_bw"]


def _order(units: list[int], warmup: int) -> list[tuple[str, int]]:
    """1F1B over ``units``: ``warmup`` forwards, then backward-forward pairs, then drain."""
    w = min(len(units), warmup)
    seq = [("F", u) for u in units[:w]]
    for j, u in enumerate(units[w:]):
        seq += [("B", units[j]), ("F", u)]
    return seq + [("B", u) for u in units[len(units) - w:]]


def steps(order: list[tuple[str, int]], stage: int, n_stages: int, microbatches: int,
          version: dict[int, int]) -> tuple[Action, ...]:
    """The order (F, and B or I then W per unit) with its messages (stage s's peers are
    ranks s - 1 and s + 1: I sends what B would) and one update after the weight gradient
    (B or W) of each minibatch's last microbatch (they run in unit order)."""
    acts: list[Action] = []
    for kind, u in order:
        if kind == "F":
            if stage > 0:
                acts.append(Action("RF", u, peer=stage - 1))
            acts.append(Action("F", u, version[u]))
            if stage < n_stages - 1:
                acts.append(Action("SF", u, peer=stage + 1))
            continue
        if kind != "W" and stage < n_stages - 1:
            acts.append(Action("RB", u, peer=stage + 1))
        acts.append(Action(kind, u, version[u]))
        if kind != "W" and stage > 0:
            acts.append(Action("SB", u, peer=stage - 1))
        if kind != "I" and (u + 1) % microbatches == 0:
            acts.append(Action("U", u))
    return tuple(acts)


def one_f_one_b_flush(layout: Layout, minibatches: int, microbatches: int) -> Schedule:
    """PipeDream-Flush: 1F1B within each minibatch, a flush and one update per minibatch."""
    n = require_unreplicated(layout, "PipeDream-Flush")
    check_size(layout, minibatches, microbatches)
    m = microbatches
    version = {k * m + j: k for k in range(minibatches) for j in range(m)}
    actions = []
    for s in range(n):
        order = [x for k in range(minibatches)
                 for x in _order(list(range(k * m, (k + 1) * m)), n - s)]
        actions.append(steps(order, s, n, m, version))
    sched = Schedule(layout, minibatches, "stash", tuple(actions), m)
    validate(sched)
    return sched


def two_bw(layout: Layout, minibatches: int, microbatches: int) -> Schedule:
    """PipeDream-2BW: 1F1B over every microbatch of the epoch, one update per minibatch,
    minibatch k on version max(0, k - 1) everywhere (double-buffered weights)."""
    n = require_unreplicated(layout, "PipeDream-2BW")
    check_size(layout, minibatches, microbatches)
    m = microbatches
    if m < n - 1:
        raise ScheduleError(f"PipeDream-2BW needs at least {n - 1} microbatches per "
                            f"minibatch on {n} stages (got {m}): a minibatch's forwards "
                            "would need a weight version not made yet; use --microbatches "
                            f"{n} or more")
    units = list(range(minibatches * m))
    version = {u: max(0, u // m - 1) for u in units}
    actions = tuple(steps(_order(units, n - s), s, n, m, version) for s in range(n))
    sched = Schedule(layout, minibatches, "2bw", actions, m)
    validate(sched)
    return sched

