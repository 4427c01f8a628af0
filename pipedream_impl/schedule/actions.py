"""Schedules as data: the action type, the layout of stages on ranks, and a schedule.

An ``Action`` is one of::

    RF  receive the forward input of minibatch k      (from the previous stage's replica)
    F   forward of minibatch k with weight version v
    SF  send its output                                 (to the next stage's replica)
    RB  receive the gradient of its output
    B   backward of minibatch k with weight version v
    I   the input-gradient half of B (zero-bubble schedules split B into I and W)
    W   the weight-gradient half of B (it may run later: deferred to fill a bubble)
    SB  send the gradient of its input
    A   all-reduce the weight gradients with the other replicas of the stage (round k)
    U   optimizer step
    ST  send the stage's gradient of tied weights of its update k (to the other tied stage)
    RT  receive the other tied stage's gradient of its update k (runtime/ties.py)

and prints compactly as ``F3v2`` (kind, minibatch, ``v`` version), ``F3s1`` (``s`` the
model stage, for schedules that hold several stages per rank) or ``SF3>4`` (``>`` peer
rank) / ``RF3<1`` (``<`` peer rank); ``parse_action`` reads that form back.

Versions count *minibatches whose gradients a stage has applied*: an unreplicated stage
advances by 1 per update, a stage with r replicas by r per all-reduced round, so versions of
different stages are comparable (vertical sync needs that).
The builders live beside this module (``builders``, ``successors``, ``zero_bubble``), the
validator in ``validate`` and the event engine in ``engine``; ``registry`` declares each
schedule once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.errors import ScheduleError

__all__ = ["ACTION_NAMES", "BACKWARDS", "GRADIENT_DONE", "MAX_UNITS", "WEIGHT_MODES", "Action",
           "Layout", "Schedule", "check_size", "parse_action", "require_unreplicated",
           "stage_depths", "warmup_count"]

WEIGHT_MODES = ("stash", "vertical-sync", "none")
ACTION_NAMES = {"RF": "receive activations", "F": "forward", "SF": "send activations",
                "RB": "receive gradients", "B": "backward", "SB": "send gradients",
                "A": "all-reduce", "U": "update", "ST": "send tied gradients",
                "RT": "receive tied gradients", "I": "backward (input gradient)",
                "W": "backward (weight gradient)"}  # what each action kind does
BACKWARDS = ("B", "I", "W")  # a whole backward, or its two halves (zero-bubble schedules)
GRADIENT_DONE = ("B", "W")  # after these a unit's weight gradient is complete
_ACTION = re.compile(r"^(RF|SF|RB|SB|ST|RT|F|B|I|W|A|U)(\d+)(?:v(\d+))?(?:s(\d+))?"
                     r"(?:([<>])(\d+))?$")


@dataclass(frozen=True)
class Action:
    kind: str
    mb: int
    version: int = -1
    peer: int = -1
    stage: int = -1  # the model stage it acts on; -1: the rank's only stage

    def __str__(self) -> str:
        s = f"{self.kind}{self.mb}"
        if self.version >= 0:
            s += f"v{self.version}"
        if self.stage >= 0:
            s += f"s{self.stage}"
        if self.peer >= 0:
            s += ("<" if self.kind.startswith("R") else ">") + str(self.peer)
        return s


def parse_action(text: str) -> Action:
    m = _ACTION.match(text.strip())
    if m is None:
        raise ScheduleError(f"cannot parse action {text!r}")
    number = (lambda g: int(m.group(g)) if m.group(g) else -1)  # noqa: E731
    return Action(m.group(1), int(m.group(2)), number(3), number(6), number(4))


@dataclass(frozen=True)
class Layout:
    """Which rank runs which stage replica: ranks are assigned stage by stage; ``depths``:
    minibatches each stage holds in flight under 1F1B(-RR), a plan's (``planner.depths``:
    deep enough for its transfers), None: ``stage_depths``."""

    replicas: tuple[int, ...]
    depths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        d = self.depths
        if d is not None and (len(d) != len(self.replicas) or any(
                not isinstance(x, int) or x < r or x % r
                for x, r in zip(d, self.replicas, strict=False))):
            raise ScheduleError(f"in-flight depths {list(d)}: one per stage, each a positive "
                                f"multiple of the stage's replicas {list(self.replicas)}")

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
    # several stages per rank (torch's interleaved and V schedules): the rank holding each
    # model stage, and actions name their stage; None: the layout's one stage per rank
    stage_ranks: tuple[int, ...] | None = None

    @property
    def units(self) -> int:
        return self.minibatches * self.microbatches

    @property
    def stages(self) -> int:
        return len(self.stage_ranks) if self.stage_ranks else len(self.layout.replicas)

    def owner(self, stage: int, unit: int) -> int:
        if self.stage_ranks:
            return self.stage_ranks[stage]
        return self.layout.rank_for(stage, unit // self.microbatches)

    def stage_at(self, rank: int, a: Action) -> int:
        """The model stage ``a`` acts on (a message action: the stage sending or receiving)."""
        return a.stage if a.stage >= 0 else self.layout.stage_of(rank)[0]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        if self.stage_ranks:
            return tuple(s for s, r in enumerate(self.stage_ranks) if r == rank)
        return (self.layout.stage_of(rank)[0],)

    def replicas_of(self, stage: int) -> int:
        return 1 if self.stage_ranks else self.layout.replicas[stage]

    def text(self) -> str:
        return "\n".join(f"rank {r}: " + " ".join(map(str, acts))
                         for r, acts in enumerate(self.actions))


def warmup_count(layout: Layout, stage: int, in_flight: int | None) -> int:
    """Forwards a replica of ``stage`` runs before its first backward under 1F1B(-RR): its
    share of the minibatches in flight. ``in_flight`` given: ceil(in_flight / r_s) on
    every stage (at least 1). Else the layout's depths (a plan's), divided by r_s; without
    them ``stage_depths(layout.replicas)[stage] / r_s``."""
    if in_flight is not None:
        return max(1, math.ceil(in_flight / layout.replicas[stage]))
    depths = layout.depths or stage_depths(layout.replicas)
    return depths[stage] // layout.replicas[stage]


def stage_depths(replicas: tuple[int, ...],
                 extra: tuple[float, ...] | None = None) -> tuple[int, ...]:
    """Minibatches each stage holds in flight by default (r_s per warm-up forward);
    ``extra``: minibatches more per stage, before rounding up to whole rounds (a plan's,
    for the time its transfers take: ``planner.depths``).

    From the last stage up: D_last = r_last, and D_s = r_s x ceil((D_{s+1} + r_s +
    (r_{s+1} - g) + (r_s - g) + extra_s) / r_s), g = gcd(r_s, r_{s+1}). Why: a replicated
    stage's all-reduce is a barrier after each round, so its replicas run a round of r_s
    minibatches in lockstep; a round of stage s spans rounds of stage s+1 that start up to
    r_{s+1} - g minibatch periods later (forward) and end up to r_s - g earlier (backward),
    and stage s must hold that many minibatches more than stage s+1, besides its own round,
    for no replica to wait at the all-reduce or on a receive (with balanced stages the
    simulated time per minibatch is then the ideal one). With equal replica counts both
    terms vanish and D_s is the number of workers of stage s and later: PipeDream's NOAM
    per stage, ceil(workers from s on / r_s) forwards (the input stage's is the paper's
    NOAM); the rule never gives fewer than that.
    """
    more = extra or (0.0,) * len(replicas)
    depths = [replicas[-1]]
    for s in range(len(replicas) - 2, -1, -1):
        r, nxt = replicas[s], replicas[s + 1]
        g = math.gcd(r, nxt)
        need = depths[0] + r + (nxt - g) + (r - g) + more[s]
        depths.insert(0, r * math.ceil(need / r))
    return tuple(depths)


MAX_UNITS = 1_000_000  # workers x minibatches x microbatches of one schedule (~30 s, GBs)


def check_size(layout: Layout, minibatches: int, microbatches: int = 1) -> None:
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


def require_unreplicated(layout: Layout, what: str) -> int:
    """The number of stages of ``layout``, which must have one replica per stage: the
    schedules other than PipeDream's 1F1B-RR run unreplicated stages (one home for that
    rule and its message)."""
    if any(r != 1 for r in layout.replicas):
        raise ScheduleError(f"the {what} schedule here runs unreplicated stages; got "
                            f"{'-'.join(map(str, layout.replicas))}: use one replica per "
                            "stage (e.g. 1-1-1)")
    return len(layout.replicas)
