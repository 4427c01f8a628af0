"""Workers that another program starts, connecting back to the launcher over a socket.

Why: ``Launcher`` spawns its workers and talks to them through multiprocessing queues;
under ``horovodrun`` (``baselines.horovod``) or a Slurm job step (``srun``: our runtime,
the peers and DDP, ``pipedream_impl.runtime.srun``) the workers are started by another
program, possibly on other machines. Each then connects to a listener the launcher opened
(an authenticated ``multiprocessing.connection`` socket: a random key, plain pickle, no
shared-memory handles), says its rank, and from then on the connection carries the same
control messages and epoch reports as the spawn queues. ``SocketLauncher`` is the
launcher side (the starting program is one process handle: ``procs``), ``connect_back``
the worker side.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from core.imports import load
from pipedream_impl.runtime.contract import WorkerSpec
from pipedream_impl.runtime.launcher import Launcher
from pipedream_impl.runtime.worker import worker_main

__all__ = ["ConnEnd", "PopenHandle", "SocketLauncher", "connect_back"]


class ConnEnd:
    """Queue-like ``put``/``get`` over a socket; plain pickle (no shared-memory handles)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def put(self, obj: object) -> None:
        self.conn.send_bytes(pickle.dumps(obj))

    def get(self, timeout: float | None = None) -> object:
        if not self.conn.poll(timeout):
            raise queue.Empty
        return pickle.loads(self.conn.recv_bytes())


class PopenHandle:
    """The starting program as the launcher sees a worker (exitcode/is_alive/kill/join);
    it runs in a session of its own, so ``kill`` reaches every process it started here."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class SocketLauncher(Launcher):
    """A launcher whose workers another program starts (``_command``); they connect back.

    ``bind``: the address the listener binds (``127.0.0.1`` on one machine, ``0.0.0.0`` to
    accept workers on other nodes); ``advertise``: the address the workers are told.
    """

    name = "launcher"  # what the starting program is called in messages
    bind = advertise = "127.0.0.1"
    spec_dir: str | None = None  # where the spec file goes (the workers must see it)
    cwd: str | None = None  # the starting program's working directory
    handle = PopenHandle  # how the starting program is stopped

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) of the program that starts every worker."""
        raise NotImplementedError

    def _start(self, specs: list[WorkerSpec]) -> None:
        n = len(specs)
        authkey = os.urandom(16)
        self._listener = Listener((self.bind, 0), authkey=authkey)
        port = self._listener.address[1]
        self._tmp = tempfile.TemporaryDirectory(prefix="pipebench-workers-", dir=self.spec_dir)
        spec_file = Path(self._tmp.name) / "spec.pkl"
        spec_file.write_bytes(pickle.dumps(specs[0]))
        self.log_path = Path(self._tmp.name) / "workers.log"
        cmd, env = self._command(specs, spec_file, (self.advertise, port), authkey)
        with open(self.log_path, "wb") as log:
            popen = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.procs, self.names = [self.handle(popen)], [self.name]
        self.results: queue.Queue = queue.Queue()
        self.controls: list[ConnEnd] = []  # until every rank has connected
        self.controls = self._connect(n, popen)

    def _connect(self, n: int, popen: subprocess.Popen) -> list[ConnEnd]:
        accepted: queue.Queue = queue.Queue()

        def accept() -> None:
            for _ in range(n):
                try:
                    accepted.put(self._listener.accept())
                except OSError:  # listener closed: the launcher gave up
                    return

        threading.Thread(target=accept, daemon=True).start()
        ends: dict[int, ConnEnd] = {}
        deadline = time.monotonic() + self.timeout_s + 300  # the program's start-up included
        while len(ends) < n:
            try:
                end = ConnEnd(accepted.get(timeout=0.5))
            except queue.Empty:
                if popen.poll() is not None or time.monotonic() > deadline:
                    self.fail(f"{self.name} ended (exit code {popen.poll()}) before all "
                              f"{n} ranks connected:\n{self.log_tail()}")
                continue
            try:
                rank = end.get(timeout=30)
            except (queue.Empty, EOFError, OSError):
                self.fail(f"a rank connected but did not say which it is:\n{self.log_tail()}")
            ends[rank] = end
            threading.Thread(target=self._read, args=(end, rank), daemon=True).start()
        return [ends[r] for r in range(n)]

    def _read(self, end: ConnEnd, rank: int) -> None:
        """Forward one rank's messages; a broken connection is that rank lost (the
        launcher fails the run if it was still expected to report)."""
        while True:
            try:
                self.results.put(end.get(timeout=None))
            except (EOFError, OSError):
                self.results.put(("lost", rank, None))
                return

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError):
            return ""

    def fail(self, message: str) -> None:
        tail = self.log_tail()
        if tail and tail not in message:
            message += f"\n--- {self.name} output (last lines) ---\n{tail}"
        super().fail(message)

    def close(self, kill: bool = False) -> None:
        super().close(kill)
        if getattr(self, "_listener", None) is not None:
            self._listener.close()
        if getattr(self, "_tmp", None) is not None:
            self._tmp.cleanup()


class _MonitoredControl:
    """A worker's control end that also takes ``("monitor", "module:Class", *args)``: start
    that sampler of this node (the harness names it: the runtime knows no tracking store)
    until ``("stop",)``, when its ``finish()`` runs (``Launcher.monitor``); every other
    message passes through. A sampler that fails says so and the run goes on."""

    def __init__(self, end: ConnEnd) -> None:
        self.end, self.monitor = end, None

    def get(self, timeout: float | None = None) -> object:
        while True:
            msg = self.end.get(timeout)
            if msg[0] == "monitor":
                try:
                    self.monitor = load(msg[1])(*msg[2:])
                except Exception as e:  # noqa: BLE001 - metrics must not fail the run
                    print(f"this node's system metrics are not logged: {e}", file=sys.stderr)
                continue
            if msg[0] == "stop" and self.monitor is not None:
                self.monitor.finish()
            return msg


def connect_back(spec: WorkerSpec, host: str, port: int, authkey_hex: str) -> None:
    """A worker started by another program: connect to the launcher at ``host:port``, say
    the rank (``spec.rank``, already this worker's), then serve it like a spawned one."""
    end = ConnEnd(Client((host, port), authkey=bytes.fromhex(authkey_hex)))
    end.put(spec.rank)
    worker_main(spec, _MonitoredControl(end), end)
