"""One place that starts a test's gloo ranks: ``world`` fresh processes that each run
``target(rank, world, port, *args, queue)`` and put their result on the queue.

Why: the runtime's communication tests (hierarchical all-reduce, gradient buckets,
receives posted ahead) each need real torch.distributed processes; they share how those
are started, collected and checked, and that a rank which died does not leave the others
running after the test.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable

from pipedream_impl.runtime.launcher import free_port

RESULT_TIMEOUT_S = 120.0  # per rank's result
JOIN_TIMEOUT_S = 60.0


def run_ranks(target: Callable, world: int, *args) -> list:  # noqa: ANN002
    """Each rank's result, in the order they arrive; every rank must exit with 0."""
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=RESULT_TIMEOUT_S) for _ in procs]
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT_S)
            assert p.exitcode == 0, [q.exitcode for q in procs]
        return got
    finally:  # a rank that died must not leave the others waiting
        for p in procs:
            if p.is_alive():
                p.terminate()
