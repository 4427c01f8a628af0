"""How a launcher on this machine starts its worker processes: forked from a fork server
that has done the workers' imports once, with the launcher's environment handed over.

Why: a spawned worker imports torch, torchvision and the workloads afresh, 3.4 s of CPU
on the 2-core machine here, in every run, while a tiny cell's epoch trains in half a
second: most of a nightly's hour went to starting workers, and so did much of the test
suite's. multiprocessing's ``forkserver`` start method imports ``PRELOAD`` once, in a
server process of the launching process, and forks each worker from it. Unlike ``fork``
it copies none of the launcher's threads, CUDA context or open connections, so it is as
safe with CUDA and NCCL as ``spawn``.

What a spawned worker took from its launcher at start, a forked one takes from the fork
server, as they were when that server started: the environment and the working
directory. ``process`` hands both over, so an environment switch set between runs
(``PIPEBENCH_PIN``, a test's ``monkeypatch.setenv``) reaches the next run's workers as
it did under ``spawn``. The fork server lives as long as the process that started it (a
child of it, beside multiprocessing's resource tracker); the workers are its children.

``PIPEBENCH_FORKSERVER=0`` spawns every worker instead (the old start-up, for an A/B of
the two); where ``forkserver`` does not exist (Windows), workers are spawned.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch.multiprocessing as mp

from pipedream_impl.runtime import switch

__all__ = ["FORKSERVER_ENV", "PRELOAD", "context", "process"]

FORKSERVER_ENV = "PIPEBENCH_FORKSERVER"
# what the fork server imports once: the worker's module pulls in torch, torchvision and
# every workload; an executor's own module (a peer's DeepSpeed) is still imported per run
PRELOAD = ("pipedream_impl.runtime.worker",)


def context():  # noqa: ANN201 - a multiprocessing context
    """The start method for local worker processes (module doc)."""
    use = switch(FORKSERVER_ENV, "1", "fork workers from a server that has their imports "
                 "done, the default", "spawn each worker afresh")
    if not use or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # no effect once its server runs
    return ctx


def process(ctx, target: Callable, args: tuple, daemon: bool = True):  # noqa: ANN001, ANN201
    """A process of ``ctx`` that runs ``target(*args)`` with this process's environment
    and working directory as they are now (module doc)."""
    return ctx.Process(target=_as_launched, args=(dict(os.environ), os.getcwd(), target,
                                                  args), daemon=daemon)


def _as_launched(env: dict, cwd: str, target: Callable, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    target(*args)
