"""gloo's transport threads yield the CPU to the worker's compute: ``PIPEBENCH_TRANSPORT_YIELD``.

Why: gloo's TCP transport reads and writes on an event-loop thread per device
(``gloo_tcp_loop``). Its handler takes the connection's mutex with a *try*-lock and, when
another thread holds it, returns and lets the level-triggered epoll wake it again at once.
The worker's main thread holds that mutex while it posts a receive or writes a send. When
the main thread is preempted inside such a call (on this machine: 2 workers of 1 thread on
2 cores, so every wake-up of some thread preempts a computing one), the loop thread spins
on epoll until the holder runs again: milliseconds of a core, taken from the compute of
one of the two workers, the holder's included. How often, per setting:
``results/transport-spins-vgg16-b4.md`` (``scripts/transport_spins.py``, ``perf``'s
system-call tracepoints). That is the receives-ahead gap of issue 24: the extra CPU of the
workers' other threads.

What, with ``PIPEBENCH_TRANSPORT_YIELD``:
- ``idle``: each transport thread runs under ``SCHED_IDLE``: only on a core nothing else
  wants, so a spinning one takes nothing from compute and a waking one never preempts it;
  a worker that waits for a message leaves its core to the thread that reads it.
- ``nice``: each transport thread at nice 19 (a weight of 15 against the main thread's
  1024): it still runs beside compute, but a spin costs a sliver of a core.
- ``0``: gloo's threads as the kernel schedules them.
- ``auto`` (the default, CPU runs only): ``idle`` where this machine's workers' threads
  outnumber the CPUs a worker may use (``crowded``: 4 workers of 1 thread on 2 cores),
  else ``0``. Measured here with ``pipebench run``, 4 epochs, runs alternating, ``idle``
  against ``0`` on 4 workers and 2 cores (two runs a side): gpipe on tiny VGG-16 +50%,
  DDP +18% to +31%, pipedream-flush about +10%, pipedream 0% to +9%, none slower. For
  our pipelines on as many workers as cores the four settings' A/Bs
  (``results/transport-yield-ab-*.md``, ``transport-idle-ab-*.md``) found no rule that
  fits every engine, so there gloo's threads are left alone. A worker whose collectives
  run on gloo's threads while it computes (``Executor.collectives_beside_compute``:
  DDP, whose bucket all-reduces run during the backward) is crowded already where the
  threads *fill* the CPUs: DDP on 2 workers of 1 thread on 2 cores measured +21%
  (VGG-16) and +20% (GNMT-8) under ``idle`` (three runs of ``pipebench run`` a side,
  alternating), so ``auto`` gives it ``idle`` there too; left as gloo schedules them, our
  DDP baseline ran a fifth slower than it can here, tilting every comparison with it.
  ``idle`` rather than ``nice`` on crowded cores: at 4 workers on 2 cores ``nice``
  measured no faster (tiny VGG-16, 4 epochs, three runs a side, alternating: gpipe
  541-572 samples/s against 581-632 under ``idle``, pipedream 2807-2978 against
  2902-2942), so a transport thread that runs late under ``idle`` is not what keeps
  those runs below their simulation (``results/simulator-validation.md``).

The threads are found by name in ``/proc/self/task``; ``apply`` is cheap and idempotent,
so every worker runs it before each epoch (``worker._serve``), which reaches the threads
of groups made during earlier epochs too. Linux only; where the kernel refuses (or on
another system) a worker says so on stderr once and its threads stay as they are; the A/B
script, which switches the setting epoch by epoch, stops instead (``strict``): a side
that did not get its setting would measure nothing. NCCL's threads are left alone (GPU
workers wait on the device, not on a core).
"""

from __future__ import annotations

import os
import sys

__all__ = ["THREAD_NAME", "TRANSPORT_YIELD_ENV", "apply", "crowded", "mode"]

TRANSPORT_YIELD_ENV = "PIPEBENCH_TRANSPORT_YIELD"
THREAD_NAME = "gloo_tcp_loop"  # gloo's transport loop (gloo/transport/tcp/loop.cc)
_MODES = ("auto", "0", "idle", "nice")
_NICE = 19
_state: dict[int, str] = {}  # each thread set so far, and how
_warned = [False]


def mode() -> str:
    """``PIPEBENCH_TRANSPORT_YIELD``: ``auto`` (the default, also when unset), ``0``,
    ``idle`` or ``nice``; anything else is an error, not a silent default."""
    value = os.environ.get(TRANSPORT_YIELD_ENV, "auto") or "auto"
    if value not in _MODES:
        raise ValueError(f"{TRANSPORT_YIELD_ENV}={value!r}: give one of {', '.join(_MODES)} "
                         "(auto, the default: idle where the workers outnumber the cores, or "
                         "fill them for DDP, else 0; 0: gloo's threads as the kernel "
                         "schedules them; idle: SCHED_IDLE; nice: nice 19)")
    return value


def crowded(workers: int, threads: int, on_cpu: bool = True,
            beside_compute: bool = False) -> bool:
    """Whether ``workers`` of ``threads`` threads each, on CPUs, outnumber the CPUs this
    process may use (``auto``'s test, given the workers on this machine,
    ``pinning.local_workers``; GPU workers wait on their devices: never crowded); with
    ``beside_compute`` (the workers' collectives run on gloo's threads while they
    compute) whether they fill them."""
    if not on_cpu:
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return workers * threads >= cpus if beside_compute else workers * threads > cpus


def _threads() -> list[int]:
    out = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == THREAD_NAME:
                    out.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _set(tid: int, how: str) -> None:
    if how == "idle":
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    if os.sched_getscheduler(tid) != os.SCHED_OTHER:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    # "0": back to the calling thread's nice (the process's, as it was started)
    os.setpriority(os.PRIO_PROCESS, tid, _NICE if how == "nice" else os.getpriority(
        os.PRIO_PROCESS, 0))


def apply(how: str | None = None, strict: bool = False, busy: bool = False) -> int:
    """Put every transport thread under ``how`` (default: the switch's ``mode()``; ``auto``
    is ``idle`` where ``busy``, the workers crowded on the cores, else ``0``); the number of
    threads changed. Threads never set are left alone under ``0``; one set before goes back
    to ``SCHED_OTHER`` at the calling thread's nice (which needs ``CAP_SYS_NICE``:
    ``scripts/same_process_ab.py``, run as root, switches it epoch by epoch). A refusal
    raises with ``strict``, else is said on stderr once."""
    how = mode() if how is None else how
    if how == "auto":
        how = "idle" if busy else "0"
    if how not in _MODES:
        raise ValueError(f"{how!r}: not one of {', '.join(_MODES)}")
    if how == "0" and not _state:  # the default, nothing ever set: nothing to look at
        return 0
    tids = _threads()
    for gone in set(_state) - set(tids):  # ended: a new thread may reuse the id
        del _state[gone]
    n = 0
    for tid in tids:
        if _state.get(tid, "0") == how:
            continue
        try:
            _set(tid, how)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except (OSError, AttributeError) as e:  # not Linux, or refused
            if strict:
                raise RuntimeError(f"{TRANSPORT_YIELD_ENV}={how}: the kernel refused "
                                   f"({e}); run as root to switch it back") from e
            if not _warned[0]:
                print(f"pipebench: {TRANSPORT_YIELD_ENV}={how} not applied ({e}); gloo's "
                      "threads stay as they are", file=sys.stderr)
                _warned[0] = True
            return n
        _state[tid] = how
        n += 1
    return n
