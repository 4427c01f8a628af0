"""pipedream_impl/successors.py: PipeDream-Flush and PipeDream-2BW action lists written out by
hand, the validator on 2BW's versions, and their bubbles against the closed forms."""

from __future__ import annotations

import dataclasses

import pytest

from core.errors import ScheduleError
from pipedream_impl.schedule import (
    Action,
    Layout,
    Schedule,
    TickCosts,
    one_f_one_b_flush,
    simulate,
    two_bw,
    validate,
)


def _text(sched: Schedule, rank: int) -> str:
    return " ".join(map(str, sched.actions[rank]))


def _replace(sched: Schedule, rank: int, old: str, new: str) -> Schedule:
    acts = [Action(*_parse(new)) if str(a) == old else a for a in sched.actions[rank]]
    actions = list(sched.actions)
    actions[rank] = tuple(acts)
    return dataclasses.replace(sched, actions=tuple(actions))


def _parse(text: str) -> tuple:
    from pipedream_impl.schedule import parse_action

    a = parse_action(text)
    return a.kind, a.mb, a.version, a.peer


def test_flush_two_stages_exact() -> None:
    """Per minibatch of 3 microbatches: stage 0 warms up with min(p - s, M) = 2 forwards,
    alternates, drains, then updates once (U names the minibatch's last unit); minibatch
    k runs on version k everywhere."""
    s = one_f_one_b_flush(Layout((1, 1)), 2, 3)
    assert _text(s, 0) == (
        "F0v0 SF0>1 F1v0 SF1>1 RB0<1 B0v0 F2v0 SF2>1 RB1<1 B1v0 RB2<1 B2v0 U2 "
        "F3v1 SF3>1 F4v1 SF4>1 RB3<1 B3v1 F5v1 SF5>1 RB4<1 B4v1 RB5<1 B5v1 U5")
    assert _text(s, 1) == (
        "RF0<0 F0v0 B0v0 SB0>0 RF1<0 F1v0 B1v0 SB1>0 RF2<0 F2v0 B2v0 SB2>0 U2 "
        "RF3<0 F3v1 B3v1 SB3>0 RF4<0 F4v1 B4v1 SB4>0 RF5<0 F5v1 B5v1 SB5>0 U5")


def test_flush_warmup_is_capped_by_the_microbatches() -> None:
    """Three stages, two microbatches: stage 0 warms up with min(3, 2) = 2 forwards (all of
    them), stage 1 with 2, stage 2 with 1."""
    s = one_f_one_b_flush(Layout((1, 1, 1)), 2, 2)
    order = [" ".join(str(a) for a in s.actions[r] if a.kind in ("F", "B", "U"))
             for r in range(3)]
    assert order[0] == "F0v0 F1v0 B0v0 B1v0 U1 F2v1 F3v1 B2v1 B3v1 U3"
    assert order[1] == "F0v0 F1v0 B0v0 B1v0 U1 F2v1 F3v1 B2v1 B3v1 U3"
    assert order[2] == "F0v0 B0v0 F1v0 B1v0 U1 F2v1 B2v1 F3v1 B3v1 U3"


def test_2bw_two_stages_exact() -> None:
    """No flush: 1F1B runs across minibatch boundaries; minibatch k (units 2k, 2k + 1) runs
    its forward and backward on version max(0, k - 1) on both stages, although the last
    stage has made version k before minibatch k's first forward (F2v0 after U1, F4v1
    after U3)."""
    s = two_bw(Layout((1, 1)), 3, 2)
    assert _text(s, 0) == (
        "F0v0 SF0>1 F1v0 SF1>1 RB0<1 B0v0 F2v0 SF2>1 RB1<1 B1v0 U1 F3v0 SF3>1 RB2<1 B2v0 "
        "F4v1 SF4>1 RB3<1 B3v0 U3 F5v1 SF5>1 RB4<1 B4v1 RB5<1 B5v1 U5")
    assert _text(s, 1) == (
        "RF0<0 F0v0 B0v0 SB0>0 RF1<0 F1v0 B1v0 SB1>0 U1 RF2<0 F2v0 B2v0 SB2>0 "
        "RF3<0 F3v0 B3v0 SB3>0 U3 RF4<0 F4v1 B4v1 SB4>0 RF5<0 F5v1 B5v1 SB5>0 U5")
    assert s.weights == "2bw" and s.microbatches == 2


def test_validator_rejects_wrong_2bw_versions_and_early_updates() -> None:
    s = two_bw(Layout((1, 1)), 3, 2)
    # the last stage running minibatch 1 on the newest version (what stash would do)
    newest = _replace(_replace(s, 1, "F2v0", "F2v1"), 1, "B2v0", "B2v1")
    with pytest.raises(ScheduleError, match=r"F2v1 is not version max\(0, k - 1\)"):
        validate(newest)
    # forward and backward of one unit on different versions
    with pytest.raises(ScheduleError, match="does not use its forward's version"):
        validate(_replace(s, 1, "B4v1", "B4v0"))
    # the same lists under stash: 2BW's delayed versions are not the newest
    with pytest.raises(ScheduleError, match="is not the newest version"):
        validate(dataclasses.replace(s, weights="stash"))
    # an update before its minibatch's last backward (rank 0: U1 moved before B1)
    acts = list(s.actions[0])
    u = acts.pop(acts.index(Action("U", 1)))
    acts.insert(acts.index(Action("B", 1, 0)), u)
    early = dataclasses.replace(s, actions=(tuple(acts), s.actions[1]))
    with pytest.raises(ScheduleError, match="U1 must follow exactly the backwards of units "
                       "0..1"):
        validate(early)


def test_builders_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ScheduleError, match="unreplicated"):
        two_bw(Layout((2, 1)), 2, 2)
    with pytest.raises(ScheduleError, match="unreplicated"):
        one_f_one_b_flush(Layout((1, 2)), 2, 2)
    with pytest.raises(ScheduleError, match="needs at least 3 microbatches"):
        two_bw(Layout((1, 1, 1, 1)), 2, 2)
    two_bw(Layout((1, 1, 1, 1)), 2, 3)  # M = p - 1: the version arrives just in time


def _makespan_and_busy(sched: Schedule, ticks: dict[str, int]) -> tuple[float, float]:
    timeline = simulate(sched, costs=TickCosts(ticks))
    end = max(e for row in timeline for _, e, _ in row)
    busy = sum(e - b for row in timeline for b, e, a in row if a.kind in ("F", "B"))
    return end, busy


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("ticks", [{"F": 1, "B": 1}, {"F": 1, "B": 2}])
def test_flush_bubble_is_the_published_formula(p: int, m: int, ticks: dict) -> None:
    """PipeDream-Flush (and GPipe) with equal-cost stages: each minibatch takes
    (m + p - 1)(F + B), so the bubble is (p - 1) / (m + p - 1) of the time, i.e. an
    overhead of (p - 1) / m relative to the ideal m (F + B) (the issue's "(p - 1)/m")."""
    n = 3
    end, busy = _makespan_and_busy(one_f_one_b_flush(Layout((1,) * p), n, m), ticks)
    fb = ticks["F"] + ticks["B"]
    assert end == n * (m + p - 1) * fb
    assert 1 - busy / (end * p) == pytest.approx((p - 1) / (m + p - 1))
    assert end / (n * m * fb) - 1 == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [4, 8])
def test_2bw_has_no_bubble_in_steady_state(p: int, m: int) -> None:
    """2BW fills and drains once per epoch: n minibatches take (n m + p - 1)(F + B), and
    stage 0 finishes one minibatch every m (F + B) in steady state (no bubble)."""
    n, ticks = 4, {"F": 1, "B": 1}
    sched = two_bw(Layout((1,) * p), n, m)
    end, busy = _makespan_and_busy(sched, ticks)
    assert end == (n * m + p - 1) * 2
    assert 1 - busy / (end * p) == pytest.approx((p - 1) / (n * m + p - 1))
    done = [e for _, e, a in simulate(sched, costs=TickCosts(ticks))[0] if a.kind == "U"]
    assert {b - a for a, b in zip(done[1:-1], done[2:], strict=True)} == {m * 2}
