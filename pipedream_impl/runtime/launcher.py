"""Start a system's workers, drive them epoch by epoch, and stop them all on any failure.

``Launcher`` starts one process per rank (``processes``: forked from a fork server that
has the workers' imports done) running ``worker.worker_main``, sends each an
``("epoch", k)`` message and collects every rank's ``EpochReport``, while watching for
errors and dead processes. A system that starts its workers another way subclasses it and
overrides ``_start`` (``baselines.horovod`` starts them under ``horovodrun``).

Failure: a worker that raises reports its traceback and exits non-zero; one that dies
silently is noticed by its exit code (or, under horovodrun, by its lost connection); a
worker stuck in a receive times out inside ``comm`` (every receive and all-reduce waits at
most ``timeout_s``). A worker that stops making progress is caught by the watchdog: every
worker stamps which action it is in and since when on its progress board
(``faults.Progress``, a memory-mapped file the launcher reads twice a second); when one in
an epoch has made no progress for ``stall_timeout_s``, the launcher blames the rank that
is stuck outside a wait (ranks blocked in a receive are its victims). The launcher then
kills every worker, joins them (no orphans) and raises ``PipelineFailure`` naming the
rank, its stage and its last action, and where every other rank was.

Across machines the same ``worker_main`` runs under torchrun instead
(``pipedream_impl.runtime.torchrun_worker``, ``env://`` rendezvous); see docs/multi-node.md.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

from pipedream_impl.runtime import processes
from pipedream_impl.runtime.contract import EpochReport, WorkerSpec
from pipedream_impl.runtime.faults import board_path, read_board
from pipedream_impl.runtime.worker import worker_main

__all__ = ["Launcher", "PipelineFailure", "free_port"]


class PipelineFailure(RuntimeError):
    """A worker raised, died, timed out or stalled; the message names the rank and its
    error. ``epoch_elapsed_s``: seconds from the start of the failing epoch to the end of
    the job (None outside an epoch)."""

    epoch_elapsed_s: float | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """The workers of one run: ``epoch(k)`` returns every rank's report, in rank order.

    ``stall_timeout_s``: end the run when a worker in an epoch makes no progress for that
    long (None: no watchdog)."""

    def __init__(self, specs: list[WorkerSpec], stall_timeout_s: float | None = None) -> None:
        self.timeout_s = specs[0].run.timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.names = [f"rank {s.rank}" for s in specs]
        shm = Path("/dev/shm")
        self.board_dir = tempfile.mkdtemp(prefix="pipebench-progress-",
                                          dir=shm if shm.is_dir() else None)
        self.boards = {s.rank: board_path(self.board_dir, s.rank) for s in specs}
        self.last_seen: dict[int, dict] = {}  # rank -> its newest readable progress record
        self._epoch_t0: float | None = None
        self.procs: list = []
        self.controls: list = []
        try:
            self._start([dataclasses.replace(s, progress_dir=self.board_dir,
                                             launcher_pid=os.getpid()) for s in specs])
        except BaseException:  # nothing half-started may outlive a failed start (a
            self.close(kill=True)  # subclass's close copes with a half-made start)
            raise

    def _start(self, specs: list[WorkerSpec]) -> None:
        """One process per rank (``processes``); ``controls[rank]``/``results`` are its
        queues.

        A subclass may start workers another way: it sets ``procs`` (handles with
        exitcode/is_alive/kill/join, named by ``names``), ``controls`` (``put``) and
        ``results`` (``get(timeout)`` raising ``queue.Empty``).
        """
        ctx = processes.context()
        self.results = ctx.Queue()
        self.controls = [ctx.Queue() for _ in specs]
        self.procs = []
        for ws in specs:
            p = processes.process(ctx, worker_main, (ws, self.controls[ws.rank], self.results))
            p.start()
            self.procs.append(p)

    def monitor(self, sampler: str, *args: object) -> None:
        """On every other machine, have one worker run ``sampler`` (``module:Class``,
        called with ``*args`` and the machine's name; ``finish()`` at stop): the harness's
        system metrics of that machine. Nothing to do when every worker runs here."""

    def restore(self, states: list[dict]) -> None:
        """Load each rank's checkpoint state before its next epoch (in rank order)."""
        for q, state in zip(self.controls, states, strict=True):
            q.put(("restore", state))

    def epoch(self, epoch: int) -> list[EpochReport]:
        for q in self.controls:
            q.put(("epoch", epoch))
        self._epoch_t0 = time.monotonic()
        reports = self._collect()
        self._epoch_t0 = None
        return reports

    def _collect(self) -> list[EpochReport]:
        # No overall deadline: an epoch may take hours at full scale. Workers bound every
        # wait themselves (comm timeouts), a dead worker shows up as an exit code or a lost
        # connection, and the watchdog ends a run that stopped making progress.
        reports: dict[int, EpochReport] = {}
        watched = time.monotonic()
        while len(reports) < len(self.controls):
            try:
                kind, rank, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                kind = None
            if kind == "error":
                self._fail_with_cause({rank: payload}, [])
            elif kind == "lost":
                self._fail_with_cause({}, [rank])
            elif kind == "epoch":
                reports[rank] = payload
            if kind is None or time.monotonic() - watched > 0.5:
                watched = time.monotonic()
                if any(p.exitcode not in (None, 0) for p in self.procs):
                    self._fail_with_cause({}, [])
                self._watch(reports)
        return [reports[r] for r in range(len(self.controls))]

    def progress(self, rank: int) -> dict | None:
        """The rank's newest progress record (its board, else the last one read)."""
        state = read_board(self.boards[rank]) if rank in self.boards else None
        if state is not None:
            self.last_seen[rank] = state
        return self.last_seen.get(rank)

    def where(self, rank: int) -> str:
        """``rank R (stage S, action X of epoch E)`` from its progress board."""
        p = self.progress(rank)
        if p is None or p["stage"] is None:
            return f"rank {rank}"
        return f"rank {rank} (stage {p['stage']}, {p['action']} of epoch {p['epoch']})"

    def others(self, rank: int | None) -> str:
        """Where every other rank was, one line each (for failure messages)."""
        lines = []
        for r in sorted(self.boards):
            p = self.progress(r)
            if r != rank and p is not None and p["stage"] is not None:
                lines.append(f"  rank {r} (stage {p['stage']}): "
                             f"{'waiting in' if p['waiting'] else 'in'} {p['action']} "
                             f"for {p['age_s']:.0f} s")
        return ("\nother ranks:\n" + "\n".join(lines)) if lines else ""

    def _watch(self, reports: dict[int, EpochReport]) -> None:
        """Fail when no rank still in this epoch has made progress for the stall timeout."""
        if self.stall_timeout_s is None:
            return
        ages = {r: p for r in self.boards if r not in reports
                and (p := self.progress(r)) is not None and p["active"]}
        # stalled: no rank still in the epoch has moved for the timeout (a rank waiting
        # behind a slow but moving stage is not a stall)
        if not ages or min(p["age_s"] for p in ages.values()) <= self.stall_timeout_s:
            return
        # blame a rank stuck outside a wait before its victims blocked in a receive
        culprits = [r for r, p in ages.items() if not p["waiting"]] or list(ages)
        rank = max(culprits, key=lambda r: ages[r]["age_s"])
        self.fail(f"worker {self.where(rank)} made no progress for "
                  f"{ages[rank]['age_s']:.0f} s (stall timeout {self.stall_timeout_s:g} s); "
                  f"every worker was stopped. If an action legitimately takes that long, "
                  f"raise --stall-timeout.{self.others(rank)}")

    def _fail_with_cause(self, errors: dict[int, str], lost: list[int]) -> None:
        """Something broke. Gather what every rank reports (up to 3 s: a killed process
        may be reaped after its peers' receives broke), then name the root cause, in this
        order: a rank killed by a signal; a rank's own error; a rank gone without a word
        (its process ended or its connection broke: under horovodrun the others are
        ended that way once one fails); a rank whose receive broke because a peer went
        away. The rest follow as "then: ..." lines."""
        one_per_rank = self.names[0] == "rank 0"
        deadline = time.monotonic() + 3.0
        while True:
            self._drain(errors, lost)
            signalled = [i for i, p in enumerate(self.procs) if one_per_rank
                         and p.exitcode is not None and p.exitcode < 0 and i not in errors]
            own = [r for r, tb in errors.items() if not _peer_gone(tb)]
            if signalled or own or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # polling the exit codes, with a deadline
        dead = [i for i, p in enumerate(self.procs) if one_per_rank
                and p.exitcode not in (None, 0) and i not in errors and i not in signalled]
        gone = dead + [r for r in lost if r not in errors and r not in dead + signalled]
        causes: list[tuple[int, str]] = []
        causes += [(i, _exit_text(self.procs[i].exitcode)) for i in signalled]
        causes += [(r, "failed:\n" + errors[r]) for r in own]
        causes += [(r, _exit_text(self.procs[r].exitcode) if r in dead else
                    "its process ended or its connection to the launcher broke")
                   for r in gone]
        causes += [(r, "failed:\n" + tb) for r, tb in errors.items() if r not in own]
        if not causes:  # a launcher process other than a rank (horovodrun) ended
            self.fail("worker stopped: " + "; ".join(
                f"{self.names[i]}: {_exit_text(p.exitcode)}"
                for i, p in enumerate(self.procs) if p.exitcode not in (None, 0)))
        rank, why = causes[0]
        message = f"worker {self.where(rank)} {why}" if why.startswith("failed") \
            else f"worker stopped: {self.where(rank)}: {why}"
        rest = [f"rank {r}: {_last_line(w)}" for r, w in causes[1:]]
        if rest:
            message += "\nthen: " + "; ".join(rest)
        self.fail(message + self.others(rank))

    def _drain(self, errors: dict[int, str], lost: list[int]) -> None:
        """Every message waiting now (reports of a failed epoch are dropped)."""
        while True:
            try:
                kind, rank, payload = self.results.get(timeout=0.05)
            except queue.Empty:
                return
            if kind == "error":
                errors.setdefault(rank, payload)
            elif kind == "lost" and rank not in lost:
                lost.append(rank)

    def fail(self, message: str) -> None:
        """Kill and join every worker, then raise: the one way a run ends badly."""
        for r in self.boards:  # read every board before the workers are gone
            self.progress(r)
        self.close(kill=True)
        error = PipelineFailure(message)
        if self._epoch_t0 is not None:
            error.epoch_elapsed_s = time.monotonic() - self._epoch_t0
        raise error

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
        shutil.rmtree(self.board_dir, ignore_errors=True)


def _peer_gone(traceback_text: str) -> bool:
    """An error that only says another rank went away (a consequence, not a cause)."""
    return any(m in traceback_text for m in ("by peer", "CommTimeout", "Connection closed",
                                             "Connection reset", "HorovodInternalError"))


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else text


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
