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
(``isend``); their handles are completed lazily and at ``flush``.

Backends: NCCL when the tensors live on a GPU (chosen by the runtime), else gloo.
"""

from __future__ import annotations

import datetime
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from core.collectives import ring_allreduce_bytes

__all__ = ["Comm", "CommTimeout", "HEADER", "LinkStats", "TAGS"]

HEADER = 64  # int64 slots: enough for 8 tensors of up to 5 dimensions
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.bool, torch.uint8]
TAGS = {"F": 1, "B": 2}


class CommTimeout(RuntimeError):
    pass


@dataclass
class LinkStats:
    payload: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    header: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    allreduce: int = 0  # bytes this rank sends in ring all-reduces (2 (r-1)/r per byte)
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


class Comm:
    def __init__(self, rank: int, device: torch.device, timeout_s: float,
                 static_shapes: bool = False) -> None:
        self.rank, self.device = rank, device
        self.static_shapes = static_shapes
        self._sent_shapes: dict[tuple[int, int], list] = {}
        self._recv_shapes: dict[tuple[int, int], list] = {}
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.stats = LinkStats()
        self._pending: list[dist.Work] = []
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

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
        if known is None:
            h = _header(tensors)
            self._pending.append(dist.isend(h.to(self._wire_device()), dst, tag=tag))
            self.stats.header[(self.rank, dst)] += h.numel() * h.element_size()
            self._sent_shapes[(dst, tag)] = shapes
        elif known != shapes:
            raise ValueError(f"rank {self.rank}: static_shapes, but a {kind} message to rank "
                             f"{dst} changed shapes from {known} to {shapes}")
        for t in tensors:
            self._pending.append(dist.isend(t.detach().contiguous(), dst, tag=tag))
            self.stats.payload[(self.rank, dst)] += t.numel() * t.element_size()
        self._pending = [w for w in self._pending if not w.is_completed()]

    def recv(self, src: int, kind: str) -> tuple[Tensor, ...]:
        tag = TAGS[kind]
        shapes = self._recv_shapes.get((src, tag)) if self.static_shapes else None
        if shapes is None:
            h = torch.zeros(HEADER, dtype=torch.int64, device=self._wire_device())
            self._wait(dist.irecv(h, src, tag=tag),
                       f"receive of a {kind} header from rank {src}")
            shapes = self._recv_shapes[(src, tag)] = _shapes(h.cpu())
        out = []
        for dtype, shape in shapes:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            self._wait(dist.irecv(t, src, tag=tag), f"receive of a {kind} tensor from {src}")
            out.append(t)
        return tuple(out)

    def group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        """Every rank must create every group in the same order (runtime does, at start)."""
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(list(ranks))
        return self._groups[ranks]

    def allreduce_mean(self, tensors: list[Tensor], ranks: tuple[int, ...]) -> None:
        if len(ranks) < 2:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        work = dist.all_reduce(flat, group=self.group(ranks), async_op=True)
        self._wait(work, f"all-reduce among ranks {ranks}")
        flat /= len(ranks)
        n = len(ranks)
        self.stats.allreduce += int(ring_allreduce_bytes(flat.numel() * flat.element_size(), n))
        pos = 0
        for t in tensors:
            t.copy_(flat[pos:pos + t.numel()].view_as(t))
            pos += t.numel()

    def flush(self) -> None:
        for w in self._pending:
            self._wait(w, "a send")
        self._pending = []

    def _wire_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")
