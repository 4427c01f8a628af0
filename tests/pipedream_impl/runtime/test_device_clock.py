"""pipedream_impl/runtime/device_clock.py: actions timed by device events, read at the
epoch's close (the GPU path; here with a stand-in event, since no CUDA device is at hand)."""

from __future__ import annotations

import time

import pytest
import torch

from pipedream_impl.runtime.contract import Executor, RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.device_clock import DeviceClock
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.local import local_executors, run_local
from pipedream_impl.schedule import Layout, one_f_one_b


class ScriptedEvent:
    """An event whose device timestamps (seconds) are given in order."""

    def __init__(self, times: list[float]) -> None:
        self.times, self.t = times, None

    def record(self) -> None:
        self.t = self.times.pop(0)

    def elapsed_time(self, other: ScriptedEvent) -> float:  # milliseconds, as CUDA's
        return (other.t - self.t) * 1e3


class HostEvent(ScriptedEvent):
    """An event stamped with the host clock when recorded (a device that is never behind)."""

    def __init__(self) -> None:
        super().__init__([])

    def record(self) -> None:
        self.t = time.perf_counter()


def test_spans_are_read_off_the_device_timeline_from_the_anchor() -> None:
    """The anchor at device time 10.0 s is host time 100.0 s; each span starts where the
    stream reached the action's first event and lasts until its last one."""
    times = [10.0, 10.5, 10.7, 10.7, 11.25]
    clock = DeviceClock(100.0, lambda: ScriptedEvent(times))
    f = clock.start()
    clock.stop(f, "F", busy=True)
    r = clock.start()
    clock.stop(r, "RB", busy=False)
    spans = clock.spans()
    assert [(n, b) for n, _, _, b in spans] == [("F", True), ("RB", False)]
    assert spans[0][1:3] == pytest.approx((100.5, 100.7))
    assert spans[1][1:3] == pytest.approx((100.7, 101.25))
    assert clock.spans() == []  # read once


def _spec(fault: Fault | None = None) -> WorkerSpec:
    return WorkerSpec(0, RunSettings("vgg16", "tiny", 0, 32, max_steps=4, timeout_s=60.0,
                                     fault=fault),
                      SystemSettings((1, 1), ((0, 14), (14, 40))))


def _event_timed(monkeypatch: pytest.MonkeyPatch, spec: WorkerSpec) -> tuple[list, list]:
    """One epoch of two in-process stages as on a GPU (the executors told they are on one,
    their events stamped by the host clock, their tensors on the CPU); every wait for the
    device counted."""
    waits: list[int] = []
    monkeypatch.setattr(Executor, "on_gpu", lambda self: True)
    monkeypatch.setattr(Executor, "event", staticmethod(HostEvent))
    monkeypatch.setattr(Executor, "synchronize", lambda self: waits.append(self.rank))
    torch.set_num_threads(1)
    executors = local_executors(spec)
    return run_local(executors, 0), waits


def test_event_timed_actions_are_booked_at_the_close_without_a_wait_per_action(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reports, waits = _event_timed(monkeypatch, _spec())
    sched = one_f_one_b(Layout((1, 1)), 4, "stash")
    for rank, rep in enumerate(reports):
        acts = sched.actions[rank]
        # every action booked once, in order, with its kind's busy/idle role
        assert [e[0] for e in rep.events] == [a.kind for a in acts]
        assert all(busy == (kind[0] != "R") for kind, _, _, busy in rep.events)
        starts = [e[1] for e in rep.events]
        assert starts == sorted(starts) and all(e[2] >= 0 for e in rep.events)
        assert rep.busy_s + rep.idle_s == pytest.approx(sum(e[2] for e in rep.events))
        assert sum(rep.action_s.values()) == pytest.approx(sum(e[2] for e in rep.events))
    # the device is waited for once per rank as the clock starts and once at the close,
    # never per action
    assert sorted(waits) == [0, 0, 1, 1]


def test_a_slowed_rank_keeps_waiting_per_action(monkeypatch: pytest.MonkeyPatch) -> None:
    """A straggler fault spins on the host clock, so its rank is timed per action there."""
    reports, waits = _event_timed(monkeypatch, _spec(Fault.parse("slow:1:F:2")))
    sched = one_f_one_b(Layout((1, 1)), 4, "stash")
    assert waits.count(0) == 2 and waits.count(1) == len(sched.actions[1])
    assert [e[0] for e in reports[1].events] == [a.kind for a in sched.actions[1]]
