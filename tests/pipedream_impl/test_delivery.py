"""pipedream_impl/schedule/delivery.py: what it says has arrived has arrived, in every
execution of the schedule, and it says so for the sends a pipeline can release.

The reference is independent of the analysis: random executions of every rank's list under
the runtime's rules (a receive waits for its message, replicas meet at an all-reduce, sends
never wait), checked at each point where the analysis says messages have arrived."""

from __future__ import annotations

import random

import pytest

from core.errors import ScheduleError
from pipedream_impl.runtime.ties import with_ties
from pipedream_impl.schedule import Action, Layout, Schedule, one_f_one_b
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.delivery import RECEIVES, SENDS, delivered, receives_followed


def _random_execution(sched: Schedule, rng: random.Random):
    """Yield (rank, position, received) after each action of one random valid execution;
    ``received[(src, dst, kind)]``: messages dst has taken from src so far."""
    acts, pos = sched.actions, [0] * len(sched.actions)
    sent: dict[tuple[int, int, str], int] = {}
    received: dict[tuple[int, int, str], int] = {}
    while any(p < len(a) for p, a in zip(pos, acts, strict=True)):
        ready = []
        for r, a in enumerate(acts):
            if pos[r] == len(a):
                continue
            act = a[pos[r]]
            if act.kind in RECEIVES:
                key = (act.peer, r, RECEIVES[act.kind])
                if sent.get(key, 0) <= received.get(key, 0):
                    continue
            elif act.kind == "A":  # a barrier of the stage's replicas
                stage = sched.layout.stage_of(r)[0]
                group = [sched.layout.rank(stage, i)
                         for i in range(sched.layout.replicas[stage])]
                if not all(pos[g] < len(acts[g]) and acts[g][pos[g]].kind == "A"
                           for g in group):
                    continue
            ready.append(r)
        assert ready, "the schedule deadlocked"
        r = rng.choice(ready)
        act = acts[r][pos[r]]
        if act.kind == "A":  # the whole group passes its barrier together
            stage = sched.layout.stage_of(r)[0]
            for i in range(sched.layout.replicas[stage]):
                g = sched.layout.rank(stage, i)
                pos[g] += 1
                yield g, pos[g] - 1, received
            continue
        if act.kind in SENDS:
            key = (r, act.peer, SENDS[act.kind])
            sent[key] = sent.get(key, 0) + 1
        elif act.kind in RECEIVES:
            key = (act.peer, r, RECEIVES[act.kind])
            received[key] = received.get(key, 0) + 1
        pos[r] += 1
        yield r, pos[r] - 1, received


_CASES = [(k.name, layout, False) for k in schedules.ours() if not k.from_file
          for layout in (Layout((1, 1)), Layout((1, 1, 1)))
          ] + [("1f1b", Layout((2, 1)), False), ("1f1b", Layout((1, 3, 2)), False),
               ("1f1b", Layout((1, 1, 1)), True), ("1f1b-flush", Layout((1, 1)), True)]


@pytest.mark.parametrize(("name", "layout", "tied"), _CASES, ids=lambda c: str(c))
def test_every_message_said_to_have_arrived_has_arrived_in_random_executions(
        name: str, layout: Layout, tied: bool) -> None:
    """Every schedule of ours, on 2 and 3 stages, two replicated layouts, and with the tie
    messages (ST/RT) of weights shared by the first and last stage."""
    m = schedules.microbatches(name, len(layout.replicas))
    sched = schedules.build(name, layout, 6, m)
    if tied:
        sched, _ = with_ties(sched, (0, len(layout.replicas) - 1))
        assert any(a.kind == "RT" for acts in sched.actions for a in acts)
    claims = [delivered(sched.actions, r) for r in range(layout.workers)]
    checked = 0
    for seed in range(20):
        for r, p, received in _random_execution(sched, random.Random(seed)):
            for peer, kind, n in claims[r].get(p, ()):
                assert received.get((r, peer, kind), 0) >= n, (seed, r, p, peer, kind, n)
                checked += 1
    assert checked > 0


def _sends(acts: tuple[Action, ...], kind: str) -> int:
    return sum(1 for a in acts if a.kind in SENDS and SENDS[a.kind] == kind)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_1f1b_releases_every_forward_send_and_all_but_the_drain_s_gradient_sends(
        stages: int) -> None:
    """In PipeDream's 1F1B each forward's gradient comes back, so every forward send is
    released within the epoch, each by the receive of its own unit's gradient at the latest;
    a gradient
    sent back is released by the next forward from the previous stage that followed it, so
    only those sent after the previous stage's last forward wait for the epoch's end."""
    sched = one_f_one_b(Layout((1,) * stages), 8)
    for r in range(stages - 1):
        acts = sched.actions[r]
        said = delivered(sched.actions, r)
        f = [n for p in sorted(said) for peer, kind, n in said[p] if kind == "F"]
        assert f[-1] == _sends(acts, "F") == 8
        for p, claims in said.items():  # the n-th gradient received releases n forwards,
            for _, kind, n in claims:  # or more where the next stage took more first
                if kind == "F":
                    assert acts[p].kind == "RB"
                    assert n >= sum(1 for a in acts[:p + 1] if a.kind == "RB")
    for r in range(1, stages):
        prev = sched.actions[r - 1]
        last_forward = max(i for i, a in enumerate(prev) if a.kind == "SF")
        drain = sum(1 for a in prev[last_forward:] if a.kind == "RB")
        said = delivered(sched.actions, r)
        b = max((n for claims in said.values() for _, kind, n in claims if kind == "B"),
                default=0)
        assert b == 8 - drain


def test_a_receive_the_peer_never_sends_is_an_error() -> None:
    sched = one_f_one_b(Layout((1, 1)), 2)
    broken = (sched.actions[0], sched.actions[1] + (Action("RF", 2, peer=0),))
    with pytest.raises(ScheduleError, match="receives message 3 of kind F from rank 0"):
        delivered(broken, 1)


def test_receives_followed_counts_the_later_receives_of_each_peer_and_kind() -> None:
    acts = tuple(Action(k, mb, peer=p) for k, mb, p in
                 [("RF", 0, 0), ("RB", 0, 2), ("RF", 1, 0), ("RF", 2, 5), ("RB", 1, 2),
                  ("SF", 0, 3), ("RF", 3, 0)])
    assert receives_followed(acts) == {0: 2, 1: 1, 2: 1, 3: 0, 4: 0, 6: 0}
