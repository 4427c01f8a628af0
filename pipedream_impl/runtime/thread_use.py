"""What an action costs the thread that runs it, beyond its wall time: CPU time, the part
of it in the kernel, minor page faults and involuntary context switches.

Why: a pipelined stage's actions take longer than the same actions run in one process
(``scripts/efficiency.py``, issue 24), and wall time alone cannot say why. The thread may
have been off its core (preempted, or woken late: wall time above CPU time), in the kernel
(page faults of fresh buffers: system time and faults), or on its core the whole time but
slower (CPU time itself grown). The kernel keeps these counts per thread; reading them
around every host-timed action costs four system calls (``getrusage`` and the thread CPU
clock, which the vDSO does not serve, at each end): a reading took 1.3 us here, two
readings and the booking about 3 us an action: for tiny VGG-16 on 2 workers (about 300
actions a second a worker at 32 samples a microbatch, 800 at 4) under 0.1% and about 0.25%
of a worker's time.

``reading`` takes one snapshot; ``add`` books the difference of two under an action kind,
into ``{kind: [cpu_s, sys_s, faults, preemptions]}`` (``FIELDS``' order). CPU time is the
thread's CPU clock (``CLOCK_THREAD_CPUTIME_ID``: exact at the call); the kernel's split of
it into user and system time is sampled at its timer tick, so ``sys_s`` is exact only
summed over many actions. Only the calling thread is counted: gloo's transport threads
and an all-reduce thread are not (their CPU shows in the epoch's process CPU time).
Actions timed by device events (a GPU's device clock) are not read: their span is the
device's time, not the thread's.
"""

from __future__ import annotations

import resource
import time

__all__ = ["FIELDS", "Reading", "add", "reading"]

FIELDS = ("cpu_s", "sys_s", "faults", "preemptions")
Reading = tuple[float, float, int, int]


def reading() -> Reading:
    """This thread's CPU seconds, system seconds, minor faults and involuntary switches."""
    use = resource.getrusage(resource.RUSAGE_THREAD)
    return time.thread_time(), use.ru_stime, use.ru_minflt, use.ru_nivcsw


def add(into: dict[str, list[float]], kind: str, before: Reading, after: Reading) -> None:
    """Book ``after - before`` under ``kind`` in ``into`` (summed with what is there).
    Written out field by field: it runs after every action."""
    acc = into.get(kind)
    if acc is None:
        acc = into[kind] = [0.0] * len(FIELDS)
    acc[0] += after[0] - before[0]
    acc[1] += after[1] - before[1]
    acc[2] += after[2] - before[2]
    acc[3] += after[3] - before[3]
