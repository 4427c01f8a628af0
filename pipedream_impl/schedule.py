"""Schedules as data: for every worker, the ordered list of actions the runtime executes.

An ``Action`` is one of::

    RF  receive the forward input of minibatch k      (from the previous stage's replica)
    F   forward of minibatch k with weight version v
    SF  send its output                                 (to the next stage's replica)
    RB  receive the gradient of its output
    B   backward of minibatch k with weight version v
    SB  send the gradient of its input
    A   all-reduce the weight gradients with the other replicas of the stage (round k)
    U   optimizer step
    ST  send the stage's gradient of tied weights of its update k (to the other tied stage)
    RT  receive the other tied stage's gradient of its update k (runtime/ties.py)

and prints compactly as ``F3v2`` (kind, minibatch, ``v`` version) or ``SF3>4`` (``>`` peer
rank) / ``RF3<1`` (``<`` peer rank); ``parse_action`` reads that form back.

Versions count *minibatches whose gradients a stage has applied*: an unreplicated stage
advances by 1 per update, a stage with r replicas by r per all-reduced round, so versions of
different stages are comparable (vertical sync needs that).

``gpipe`` builds GPipe's flush schedule over microbatches (unit ids ``k * M + j``).
``one_f_one_b`` builds PipeDream's schedule (1F1B, and 1F1B-RR for replicated stages):
minibatch k goes to replica ``k mod r`` of every stage; a worker first runs ``warmup``
forwards (its share of the in-flight minibatches: ceil(workers in this and later stages /
replicas of this stage), which for the input stage is NOAM), then alternates one backward
and one forward, then drains. ``in_flight=1`` gives model parallelism (one minibatch in
the pipeline at a time). Weight modes decide the version each F and B uses:

- ``stash``: F uses the newest version; B of k uses the version F of k used;
- ``vertical-sync``: every stage uses, for minibatch k, the newest own version not newer
  than the one stage 0 used for k;
- ``none``: F and B each use whatever is newest when they run;
- ``2bw`` (``successors.two_bw``, microbatched): F and B of every unit of minibatch k use
  version max(0, k - 1) (PipeDream-2BW's one-step delay).

``validate`` checks what the runtime relies on, for generated and hand-written schedules
alike, and raises ``ScheduleError`` on: versions that contradict the mode, a backward before
its forward, a minibatch not completed everywhere, a forward before its receive (or a
message kind out of place, on the wrong peer, missing or doubled), an update dropped,
added, or ahead of its all-reduce, a send never received or a receive never sent, and (by
running the lists against blocking receives and all-reduce barriers) a deadlock or a
receive of the wrong minibatch.
``grid`` renders the run as a worker x time table (F one tick, B two ticks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from core.errors import ScheduleError

__all__ = ["ACTION_NAMES", "Action", "Layout", "Schedule", "TickCosts", "WEIGHT_MODES",
           "gpipe", "grid", "interleave", "one_f_one_b", "parse_action", "simulate",
           "validate", "warmup_count"]

WEIGHT_MODES = ("stash", "vertical-sync", "none")
ACTION_NAMES = {"RF": "receive activations", "F": "forward", "SF": "send activations",
                "RB": "receive gradients", "B": "backward", "SB": "send gradients",
                "A": "all-reduce", "U": "update", "ST": "send tied gradients",
                "RT": "receive tied gradients"}  # what each action kind does
_ACTION = re.compile(r"^(RF|SF|RB|SB|ST|RT|F|B|A|U)(\d+)(?:v(\d+))?(?:([<>])(\d+))?$")


@dataclass(frozen=True)
class Action:
    kind: str
    mb: int
    version: int = -1
    peer: int = -1

    def __str__(self) -> str:
        s = f"{self.kind}{self.mb}"
        if self.version >= 0:
            s += f"v{self.version}"
        if self.peer >= 0:
            s += ("<" if self.kind.startswith("R") else ">") + str(self.peer)
        return s


def parse_action(text: str) -> Action:
    m = _ACTION.match(text.strip())
    if m is None:
        raise ScheduleError(f"cannot parse action {text!r}")
    return Action(m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else -1,
                  int(m.group(5)) if m.group(5) else -1)


@dataclass(frozen=True)
class Layout:
    """Which rank runs which stage replica: ranks are assigned stage by stage."""

    replicas: tuple[int, ...]

    @property
    def workers(self) -> int:
        return sum(self.replicas)

    def rank(self, stage: int, replica: int) -> int:
        return sum(self.replicas[:stage]) + replica

    def rank_for(self, stage: int, mb: int) -> int:
        return self.rank(stage, mb % self.replicas[stage])

    def stage_of(self, rank: int) -> tuple[int, int]:
        for s, r in enumerate(self.replicas):
            if rank < r:
                return s, rank
            rank -= r
        raise ValueError("rank out of range")

    @staticmethod
    def from_config(config: str) -> Layout:
        try:
            reps = tuple(int(x) for x in config.split("-"))
        except ValueError:
            raise ScheduleError(f"cannot read config {config!r}; write e.g. 2-1-1") from None
        if not reps or min(reps) < 1:
            raise ScheduleError(f"config {config!r}: every stage needs >= 1 replica "
                                "(e.g. 2-1-1)")
        return Layout(reps)


@dataclass(frozen=True)
class Schedule:
    layout: Layout
    minibatches: int
    weights: str
    actions: tuple[tuple[Action, ...], ...]  # per rank
    microbatches: int = 1  # action ids are units k * microbatches + j (GPipe); 1 otherwise

    @property
    def units(self) -> int:
        return self.minibatches * self.microbatches

    def owner(self, stage: int, unit: int) -> int:
        return self.layout.rank_for(stage, unit // self.microbatches)

    def text(self) -> str:
        return "\n".join(f"rank {r}: " + " ".join(map(str, acts))
                         for r, acts in enumerate(self.actions))


def warmup_count(layout: Layout, stage: int, in_flight: int | None) -> int:
    if in_flight is not None:
        return max(1, math.ceil(in_flight / layout.replicas[stage]))
    return math.ceil(sum(layout.replicas[stage:]) / layout.replicas[stage])


MAX_UNITS = 1_000_000  # workers x minibatches x microbatches of one schedule (~30 s, GBs)


def _check_size(layout: Layout, minibatches: int, microbatches: int = 1) -> None:
    """Inputs every schedule builder shares: at least one minibatch, and a schedule small
    enough to build in memory (every action of every worker is kept)."""
    if minibatches < 1:
        raise ScheduleError(f"--minibatches must be at least 1 (got {minibatches})")
    if microbatches < 1:
        raise ScheduleError(f"--microbatches must be at least 1 (got {microbatches})")
    units = layout.workers * minibatches * microbatches
    if units > MAX_UNITS:
        most = max(1, MAX_UNITS // (layout.workers * microbatches))
        raise ScheduleError(f"{layout.workers} workers x {minibatches} minibatches"
                            + (f" x {microbatches} microbatches" if microbatches > 1 else "")
                            + f" is {units:,} units of work, more than the {MAX_UNITS:,} a "
                            f"schedule holds in memory; use at most {most:,} minibatches "
                            "(a steady state shows after a few dozen)")


def one_f_one_b(layout: Layout, minibatches: int, weights: str = "stash",
                in_flight: int | None = None) -> Schedule:
    if weights not in WEIGHT_MODES:
        raise ScheduleError(f"unknown weight mode {weights!r}; choose one of "
                            f"{', '.join(WEIGHT_MODES)}")
    _check_size(layout, minibatches)
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
    if any(r != 1 for r in layout.replicas):
        raise ScheduleError("the GPipe schedule here runs unreplicated stages; use one "
                            "replica per stage (e.g. 1-1-1)")
    _check_size(layout, minibatches, microbatches)
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


class TickCosts:
    """The schedule grid's illustrative costs: forward 1 tick, backward 2, the rest free.

    A cost model answers three questions (``harness.sim.costs.ClusterCosts`` answers them
    from a profile and a cluster): how long a rank's compute action takes, when a message
    sent at ``t`` leaves the sender free, when it is in once the receiver posts its receive
    (``send`` returns a token ``receive`` reads: an eager transfer's arrival time, or a
    rendezvous transfer's ready time), and how long an all-reduce among a stage's replicas
    takes.
    """

    def __init__(self, ticks: dict[str, int] | None = None) -> None:
        self.ticks = ticks or {"F": 1, "B": 2}

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
    the sender is free again; a receive blocks until the cost model says the message is
    in (an eager transfer's arrival, or a rendezvous transfer that starts once the
    receive is posted); an all-reduce starts when the last replica reaches it. Returns,
    per rank, (start, end, action) of its F, B, A and U actions. Raises ScheduleError on a
    deadlock or a receive that does not match the oldest pending send.
    """
    costs = costs or TickCosts(ticks)
    n = sched.layout.workers
    clock = [0] * n
    channels: dict[tuple[int, int, str], list[tuple[int, float]]] = {}
    allreduce_wait: dict[tuple[int, int], dict[int, float]] = {}
    timeline: list[list[tuple[float, float, Action]]] = [[] for _ in range(n)]

    def step(rank: int, pos: int, a: Action) -> bool:
        if a.kind in ("SF", "SB", "ST"):
            clock[rank], token = costs.send(rank, a.peer, a, clock[rank])
            channels.setdefault((rank, a.peer, a.kind[1]), []).append((a.mb, token))
        elif a.kind in ("RF", "RB", "RT"):
            q = channels.get((a.peer, rank, a.kind[1]), [])
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
        elif a.kind in ("F", "B", "U"):
            start = clock[rank]
            clock[rank] += costs.compute(rank, a)
            timeline[rank].append((start, clock[rank], a))
        return True

    interleave(sched.actions, step)
    return timeline


def validate(sched: Schedule) -> None:
    """Raise ``ScheduleError`` where ``sched`` cannot be run as the runtime runs it.

    Hand-written schedules reach the runtime too, so every rule a generated schedule keeps
    by construction is checked: per rank, versions as the weight mode defines them; each
    unit's forward preceded by its receive and followed by its send (backward: receive
    before, send after) on the right peers, exactly once each, so with every rank completing
    exactly its units every send has its receive and no message is left unreceived; one
    update per minibatch (after its backwards, replicas all-reducing first); then the event
    engine proves the lists free of deadlocks and out-of-order messages.
    """
    layout = sched.layout
    for rank, acts in enumerate(sched.actions):
        _check_versions(sched, rank, acts)
        _check_messages(sched, rank, acts)
        _check_updates(sched, rank, acts)
    _check_tie_pairs(sched)
    if sched.weights == "vertical-sync":
        v0 = {a.mb: a.version for r in range(layout.replicas[0]) for a in sched.actions[r]
              if a.kind == "F"}
        for rank, acts in enumerate(sched.actions):
            for a in acts:
                if a.kind == "F" and a.version > v0[a.mb]:
                    raise ScheduleError(f"rank {rank}: {a} is newer than stage 0's "
                                        f"version {v0[a.mb]} (vertical sync)")
    simulate(sched)


def _check_versions(sched: Schedule, rank: int, acts: tuple[Action, ...]) -> None:
    s, _ = sched.layout.stage_of(rank)
    if sched.weights == "2bw" and sched.layout.replicas[s] != 1:
        raise ScheduleError(f"rank {rank}: 2BW versions are defined on unreplicated stages")
    seen_f: dict[int, int] = {}
    applied = 0
    for a in acts:
        if a.kind == "F":
            if a.mb in seen_f:
                raise ScheduleError(f"rank {rank}: forward of {a.mb} twice")
            if a.version > applied:
                raise ScheduleError(f"rank {rank}: {a} uses a version not yet made")
            if sched.weights == "stash" and a.version != applied:
                raise ScheduleError(f"rank {rank}: {a} is not the newest version {applied}")
            if sched.weights == "2bw" and a.version != max(0, a.mb // sched.microbatches - 1):
                raise ScheduleError(f"rank {rank}: {a} is not version max(0, k - 1) of its "
                                    f"minibatch k = {a.mb // sched.microbatches} (2BW's delay)")
            seen_f[a.mb] = a.version
        elif a.kind == "B":
            if a.mb not in seen_f:
                raise ScheduleError(f"rank {rank}: backward of {a.mb} before its forward")
            if sched.weights != "none" and a.version != seen_f[a.mb]:
                raise ScheduleError(f"rank {rank}: {a} does not use its forward's version "
                                    f"{seen_f[a.mb]}")
            if sched.weights == "none" and a.version != applied:
                raise ScheduleError(f"rank {rank}: {a} is not the newest version")
        elif a.kind == "U":
            applied += sched.layout.replicas[s]
    mine = {u for u in range(sched.units) if sched.owner(s, u) == rank}
    done_b = {a.mb for a in acts if a.kind == "B"}
    if set(seen_f) != mine or done_b != mine:
        raise ScheduleError(f"rank {rank} (stage {s}) does not complete exactly its "
                            f"minibatches {sorted(mine)}")


# (compute kind, message kind, before or after it, stage whose replica is the peer)
_MESSAGES = (("F", "RF", "before", -1), ("F", "SF", "after", 1),
             ("B", "RB", "before", 1), ("B", "SB", "after", -1))


def _check_messages(sched: Schedule, rank: int, acts: tuple[Action, ...]) -> None:
    """A forward consumes exactly one receive of its unit placed before it (stage > 0) and
    is followed by exactly one send (not the last stage); a backward the other way round."""
    s, _ = sched.layout.stage_of(rank)
    last = len(sched.layout.replicas) - 1
    pos = {(a.kind, a.mb): i for i, a in enumerate(acts) if a.kind in ("F", "B")}
    count: dict[tuple[str, int], int] = {}
    for i, a in enumerate(acts):
        if a.kind not in ("RF", "SF", "RB", "SB"):
            continue
        count[(a.kind, a.mb)] = count.get((a.kind, a.mb), 0) + 1
        compute, _, where, step = next(m for m in _MESSAGES if m[1] == a.kind)
        if not 0 <= s + step <= last:
            raise ScheduleError(f"rank {rank} (stage {s}): {a} has no stage to talk to")
        peer = sched.owner(s + step, a.mb)
        if a.peer != peer:
            raise ScheduleError(f"rank {rank}: {a} names rank {a.peer}; the replica of stage "
                                f"{s + step} that runs unit {a.mb} is rank {peer}")
        j = pos.get((compute, a.mb))
        if j is None or (j < i if where == "before" else j > i):
            raise ScheduleError(f"rank {rank}: {a} must come {where} {compute}{a.mb}")
    for compute, kind, where, step in _MESSAGES:
        if not 0 <= s + step <= last:
            continue
        for (k, mb) in pos:
            if k == compute and count.get((kind, mb), 0) != 1:
                raise ScheduleError(f"rank {rank} (stage {s}): {compute}{mb} needs exactly "
                                    f"one {kind}{mb} {where} it, found "
                                    f"{count.get((kind, mb), 0)}")


def _check_tie_pairs(sched: Schedule) -> None:
    """Tie messages (ST/RT, ``pipedream_impl.runtime.ties``) are not tied to a unit's
    compute, so they are paired across ranks: each sent once and received once."""
    count: dict[tuple[int, int, int], int] = {}
    for rank, acts in enumerate(sched.actions):
        for a in acts:
            if a.kind in ("ST", "RT"):
                key = (rank, a.peer, a.mb) if a.kind == "ST" else (a.peer, rank, a.mb)
                count[key] = count.get(key, 0) + (1 if a.kind == "ST" else -1)
    for (src, dst, mb), n in sorted(count.items()):
        if n:
            raise ScheduleError(f"tie message {mb} from rank {src} to rank {dst}: "
                                + ("sent but never received" if n > 0
                                   else "received but never sent"))


def _check_updates(sched: Schedule, rank: int, acts: tuple[Action, ...]) -> None:
    """One update per minibatch the rank works on, each after backward work done since the
    previous one (microbatched: exactly its minibatch's backwards, and named after its
    last unit); a replicated stage all-reduces (rounds 0, 1, ...) before each update."""
    s, _ = sched.layout.stage_of(rank)
    replicated = sched.layout.replicas[s] > 1
    backwards = rounds = updates = 0
    reduced = False
    since: set[int] = set()  # units whose backward ran since the previous update
    for a in acts:
        if a.kind == "B":
            backwards += 1
            since.add(a.mb)
        elif a.kind == "A":
            if not replicated:
                raise ScheduleError(f"rank {rank}: {a} on stage {s}, which has one replica")
            if a.mb != rounds or backwards == 0:
                raise ScheduleError(f"rank {rank}: {a} out of order (expected A{rounds} "
                                    "after a backward)")
            rounds += 1
            reduced = True
        elif a.kind == "U":
            if backwards == 0:
                raise ScheduleError(f"rank {rank}: {a} updates with no backward since the "
                                    "previous update")
            if replicated and not reduced:
                raise ScheduleError(f"rank {rank}: {a} before its all-reduce: the replicas "
                                    f"of stage {s} would drift apart")
            m = sched.microbatches
            last = a.mb // m * m + m - 1  # microbatched: U names its minibatch's last unit
            if m > 1 and (a.mb != last or since != set(range(last - m + 1, last + 1))):
                raise ScheduleError(f"rank {rank}: {a} must follow exactly the backwards of "
                                    f"units {last - m + 1}..{last}, its minibatch's (one "
                                    "update per minibatch, after its last backward)")
            backwards, reduced, updates, since = 0, False, updates + 1, set()
    expected = len({a.mb // sched.microbatches for a in acts if a.kind == "B"})
    if updates != expected or backwards:
        raise ScheduleError(f"rank {rank} (stage {s}): {updates} updates for {expected} "
                            "minibatches" + (", gradients left unapplied at the end"
                                             if backwards else "")
                            + ": an update was dropped or added")


def grid(sched: Schedule) -> str:
    """Worker x time table: F one tick, B two; '.' idle."""
    timeline = [[x for x in row if x[2].kind in ("F", "B")] for row in simulate(sched)]
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
