"""Schedules from per-rank compute orders: torch's schedules and schedule files as our
actions, for the one event engine and (one stage per rank) our runtime.

A compute order lists, per rank, one step's compute actions as ``(kind, stage,
microbatch)``: F, B, or the split backward's I and W, the form torch.distributed.pipelining
keeps in ``pipeline_order`` and writes to its CSV schedule files (``torch_csv``).
``from_compute_order`` repeats the step for every minibatch (unit ``k * M + j``, version k:
each step ends in one update per rank, a flush), adds the messages between stages held by
different ranks (receive right before the consuming action, send right after the
producing one; a hand-off between two stages of one rank needs none) and validates the
result. Stages sit where the order puts them: each stage on exactly one rank; a rank may
hold several (interleaved, V-shaped), and then every action names its stage.
"""

from __future__ import annotations

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import BACKWARDS, Action, Layout, Schedule, check_size
from pipedream_impl.schedule.validate import validate

__all__ = ["Op", "from_compute_order", "stage_map"]

Op = tuple[str, int, int]  # (F, B, I or W; model stage; microbatch within the step)


def stage_map(order: list[list[Op]]) -> tuple[int, ...]:
    """The rank holding each stage, read off the order."""
    where: dict[int, int] = {}
    for rank, row in enumerate(order):
        for _, s, _ in row:
            if where.setdefault(s, rank) != rank:
                raise ScheduleError(f"stage {s} has actions on ranks {where[s]} and {rank}; "
                                    "a stage lives on one rank")
    if sorted(where) != list(range(len(where))):
        raise ScheduleError(f"the order names stages {sorted(where)}; number them 0, 1, ... "
                            "without gaps")
    return tuple(where[s] for s in range(len(where)))


def from_compute_order(order: list[list[Op]], minibatches: int, microbatches: int) -> Schedule:
    """``minibatches`` steps of ``order`` with their messages and updates, validated."""
    workers, m = len(order), microbatches
    for rank, row in enumerate(order):
        for kind, s, j in row:
            if kind != "F" and kind not in BACKWARDS:
                raise ScheduleError(f"rank {rank}: {s}{kind}{j} is not a compute action "
                                    "(F, B, I or W): write the compute-only form, the "
                                    "messages are added here")
            if not 0 <= j < m:
                raise ScheduleError(f"rank {rank}: {s}{kind}{j} names microbatch {j} of "
                                    f"{m} (0..{m - 1})")
    ranks = stage_map(order)
    last = len(ranks) - 1
    named = ranks != tuple(range(workers))  # else stage s is rank s: the layout says it
    check_size(Layout((1,) * workers), minibatches, m)
    actions = []
    for rank, row in enumerate(order):
        acts: list[Action] = []
        for k in range(minibatches):
            for kind, s, j in row:
                u, tag = k * m + j, s if named else -1
                prev = ranks[s - 1] if s > 0 and ranks[s - 1] != rank else -1
                nxt = ranks[s + 1] if s < last and ranks[s + 1] != rank else -1
                before, after = (("RF", prev), ("SF", nxt)) if kind == "F" else \
                    (("RB", nxt), ("SB", prev)) if kind != "W" else (("", -1), ("", -1))
                if before[1] >= 0:
                    acts.append(Action(before[0], u, peer=before[1], stage=tag))
                acts.append(Action(kind, u, k, stage=tag))
                if after[1] >= 0:
                    acts.append(Action(after[0], u, peer=after[1], stage=tag))
            acts.append(Action("U", k * m + m - 1))
        actions.append(tuple(acts))
    sched = Schedule(Layout((1,) * workers), minibatches, "stash", tuple(actions), m,
                     ranks if named else None)
    validate(sched)
    return sched
