"""``--system ddp``: torch DistributedDataParallel, the second data-parallel reference.

Runs inside the same worker processes and launcher as the pipeline systems (one "stage"
with W replicas, so the launcher code is shared): every rank holds the whole model, takes
its 1/W slice of each global minibatch (the same minibatches, in the same order, as every
other system), and DDP averages the gradients; clipping, when a workload asks for it, sees
the averaged gradients, as in one process. Bytes come from a DDP communication hook: for
each gradient bucket it reduces, a rank sends 2 (W-1)/W x the bucket's bytes (ring).
``gradient_buckets`` says which buckets those are, so that the simulator's validation can
measure the all-reduce DDP does: its buckets, each at its size.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _DEFAULT_BUCKET_CAP_MB

from baselines.data_parallel import DataParallelExecutor

__all__ = ["DDPExecutor", "gradient_buckets"]


class DDPExecutor(DataParallelExecutor):
    collectives_beside_compute = True  # each bucket's all-reduce, during the backward

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # noqa: ANN202
        ddp = DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        ddp.register_comm_hook(None, self._hook)
        return ddp, optimizer

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
        buf = bucket.buffer()
        self.sent += self.ring_bytes(buf)
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(self.world))


def gradient_buckets(parameters: Iterable[torch.Tensor]) -> tuple[int, ...]:
    """Bytes of each gradient bucket DDP all-reduces per step for a model with these
    parameters (in registration order), as ``DDPExecutor`` wraps it (DDP's default caps),
    in the order they are reduced. From DDP's second step on (its first runs one bucket,
    then it rebuilds them) the buckets follow the order the gradients became ready, under
    a first cap of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` and ``_DEFAULT_BUCKET_CAP_MB``
    after; this takes that order to be the parameters' reversed (a chain of layers) and
    assigns them with DDP's own function. Checked against a real DDP's rebuilt buckets
    (tests/baselines/test_ddp_buckets.py): as many, though a parameter whose gradient is
    ready out of the layers' order (on GNMT-8, a bias) may sit in the neighbouring one."""
    ready = [p for p in reversed(list(parameters)) if p.requires_grad]
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, _DEFAULT_BUCKET_CAP_MB * 1024 * 1024]
    buckets, _ = dist._compute_bucket_assignment_by_size(ready, caps)
    return tuple(sum(ready[i].numel() * ready[i].element_size() for i in b) for b in buckets)
