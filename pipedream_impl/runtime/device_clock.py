"""Per-action times on a GPU without waiting for the device after every action.

Why: the runtime books each action's span (seconds per action kind, busy and idle time,
the trace's events). On the CPU an action is done when its handler returns; on a GPU its
kernels are only queued, and waiting for the device after every action (what the runtime
did) keeps the host from queueing the next action while the device works. Measured on an
H100 (``results/gpu/pipeline-h100.md``) that wait cost 2-21 ms per minibatch (0.4-0.9 ms
per action at 4 stages, more per action with fewer), more than the rest of the runtime's
overhead. torch's pipelining engine, timed by the harness's wrappers of its chunks, uses
the same clock (``baselines.torch_peers``).

How: a pair of CUDA events around each action, recorded on the current stream, and one
anchor event recorded when the epoch's clock starts (after one synchronisation, so the
anchor and the host's clock reading are the same instant). At the epoch's close, after one
synchronisation, each action's span is read off the device's timeline: it starts when the
stream reached its first event (everything queued before it was done) and ends when its
last kernel finished; the spans are then booked exactly as host-timed ones are
(``Executor.record``), so every report, metric and trace reads the same fields.

A span is the action's device time on the compute stream. A receive's span is the
stream's wait for the message (idle); a send's is only its hand-over to the transfer,
which runs on the communication library's own stream (NCCL) beside the next actions; a
host-side wait inside an action (a blocking transfer) still lies inside its span, since
the end event is queued after it. An action timed on the host instead (a straggler
fault's, whose spin reads the host clock) is booked with ``host`` in its place among them.

A minibatch's completion (the steady-state throughput's stamp) is a mark: an event
recorded once its update's kernels are queued, read at the close like the spans, so the
last stage no longer waits for the device after each update to stamp it (that wait kept
the host from preparing the next minibatch while the update ran). Marks are one per
minibatch and are all kept until the close. A minibatch's inputs (first stage) and targets
(last stage) go to the device through pinned memory without waiting
(``workloads.base.to_device``): a copy from pageable memory had waited for the stream to
drain.

Once ``FOLD_AT`` actions are pending, those at the front whose end the device has passed
are read as each action ends, so a long epoch does not hold two events per action until
its close.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FOLD_AT", "DeviceClock"]

FOLD_AT = 1024  # pending actions at which the finished ones are read


class DeviceClock:
    """One epoch's actions timed by device events: ``start`` before an action, ``stop``
    after it, ``spans`` once the device is synchronised."""

    def __init__(self, now: float, event: Callable[[], Any]) -> None:
        """``now``: the host clock (``time.perf_counter``) at the anchor, read right after
        a synchronisation; ``event``: makes an event with timing on (``torch.cuda.Event``
        with ``enable_timing=True``; a stand-in in tests)."""
        self.event = event
        self.anchor, self.anchor_at = event(), now
        self.anchor.record()
        self.pending: list[tuple[str, Any, Any, bool]] = []
        self.read: list[tuple[str, float, float, bool]] = []  # spans already read
        self.marks: list[tuple[Any, Any]] = []  # (tag, event) of each ``mark``

    def start(self) -> Any:
        ev = self.event()
        ev.record()
        return ev

    def stop(self, begin: Any, name: str, busy: bool) -> None:
        end = self.event()
        end.record()
        self.pending.append((name, begin, end, busy))
        if len(self.pending) >= FOLD_AT:
            self._fold(lambda end: end.query())

    def mark(self, tag: Any) -> None:
        """Note when the device reaches this point of the stream (read by ``stamps``)."""
        ev = self.event()
        ev.record()
        self.marks.append((tag, ev))

    def stamps(self) -> list[tuple[Any, float]]:
        """``(tag, t)`` of every mark in order, ``t`` on the host's clock
        (``time.perf_counter`` seconds); the device must be synchronised first."""
        out = [(tag, self.anchor_at + self.anchor.elapsed_time(ev) / 1e3)
               for tag, ev in self.marks]
        self.marks = []
        return out

    def host(self, name: str, t0: float, t1: float, busy: bool) -> None:
        """An action timed on the host clock (the device waited for on both sides)."""
        self.pending.append((name, None, (t0, t1), busy))

    def spans(self) -> list[tuple[str, float, float, bool]]:
        """``(name, t0, t1, busy)`` of every action in order, on the host's clock
        (``time.perf_counter`` seconds); the device must be synchronised first."""
        self._fold(lambda end: True)
        out, self.read = self.read, []
        return out

    def _fold(self, done: Callable[[Any], bool]) -> None:
        """Read the leading pending actions whose end ``done`` says the device passed."""
        k = 0
        for name, begin, end, busy in self.pending:
            if begin is None:  # timed on the host: end holds its span
                self.read.append((name, *end, busy))
            elif done(end):
                t0 = self.anchor_at + self.anchor.elapsed_time(begin) / 1e3
                self.read.append((name, t0, t0 + begin.elapsed_time(end) / 1e3, busy))
            else:
                break
            k += 1
        del self.pending[:k]
