"""pipedream_impl/runtime/device_clock.py: actions timed by device events, read once the
device is synchronised (the GPU path; here with stand-in events stamped by the host clock,
since no CUDA device is at hand: the executors are told they are on a GPU while their
tensors stay on the CPU)."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace

import pytest
import torch

from baselines.torch_peers import TorchPipeExecutor
from pipedream_impl.runtime import device_clock
from pipedream_impl.runtime.contract import (
    EpochReport,
    Executor,
    RunSettings,
    SystemSettings,
    WorkerSpec,
)
from pipedream_impl.runtime.device_clock import DeviceClock
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.local import local_executors, play_epoch, run_local
from pipedream_impl.schedule import Layout, one_f_one_b


class ScriptedEvent:
    """An event whose device timestamps (seconds) are given in order."""

    def __init__(self, times: list[float]) -> None:
        self.times, self.t = times, None

    def record(self) -> None:
        self.t = self.times.pop(0)

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: ScriptedEvent) -> float:  # milliseconds, as CUDA's
        return (other.t - self.t) * 1e3


class Device:
    """Stand-in device: events stamped with the host clock when recorded; an event can be
    read only once a synchronisation (or ``query``) came after it; waits counted per rank."""

    def __init__(self) -> None:
        self.seq, self.synced, self.waits = 0, 0, []

    def event(self) -> HostEvent:
        return HostEvent(self)

    def synchronize(self, rank: int) -> None:
        self.synced = self.seq
        self.waits.append(rank)


class HostEvent:
    def __init__(self, device: Device) -> None:
        self.device, self.t, self.seq = device, None, None

    def record(self) -> None:
        self.device.seq += 1
        self.t, self.seq = time.perf_counter(), self.device.seq

    def query(self) -> bool:
        return self.seq <= self.device.synced

    def elapsed_time(self, other: HostEvent) -> float:
        assert self.query() and other.query(), "an event read before the device was waited for"
        return (other.t - self.t) * 1e3


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Executors that believe they are on a GPU; one torch thread, restored after."""
    dev = Device()
    monkeypatch.setattr(Executor, "on_gpu", lambda self: True)
    monkeypatch.setattr(Executor, "event", staticmethod(dev.event))
    monkeypatch.setattr(Executor, "synchronize", lambda self: dev.synchronize(self.rank))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield dev
    torch.set_num_threads(threads)


def test_spans_are_read_off_the_device_timeline_from_the_anchor() -> None:
    """The anchor at device time 10.0 s is host time 100.0 s; each span starts where the
    stream reached the action's first event and lasts until its last one; a host-timed
    action keeps its place between them."""
    times = [10.0, 10.5, 10.7, 10.95, 11.25]
    clock = DeviceClock(100.0, lambda: ScriptedEvent(times))
    f = clock.start()
    clock.stop(f, "F", busy=True)
    clock.host("B", 100.8, 100.9, True)
    r = clock.start()
    clock.stop(r, "RB", busy=False)
    spans = clock.spans()
    assert [(n, b) for n, _, _, b in spans] == [("F", True), ("B", True), ("RB", False)]
    assert spans[0][1:3] == pytest.approx((100.5, 100.7))
    assert spans[1][1:3] == (100.8, 100.9)
    assert spans[2][1:3] == pytest.approx((100.95, 101.25))
    assert clock.spans() == []  # read once


def test_finished_actions_are_read_as_the_epoch_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long epoch does not keep every action's events: past FOLD_AT pending actions the
    ones the device has passed are read, the rest wait for the close."""
    monkeypatch.setattr(device_clock, "FOLD_AT", 4)
    dev = Device()
    clock = DeviceClock(0.0, dev.event)
    for _ in range(3):
        clock.stop(clock.start(), "F", True)
    dev.synchronize(0)  # the device passed those three
    clock.stop(clock.start(), "B", True)  # the fourth: a fold, it is not yet passed
    assert len(clock.read) == 3 and len(clock.pending) == 1
    clock.host("X", 1.0, 2.0, True)  # timed on the host: it stays behind the B
    for _ in range(3):
        clock.stop(clock.start(), "F", True)
    assert len(clock.read) == 3 and [p[0] for p in clock.pending] == ["B", "X", "F", "F", "F"]
    dev.synchronize(0)
    assert [s[0] for s in clock.spans()] == ["F", "F", "F", "B", "X", "F", "F", "F"]


def _spec(fault: Fault | None = None, steps: int = 4) -> WorkerSpec:
    return WorkerSpec(0, RunSettings("vgg16", "tiny", 0, 32, max_steps=steps, timeout_s=60.0,
                                     fault=fault),
                      SystemSettings((1, 1), ((0, 14), (14, 40))))


STEPS = 16  # minibatches of the timed epoch below


def test_event_timed_actions_are_booked_at_the_close_without_a_wait_per_action(
        gpu: Device) -> None:
    executors = local_executors(_spec(steps=STEPS))
    # the epoch's fixed costs outside its actions (its open and close: the peak memory read
    # from /proc/self/smaps among them, about 33 ms a rank with the suite's libraries
    # loaded) took as long as 4 minibatches' actions twice in make test (spent 0.10 of
    # 0.20 s); 16 minibatches keep the actions most of the epoch
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        reports = run_local(executors, 0)
        wall = time.perf_counter() - t0
    finally:
        gc.enable()
    sched = one_f_one_b(Layout((1, 1)), STEPS, "stash")
    spent = 0.0
    for rank, rep in enumerate(reports):
        acts = sched.actions[rank]
        # every action booked once, in order, with its kind's busy/idle role
        assert [e[0] for e in rep.events] == [a.kind for a in acts]
        assert all(busy == (kind[0] != "R") for kind, _, _, busy in rep.events)
        starts = [e[1] for e in rep.events]
        assert starts == sorted(starts)
        assert all(dt > 0 for kind, _, dt, _ in rep.events if kind in ("F", "B", "U"))
        assert rep.busy_s + rep.idle_s == pytest.approx(sum(e[2] for e in rep.events))
        assert sum(rep.action_s.values()) == pytest.approx(sum(e[2] for e in rep.events))
        spent += rep.busy_s + rep.idle_s
    # the ranks take turns in this one process: their actions fill most of the epoch
    assert 0.5 * wall < spent < wall
    # the device is waited for once per rank as the clock starts and once at the close:
    # never per action, nor per minibatch stamped done (the steady-state clock)
    assert sorted(gpu.waits) == [0, 0, 1, 1]
    # each minibatch's stamp is its mark's event, read at the close on the wall clock:
    # after the minibatch's update (U) began on the last stage, in order, one each
    last = reports[-1]
    updates = [start for kind, start, _, _ in last.events if kind == "U"]
    assert [k for k, _ in last.done_at] == list(range(STEPS))
    stamps = [t for _, t in last.done_at]
    assert all(u < t for u, t in zip(updates, stamps, strict=True))
    assert stamps == sorted(stamps) and stamps[-1] <= last.end_at
    warm = min(STEPS, executors[-1].run.warmup_steps) - 1
    assert last.warm_done_at == stamps[warm]
    assert reports[0].done_at == []  # the first stage stamps nothing


def test_a_slowed_action_is_timed_on_the_host_in_its_place(gpu: Device) -> None:
    """A straggler fault spins on the host clock, so its actions (and only those) wait for
    the device on both sides; they stay in order among the device-timed ones."""
    reports = run_local(local_executors(_spec(Fault.parse("slow:1:F:2"))), 0)
    sched = one_f_one_b(Layout((1, 1)), 4, "stash")
    forwards = sum(a.kind == "F" for a in sched.actions[1])
    assert gpu.waits.count(0) == 2 and gpu.waits.count(1) == 2 + 2 * forwards
    events = reports[1].events
    assert [e[0] for e in events] == [a.kind for a in sched.actions[1]]
    assert [e[1] for e in events] == sorted(e[1] for e in events)


def test_torch_peers_time_their_chunks_by_the_device_clock_too(gpu: Device) -> None:
    """torch's engine runs our wrappers of its stages' chunk methods: on a GPU they are
    timed by the same clock (no wait per chunk), read when the step is booked."""
    ex = object.__new__(TorchPipeExecutor)
    ex.rank, ex._spans = 0, []
    ex.run = SimpleNamespace(fault=None)
    ex._wall0, ex._perf0 = time.time(), time.perf_counter()
    ex.clock = DeviceClock(time.perf_counter(), gpu.event)
    stage = SimpleNamespace(forward_one_chunk=lambda x: torch.ones(64, 64) @ x)
    ex._time(stage, "forward_one_chunk", lambda kw: "F")
    t0 = time.perf_counter()
    out = stage.forward_one_chunk(torch.ones(64, 64))
    time.sleep(0.01)  # a gap between the chunks: the engine waiting for a message
    stage.forward_one_chunk(out)
    assert gpu.waits == []  # nothing waited for per chunk
    gpu.synchronize(0)  # the step ends synchronised (PeerExecutor.run_epoch)
    report = EpochReport(0, 0, 0)
    ex._book(report, t0, time.perf_counter())
    assert [e[0] for e in report.events] == ["wait", "F", "wait", "F", "wait"]
    assert report.action_s["wait"] >= 0.009 and report.action_s["F"] > 0


def test_minibatches_are_stamped_done_from_their_marks_at_the_close(gpu: Device) -> None:
    """The stamps come from the clock's marks when the epoch closes, not from the host's
    clock as each minibatch's update is queued: none exists before the close, and each is
    its mark's device time on the wall clock. The stand-in device's clock runs at ``rate``
    times the host's, so a stamp taken from the host clock would be off; the last stamp
    lies past the epoch's end unless the close takes 99 times as long as the epoch before
    it (at twice the rate, a close longer than the epoch on a loaded machine failed it)."""
    base, rate = time.perf_counter(), 100.0

    class Fast(HostEvent):
        def record(self) -> None:
            super().record()
            self.host, self.t = self.t, base + rate * (self.t - base)

    executors = local_executors(_spec())
    for ex in executors:
        ex.event = lambda: Fast(gpu)
    play_epoch(executors, 0)
    last = executors[-1]
    assert last.report.done_at == [] and last.report.warm_done_at is None
    clock, marks = last.clock, list(last.clock.marks)
    reports = [ex.finish_epoch() for ex in executors]
    on_wall = last._wall0 - last._perf0 + clock.anchor_at
    expected = [(k, on_wall + rate * (ev.host - clock.anchor.host)) for k, ev in marks]
    assert [k for k, _ in reports[-1].done_at] == [k for k, _ in expected] == list(range(4))
    assert [t for _, t in reports[-1].done_at] == pytest.approx(
        [t for _, t in expected], rel=0, abs=1e-6)
    assert reports[-1].done_at[-1][1] > reports[-1].end_at  # a host stamp could not be
