"""``--system ddp``: torch DistributedDataParallel, the second data-parallel reference.

Runs inside the same worker processes and launcher as the pipeline systems (one "stage"
with W replicas, so the launcher code is shared): every rank holds the whole model, takes
its 1/W slice of each global minibatch (the same minibatches, in the same order, as every
other system), and DDP averages the gradients; clipping, when a workload asks for it, sees
the averaged gradients, as in one process. Bytes come from a DDP communication hook: for
each gradient bucket it reduces, a rank sends 2 (W-1)/W x the bucket's bytes (ring).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipedream_impl.runtime import EpochReport, WorkerSpec
from pipedream_impl.schedule import Layout
from workloads import registry
from workloads.recipe import (
    epoch_order,
    load_splits,
    make_optimizer,
    microbatch,
    peak_memory_bytes,
)


class DDPExecutor:
    def __init__(self, spec: WorkerSpec, layout: Layout, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.world = layout.workers
        self.wl = registry.get(spec.workload)
        self.scale_spec = self.wl.spec(spec.scale)
        self.splits = load_splits(self.wl, spec.scale, spec.data, spec.seed)
        model = self.wl.build(spec.scale, {**self.splits.train.meta, "init_seed": spec.seed})
        self.model = model.to(device).train()
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.sent = 0
        self.ddp.register_comm_hook(None, self._hook)
        self.optimizer = make_optimizer(self.scale_spec, self.ddp.parameters(), spec.lr)
        n = len(self.splits.train) // spec.batch_size
        self.n_steps = n if spec.max_steps is None else min(n, spec.max_steps)

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
        buf = bucket.buffer()
        self.sent += int(2 * (self.world - 1) / self.world * buf.numel() * buf.element_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(self.world))

    def run_epoch(self, epoch: int) -> EpochReport:
        rank = self.spec.rank
        order = epoch_order(len(self.splits.train), self.spec.seed, epoch)
        report = EpochReport(rank, 0, rank)
        torch.manual_seed(self.spec.seed * 7919 + epoch * 131 + rank)
        for k in range(self.n_steps):
            if self.spec.fail_at is not None and self.spec.fail_at == (rank, k):
                raise RuntimeError(f"injected failure at minibatch {k}")
            t0 = time.perf_counter()
            b = microbatch(self.splits.train, self.wl, order, k, rank, self.spec.batch_size,
                           self.world).to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.wl.loss(self.ddp(b.inputs), b.targets)
            loss.backward()  # DDP all-reduces (averages) the gradients here
            if self.scale_spec.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), self.scale_spec.grad_clip)
            self.optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            report.busy_s += time.perf_counter() - t0
            report.losses.append(float(loss.detach()))
            if k == min(self.n_steps, 2) - 1:
                report.warm_done_at = time.time()
        report.end_at = time.time()
        report.allreduce_bytes = self.sent
        report.peak_memory = peak_memory_bytes(self.device)
        report.state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return report
