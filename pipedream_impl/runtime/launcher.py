"""Start a system's workers, drive them epoch by epoch, and stop them all on any failure.

``Launcher`` spawns one process per rank (``torch.multiprocessing``, spawn start method)
running ``contract.worker_main``, sends each an ``("epoch", k)`` message and collects every
rank's ``EpochReport``, while watching for errors and dead processes. A system that starts
its workers another way subclasses it and overrides ``_start`` (``baselines.horovod``
starts them under ``horovodrun``).

Failure: a worker that raises reports its traceback and exits non-zero; one that dies
silently is noticed by its exit code; a worker stuck in a receive times out inside
``comm`` (every receive and all-reduce waits at most ``timeout_s``). The launcher then
kills every worker, joins them (no orphans) and raises ``PipelineFailure`` with the
failing rank's error.

Across machines the same ``worker_main`` runs under torchrun instead
(``pipedream_impl.runtime.torchrun_worker``, ``env://`` rendezvous); see the README.
"""

from __future__ import annotations

import queue
import socket

import torch.multiprocessing as mp

from pipedream_impl.runtime.contract import EpochReport, WorkerSpec, worker_main

__all__ = ["Launcher", "PipelineFailure", "free_port"]


class PipelineFailure(RuntimeError):
    """A worker raised, died or timed out; the message names the rank and its error."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """The workers of one run: ``epoch(k)`` returns every rank's report, in rank order."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.timeout_s = specs[0].run.timeout_s
        self.names = [f"rank {s.rank}" for s in specs]
        self._start(specs)

    def _start(self, specs: list[WorkerSpec]) -> None:
        """One spawned process per rank; ``controls[rank]``/``results`` are its queues.

        A subclass may start workers another way: it sets ``procs`` (handles with
        exitcode/is_alive/kill/join, named by ``names``), ``controls`` (``put``) and
        ``results`` (``get(timeout)`` raising ``queue.Empty``).
        """
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.controls = [ctx.Queue() for _ in specs]
        self.procs = []
        for ws in specs:
            p = ctx.Process(target=worker_main, args=(ws, self.controls[ws.rank], self.results),
                            daemon=True)
            p.start()
            self.procs.append(p)

    def epoch(self, epoch: int) -> list[EpochReport]:
        for q in self.controls:
            q.put(("epoch", epoch))
        return self._collect()

    def _collect(self) -> list[EpochReport]:
        # No overall deadline: an epoch may take hours at full scale. Workers bound every
        # wait themselves (comm timeouts), and a dead worker shows up as an exit code.
        reports: dict[int, EpochReport] = {}
        while len(reports) < len(self.controls):
            try:
                kind, rank, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [(self.names[i], p.exitcode) for i, p in enumerate(self.procs)
                        if p.exitcode not in (None, 0)]
                if dead:
                    self._drain_errors_and_fail(dead)
                continue
            if kind == "error":
                self.fail(f"worker rank {rank} failed:\n{payload}")
            reports[rank] = payload
        return [reports[r] for r in range(len(self.controls))]

    def _drain_errors_and_fail(self, dead: list[tuple[str, int]]) -> None:
        try:
            while True:
                kind, rank, payload = self.results.get(timeout=1.0)
                if kind == "error":
                    self.fail(f"worker rank {rank} failed:\n{payload}")
        except queue.Empty:
            pass
        what = ", ".join(f"{r} exit code {c}" for r, c in dead)
        self.fail(f"pipeline workers stopped: {what}")

    def fail(self, message: str) -> None:
        """Kill and join every worker, then raise: the one way a run ends badly."""
        self.close(kill=True)
        raise PipelineFailure(message)

    def close(self, kill: bool = False) -> None:
        for q in self.controls:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            if kill and p.is_alive():
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
