"""Multi-machine Horovod: the ``HorovodExecutor`` as a scripted worker under ``horovodrun``.

``pipebench run --system horovod`` starts ``horovodrun -H localhost:W`` and drives its
ranks from a launcher socket on 127.0.0.1, which cannot span machines. Across machines,
start this module with horovodrun from the first machine (it reaches the others over ssh)::

    horovodrun --gloo -np 2 -H host0:1,host1:1 --network-interface eth0 \\
        python -m baselines.horovod_worker --workload vgg16 --scale full --epochs 1 \\
        --timeout 60 --out runs/vgg16-horovod

Like ``pipedream_impl.runtime.torchrun_worker`` (whose flags, ``RunSettings`` and scripted
control/sink it shares), each rank runs the epoch budget on its 1/W slice of every global
minibatch and writes, per epoch, a JSON line of its report to ``--out/rank<R>.jsonl`` and
the replica's weights to ``--out/stage0_replica<R>.pt`` (on its own machine's disk).

Each machine's host name must resolve, on that machine, to a routable address (the
``--network-interface``'s): Horovod 0.28.1 binds its process-set gloo context to the host
name's address, not to the interface. A host name that resolves to loopback (Debian's
``127.0.1.1 host`` line) would leave the other machines' ranks unable to connect; the
worker refuses to start then, with one line saying what to change.

``--timeout`` also becomes ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (Horovod's gloo context: its
rendezvous and every collective), so a cut link ends each rank's all-reduce with an error
after that long instead of a hang; a rank that fails exits 1 with a one-line cause (also in
``--out/rank<R>.error``), and horovodrun then terminates the other ranks and exits
non-zero. Horovod raises only "Horovod has been shut down" in Python; the cause (a gloo
timeout, a connection reset) is a line its C++ core writes to stderr, so the worker keeps
an eye on its own stderr (``HorovodErrorTail``) and puts that line in the failure summary.
``HOROVOD_AUTOTUNE=0`` as in the single-machine launcher.
"""

from __future__ import annotations

import atexit
import ipaddress
import math
import os
import socket
import threading
from pathlib import Path

from baselines.horovod import HOROVOD_ENV, HorovodExecutor
from pipedream_impl.runtime.contract import SystemSettings, WorkerSpec
from pipedream_impl.runtime.torchrun_worker import (
    FileSink,
    run_scripted,
    run_settings,
    scripted_parser,
)

__all__ = ["EXECUTOR", "HorovodErrorTail", "HorovodSink", "check_host_name", "main"]

EXECUTOR = f"{HorovodExecutor.__module__}:{HorovodExecutor.__qualname__}"
MARKER = b"background loop uncaught exception: "  # Horovod's C++ log line with the cause


class HorovodErrorTail:
    """Copies this process's stderr (file descriptor 2, where Horovod's C++ core logs)
    through, remembering the cause of the last background-loop failure."""

    def __init__(self) -> None:
        self.cause: str | None = None
        self.seen = threading.Event()
        self._stderr = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._pump = threading.Thread(target=self._copy, args=(read,), daemon=True)
        self._pump.start()
        atexit.register(self.close)

    def _copy(self, read: int) -> None:
        pending, forward = b"", True
        while chunk := os.read(read, 65536):
            if forward:
                try:
                    os.write(self._stderr, chunk)
                except OSError:  # stderr leads nowhere now (a dropped ssh session)
                    forward = False
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if MARKER in line:
                    self.cause = line.split(MARKER, 1)[1].decode(errors="replace").strip()
                    self.seen.set()
        os.close(read)

    def close(self) -> None:
        """Give stderr back and copy what is still in the pipe (at exit)."""
        os.dup2(self._stderr, 2)  # drops the pipe's last write end: the pump reads EOF
        self._pump.join(timeout=2.0)


class HorovodSink(FileSink):
    """``FileSink`` whose error summary names Horovod's own cause (``HorovodErrorTail``)."""

    def __init__(self, out: Path, rank: int, tail: HorovodErrorTail) -> None:
        super().__init__(out, rank)
        self.tail = tail

    def put(self, message: tuple) -> None:
        kind, rank, payload = message
        if kind == "error" and "Horovod has been shut down" in payload:
            self.tail.seen.wait(2.0)  # the C++ line precedes the Python error
            if self.tail.cause:
                payload = f"{payload}\nHorovod background loop: {self.tail.cause}"
        super().put((kind, rank, payload))


def _layers(workload: str, scale: str, data: str | None, seed: int) -> int:
    """How many layers the workload's model has (the one stage every replica holds)."""
    from workloads import registry
    from workloads.recipe import load_splits

    wl = registry.get(workload)
    meta = load_splits(wl, scale, data, seed).train.meta
    return len(wl.build(scale, {**meta, "init_seed": seed}))


def check_host_name() -> None:
    """Refuse a multi-machine run whose host name resolves to loopback (module doc)."""
    if int(os.environ.get("HOROVOD_CROSS_SIZE", "1")) <= 1:
        return  # every rank on this machine: loopback is fine
    name = socket.gethostname()
    iface = os.environ.get("HOROVOD_GLOO_IFACE", "horovodrun's --network-interface")
    try:
        addr = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        raise SystemExit(f"host name {name!r} does not resolve on this machine: map it to "
                         f"the address of {iface} in /etc/hosts") from None
    if ipaddress.ip_address(addr).is_loopback:
        raise SystemExit(f"host name {name!r} resolves to {addr} on this machine, but Horovod "
                         "binds its process-set gloo context to that address and the other "
                         f"machines cannot reach it: map {name!r} to the address of {iface} "
                         "in /etc/hosts")


def main(argv: list[str] | None = None) -> None:
    a = scripted_parser(__doc__.split("\n\n")[0], out="horovod-run").parse_args(argv)
    # read by Horovod's C++ core at init: set before hvd.init()
    os.environ.update(HOROVOD_ENV)
    os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, math.ceil(a.timeout)))
    check_host_name()
    tail = HorovodErrorTail()
    import horovod.torch as hvd

    hvd.init()
    run = run_settings(a)
    world = hvd.size()
    if run.batch_size % world:
        raise SystemExit(f"the global minibatch ({run.batch_size}) must divide by the "
                         f"{world} ranks horovodrun started: give --batch-size")
    system = SystemSettings(replicas=(world,),
                            bounds=((0, _layers(a.workload, a.scale, a.data, a.seed)),),
                            executor=EXECUTOR, microbatches=world)
    spec = WorkerSpec(hvd.rank(), run, system, local_rank=hvd.local_rank())
    run_scripted(spec, a, HorovodSink(Path(a.out), spec.rank, tail))


if __name__ == "__main__":
    main()
