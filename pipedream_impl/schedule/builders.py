"""PipeDream's and GPipe's schedules: 1F1B / 1F1B-RR with its weight modes, and the flush.

``gpipe`` builds GPipe's flush schedule over microbatches (unit ids ``k * M + j``).
``one_f_one_b`` builds PipeDream's schedule (1F1B, and 1F1B-RR for replicated stages):
minibatch k goes to replica ``k mod r`` of every stage; a worker first runs its stage's
warm-up forwards (``actions.warmup_count``: PipeDream's per-stage depth, ceil(workers in
this and later stages / replicas of this stage) on straight and evenly replicated
pipelines, NOAM at the input stage; more where neighbouring stages have different replica
counts, so that no replica idles at the round's all-reduce: ``actions.stage_depths``),
then alternates one backward and one forward, then drains. ``in_flight=1`` gives model
parallelism (one minibatch in the pipeline at a time). Weight modes decide the version
each F and B uses:

- ``stash``: F uses the newest version; B of k uses the version F of k used;
- ``vertical-sync``: every stage uses, for minibatch k, the newest own version not newer
  than the one stage 0 used for k;
- ``none``: F and B each use whatever is newest when they run;
- ``2bw`` (``successors.two_bw``, microbatched): F and B of every unit of minibatch k use
  version max(0, k - 1) (PipeDream-2BW's one-step delay).

Every builder validates what it returns (``validate``).
"""

from __future__ import annotations

import math

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import (
    WEIGHT_MODES,
    Action,
    Layout,
    Schedule,
    check_size,
    require_unreplicated,
    warmup_count,
)
from pipedream_impl.schedule.validate import validate

__all__ = ["gpipe", "one_f_one_b"]


def one_f_one_b(layout: Layout, minibatches: int, weights: str = "stash",
                in_flight: int | None = None) -> Schedule:
    if weights not in WEIGHT_MODES:
        raise ScheduleError(f"unknown weight mode {weights!r}; choose one of "
                            f"{', '.join(WEIGHT_MODES)}")
    check_size(layout, minibatches)
    if in_flight is not None and in_flight < 1:
        raise ScheduleError(f"--in-flight must be at least 1 (got {in_flight}); 1 is model "
                            "parallelism, leave it out for PipeDream's NOAM")
    n_stages = len(layout.replicas)
    lcm = math.lcm(*layout.replicas)
    if minibatches % lcm:
        raise ScheduleError(f"{minibatches} minibatches do not divide evenly over the "
                            f"replicas {layout.replicas}: use a multiple of {lcm}")
    orders = []
    for rank in range(layout.workers):
        s, i = layout.stage_of(rank)
        mine = list(range(i, minibatches, layout.replicas[s]))
        w = min(len(mine), warmup_count(layout, s, in_flight))
        seq = [("F", k) for k in mine[:w]]
        for j, k in enumerate(mine[w:]):
            seq += [("B", mine[j]), ("F", k)]
        seq += [("B", k) for k in mine[max(0, len(mine) - w):]]
        orders.append(seq)
    # Versions: a stage's version = minibatches applied; stash needs F's version at B.
    stage0_version: dict[int, int] = {}
    out: list[tuple[Action, ...]] = []
    # Stage 0 first, so vertical sync can read its versions.
    for rank in sorted(range(layout.workers), key=lambda r: layout.stage_of(r)[0]):
        s, _ = layout.stage_of(rank)
        r = layout.replicas[s]
        applied, fwd_version, acts, rounds = 0, {}, [], 0
        for kind, k in orders[rank]:
            if kind == "F":
                v = applied
                if s == 0:
                    stage0_version[k] = v
                elif weights == "vertical-sync":
                    v = (stage0_version[k] // r) * r if r > 1 else stage0_version[k]
                    v = min(v, applied)
                fwd_version[k] = v
                if s > 0:
                    acts.append(Action("RF", k, peer=layout.rank_for(s - 1, k)))
                acts.append(Action("F", k, v))
                if s < n_stages - 1:
                    acts.append(Action("SF", k, peer=layout.rank_for(s + 1, k)))
            else:
                if s < n_stages - 1:
                    acts.append(Action("RB", k, peer=layout.rank_for(s + 1, k)))
                acts.append(Action("B", k, applied if weights == "none" else fwd_version[k]))
                if s > 0:
                    acts.append(Action("SB", k, peer=layout.rank_for(s - 1, k)))
                if r > 1:
                    acts.append(Action("A", rounds))
                acts.append(Action("U", k))
                rounds += 1
                applied += r
        out.append((rank, tuple(acts)))
    actions = tuple(a for _, a in sorted(out))
    sched = Schedule(layout, minibatches, weights, actions)
    validate(sched)
    return sched


def gpipe(layout: Layout, minibatches: int, microbatches: int) -> Schedule:
    """GPipe: per minibatch, every microbatch's forward, then every backward, then one
    synchronous update (a flush). Unit ids are ``k * microbatches + j``. Stages are not
    replicated (GPipe's data parallelism would be a separate all-reduce at the flush)."""
    require_unreplicated(layout, "GPipe")
    check_size(layout, minibatches, microbatches)
    n = len(layout.replicas)
    actions = []
    for s in range(n):
        acts: list[Action] = []
        for k in range(minibatches):
            units = [k * microbatches + j for j in range(microbatches)]
            for u in units:
                if s > 0:
                    acts.append(Action("RF", u, peer=s - 1))
                acts.append(Action("F", u, k))
                if s < n - 1:
                    acts.append(Action("SF", u, peer=s + 1))
            for u in units:
                if s < n - 1:
                    acts.append(Action("RB", u, peer=s + 1))
                acts.append(Action("B", u, k))
                if s > 0:
                    acts.append(Action("SB", u, peer=s - 1))
            acts.append(Action("U", units[-1]))
        actions.append(tuple(acts))
    sched = Schedule(layout, minibatches, "stash", tuple(actions), microbatches)
    validate(sched)
    return sched


