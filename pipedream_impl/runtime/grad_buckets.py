"""A replicated stage's gradient all-reduce, overlapped with the backward that finishes them.

DistributedDataParallel's idea for our executor: the parameters are split into buckets of
about ``BUCKET_MB`` megabytes in reverse order (the backward produces the last layers'
gradients first), and during the backward that completes an update round's gradients (the
last B or W before the round's A on that rank) a hook on each leaf the backward
accumulates into (``Tensor.register_post_accumulate_grad_hook``) writes that parameter's
final gradient into its bucket; a full bucket's all-reduce starts at once
(``Comm.allreduce_start``), buckets in order on every replica. The A action then only
starts what is left (a parameter the backward did not reach), waits for every bucket,
divides by the replica count and copies the mean back into the gathered gradients.

What is reduced is exactly what the executor's ``gather_grads`` sums at A: the executor
gives ``arm`` a function that computes one parameter's gathered gradient from the state
after the backward (the snapshots' and the module's gradients, added in the order
``gather_grads`` adds them), so the result is the blocking path's to the bit wherever the
all-reduce's own sum is (two replicas; integer-valued gradients). Bytes are counted once
per all-reduce at A, for the whole gradient, as the blocking path counts them.

``PIPEBENCH_ALLREDUCE_BUCKET_MB`` overrides the bucket size; ``0`` turns the overlap off (the
blocking all-reduce at A: the tests' reference).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from pipedream_impl.runtime.comm import Comm
from pipedream_impl.schedule.actions import GRADIENT_DONE, Action

__all__ = ["BUCKET_MB", "BUCKET_MB_ENV", "GradBuckets", "bucket_mb", "last_backwards",
           "plan_buckets"]

BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
BUCKET_MB_ENV = "PIPEBENCH_ALLREDUCE_BUCKET_MB"


def bucket_mb() -> float:
    """The bucket size in MB: ``PIPEBENCH_ALLREDUCE_BUCKET_MB`` if set, else ``BUCKET_MB``;
    0 turns the overlapped all-reduce off."""
    raw = os.environ.get(BUCKET_MB_ENV, "")
    try:
        mb = float(raw) if raw else BUCKET_MB
    except ValueError:
        raise ValueError(f"{BUCKET_MB_ENV}={raw!r}: give a number of megabytes "
                         "(0 turns the overlapped all-reduce off)") from None
    if mb < 0:
        raise ValueError(f"{BUCKET_MB_ENV}={raw!r}: give 0 or more megabytes")
    return mb


def plan_buckets(nbytes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """Parameter indices per bucket: reverse order, each bucket filled until it reaches
    ``cap_bytes`` or more (a bucket closes once it holds the cap: a large parameter ends
    the bucket it joins, and the next parameter opens a new one)."""
    out: list[list[int]] = []
    size = 0.0
    for i in range(len(nbytes) - 1, -1, -1):
        if not out or size >= cap_bytes:
            out.append([])
            size = 0.0
        out[-1].append(i)
        size += nbytes[i]
    return out


class GradBuckets:
    """The buckets of one replicated stage's parameters and their all-reduces in flight."""

    def __init__(self, comm: Comm, ranks: tuple[int, ...], params: Sequence[Tensor],
                 cap_mb: float) -> None:
        self.comm, self.ranks = comm, ranks
        self.numel = [p.numel() for p in params]
        sizes = [p.numel() * p.element_size() for p in params]
        self.buckets = plan_buckets(sizes, cap_mb * 2**20)
        self.where: dict[int, tuple[int, int]] = {}  # parameter -> (bucket, offset)
        for b, idx in enumerate(self.buckets):
            off = 0
            for i in idx:
                self.where[i] = (b, off)
                off += self.numel[i]
        self.dtype, self.device = params[0].dtype, params[0].device
        self.started_early = 0  # buckets started during a backward (for the tests)
        self._reset()

    def _reset(self) -> None:
        self.flats: list[Tensor] | None = None
        self.missing: list[set[int]] = [set(idx) for idx in self.buckets]
        self.waits: list[Callable[[], None]] = []  # of buckets 0 .. len(waits) - 1
        self.handles: list = []

    @property
    def armed(self) -> bool:
        return self.flats is not None

    def arm(self, leaves: Sequence[Tensor], value: Callable[[int], Tensor]) -> None:
        """Before the round's last backward: hook ``leaves`` (one per parameter, in the
        parameters' order); when leaf i's gradient is accumulated, ``value(i)`` (the
        parameter's gathered gradient) goes into its bucket."""
        self.flats = [torch.empty(sum(self.numel[i] for i in idx), dtype=self.dtype,
                                  device=self.device) for idx in self.buckets]
        for i, leaf in enumerate(leaves):
            if leaf.requires_grad:
                self.handles.append(leaf.register_post_accumulate_grad_hook(
                    lambda _t, i=i: self._ready(i, value(i), early=True)))

    def disarm(self) -> None:
        """After that backward: remove the hooks (the buckets stay in flight)."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _ready(self, i: int, grad: Tensor, early: bool = False) -> None:
        b, off = self.where[i]
        if i not in self.missing[b]:
            return
        self.flats[b][off:off + self.numel[i]].copy_(grad.reshape(-1))
        self.missing[b].discard(i)
        while len(self.waits) < len(self.buckets) and not self.missing[len(self.waits)]:
            self.waits.append(self.comm.allreduce_start(self.flats[len(self.waits)],
                                                        self.ranks))
            self.started_early += early

    def finish(self, grads: list[Tensor]) -> None:
        """At A: start what the backward left, wait for every bucket, write the mean into
        ``grads`` (the gathered gradients, the parameters' order) and count the bytes."""
        for b in range(len(self.buckets)):
            for i in sorted(self.missing[b]):
                self._ready(i, grads[i])
        for wait in self.waits:
            wait()
        n = len(self.ranks)
        for flat, idx in zip(self.flats, self.buckets, strict=True):
            flat /= n
            off = 0
            for i in idx:
                grads[i].copy_(flat[off:off + self.numel[i]].view_as(grads[i]))
                off += self.numel[i]
        nbytes = sum(self.numel) * torch.empty((), dtype=self.dtype).element_size()
        self.comm.count_allreduce(nbytes, self.ranks)
        self._reset()


def last_backwards(acts: tuple[Action, ...]) -> set[int]:
    """Positions of the last B or W before each all-reduce: the backwards that finish an
    update round's gradients, during which the buckets' all-reduces start."""
    out, last = set(), None
    for pos, a in enumerate(acts):
        if a.kind in GRADIENT_DONE:
            last = pos
        elif a.kind == "A" and last is not None:
            out.add(last)
            last = None
    return out
