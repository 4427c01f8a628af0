"""One place that starts a test's gloo ranks: ``world`` processes that each run
``target(rank, world, port, *args, queue)`` and put their result on the queue.

Why: the runtime's communication tests (hierarchical all-reduce, gradient buckets,
receives posted ahead) each need real torch.distributed processes; they share how those
are started, collected and checked, and that a rank which died does not leave the others
running after the test.

Results travel as plain pickled bytes: a tensor put on a torch queue is shared through a
file descriptor its sender hands over on request, so a rank that exits right after
putting its result can leave the receiver unable to fetch it (``FileNotFoundError`` from
``resource_sharer``, seen once in CI). Bytes hold their own copy.

Ranks start as the runtime's workers do (``pipedream_impl.runtime.processes``): forked from
this test process's fork server, which has done their imports once, with the environment
of now (``PIPEBENCH_FORKSERVER=0``: spawned).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from pipedream_impl.runtime import processes
from pipedream_impl.runtime.launcher import free_port

RESULT_TIMEOUT_S = 120.0  # per rank's result
JOIN_TIMEOUT_S = 60.0


class _BytesQueue:
    """What a rank sees as its queue: ``put`` sends the object's own pickled bytes."""

    def __init__(self, queue) -> None:  # noqa: ANN001
        self.queue = queue

    def put(self, obj: object) -> None:
        self.queue.put(pickle.dumps(obj))


def run_ranks(target: Callable, world: int, *args) -> list:  # noqa: ANN002
    """Each rank's result, in the order they arrive; every rank must exit with 0."""
    ctx = processes.context()
    out, port = ctx.Queue(), free_port()
    procs = [processes.process(ctx, target, (r, world, port, *args, _BytesQueue(out)),
                               daemon=False) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = [pickle.loads(out.get(timeout=RESULT_TIMEOUT_S)) for _ in procs]
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT_S)
            assert p.exitcode == 0, [q.exitcode for q in procs]
        return got
    finally:  # a rank that died must not leave the others waiting
        for p in procs:
            if p.is_alive():
                p.terminate()
