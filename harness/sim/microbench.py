"""Microbenchmarks of this machine's gloo transport, for the simulator's validation.

Each measurement runs W real processes in a gloo group (``_bench``), optionally with the
cores kept busy by spinning processes (a loaded machine, as when every worker computes):
the plain ping-pong's latency and bandwidth (``measure_link``), the all-reduce among W of
a model's gradient buckets one after another, at their own sizes (``measure_allreduce``:
gloo's time is far from linear in the bytes between 4 B and 4 MiB, so a line through two
sizes misplaces a bucket's; with its CPU time, which is what it takes from cores the
workers share), and each stage's typical message
sent through the runtime's own ``Comm`` (``measure_transfers``: one-way time and the
sender's own time in the send call).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["link_rate", "measure_allreduce", "measure_link", "measure_transfers"]


def _bench_worker(rank: int, world: int, port: int, out, fn, args) -> None:  # noqa: ANN001
    """One process of a microbenchmark: a gloo group of ``world``, then ``fn``; rank 0
    puts what ``fn`` returns on ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        result = fn(rank, *args)
        if rank == 0:
            out.put(result)
    finally:
        dist.destroy_process_group()


def _bench(fn, world: int, args: tuple, load: int = 0):  # noqa: ANN001, ANN202
    """Run ``fn(rank, *args)`` in ``world`` processes (``processes``) joined by gloo, with
    ``load`` other processes computing meanwhile; returns rank 0's result. A process that dies is
    an error at once, not a timeout."""
    import queue

    from pipedream_impl.runtime import processes
    from pipedream_impl.runtime.launcher import free_port

    ctx = processes.context()
    out = ctx.Queue()
    port = free_port()
    procs = [processes.process(ctx, _bench_worker, (r, world, port, out, fn, args))
             for r in range(world)]
    with _busy_cores(ctx, load):
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    result = out.get(timeout=1.0)
                    break
                except queue.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(f"microbenchmark {fn.__name__} failed (exit codes "
                                           f"{[p.exitcode for p in procs]})") from None
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    return result


def _pingpong(rank: int, sizes: list[int], reps: int) -> dict[int, float]:
    """One-way time of each message size: the median over ``reps`` round trips (halved)
    after two warm-up ones; the median, because a loaded machine adds rare long stalls."""
    import torch.distributed as dist

    times = {}
    for n in sizes:
        t = torch.zeros(max(1, n // 4))
        laps = []
        for rep in range(reps + 2):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            if rep >= 2:
                laps.append((time.perf_counter() - t0) / 2)
        times[n] = statistics.median(laps)
    return times


def measure_link(reps: int = 50) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of gloo between two local processes: a 4-byte and a
    4 MiB message's one-way times; the bandwidth is the large message's size over its time
    beyond the latency, or over its whole time where noise leaves less than half of it
    (never an absurd rate from a difference of two noisy numbers)."""
    sizes = [4, 4 << 20]
    times = _bench(_pingpong, 2, (sizes, reps))
    return times[sizes[0]], link_rate(times[sizes[0]], times[sizes[1]], sizes[1])


def link_rate(latency: float, big: float, nbytes: int) -> float:
    """Bytes/s from a small message's one-way time and a large one's (``nbytes``)."""
    return nbytes / (big - latency if big - latency > big / 2 else big)


def _allreduce_bench(rank: int, sizes: tuple[int, ...], reps: int) -> tuple[float, float]:
    import torch.distributed as dist

    buckets = [torch.ones(max(1, n // 4)) for n in sizes]
    times, cpu = [], []
    for rep in range(reps + 3):  # three to warm up
        dist.barrier()  # every rank starts the buckets together, as after a backward
        t0, c0 = time.perf_counter(), time.process_time()
        for t in buckets:
            dist.all_reduce(t)
        if rep >= 3:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def measure_allreduce(world: int, sizes: tuple[int, ...], reps: int = 20, load: int = 0) \
        -> tuple[float, float]:
    """(seconds, CPU seconds of one rank) to all-reduce buckets of these byte sizes one
    after another among ``world`` local processes with gloo (medians over ``reps``, each
    started together after a barrier; the CPU time is rank 0's, all its threads, gloo's
    included); ``load``: that many other processes computing meanwhile. With more ranks
    than cores the two part: an all-reduce among 4 ranks on 2 cores here takes several
    times its CPU time, its ranks waiting off core for each other's turns."""
    return _bench(_allreduce_bench, world, (tuple(sizes), reps), load)


def _transfer_bench(rank: int, messages: list, static: bool, reps: int) \
        -> list[tuple[float, float]]:
    from pipedream_impl.runtime.comm import Comm

    peer = 1 - rank
    times = []
    for kind, shapes in messages:  # a fresh Comm each: its own shape header state
        comm = Comm(rank, torch.device("cpu"), 60.0, static)
        tensors = tuple(torch.ones(shape, dtype=dtype) for dtype, shape in shapes)
        trips, in_send = [], []
        for rep in range(reps + 3):
            t0 = time.perf_counter()
            if rank == 0:
                comm.send(tensors, peer, kind)
                t1 = time.perf_counter()
                comm.recv(peer, kind)
            else:
                comm.send(comm.recv(peer, kind), peer, kind)
                t1 = t0
            if rep >= 3:
                trips.append(time.perf_counter() - t0)
                in_send.append(t1 - t0)
        comm.flush()
        # medians: (one way, the sender's own time in the send call)
        times.append((statistics.median(trips) / 2, statistics.median(in_send)))
    return times


def _spin(stop) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    x = torch.randn(128, 128)
    while not stop.is_set():
        x @ x


@contextmanager
def _busy_cores(ctx, n: int) -> Iterator[None]:  # noqa: ANN001
    """``n`` processes computing (one thread each) for the duration of the block."""
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=60)


def measure_transfers(messages: dict[tuple[int, str], list[tuple]], static: bool,
                      reps: int = 30, load: int = 0) \
        -> dict[tuple[int, str], tuple[float, float]]:
    """One-way seconds of each message through the runtime's ``Comm`` (gloo, shape header
    as the workload uses it) between two local processes: a ping-pong of the real
    tensors' shapes and dtypes; ``load``: that many other processes computing meanwhile
    (the cores as busy as in a run where every worker computes). Values: (one-way
    seconds, seconds the sender spends in the send call itself)."""
    if not messages:
        return {}
    keys = sorted(messages)
    args = [(kind, messages[(stage, kind)]) for stage, kind in keys]
    return dict(zip(keys, _bench(_transfer_bench, 2, (args, static, reps), load), strict=True))
