"""thread_use.py against what the thread was made to do: spin, sleep, touch fresh pages,
share its core with a spinning process.

Why: ``scripts/efficiency.py`` splits a pipelined stage's extra time into CPU time and time
off the core by these readings (issue 24). Each reference here is independent of the code:
the wall clock (one thread's CPU time cannot exceed it, and a spinning thread alone on a
core gets most of it), the number of pages touched (one minor fault each at least), and two
runnable tasks on one CPU (the scheduler must switch between them).
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import time

import pytest

from pipedream_impl.runtime.thread_use import FIELDS, add, reading

PAGE = mmap.PAGESIZE


def _used(action) -> dict[str, float]:  # noqa: ANN001 - a callable
    """``action()``'s thread use, by field, and its wall time."""
    got: dict[str, list[float]] = {}
    t0, before = time.perf_counter(), reading()
    action()
    after, wall = reading(), time.perf_counter() - t0
    add(got, "x", before, after)
    return {**dict(zip(FIELDS, got["x"], strict=True)), "wall": wall}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_add_sums_each_field_under_its_kind() -> None:
    got: dict[str, list[float]] = {}
    add(got, "F", (1.0, 0.25, 10, 1), (3.0, 0.5, 14, 2))
    add(got, "F", (0.0, 0.0, 0, 0), (1.0, 0.0, 1, 0))
    add(got, "B", (0.0, 0.0, 0, 0), (0.5, 0.0, 0, 3))
    assert got == {"F": [3.0, 0.25, 5, 1], "B": [0.5, 0.0, 0, 3]}


def test_a_spinning_thread_is_on_its_core_and_a_sleeping_one_is_not() -> None:
    # one thread: never more CPU time than wall time (the two clocks may be slewed apart
    # by a hair); and a good part of it in the best of a few spins, even with other tests'
    # processes on the 2 cores (one spin in a loaded stretch here got 13% of its wall)
    spins = []
    for _ in range(5):
        spins.append(_used(lambda: _spin(0.2)))
        assert spins[-1]["cpu_s"] <= spins[-1]["wall"] * 1.001
        if spins[-1]["cpu_s"] >= 0.25 * spins[-1]["wall"]:
            break
    assert max(s["cpu_s"] / s["wall"] for s in spins) >= 0.25
    slept = _used(lambda: time.sleep(0.1))
    assert slept["wall"] >= 0.1 and slept["cpu_s"] < 0.02
    assert all(slept[f] >= 0 for f in FIELDS)


def test_touching_fresh_pages_counts_a_fault_each() -> None:
    pages = 128  # 512 KiB with 4 KiB pages: too small for a transparent huge page
    # private and anonymous: no page is there before its first touch
    area = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def touch() -> None:
        for i in range(pages):
            area[i * PAGE] = 1

    try:
        got = _used(touch)
    finally:
        area.close()
    assert pages <= got["faults"] <= pages + 64  # the interpreter may fault a few of its own
    assert got["sys_s"] >= 0


def _spinner(cpu: int, ready, stop) -> None:  # noqa: ANN001 - multiprocessing events
    os.sched_setaffinity(0, {cpu})
    ready.set()
    while not stop.is_set():
        _spin(0.01)


@pytest.mark.multiprocess
def test_sharing_a_core_with_a_spinning_process_counts_preemptions() -> None:
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_spinner, args=(cpu, ready, stop), daemon=True)
    other.start()
    try:
        assert ready.wait(60), "the spinning process did not start"
        os.sched_setaffinity(0, {cpu})  # this thread only (pid 0: the caller)
        got = _used(lambda: _spin(0.3))
    finally:
        os.sched_setaffinity(0, mine)
        stop.set()
        other.join(30)
    # two runnable tasks on one CPU for 0.3 s: the scheduler's slices are milliseconds
    assert got["preemptions"] >= 1
    assert got["cpu_s"] < got["wall"]  # it shared the core: off it part of the time
