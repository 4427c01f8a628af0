"""The one event engine for schedules: every rank's action list run against blocking
receives and all-reduce barriers, under a cost model.

The validator and the grid printer run it with ``TickCosts`` (illustrative ticks); the
cluster simulator (``harness.sim``) with its cost model of a profiled model on a modelled
cluster; the in-process runtime (``pipedream_impl.runtime.local``) and the tie planner
drive their own steps with ``interleave``. Messages are FIFO per (sender, receiver, kind,
consuming stage): schedules that hold several stages per rank keep the message streams of
different stage pairs apart.
"""

from __future__ import annotations

from collections.abc import Callable

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import BACKWARDS, Action, Schedule

__all__ = ["COMPUTE", "TickCosts", "grid", "interleave", "simulate"]

COMPUTE = ("F", *BACKWARDS)  # the compute actions a timeline shows (U is an update)


class TickCosts:
    """The schedule grid's illustrative costs: forward 1 tick, backward 2 (its input and
    weight halves 1 each), the rest free.

    A cost model answers three questions (``harness.sim.costs.ClusterCosts`` answers them
    from a profile and a cluster): how long a rank's compute action takes, when a message
    sent at ``t`` leaves the sender free, when the receiver is free again once it posts its
    receive (``send`` returns a token ``receive`` reads: an eager transfer's arrival time,
    or a rendezvous transfer's ready time; plus, for a measured machine, the receiver's
    own time), and how long an all-reduce among a stage's replicas takes.
    """

    def __init__(self, ticks: dict[str, int] | None = None) -> None:
        self.ticks = ticks or {"F": 1, "B": 2, "I": 1, "W": 1}

    def compute(self, rank: int, a: Action) -> float:
        return self.ticks.get(a.kind, 0)

    def send(self, src: int, dst: int, a: Action, t: float) -> tuple[float, float]:
        return t, t  # (sender free again, token: here the time the message arrives)

    def receive(self, src: int, dst: int, a: Action, token: float, posted: float) -> float:
        return token  # when the message is in: the receiver posted its receive at ``posted``

    def allreduce(self, stage: int, ranks: tuple[int, ...], t: float) -> float:
        return 0


def interleave(actions: tuple[tuple[Action, ...], ...] | list,
               step: Callable[[int, int, Action], bool]) -> None:
    """Drive every rank's action list in rounds: a rank goes on while ``step(rank, pos,
    action)`` returns True and stops at the first False (blocked: a receive with nothing
    waiting, an all-reduce another replica has not reached); rounds repeat while any rank
    moved. Raises ScheduleError on a deadlock. The event engine below and the in-process
    runtime (``pipedream_impl.runtime.local``) both run on it."""
    pc = [0] * len(actions)
    progress = True
    while progress:
        progress = False
        for rank, acts in enumerate(actions):
            while pc[rank] < len(acts) and step(rank, pc[rank], acts[pc[rank]]):
                pc[rank] += 1
                progress = True
    stuck = [r for r in range(len(actions)) if pc[r] < len(actions[r])]
    if stuck:
        at = ", ".join(f"rank {r} at {actions[r][pc[r]]}" for r in stuck)
        raise ScheduleError(f"deadlock: {at}")


def simulate(sched: Schedule, ticks: dict[str, int] | None = None, costs=None) \
        -> list[list[tuple[float, float, Action]]]:  # noqa: ANN001 - any cost model
    """Run every worker's list with blocking receives and all-reduce barriers.

    The one event engine for schedules: the validator and grid use ``TickCosts``; the
    cluster simulator passes its own cost model. A send returns when the cost model says
    the sender is free again; a receive blocks until the cost model says the receiver is
    free again (the message in: an eager transfer's arrival, or a rendezvous transfer that
    starts once the receive is posted; then any time of its own); an all-reduce starts
    when the last replica reaches it. Returns, per rank, (start, end, action) of its F, B,
    I, W, A and U actions. Raises ScheduleError on a deadlock or a receive that does not
    match the oldest pending send.
    """
    costs = costs or TickCosts(ticks)
    n = sched.layout.workers
    clock = [0] * n
    channels: dict[tuple[int, int, str, int], list[tuple[int, float]]] = {}
    allreduce_wait: dict[tuple[int, int], dict[int, float]] = {}
    timeline: list[list[tuple[float, float, Action]]] = [[] for _ in range(n)]

    def step(rank: int, pos: int, a: Action) -> bool:
        if a.kind in ("SF", "SB", "ST"):
            clock[rank], token = costs.send(rank, a.peer, a, clock[rank])
            channels.setdefault(_channel(rank, a.peer, a), []).append((a.mb, token))
        elif a.kind in ("RF", "RB", "RT"):
            q = channels.get(_channel(a.peer, rank, a), [])
            if not q:
                return False
            mb, token = q[0]
            if mb != a.mb:
                raise ScheduleError(f"rank {rank} expects {a} but the next message "
                                    f"from rank {a.peer} is minibatch {mb}")
            q.pop(0)
            clock[rank] = max(clock[rank], costs.receive(a.peer, rank, a, token, clock[rank]))
        elif a.kind == "A":  # a barrier among the stage's replicas
            s, _ = sched.layout.stage_of(rank)
            arrivals = allreduce_wait.setdefault((s, a.mb), {})
            arrivals[rank] = clock[rank]
            if len(arrivals) < sched.layout.replicas[s]:
                return False
            ranks = tuple(sorted(arrivals))
            start = max(arrivals.values())
            clock[rank] = start + costs.allreduce(s, ranks, start)
            timeline[rank].append((arrivals[rank], clock[rank], a))
        elif a.kind in COMPUTE or a.kind == "U":
            start = clock[rank]
            clock[rank] += costs.compute(rank, a)
            timeline[rank].append((start, clock[rank], a))
        return True

    interleave(sched.actions, step)
    return timeline


def _channel(src: int, dst: int, a: Action) -> tuple[int, int, str, int]:
    """The FIFO a message travels on: its ranks, its kind (F, B or T) and the stage that
    consumes it (-1 where every rank holds one stage). Sends carry the sending stage,
    receives the receiving one."""
    if a.stage < 0 or a.kind[1] == "T":
        return src, dst, a.kind[1], -1
    if a.kind[0] == "R":
        return src, dst, a.kind[1], a.stage
    return src, dst, a.kind[1], a.stage + (1 if a.kind == "SF" else -1)


def grid(sched: Schedule) -> str:
    """Worker x time table: F one tick, B two (I and W one each); '.' idle."""
    timeline = [[x for x in row if x[2].kind in COMPUTE] for row in simulate(sched)]
    end = max((e for row in timeline for _, e, _ in row), default=0)
    width = max(3, len(str(sched.units)) + 2)
    lines = ["time".ljust(8) + "".join(str(t).ljust(width) for t in range(end))]
    for rank, row in enumerate(timeline):
        s, i = sched.layout.stage_of(rank)
        cells = ["." * 1] * end
        for start, stop, a in row:
            for t in range(start, stop):
                cells[t] = f"{a.kind}{a.mb}"
        lines.append(f"s{s}r{i}".ljust(8) + "".join(c.ljust(width) for c in cells))
    busy = sum(e - b for row in timeline for b, e, _ in row)
    lines.append(f"bubble fraction {1 - busy / max(1, end * sched.layout.workers):.2f}")
    return "\n".join(lines)
