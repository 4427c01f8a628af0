"""Each CPU worker on cores of its own, where the cores allow it: ``PIPEBENCH_PIN``.

Why: with as many cores as workers (here: 2 workers of 1 thread on 2 cores) the kernel
may run any worker's threads on any core. gloo's transport thread of one worker then wakes
on the core where the other worker computes, and the workers' own threads move between
cores. MPI launchers bind each rank to its cores for this reason (Open MPI's
``--bind-to core``). This switch measures whether binding changes anything here:
``scripts/env_ab.py --set PIPEBENCH_PIN=1`` runs the bench both ways.

The rule, with ``PIPEBENCH_PIN=1`` on the CPU: the worker of local rank ``i`` with ``t``
torch threads takes logical CPUs ``[i t, (i + 1) t)`` of those the launcher may use (its
affinity mask, in order; where SMT siblings are numbered next to each other, two of them
share one physical core), provided that the workers on this machine (``LOCAL_WORLD_SIZE``
where the launcher sets it, else the whole world) times ``t`` fit on them. Otherwise
nothing is pinned, and the worker says so on stderr: a measured "pinned" side that was not
pinned would measure nothing. Every thread the process has at that moment (gloo's,
Horovod's, the orphan guard) is pinned, and threads started later inherit the mask. Every
system's workers pass through the same call (``worker._serve``), so all are pinned
alike; GPU runs are not pinned. ``0`` (the default) leaves placement to the kernel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipedream_impl.runtime import switch

__all__ = ["PIN_ENV", "cores_for", "local_workers", "pin", "pinning"]

PIN_ENV = "PIPEBENCH_PIN"  # "1": each CPU worker on cores of its own (see the module doc)


def pinning() -> bool:
    """Whether ``PIPEBENCH_PIN`` asks for pinning: ``1``, or ``0`` (the default, also when
    unset). Anything else is an error rather than a silent default."""
    return switch(PIN_ENV, "0", "each CPU worker on cores of its own",
                  "the kernel places the threads; the default")


def cores_for(local_rank: int, threads: int, world: int, cores: list[int]) -> set[int]:
    """The cores of the worker of ``local_rank`` (the rule in the module doc), or the empty
    set where the world's threads do not fit on ``cores``."""
    if threads < 1 or world * threads > len(cores) or not 0 <= local_rank < world:
        return set()
    return set(cores[local_rank * threads:(local_rank + 1) * threads])


def local_workers(world: int) -> int:
    """The run's workers on this machine: the launcher's ``LOCAL_WORLD_SIZE`` where set
    (torchrun sets it), else all ``world`` of them."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def pin(local_rank: int, threads: int, world: int) -> set[int]:
    """Pin this process's threads as the rule says, if ``PIPEBENCH_PIN=1``; returns the
    cores taken (empty: nothing pinned). ``world``: every worker of the run; the launcher's
    ``LOCAL_WORLD_SIZE``, where set, counts those on this machine instead."""
    if not pinning():
        return set()
    local = local_workers(world)
    allowed = sorted(os.sched_getaffinity(0))
    mine = cores_for(local_rank, threads, local, allowed)
    if not mine:
        print(f"{PIN_ENV}=1: not pinned: {local} worker(s) x {threads} thread(s) do not fit "
              f"on the {len(allowed)} CPU(s) this worker may use", file=sys.stderr)
        return set()
    done: set[int] = set()
    while True:  # until no thread is left that a pinned one started meanwhile
        tids = {int(t.name) for t in Path("/proc/self/task").iterdir()} - done
        if not tids:
            return mine
        for tid in tids:
            try:
                os.sched_setaffinity(tid, mine)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        done |= tids
