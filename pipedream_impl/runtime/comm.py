"""The one small communication layer: tuples of tensors between ranks, counted in bytes.

Every point-to-point message is a tuple of tensors. A fixed-size int64 header goes first
(count, then dtype code, ndim and shape of each tensor), so the receiver allocates exactly
what arrives without knowing the stage's shapes in advance. ``payload`` bytes (the tensors
the schedule says it sends) and ``header`` bytes are counted separately per link.

With ``static_shapes`` (workloads whose minibatches all have one shape), the header goes
only with the first message of each link and direction; later messages are the tensors
alone and the receiver reuses the shapes it learnt (a sender whose shapes change then is
an error, not silent corruption). That halves the messages per microbatch, which matters
for small microbatches (GPipe).

Receives and all-reduces wait with a timeout: a peer that died turns into a
``CommTimeout`` on every worker waiting for it, never a hang. Sends are asynchronous
(``isend``) and kept per peer and kind, in order, until they are waited for. Waiting for a
send whose receive is not posted could deadlock a valid schedule (gloo completes a send
only once its receive is posted), so a send is waited for only where that cannot block:
``settle``, when the schedule shows that the peer has received it
(``pipedream_impl.schedule.delivery``; the executor calls it after such receives), and
``flush`` at the epoch's end for the rest (``PIPEBENCH_SETTLE_SENDS=0``: only there, as
before; a switch for measuring it). Sends NCCL reports complete are also dropped, from the
front of each queue, whenever the number held doubles (gloo's never report completion).

A replicated stage's gradients are averaged by the all-reduce the planner and the
simulator model, hierarchical, one level per machine boundary: ``hosts.Hierarchy`` groups
the replica ranks by host (hosts are exchanged once over the whole world, when the first
replicated stage's groups are made) and says what each level counts.

Receives are posted ahead (``recv(prefetch=)``) for the next message of each link, or the
next ``PIPEBENCH_RECV_AHEAD`` (``0``: none), a switch for measuring them
(``scripts/same_process_ab.py``, ``scripts/env_ab.py``; ``results/recv-ahead-ab-*.md``,
``results/same-process-ab-*.md``, ``results/transport-*-ab-*.md``).

``allreduce_start`` starts one bucket's all-reduce and returns its wait, so a stage can
reduce its gradients while its backward still runs (``grad_buckets``); ``allreduce_mean``
is the blocking form (start, wait, average, copy back).

On gloo, gradients (``B``) travel on connections of their own: a second process group over
the world, made when the ``Comm`` is (every rank makes one, at start). gloo keeps one
connection per pair of ranks per group, with one lock taken by the rank's main thread
(posting a receive, writing a send) and by gloo's transport thread (reading what comes
in); in a 1F1B schedule activations and gradients cross a link in both directions at
once, and on one connection each side's transport thread spun on the lock while the main
thread wrote (``results/transport-spins-vgg16-b4.md``). Measured in the same processes
(``results/backward-link-ab-*.md``). ``PIPEBENCH_OWN_BACKWARD_LINK=0`` shares one
connection, as before; NCCL keeps its own communicators per pair.

Backends: NCCL when the tensors live on a GPU (chosen by the runtime), else gloo.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from pipedream_impl.runtime import switch
from pipedream_impl.runtime.clipping import world_sum
from pipedream_impl.runtime.hosts import Hierarchy, host_name

__all__ = ["BACKWARD_LINK_ENV", "HEADER", "RECV_AHEAD_ENV", "SETTLE_ENV", "TAGS", "Comm",
           "CommTimeout", "LinkStats", "own_backward_link", "recv_ahead", "settle_sends"]

HEADER = 64  # int64 slots: enough for 8 tensors of up to 5 dimensions
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.bool, torch.uint8]
TAGS = {"F": 1, "B": 2, "T": 3}  # T: tied gradients (ties.py)
RECV_AHEAD_ENV = "PIPEBENCH_RECV_AHEAD"  # messages of a link posted ahead ("0": when due)
SETTLE_ENV = "PIPEBENCH_SETTLE_SENDS"  # "0": hold every send until the epoch's end
BACKWARD_LINK_ENV = "PIPEBENCH_OWN_BACKWARD_LINK"  # "0": gradients share the activations' link
_PRUNE_MIN = 64  # pending sends before the first check for completed ones


class CommTimeout(RuntimeError):
    pass


@dataclass
class LinkStats:
    payload: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    header: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    allreduce: int = 0  # bytes this rank sends in all-reduces (the sum over levels)
    allreduce_levels: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: float = 0.0


def _header(tensors: tuple[Tensor, ...]) -> Tensor:
    h = torch.zeros(HEADER, dtype=torch.int64)
    h[0] = len(tensors)
    pos = 1
    for t in tensors:
        fields = [_DTYPES.index(t.dtype), t.dim(), *t.shape]
        if pos + len(fields) > HEADER:
            raise ValueError("too many tensors or dimensions for one message header")
        h[pos:pos + len(fields)] = torch.tensor(fields)
        pos += len(fields)
    return h


def _shapes(h: Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    out, pos = [], 1
    for _ in range(int(h[0])):
        dtype, ndim = _DTYPES[int(h[pos])], int(h[pos + 1])
        out.append((dtype, tuple(int(x) for x in h[pos + 2:pos + 2 + ndim])))
        pos += 2 + ndim
    return out


def recv_ahead() -> int:
    """How many messages of a link may have their receives posted ahead:
    ``PIPEBENCH_RECV_AHEAD``, a count (``1``, the default, also when unset: the next one;
    ``0``: none, each posted when due); anything else is an error, not a silent default."""
    value = os.environ.get(RECV_AHEAD_ENV, "1")
    if not value.isdigit():
        raise ValueError(f"{RECV_AHEAD_ENV}={value!r}: give how many messages of a link to "
                         "post receives for ahead (1: the next, the default; 0: each when "
                         "due)")
    return int(value)


def own_backward_link() -> bool:
    """Whether gradients travel on gloo connections of their own
    (``PIPEBENCH_OWN_BACKWARD_LINK``, ``1`` by default) or share the activations' (``0``)."""
    return switch(BACKWARD_LINK_ENV, "1", "gradients on connections of their own, the "
                  "default", "one connection per pair of ranks for both directions")


def settle_sends() -> bool:
    """Whether sends known delivered are waited for and dropped as soon as the schedule shows
    it (``PIPEBENCH_SETTLE_SENDS``, ``1`` by default) or only at the epoch's end (``0``)."""
    return switch(SETTLE_ENV, "1", "drop each send once the schedule shows it arrived, the "
                  "default", "hold every send until the epoch's end")


class Comm:
    def __init__(self, rank: int, device: torch.device, timeout_s: float,
                 static_shapes: bool = False) -> None:
        self.rank, self.device = rank, device
        self.static_shapes = static_shapes
        self.ahead = recv_ahead()
        self._sent_shapes: dict[tuple[int, int], list] = {}
        self._recv_shapes: dict[tuple[int, int], list] = {}
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.stats = LinkStats()
        # (dst, tag) -> each held message's send handles, in order, and how many of the
        # link's messages this epoch went before them
        self._sent: dict[tuple[int, int], deque[list[dist.Work]]] = defaultdict(deque)
        self._dropped: dict[tuple[int, int], int] = defaultdict(int)
        self._held = 0  # messages in _sent
        self._prune_at = _PRUNE_MIN  # the next count at which completed sends are dropped
        # (src, tag) -> receives posted ahead for the next messages, in order
        # (``recv(prefetch=)``)
        self._posted: dict[tuple[int, int], deque[list]] = defaultdict(deque)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self._hierarchies: dict[tuple[int, ...], Hierarchy] = {}
        self.hosts: list[str] | None = None  # each global rank's host, once exchanged
        self._chain: queue.SimpleQueue | None = None  # hierarchical all-reduces, in order
        # tag -> the group whose connections carry that kind (absent: the world's)
        self._links: dict[int, dist.ProcessGroup] = {}
        if device.type == "cpu" and dist.is_initialized() and own_backward_link():
            self._links[TAGS["B"]] = dist.new_group(list(range(dist.get_world_size())),
                                                    backend="gloo")

    def _link(self, tag: int) -> dict:
        """The point-to-point call's group for a kind: its own where it has one."""
        return {"group": self._links[tag]} if tag in self._links else {}

    def _wait(self, work: dist.Work, what: str) -> None:
        t0 = time.perf_counter()
        try:
            work.wait(self.timeout)
        except RuntimeError as e:
            waited = time.perf_counter() - t0
            if waited < 0.9 * self.timeout.total_seconds():  # the peer went away
                raise CommTimeout(f"rank {self.rank}: {what} failed after {waited:.1f}s "
                                  f"({e})") from e
            raise CommTimeout(f"rank {self.rank}: {what} did not complete within "
                              f"{self.timeout.total_seconds():.0f}s ({e})") from e
        finally:
            self.stats.wait_s += time.perf_counter() - t0

    def send(self, tensors: tuple[Tensor, ...], dst: int, kind: str) -> None:
        tag = TAGS[kind]
        shapes = [(t.dtype, tuple(t.shape)) for t in tensors]
        known = self._sent_shapes.get((dst, tag)) if self.static_shapes else None
        works = []
        if known is None:
            h = _header(tensors)
            works.append(dist.isend(h.to(self._wire_device()), dst, tag=tag,
                                    **self._link(tag)))
            self.stats.header[(self.rank, dst)] += h.numel() * h.element_size()
            self._sent_shapes[(dst, tag)] = shapes
        elif known != shapes:
            raise ValueError(f"rank {self.rank}: static_shapes, but a {kind} message to rank "
                             f"{dst} changed shapes from {known} to {shapes}")
        for t in tensors:
            works.append(dist.isend(t.detach().contiguous(), dst, tag=tag,
                                    **self._link(tag)))
            self.stats.payload[(self.rank, dst)] += t.numel() * t.element_size()
        self._sent[(dst, tag)].append(works)
        self._held += 1
        if self._held >= self._prune_at:
            for link, q in self._sent.items():
                while q and all(w.is_completed() for w in q[0]):
                    q.popleft()
                    self._dropped[link] += 1
                    self._held -= 1
            self._prune_at = max(_PRUNE_MIN, 2 * self._held)

    def settle(self, dst: int, kind: str, count: int) -> None:
        """The first ``count`` messages of ``kind`` sent to ``dst`` this epoch have been
        received there: wait for their sends (at once) and drop them with their tensors."""
        link = (dst, TAGS[kind])
        q = self._sent[link]
        while q and self._dropped[link] < count:
            for w in q.popleft():
                self._wait(w, f"a {kind} send to rank {dst}")
            self._dropped[link] += 1
            self._held -= 1

    def recv(self, src: int, kind: str, prefetch: int = 0) -> tuple[Tensor, ...]:
        """The next message of ``kind`` from ``src``. ``prefetch``: how many more such
        messages follow in this epoch; on gloo with static shapes the receives of up to
        ``PIPEBENCH_RECV_AHEAD`` of them (1 by default) are kept posted, so each moves as
        soon as it is sent, while this rank computes (gloo moves a message only once its
        receive is posted; ``0`` turns this off). Not on NCCL, which matches
        point-to-point messages by order regardless of tags (a posted receive could take
        a tie message)."""
        tag = TAGS[kind]
        posted = self._posted[(src, tag)]
        out = (self._recv_posted(posted.popleft(), src, kind) if posted
               else self._recv_now(src, tag, kind))
        shapes = self._recv_shapes.get((src, tag))
        if shapes is not None and self._wire_device().type == "cpu":
            while len(posted) < min(prefetch, self.ahead):
                posted.append(self._post(src, tag, shapes))
        return out

    def _post(self, src: int, tag: int, shapes: list) -> list[tuple[dist.Work, Tensor]]:
        """A receive posted for every tensor of a message, each with its buffer: all before
        any is waited for (as torch's pipelining batches them; one at a time, each would
        cost its own round trip with the sender)."""
        bufs = [torch.empty(shape, dtype=dtype, device=self.device) for dtype, shape in shapes]
        return [(dist.irecv(t, src, tag=tag, **self._link(tag)), t) for t in bufs]

    def _recv_posted(self, posted: list, src: int, kind: str) -> tuple[Tensor, ...]:
        for work, _ in posted:
            self._wait(work, f"receive of a {kind} tensor from {src}")
        return tuple(t for _, t in posted)

    def _recv_now(self, src: int, tag: int, kind: str) -> tuple[Tensor, ...]:
        shapes = self._recv_shapes.get((src, tag)) if self.static_shapes else None
        if shapes is None:
            h = torch.zeros(HEADER, dtype=torch.int64, device=self._wire_device())
            self._wait(dist.irecv(h, src, tag=tag, **self._link(tag)),
                       f"receive of a {kind} header from rank {src}")
            shapes = _shapes(h.cpu())
            if self.static_shapes:
                self._recv_shapes[(src, tag)] = shapes
        return self._recv_posted(self._post(src, tag, shapes), src, kind)

    def group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        """Every rank must create every group in the same order (runtime does, at start)."""
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(list(ranks))
        return self._groups[ranks]

    def allreduce_groups(self, ranks: tuple[int, ...]) -> Hierarchy:
        """Make the process groups of an all-reduce over ``ranks``. Every rank of the world
        must call this for every replica group, in the same order (the runtime does, at
        start): the first call exchanges the host names over the whole world."""
        if ranks not in self._hierarchies:
            if self.hosts is None:
                names: list = [None] * dist.get_world_size()
                dist.all_gather_object(names, host_name(self.rank))
                self.hosts = names
            h = self._hierarchies[ranks] = Hierarchy.of(ranks, self.hosts)
            for g in h.groups():
                self.group(g)
        return self._hierarchies[ranks]

    def allreduce_mean(self, tensors: list[Tensor], ranks: tuple[int, ...]) -> None:
        """Average ``tensors`` over ``ranks`` in place: reduce inside each host, all-reduce
        among the hosts' leaders, broadcast inside each host (one host: one all-reduce).
        Blocking: ``allreduce_start`` and its wait, as one bucket."""
        if len(ranks) < 2:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.allreduce_start(flat, ranks)()
        flat /= len(ranks)
        self.count_allreduce(flat.numel() * flat.element_size(), ranks)
        pos = 0
        for t in tensors:
            t.copy_(flat[pos:pos + t.numel()].view_as(t))
            pos += t.numel()

    def norm_sum(self, share: Callable[[], Tensor]) -> Tensor:
        """Every rank's scalar ``share()`` summed over the world, blocking (a squared
        gradient norm: ``clipping``); its 8 bytes are not counted."""
        return world_sum(share(), self._wire_device(),
                         lambda work: self._wait(work, "the gradient norm's all-reduce"))

    def allreduce_start(self, flat: Tensor, ranks: tuple[int, ...]) -> Callable[[], None]:
        """Start summing ``flat`` over ``ranks`` in place; returns the wait (it raises
        ``CommTimeout`` for a peer that died). One host: one asynchronous all-reduce. Several:
        the reduce, the leaders' all-reduce and the broadcast run in that order on one
        background thread (each level waits for the one before), so the caller goes on.
        Every rank of ``ranks`` must start its buckets in the same order. Bytes are counted
        apart (``count_allreduce``), so bucketing does not change the totals' rounding."""
        h = self._hierarchies.get(ranks)
        if h is None:  # groups are made collectively, by every rank: never lazily here
            raise RuntimeError(f"no all-reduce groups for ranks {ranks}: call "
                               "Comm.allreduce_groups for every replica group on every rank "
                               "at start, in the same order")
        where = f"all-reduce among ranks {ranks}"
        if len(h.leaders) == 1:
            work = dist.all_reduce(flat, group=self.group(ranks), async_op=True)
            return lambda: self._wait(work, where)
        if self._chain is None:  # a daemon: a worker that fails exits without joining it
            self._chain = queue.SimpleQueue()
            threading.Thread(target=self._chain_loop, name="allreduce-chain",
                             daemon=True).start()
        done: Future = Future()
        self._chain.put((done, flat, h, where))
        return lambda: done.result()

    def _chain_loop(self) -> None:
        """The hierarchical all-reduces, one after another, in the order they started."""
        while True:
            done, flat, h, where = self._chain.get()
            try:
                self._hierarchical(flat, h, where)
                done.set_result(None)
            except BaseException as e:  # noqa: BLE001 - raised again by the waiter
                done.set_exception(e)

    def _hierarchical(self, flat: Tensor, h: Hierarchy, where: str) -> None:
        mine = h.host_of(self.rank)
        if len(mine) > 1:
            self._wait(dist.reduce(flat, dst=mine[0], group=self.group(mine), async_op=True),
                       f"{where}: reduce inside the host")
        if self.rank == mine[0]:
            self._wait(dist.all_reduce(flat, group=self.group(h.leaders), async_op=True),
                       f"{where}: all-reduce among hosts")
        if len(mine) > 1:
            self._wait(dist.broadcast(flat, src=mine[0], group=self.group(mine),
                                      async_op=True), f"{where}: broadcast inside the host")

    def count_allreduce(self, nbytes: int, ranks: tuple[int, ...]) -> None:
        """Book an all-reduce of ``nbytes`` over ``ranks``: what this rank sends per level."""
        for lv, b in self._hierarchies[ranks].bytes_sent(self.rank, nbytes).items():
            self.stats.allreduce_levels[lv] += b
            self.stats.allreduce += b

    def flush(self) -> None:
        """The epoch's end: wait for every send still held; messages count from 0 again."""
        for q in self._sent.values():
            for works in q:
                for w in works:
                    self._wait(w, "a send")
        self._sent.clear()
        self._dropped.clear()
        self._held = 0
        self._prune_at = _PRUNE_MIN

    def _wire_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")
