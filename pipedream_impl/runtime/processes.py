"""How a launcher on this machine starts its worker processes: forked from a fork server
that has done the workers' imports once, with the launcher's environment handed over.

Why: a spawned worker imports torch, torchvision and the workloads afresh, 3.4 s of CPU
on the 2-core machine here, in every run, while a tiny cell's epoch trains in half a
second: most of a nightly's hour went to starting workers, and so did much of the test
suite's. multiprocessing's ``forkserver`` start method imports ``PRELOAD`` once, in a
server process of the launching process, and forks each worker from it. Unlike ``fork``
it copies none of the launcher's threads, CUDA context or open connections, so it is as
safe with CUDA and NCCL as ``spawn``.

A forked worker takes from the fork server, as it was when that server started, what a
spawned one took from its launcher at start: ``process`` hands over the environment, so an
environment switch set between runs (``PIPEBENCH_PIN``, a test's ``monkeypatch.setenv``)
reaches the next run's workers as it did under ``spawn`` (multiprocessing itself hands
over the working directory). What is fixed when the server starts and not handed over:
CPU affinity, umask and resource limits, standard output and error, and what is read when
the interpreter or a library loads (``LD_PRELOAD``, ``MALLOC_*``, ``OMP_*``,
``PYTHONHASHSEED``); nothing in pipebench changes these between the runs of one process.

A server's workers share its address-space layout and string-hash seed (both drawn when a
program is executed, not when it forks), and these move a program's speed by a few percent
(Mytkowicz et al., ASPLOS 2009). A suite repeats its cells in rounds and starts each round
from a new server (``new_server``), so that the repeats of a cell, whose spread the
regression rule takes for the cell's noise, each draw their own layout as spawned workers
did. The server lives as long as the process that started it (a child of it, beside
multiprocessing's resource tracker); the workers are its children.

``PIPEBENCH_FORKSERVER=0`` spawns every worker instead (the old start-up, for an A/B of
the two); where ``forkserver`` does not exist (Windows), workers are spawned.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch.multiprocessing as mp

from pipedream_impl.runtime import switch

__all__ = ["FORKSERVER_ENV", "PRELOAD", "context", "new_server", "process"]

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
    """A process of ``ctx`` that runs ``target(*args)`` with this process's environment as
    it is now (module doc)."""
    return ctx.Process(target=_as_launched, args=(dict(os.environ), target, args),
                       daemon=daemon)


def new_server() -> None:
    """Stop this process's fork server, if one runs: the next worker starts a new one, a
    program executed afresh (module doc). Call it between runs, with no worker alive."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # noqa: SLF001 - no public way
    if stop is not None:
        stop()


def _as_launched(env: dict, target: Callable, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    target(*args)
