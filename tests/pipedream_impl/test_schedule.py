"""pipedream_impl/schedule.py: exact 1F1B / 1F1B-RR action lists and the validator."""

from __future__ import annotations

import dataclasses

import pytest

from core.errors import ScheduleError
from pipedream_impl.schedule import (
    Action,
    Layout,
    Schedule,
    grid,
    one_f_one_b,
    parse_action,
    validate,
)


def compute_order(sched: Schedule, rank: int) -> str:
    return " ".join(str(a) for a in sched.actions[rank] if a.kind in ("F", "B"))


def test_straight_two_stages_exact() -> None:
    s = one_f_one_b(Layout.from_config("1-1"), 4)
    # stash: each backward uses its forward's version
    assert compute_order(s, 0) == "F0v0 F1v0 B0v0 F2v1 B1v0 F3v2 B2v1 B3v2"
    assert compute_order(s, 1) == "F0v0 B0v0 F1v1 B1v1 F2v2 B2v2 F3v3 B3v3"
    assert " ".join(map(str, s.actions[1][:5])) == "RF0<0 F0v0 B0v0 SB0>0 U0"


def test_three_stages_warmup_is_noam_at_the_input() -> None:
    s = one_f_one_b(Layout.from_config("1-1-1"), 6)
    assert compute_order(s, 0).startswith("F0v0 F1v0 F2v0 B0v0 F3v1")
    assert compute_order(s, 1).startswith("F0v0 F1v0 B0v0 F2v1")
    assert compute_order(s, 2).startswith("F0v0 B0v0 F1v1")


def test_round_robin_replicas_exact() -> None:
    s = one_f_one_b(Layout.from_config("2-1"), 8)
    # versions advance by 2 per all-reduced round of the replicated stage
    assert compute_order(s, 0) == "F0v0 F2v0 B0v0 F4v2 B2v0 F6v4 B4v2 B6v4"
    assert compute_order(s, 1) == "F1v0 F3v0 B1v0 F5v2 B3v0 F7v4 B5v2 B7v4"
    assert " ".join(map(str, s.actions[0][:8])) == "F0v0 SF0>2 F2v0 SF2>2 RB0<2 B0v0 A0 U0"
    assert [a.peer for a in s.actions[2] if a.kind == "RF"] == [0, 1, 0, 1, 0, 1, 0, 1]


def test_vertical_sync_uses_stage_zero_versions_and_none_uses_newest() -> None:
    v = one_f_one_b(Layout.from_config("1-1-1"), 6, "vertical-sync")
    assert compute_order(v, 2).startswith("F0v0 B0v0 F1v0 B1v0 F2v0 B2v0 F3v1 B3v1")
    assert compute_order(v, 1).startswith("F0v0 F1v0 B0v0 F2v0 B1v0 F3v1")
    n = one_f_one_b(Layout.from_config("1-1"), 4, "none")
    assert compute_order(n, 0) == "F0v0 F1v0 B0v0 F2v1 B1v1 F3v2 B2v2 B3v3"
    assert compute_order(n, 1) == "F0v0 B0v0 F1v1 B1v1 F2v2 B2v2 F3v3 B3v3"


def test_model_parallel_has_one_minibatch_in_flight() -> None:
    s = one_f_one_b(Layout.from_config("1-1"), 3, in_flight=1)
    assert compute_order(s, 0) == "F0v0 B0v0 F1v1 B1v1 F2v2 B2v2"


def test_action_strings_round_trip() -> None:
    s = one_f_one_b(Layout.from_config("2-1-1"), 8)
    for acts in s.actions:
        for a in acts:
            assert parse_action(str(a)) == a
    with pytest.raises(ScheduleError):
        parse_action("X3")


def _broken(s: Schedule, rank: int, acts: list[Action]) -> Schedule:
    actions = list(s.actions)
    actions[rank] = tuple(acts)
    return dataclasses.replace(s, actions=tuple(actions))


def test_validator_rejects_hand_broken_schedules() -> None:
    s = one_f_one_b(Layout.from_config("1-1"), 4)
    # rank 1 runs minibatch 1 before minibatch 0 (versions kept consistent): its first
    # receive asks for minibatch 1 while rank 0 sends minibatch 0 first
    a1 = list(s.actions[1])
    block0, block1 = a1[:5], a1[5:10]  # RF F B SB U of minibatches 0 and 1
    swapped = [dataclasses.replace(a, version=0) if a.kind in ("F", "B") else a
               for a in block1] + [dataclasses.replace(a, version=1) if a.kind in ("F", "B")
                                   else a for a in block0] + a1[10:]
    with pytest.raises(ScheduleError, match="next message"):
        validate(_broken(s, 1, swapped))
    # backward before forward
    a0 = list(s.actions[0])
    b0, f0 = a0.index(parse_action("B0v0")), a0.index(parse_action("F0v0"))
    a0[b0], a0[f0] = a0[f0], a0[b0]
    with pytest.raises(ScheduleError, match="before its forward"):
        validate(_broken(s, 0, a0))
    # a dropped minibatch
    with pytest.raises(ScheduleError, match="does not complete"):
        validate(_broken(s, 1, [a for a in s.actions[1] if a.mb != 3]))
    # stash with a backward on another version than its forward
    a0 = [Action("B", a.mb, a.version + 1) if a.kind == "B" and a.mb == 2 else a
          for a in s.actions[0]]
    with pytest.raises(ScheduleError, match="forward's version"):
        validate(_broken(s, 0, a0))
    # deadlock: rank 1 waits for a gradient before sending anything
    a1 = [Action("RB", 0, peer=0)] + list(s.actions[1])
    with pytest.raises(ScheduleError):
        validate(_broken(s, 1, a1))


def _without(acts: tuple[Action, ...], *drop: str) -> list[Action]:
    gone = [parse_action(x) for x in drop]
    return [a for a in acts if a not in gone]


def test_validator_rejects_a_forward_before_its_receive() -> None:
    s = one_f_one_b(Layout.from_config("1-1-1"), 6)
    a1 = list(s.actions[1])
    i, j = a1.index(parse_action("RF2<0")), a1.index(parse_action("F2v1"))
    assert i == j - 1  # generated: receive, then forward
    a1[i], a1[j] = a1[j], a1[i]  # the forward would run on an input not yet received
    with pytest.raises(ScheduleError, match="RF2<0 must come before F2"):
        validate(_broken(s, 1, a1))


def test_validator_rejects_a_missing_send_receive_pair() -> None:
    # both halves gone: no deadlock, every minibatch still "completes" on both ranks
    s = one_f_one_b(Layout.from_config("1-1"), 4)
    broken = _broken(_broken(s, 0, _without(s.actions[0], "SF2>1")), 1,
                     _without(s.actions[1], "RF2<0"))
    with pytest.raises(ScheduleError, match="F2 needs exactly one SF2 after it, found 0"):
        validate(broken)
    # the same for a gradient, on a replicated layout (peer = the replica that ran it)
    s = one_f_one_b(Layout.from_config("2-1"), 4)
    assert parse_action("SB3>1") in s.actions[2]
    broken = _broken(_broken(s, 2, _without(s.actions[2], "SB3>1")), 1,
                     _without(s.actions[1], "RB3<2"))
    with pytest.raises(ScheduleError, match="needs exactly one RB3 before it, found 0"):
        validate(broken)


def test_validator_rejects_messages_to_the_wrong_peer_or_twice() -> None:
    s = one_f_one_b(Layout.from_config("2-1"), 4)
    a2 = [Action("RF", 1, peer=0) if a == parse_action("RF1<1") else a for a in s.actions[2]]
    with pytest.raises(ScheduleError, match="the replica of stage 0 that runs unit 1 is "
                                            "rank 1"):
        validate(_broken(s, 2, a2))
    # a message sent twice is never received the second time
    a0 = list(s.actions[0])
    a0.insert(a0.index(parse_action("SF0>2")), parse_action("SF0>2"))
    with pytest.raises(ScheduleError, match="needs exactly one SF0 after it, found 2"):
        validate(_broken(s, 0, a0))


def test_validator_rejects_a_dropped_or_early_update() -> None:
    s = one_f_one_b(Layout.from_config("1-1"), 4)
    # the last update dropped: no later version check can notice, gradients left unapplied
    a0 = list(s.actions[0])
    last_u = max(i for i, a in enumerate(a0) if a.kind == "U")
    with pytest.raises(ScheduleError, match="3 updates for 4 minibatches, gradients left"):
        validate(_broken(s, 0, a0[:last_u] + a0[last_u + 1:]))
    # an extra update with no backward since the previous one
    with pytest.raises(ScheduleError, match="no backward since the previous update"):
        validate(_broken(s, 0, a0 + [Action("U", 3)]))
    # a replicated stage updating before its all-reduce
    r = one_f_one_b(Layout.from_config("2-1"), 4)
    with pytest.raises(ScheduleError, match="before its all-reduce"):
        validate(_broken(r, 0, _without(r.actions[0], "A1")))
    # gpipe: one update per minibatch of microbatches, not per microbatch
    from pipedream_impl.schedule import gpipe

    g = gpipe(Layout.from_config("1-1"), 2, 3)
    extra = list(g.actions[1])
    extra.insert(extra.index(parse_action("B4v1")), Action("U", 3))
    with pytest.raises(ScheduleError, match="U3 must follow exactly the backwards of units "
                       "3..5"):  # caught at the update itself (before: by the count)
        validate(_broken(g, 1, extra))


def test_generated_schedules_pass_the_stricter_validator() -> None:
    from pipedream_impl.schedule import gpipe

    for config in ("1-1", "2-1", "1-2", "2-1-1", "3-2-1", "1-1-1-1"):
        for mode in ("stash", "vertical-sync", "none"):
            one_f_one_b(Layout.from_config(config), 12, mode)  # validates
        one_f_one_b(Layout.from_config(config), 12, in_flight=1)
    gpipe(Layout.from_config("1-1-1"), 3, 4)


def test_minibatches_must_divide_over_replicas() -> None:
    with pytest.raises(ScheduleError, match="multiple of 2"):
        one_f_one_b(Layout.from_config("2-1"), 5)


def test_grid_of_two_stages() -> None:
    g = grid(one_f_one_b(Layout.from_config("1-1"), 2)).splitlines()
    # rank 0 waits for B1's gradient: rank 1 runs F1 only after its B0 (1F1B)
    assert g[1].split() == ["s0r0", "F0", "F1", ".", ".", "B0", "B0", ".", "B1", "B1"]
    assert g[2].split() == ["s1r0", ".", "F0", "B0", "B0", "F1", "B1", "B1", ".", "."]
    assert g[-1] == "bubble fraction 0.33"  # 12 busy ticks of 2 x 9


def test_gpipe_flushes_every_minibatch() -> None:
    from pipedream_impl.schedule import gpipe

    s = gpipe(Layout.from_config("1-1"), 2, 3)
    assert compute_order(s, 0) == "F0v0 F1v0 F2v0 B0v0 B1v0 B2v0 F3v1 F4v1 F5v1 B3v1 B4v1 B5v1"
    assert [str(a) for a in s.actions[0] if a.kind == "U"] == ["U2", "U5"]
    assert grid(s).splitlines()[-1] == "bubble fraction 0.25"
    with pytest.raises(ScheduleError, match="unreplicated"):
        gpipe(Layout.from_config("2-1"), 2, 2)
