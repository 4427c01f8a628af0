"""pipedream_impl/schedule/zero_bubble.py: ZB-H1's action lists against the zero-bubble
paper's closed forms (Qi et al., ICLR 2024), on the event engine with equal F, I, W."""

from __future__ import annotations

import pytest

from core.errors import ScheduleError
from pipedream_impl.schedule import Action, Layout, Schedule, TickCosts, simulate, validate
from pipedream_impl.schedule.successors import one_f_one_b_flush
from pipedream_impl.schedule.zero_bubble import zb_h1

EQUAL = {"F": 1, "I": 1, "W": 1, "B": 2}  # T_F = T_B(input) = T_W; a whole B is I + W


def _span(sched: Schedule) -> float:
    return max(e for row in simulate(sched, costs=TickCosts(EQUAL)) for _, e, _ in row)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [4, 8, 12])
def test_bubble_is_p_minus_1_over_3m(p: int, m: int) -> None:
    """ZB-H1 leaves (p - 1)(T_F + T_B - T_W) idle per minibatch: with equal F, I, W that is
    p - 1 units against 3m of work, (p - 1) / (3m); 1F1B-flush leaves 3(p - 1), (p - 1) / m."""
    n = 3
    span = _span(zb_h1(Layout((1,) * p), n, m))
    assert (span - n * 3 * m) / (n * 3 * m) == pytest.approx((p - 1) / (3 * m))
    flush = _span(one_f_one_b_flush(Layout((1,) * p), n, m))
    assert (flush - n * 3 * m) / (n * 3 * m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_activations_held_peak_at_p_on_every_stage(p: int) -> None:
    """A unit's activations live from its F until its W: at most p on every stage, the
    peak 1F1B has on its first stage (ZB-H1 keeps 1F1B's peak memory)."""
    sched = zb_h1(Layout((1,) * p), 2, 2 * p)
    for acts in sched.actions:
        live, peak = set(), 0
        for a in acts:
            if a.kind == "F":
                live.add(a.mb)
            elif a.kind == "W":
                live.discard(a.mb)
            peak = max(peak, len(live))
        assert peak == p


def test_every_unit_runs_i_then_w_and_the_input_gradient_is_sent_at_i() -> None:
    sched = zb_h1(Layout((1, 1, 1)), 2, 4)
    acts = sched.actions[1]
    for u in range(8):
        i = acts.index(Action("I", u, u // 4))
        w = acts.index(Action("W", u, u // 4))
        assert i < w
        assert acts[i + 1] == Action("SB", u, peer=0)
        assert acts[i - 1] == Action("RB", u, peer=2)
    assert [a for a in acts if a.kind == "U"] == [Action("U", 3), Action("U", 7)]


def test_the_validator_refuses_a_bad_split() -> None:
    good = zb_h1(Layout((1, 1)), 1, 2)
    rows = [list(r) for r in good.actions]
    w_first = rows[1].index(Action("W", 0, 0))
    i_first = rows[1].index(Action("I", 0, 0))
    bad = [list(r) for r in rows]
    bad[1][w_first], bad[1][i_first] = bad[1][i_first], bad[1][w_first]  # W before I
    with pytest.raises(ScheduleError, match="W0v0 must come after its I"):
        validate(Schedule(good.layout, 1, "stash", tuple(map(tuple, bad)), 2))
    both = [list(r) for r in rows]
    both[1].insert(w_first + 1, Action("B", 0, 0))  # a whole backward besides the halves
    with pytest.raises(ScheduleError, match="B0v0 must come once"):
        validate(Schedule(good.layout, 1, "stash", tuple(map(tuple, both)), 2))
