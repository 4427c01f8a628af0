"""The validator: every rule the runtime relies on, checked on any schedule.

Generated schedules keep these rules by construction; hand-written ones (a schedule file,
a new builder) reach the runtime too. ``validate`` raises ``ScheduleError`` on: versions
that contradict the weight mode, a backward before its forward (or a weight-gradient half
W before its input half I, or a unit with both a whole B and halves), a minibatch not
completed everywhere, a forward before its receive (or a message kind out of place, on the
wrong peer, missing or doubled), an update dropped, added, or ahead of its all-reduce, a
send never received or a receive never sent, and (by running the lists on the event
engine against blocking receives and all-reduce barriers) a deadlock or a receive of the
wrong minibatch.
"""

from __future__ import annotations

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import GRADIENT_DONE, Action, Schedule
from pipedream_impl.schedule.engine import simulate

__all__ = ["validate"]


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
        for stage in sched.stages_of(rank):  # one lane per model stage the rank holds
            lane = tuple(a for a in acts
                         if a.kind in ("A", "U") or sched.stage_at(rank, a) == stage)
            _check_versions(sched, rank, stage, lane)
            _check_messages(sched, rank, stage, lane)
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


def _check_versions(sched: Schedule, rank: int, s: int, acts: tuple[Action, ...]) -> None:
    if sched.weights == "2bw" and sched.replicas_of(s) != 1:
        raise ScheduleError(f"rank {rank}: 2BW versions are defined on unreplicated stages")
    seen_f: dict[int, int] = {}
    halves: dict[int, str] = {}  # unit -> the backward kinds seen so far
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
        elif a.kind in ("B", "I", "W"):
            if a.mb not in seen_f:
                raise ScheduleError(f"rank {rank}: backward of {a.mb} before its forward")
            _check_halves(rank, a, halves)
            if sched.weights != "none" and a.version != seen_f[a.mb]:
                raise ScheduleError(f"rank {rank}: {a} does not use its forward's version "
                                    f"{seen_f[a.mb]}")
            if sched.weights == "none" and a.version != applied:
                raise ScheduleError(f"rank {rank}: {a} is not the newest version")
        elif a.kind == "U":
            applied += sched.replicas_of(s)
    mine = {u for u in range(sched.units) if sched.owner(s, u) == rank}
    done_b = {u for u, kinds in halves.items() if kinds in ("B", "IW")}
    if set(seen_f) != mine or done_b != mine:
        raise ScheduleError(f"rank {rank} (stage {s}) does not complete exactly its "
                            f"minibatches {sorted(mine)}")


# (compute kind, message kind, before or after it, stage whose replica is the peer)
_MESSAGES = (("F", "RF", "before", -1), ("F", "SF", "after", 1),
             ("B", "RB", "before", 1), ("B", "SB", "after", -1))


def _check_messages(sched: Schedule, rank: int, s: int, acts: tuple[Action, ...]) -> None:
    """A forward consumes exactly one receive of its unit placed before it (stage > 0) and
    is followed by exactly one send (not the last stage); a backward the other way round.
    Between two stages of one rank (a V's turn) nothing is sent: the rank hands over."""
    last = sched.stages - 1
    # the input-gradient half I receives and sends what a whole backward B would
    pos = {("B" if a.kind == "I" else a.kind, a.mb): i for i, a in enumerate(acts)
           if a.kind in ("F", "B", "I")}
    count: dict[tuple[str, int], int] = {}
    for i, a in enumerate(acts):
        if a.kind not in ("RF", "SF", "RB", "SB"):
            continue
        count[(a.kind, a.mb)] = count.get((a.kind, a.mb), 0) + 1
        compute, _, where, step = next(m for m in _MESSAGES if m[1] == a.kind)
        if not 0 <= s + step <= last:
            raise ScheduleError(f"rank {rank} (stage {s}): {a} has no stage to talk to")
        peer = sched.owner(s + step, a.mb)
        if peer == rank:
            raise ScheduleError(f"rank {rank}: {a} talks to stage {s + step}, which this rank "
                                "holds too: a hand-off needs no message")
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
            if k == compute and sched.owner(s + step, mb) != rank \
                    and count.get((kind, mb), 0) != 1:
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
        if a.kind in GRADIENT_DONE:
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
    expected = len({a.mb // sched.microbatches for a in acts if a.kind in GRADIENT_DONE})
    if updates != expected or backwards:
        raise ScheduleError(f"rank {rank} (stage {s}): {updates} updates for {expected} "
                            "minibatches" + (", gradients left unapplied at the end"
                                             if backwards else "")
                            + ": an update was dropped or added")


def _check_halves(rank: int, a: Action, halves: dict[int, str]) -> None:
    """A unit's backward is one B, or I then W (the zero-bubble split), each once."""
    seen = halves.get(a.mb, "")
    allowed = {"B": "", "I": "", "W": "I"}[a.kind]
    if seen != allowed:
        want = "after its I" if a.kind == "W" else "once, with no other backward of the unit"
        raise ScheduleError(f"rank {rank}: {a} must come {want} (this unit has "
                            f"{seen or 'no backward'} so far)")
    halves[a.mb] = seen + a.kind
