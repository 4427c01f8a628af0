"""A real ``mlflow server`` on loopback for the tracking tests: started on a given port
(so a test can point runs at it before it is up), ready when ``/health`` answers (polled
with a deadline, no fixed sleep), killed like a crashed server (its process group, so no
worker outlives it). The job runner is off: nothing here uses it and it starts 8 more
processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pipedream_impl.runtime.launcher import free_port

__all__ = ["MlflowServer", "free_port"]


class MlflowServer:
    """``mlflow server`` with a sqlite backend and served artifacts under ``root``."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root, self.port = root, port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, deadline_s: float = 180) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "a")  # the server's stderr, kept for a failure
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root / 'store.db'}",
             "--artifacts-destination", str(self.root / "artifacts")],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError("mlflow server did not start: "
                                     + (self.root / "server.log").read_text()[-2000:])
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group), as a crash would."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None
