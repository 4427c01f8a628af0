"""A worker process: what every multi-process system's worker runs, from start to exit.

Why apart from ``contract``: the contract says what a worker is handed and what its
executor does each epoch; this is the process around it, the same for every system and
every way of starting workers (``launcher``'s spawned processes, ``remote``'s workers that
connect back, ``torchrun_worker`` across machines): the machine settings it takes before
the process group starts its threads (``torch`` threads, ``no_halt``, ``pinning``), the
process group, one epoch per control message (each after ``transport_yield`` on gloo's
threads started so far), and how it ends.

A worker that raises reports its traceback on the results queue and exits non-zero; the
launcher (``pipedream_impl.runtime.launcher``) then stops every worker. Workers ignore
SIGINT and SIGTERM (the launcher decides what Ctrl-C or a termination means and stops them
itself) and exit on their own when their parent dies, so nothing outlives a killed launcher.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
import traceback

import torch
import torch.distributed as dist

from core.imports import load
from pipedream_impl.runtime import no_halt, transport_yield
from pipedream_impl.runtime.contract import WorkerPieces, WorkerSpec
from pipedream_impl.runtime.pinning import local_workers, pin

__all__ = ["ORPHAN_CHECK_S", "worker_main"]

ORPHAN_CHECK_S = 1.0  # how often a worker checks that its launcher is still alive


def worker_main(spec: WorkerSpec, control, results) -> None:  # noqa: ANN001 - queues
    """A worker process: build the pieces, then one epoch per ``("epoch", k)`` message
    until ``("stop",)``; ``("restore", state)`` loads a checkpoint. Errors are reported
    with their traceback, then the worker exits non-zero so the launcher stops everyone."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the launcher stops us (module doc)
        signal.signal(sig, signal.SIG_IGN)
    try:
        _serve(spec, control, results)
    except BaseException:  # report, then die non-zero: the launcher stops everyone
        results.put(("error", spec.rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _orphan_guard(launcher: int, parent: int) -> None:
    """Exit when the launcher (or, without one, the parent process: torchrun's agent) is
    gone: a killed launcher must not leave its workers waiting for an hour."""
    while True:
        if launcher:
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                os._exit(70)
        elif os.getppid() != parent:
            os._exit(70)
        time.sleep(ORPHAN_CHECK_S)


def _serve(spec: WorkerSpec, control, results) -> None:  # noqa: ANN001
    threading.Thread(target=_orphan_guard, args=(spec.launcher_pid, os.getppid()), daemon=True,
                     name="pipebench-orphan-guard").start()
    torch.set_num_threads(spec.run.threads)
    no_halt.hold()  # PIPEBENCH_NO_HALT (off by default; no_halt.py)
    device = torch.device("cpu")
    if spec.run.device == "cuda":  # one GPU per local rank; NCCL below
        device = torch.device(f"cuda:{spec.local_rank % max(1, torch.cuda.device_count())}")
        torch.cuda.set_device(device)
    else:  # before the process group starts its threads (pinning.py; off by default)
        pin(spec.local_rank, spec.run.threads, sum(spec.system.replicas))
    executor_cls = load(spec.system.executor)
    if executor_cls.torch_distributed:  # Horovod brings its own
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=spec.init_method, rank=spec.rank,
                                world_size=sum(spec.system.replicas),
                                timeout=datetime.timedelta(seconds=spec.run.timeout_s))
    executor = executor_cls(WorkerPieces.build(spec, device, own_peak=True))
    yields = transport_yield.crowded(  # what PIPEBENCH_TRANSPORT_YIELD=auto means here
        local_workers(sum(spec.system.replicas)), spec.run.threads, on_cpu=device.type == "cpu",
        beside_compute=executor_cls.collectives_beside_compute)
    while True:  # between epochs the launcher evaluates: wait long, but not forever (a
        # worker whose launcher was killed must not linger)
        msg = control.get(timeout=max(3600.0, 4 * spec.run.timeout_s))
        if msg[0] == "stop":
            return
        if msg[0] == "restore":
            executor.load_checkpoint(msg[1])
            continue
        transport_yield.apply(busy=yields)  # PIPEBENCH_TRANSPORT_YIELD: on every gloo
        # thread started so far, groups made in earlier epochs included
        report = executor.run_epoch(msg[1])
        if spec.run.checkpoint:
            report.checkpoint = executor.checkpoint_state()
        results.put(("epoch", spec.rank, report))
