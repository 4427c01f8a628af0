"""``--system ddp``: torch DistributedDataParallel, the second data-parallel reference.

Runs inside the same worker processes and launcher as the pipeline systems (one "stage"
with W replicas, so the launcher code is shared): every rank holds the whole model, takes
its 1/W slice of each global minibatch (the same minibatches, in the same order, as every
other system), and DDP averages the gradients; clipping, when a workload asks for it, sees
the averaged gradients, as in one process. Bytes come from a DDP communication hook: for
each gradient bucket it reduces, a rank sends 2 (W-1)/W x the bucket's bytes (ring).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from baselines.data_parallel import DataParallelExecutor

__all__ = ["DDPExecutor"]


class DDPExecutor(DataParallelExecutor):
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
