"""Each CPU worker on cores of its own, where the cores allow it: ``PIPEBENCH_PIN``.

Why: with as many cores as workers (here: 2 workers of 1 thread on 2 cores) the kernel
may run any worker's threads on any core. gloo's transport thread of one worker then wakes
on the core where the other worker computes, and the workers' own threads move between
cores. MPI launchers bind each rank to its cores for this reason (Open MPI's
``--bind-to core``). This switch measures whether binding changes anything here:
``scripts/env_ab.py --set PIPEBENCH_PIN=1`` runs the bench both ways.

The rule, with ``PIPEBENCH_PIN=1`` on the CPU: the worker of local rank ``i`` with ``t``
torch threads takes cores ``[i t, (i + 1) t)`` of the cores the launcher may use (its
affinity mask, in order), provided that the whole world (workers x ``t``) fits on them.
Otherwise nothing is pinned. Every thread the process has at that moment (gloo's,
Horovod's, the orphan guard) is pinned, and threads started later inherit the mask. Every
system's workers pass through the same call (``contract._serve``), so all are pinned
alike. ``0`` (the default) leaves placement to the kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PIN_ENV", "cores_for", "pin", "pinning"]

PIN_ENV = "PIPEBENCH_PIN"  # "1": each CPU worker on cores of its own (see the module doc)


def pinning() -> bool:
    """Whether ``PIPEBENCH_PIN`` asks for pinning: ``1``, or ``0`` (the default, also when
    unset). Anything else is an error rather than a silent default."""
    value = os.environ.get(PIN_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{PIN_ENV}={value!r}: use 1 (each CPU worker on cores of its "
                         "own) or 0 (the kernel places the threads; the default)")
    return value == "1"


def cores_for(local_rank: int, threads: int, world: int, cores: list[int]) -> set[int]:
    """The cores of the worker of ``local_rank`` (the rule in the module doc), or the empty
    set where the world's threads do not fit on ``cores``."""
    if threads < 1 or world * threads > len(cores) or not 0 <= local_rank < world:
        return set()
    return set(cores[local_rank * threads:(local_rank + 1) * threads])


def pin(local_rank: int, threads: int, world: int) -> set[int]:
    """Pin this process's threads as the rule says, if ``PIPEBENCH_PIN=1``; returns the
    cores taken (empty: nothing pinned)."""
    if not pinning():
        return set()
    mine = cores_for(local_rank, threads, world, sorted(os.sched_getaffinity(0)))
    if mine:
        for task in Path("/proc/self/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), mine)
            except (OSError, ValueError):  # a thread that ended meanwhile
                continue
    return mine
