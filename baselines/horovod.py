"""``--system horovod``: data parallelism with Horovod, launched with ``horovodrun --gloo``.

Worker side (``HorovodExecutor``, run by ``python -m baselines.horovod`` under horovodrun):
the shared data-parallel loop (``baselines.data_parallel``) with Horovod's recipe:
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` from rank 0, then
``hvd.DistributedOptimizer(op=Average, compression=none, groups=GROUPS)`` with default
tensor fusion and cycle time and autotune off (``HOROVOD_AUTOTUNE=0``). The step is
``synchronize(); clip (where the workload clips); with skip_synchronize(): step()``, so
clipping sees averaged gradients, as in one process, and the wait for the all-reduces is
timed on its own (action ``A``).

``broadcast_optimizer_state`` initialises a fresh optimizer by taking one step with zero
gradients; with Adam that advances the bias-correction step count and with weight decay it
moves the weights. The executor undoes that side effect (restores the weights and the empty
optimizer state, identical on every rank after the broadcasts), so a Horovod run equals
single-process training on the global batch (tested) and the comparison stays fair.

Communication volume: every tensor ``DistributedOptimizer`` hands to Horovod's
``allreduce_async_`` or ``grouped_allreduce_async_`` is counted at 2 (W-1)/W x its bytes
(ring all-reduce), per rank.
Fusion changes how many messages carry them, not how many bytes.

Launcher side (``HorovodLauncher``): the shared launcher (``pipedream_impl.runtime.launcher``) with
workers started by ``horovodrun -np W -H localhost:W --gloo`` instead of
``torch.multiprocessing``; they connect back to the launcher over a local authenticated
socket that carries the same control messages and epoch reports as the spawn queues.
The bootstrap builds Horovod for the CPU (gloo); GPU runs need a Horovod built with
``HOROVOD_GPU_OPERATIONS=NCCL``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

import torch

from baselines.data_parallel import DataParallelExecutor
from pipedream_impl.runtime.contract import WorkerSpec, worker_main
from pipedream_impl.runtime.launcher import Launcher, PipelineFailure

__all__ = ["HOROVOD_ENV", "HorovodExecutor", "HorovodLauncher"]

REPO = Path(__file__).resolve().parent.parent
HOROVOD_ENV = {"HOROVOD_AUTOTUNE": "0"}  # fusion threshold and cycle time: defaults
# DistributedOptimizer(groups=...): all gradients in one explicit group, one negotiation and
# one fused all-reduce per step (like DDP's buckets on these small models). Measured here
# (results/horovod-tuning.md): 0.72-0.76x DDP with per-tensor all-reduces, 0.79-0.88x with
# one group; cycle times of 5-20 ms and waiting by polling did not help.
GROUPS = 1


class HorovodExecutor(DataParallelExecutor):
    torch_distributed = False  # Horovod runs its own gloo context

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # noqa: ANN202
        import horovod.torch as hvd
        import horovod.torch.optimizer as hvd_optimizer

        hvd.init()
        if hvd.size() != self.world:
            raise RuntimeError(f"horovodrun started {hvd.size()} ranks, the layout has "
                               f"{self.world}")
        real = hvd_optimizer.allreduce_async_

        def counted(tensor, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.sent += self.ring_bytes(tensor)
            return real(tensor, *args, **kwargs)

        hvd_optimizer.allreduce_async_ = counted  # what DistributedOptimizer reduces
        real_grouped = hvd_optimizer.grouped_allreduce_async_

        def counted_group(tensors, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.sent += sum(self.ring_bytes(t) for t in tensors)
            return real_grouped(tensors, *args, **kwargs)

        hvd_optimizer.grouped_allreduce_async_ = counted_group  # with explicit groups
        pristine_weights = {k: v.clone() for k, v in model.state_dict().items()}
        pristine_state = optimizer.state_dict()
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # undo the zero-gradient step broadcast_optimizer_state takes on a fresh optimizer,
        # then broadcast rank 0's initial weights (once, after the undo)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(pristine_weights[k])
        optimizer.load_state_dict(pristine_state)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer.zero_grad(set_to_none=True)
        dist_opt = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                            compression=hvd.Compression.none, op=hvd.Average,
                                            groups=GROUPS)
        return model, dist_opt

    def _wait_for_gradients(self) -> None:
        self.optimizer.synchronize()  # the hooks started the all-reduces in the backward

    def _optimizer_step(self) -> None:
        with self.optimizer.skip_synchronize():  # synchronized in _wait_for_gradients
            self.optimizer.step()


# --- the control channel between the launcher and horovodrun's workers -----------------

class _ConnEnd:
    """Queue-like ``put``/``get`` over a socket; plain pickle (no shared-memory handles)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def put(self, obj: object) -> None:
        self.conn.send_bytes(pickle.dumps(obj))

    def get(self, timeout: float | None = None) -> object:
        if not self.conn.poll(timeout):
            raise queue.Empty
        return pickle.loads(self.conn.recv_bytes())


class _PopenHandle:
    """The horovodrun process as the launcher sees a worker (exitcode/is_alive/kill/join)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # horovodrun and every rank
        except ProcessLookupError:
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def horovodrun() -> str:
    exe = Path(sys.executable).parent / "horovodrun"
    found = str(exe) if exe.exists() else shutil.which("horovodrun")
    if found is None:
        raise PipelineFailure("horovodrun not found: Horovod is not installed in this "
                              "environment (make test / make demo install it)")
    return found


class HorovodLauncher(Launcher):
    def _start(self, specs: list[WorkerSpec]) -> None:
        n = len(specs)
        exe = horovodrun()  # before anything is opened: nothing to clean up if it is missing
        authkey = os.urandom(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = self._listener.address
        self._tmp = tempfile.TemporaryDirectory(prefix="pipebench-horovod-")
        spec_file = Path(self._tmp.name) / "spec.pkl"
        spec_file.write_bytes(pickle.dumps(specs[0]))
        self.log_path = Path(self._tmp.name) / "horovodrun.log"
        cmd = [exe, "-np", str(n), "-H", f"localhost:{n}", "--gloo",
               sys.executable, "-m", "baselines.horovod", str(spec_file), host, str(port),
               authkey.hex()]
        env = {**os.environ, **HOROVOD_ENV,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        with open(self.log_path, "wb") as log:
            popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.procs, self.names = [_PopenHandle(popen)], ["horovodrun"]
        self.results: queue.Queue = queue.Queue()
        self.controls: list[_ConnEnd] = []  # until every rank has connected
        self.controls = self._connect(n, popen)

    def _connect(self, n: int, popen: subprocess.Popen) -> list[_ConnEnd]:
        accepted: queue.Queue = queue.Queue()

        def accept() -> None:
            for _ in range(n):
                try:
                    accepted.put(self._listener.accept())
                except OSError:  # listener closed: the launcher gave up
                    return

        threading.Thread(target=accept, daemon=True).start()
        ends: dict[int, _ConnEnd] = {}
        deadline = time.monotonic() + self.timeout_s + 300  # horovodrun start-up included
        while len(ends) < n:
            try:
                end = _ConnEnd(accepted.get(timeout=0.5))
            except queue.Empty:
                if popen.poll() is not None or time.monotonic() > deadline:
                    self.fail(f"horovodrun ended (exit code {popen.poll()}) before all "
                               f"{n} ranks connected:\n{self.log_tail()}")
                continue
            try:
                rank = end.get(timeout=30)
            except (queue.Empty, EOFError, OSError):
                self.fail(f"a horovodrun rank connected but did not say which it is:\n"
                          f"{self.log_tail()}")
            ends[rank] = end
            threading.Thread(target=self._read, args=(end, rank), daemon=True).start()
        return [ends[r] for r in range(n)]

    def _read(self, end: _ConnEnd, rank: int) -> None:
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
        except OSError:
            return ""

    def fail(self, message: str) -> None:
        tail = self.log_tail()
        if tail and tail not in message:
            message += f"\n--- horovodrun output (last lines) ---\n{tail}"
        super().fail(message)

    def close(self, kill: bool = False) -> None:
        super().close(kill)
        self._listener.close()
        self._tmp.cleanup()


def main(argv: list[str]) -> None:
    """Entry point of one rank under horovodrun: SPEC_FILE HOST PORT AUTHKEY_HEX."""
    import horovod.torch as hvd

    hvd.init()
    spec = pickle.loads(Path(argv[0]).read_bytes())
    spec = dataclasses.replace(spec, rank=hvd.rank(), local_rank=hvd.local_rank())
    end = _ConnEnd(Client((argv[1], int(argv[2])), authkey=bytes.fromhex(argv[3])))
    end.put(spec.rank)
    worker_main(spec, end, end)


if __name__ == "__main__":
    main(sys.argv[1:])
