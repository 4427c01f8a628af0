"""Keep the machine's CPUs from halting while a run is on: ``PIPEBENCH_NO_HALT``.

Why: a pipeline stage waits for its neighbour many times per minibatch. Where the wait
sleeps, an idle virtual CPU halts, and the compute right after waking runs slower:
``results/wake-cost.md`` measured about 6-8% on this machine's VMs (cpuidle driver
``haltpoll`` with guest halt polling off), paired within rounds, against waits that keep
the CPU from halting. A process that never waits on another (``single``) should pay
little of it, the pipelines much. This switch measures what halts cost whole runs:
``scripts/env_ab.py --set PIPEBENCH_NO_HALT=1`` runs the bench both ways
(``results/no-halt-ab-vgg16*.md``), ``scripts/efficiency.py`` under it the efficiency
(``results/efficiency-*-no-halt.md``); docs/systems.md lists every measurement.

How, with ``PIPEBENCH_NO_HALT=1``: the process asks the kernel's PM QoS for a CPU wake-up
latency of 0 by writing a 32-bit 0 to ``/dev/cpu_dma_latency`` and keeping the file open
(the request lasts while some process holds it open; the kernel then keeps idle CPUs in
its polling state instead of halting them). The request is the whole machine's, not the
process's: every process on it, ours or not, gets it meanwhile. Opening the file needs
root; where it cannot be opened the process says so on stderr and runs as without the
switch (a measured side that did not get the setting would measure nothing, so the
message names why). The request is made once per process and held until it exits:
every run (``harness.experiments.runner``), every worker (``worker._serve``: on this
machine the run's request already covers it, on other machines it is theirs) and a suite
before its first drift reference (so the reference loop runs under the same setting as
the cells). ``0`` (the default) leaves the
CPUs' idle states to the kernel. Polling instead of halting costs power, and on a host
whose virtual CPUs share physical cores, execution resources of the sibling; GPU hosts get
the same request (their host threads wait on the device).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import BinaryIO

from pipedream_impl.runtime import switch

__all__ = ["DMA_LATENCY", "NO_HALT_ENV", "applied", "hold", "no_halt", "request"]

NO_HALT_ENV = "PIPEBENCH_NO_HALT"  # "1": idle CPUs poll instead of halting (module doc)
DMA_LATENCY = Path("/dev/cpu_dma_latency")  # the kernel's PM QoS CPU latency request

_held: list[BinaryIO] = []  # this process's open request (held until the process ends)


def no_halt() -> bool:
    """Whether ``PIPEBENCH_NO_HALT`` asks for it: ``1``, or ``0`` (the default, also when
    unset). Anything else is an error rather than a silent default."""
    return switch(NO_HALT_ENV, "0", "idle CPUs poll instead of halting while a run is on",
                  "the kernel chooses the idle states; the default")


def applied(path: Path | None = None) -> bool:
    """Whether the request is in force for a run here: held by this process, or one this
    process could make (the request file writable: a process that only describes runs,
    such as a script's parent, does not make it itself). Runs record a switch asked for
    but not applied as such (``harness.experiments.runner.runtime_env``)."""
    return bool(_held) or os.access(path or DMA_LATENCY, os.W_OK)


def request(path: Path | None = None) -> BinaryIO:
    """Ask for a CPU wake-up latency of 0, whatever the switch says: the open request,
    in force until it is closed (``OSError`` where it cannot be made, e.g. without root).
    ``path``: the request file (tests)."""
    f = (path or DMA_LATENCY).open("wb", buffering=0)
    try:
        f.write(struct.pack("i", 0))
    except BaseException:
        f.close()
        raise
    return f


def hold(path: Path | None = None) -> bool:
    """Make this process's request if the switch asks for it (once; later calls only
    report it); whether a request is held. ``path``: the request file (tests)."""
    if _held:
        return True
    if not no_halt():
        return False
    try:
        _held.append(request(path))
    except OSError as err:
        print(f"{NO_HALT_ENV}=1: not applied: cannot write {path or DMA_LATENCY} "
              f"({err.strerror or err}); idle CPUs may halt", file=sys.stderr)
        return False
    return True
