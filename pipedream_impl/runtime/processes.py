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

A server does its imports for seconds of CPU, and a launcher asked for one only when its
first worker starts, after its own imports, its data and its local profile: the two waited
for each other on a machine with a core to spare. ``start_server`` starts it at once
(``pipebench run`` and ``compare-run`` call it before their own imports, where the run's
workers will be forked here), so that its imports overlap the launcher's, and has it
import the slow model imports of the run's workload only (``workloads.preload``: a server
started when a worker needs one imports every workload's); a launcher that measures
anything itself (a one-process run, a local profile) first waits for the server's imports
to end (``ready``), so that no measurement shares the machine with them; a server started
early and never used is killed at exit, so that a run that failed before its workers does
not leave it importing.

``PIPEBENCH_FORKSERVER=0`` spawns every worker instead (the old start-up, for an A/B of
the two); where ``forkserver`` does not exist (Windows), workers are spawned.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from multiprocessing import forkserver

from pipedream_impl.runtime import switch
from workloads import PRELOAD_ENV

__all__ = ["FORKSERVER_ENV", "PRELOAD", "context", "new_server", "process", "ready",
           "start_server"]

FORKSERVER_ENV = "PIPEBENCH_FORKSERVER"
# what the fork server imports once: the worker's module pulls in torch and every workload,
# and workloads.preload the workloads' slow model imports (torchvision); an executor's own
# module (a peer's DeepSpeed) is still imported per run
PRELOAD = ("pipedream_impl.runtime.worker", "workloads.preload")
_early = False  # a server that start_server started may still be doing its imports


def context():  # noqa: ANN201 - a multiprocessing context
    """The start method for local worker processes (module doc)."""
    use = switch(FORKSERVER_ENV, "1", "fork workers from a server that has their imports "
                 "done, the default", "spawn each worker afresh")
    if not use or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # no effect once its server runs
    return ctx


def start_server(workload: str) -> None:
    """Start this process's fork server now, where workers are forked from one: it does
    its imports while this process does its own (module doc), of the workers' modules and
    of ``workload``'s slow model imports only (``workloads.preload``)."""
    global _early
    if context().get_start_method() != "forkserver" or _early:
        return
    before = os.environ.get(PRELOAD_ENV)
    os.environ[PRELOAD_ENV] = workload  # the server's environment: read as it starts
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ[PRELOAD_ENV]
        else:
            os.environ[PRELOAD_ENV] = before
    _early = True
    atexit.register(_kill_unused)


def ready() -> None:
    """Wait until a server ``start_server`` started has done its imports (a no-op
    otherwise): call it before this process measures anything (module doc)."""
    global _early
    if _early:
        p = context().Process(target=os.getpid)  # forked once the server's imports are done
        p.start()
        p.join()
        _early = False


def _kill_unused() -> None:
    """At exit: a server started early and not used since may still be importing, with
    this process's output open; nothing will use it."""
    pid = forkserver._forkserver._forkserver_pid  # noqa: SLF001 - no public way
    if _early and pid is not None:
        os.kill(pid, signal.SIGKILL)


def process(ctx, target: Callable, args: tuple, daemon: bool = True):  # noqa: ANN001, ANN201
    """A process of ``ctx`` that runs ``target(*args)`` with this process's environment as
    it is now (module doc)."""
    global _early
    _early = False  # its start waits for the server's imports
    return ctx.Process(target=_as_launched, args=(dict(os.environ), target, args),
                       daemon=daemon)


def new_server() -> None:
    """Stop this process's fork server, if one runs: the next worker starts a new one, a
    program executed afresh (module doc). Call it between runs, with no worker alive."""
    global _early
    _early = False
    stop = getattr(forkserver._forkserver, "_stop", None)  # noqa: SLF001 - no public way
    if stop is not None:
        stop()


def _as_launched(env: dict, target: Callable, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    target(*args)
