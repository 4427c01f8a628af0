"""What the two data-parallel baselines (DDP, Horovod) share: one replica of the whole model
per rank, each rank's slice of the same global minibatches, one averaged update per step.

Subclasses wrap the model and optimizer their way (``_wrap``) and may override ``_step``;
everything else (data order, timing, the report the launcher reads) is here once.
"""

from __future__ import annotations

import time

import torch

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


class DataParallelExecutor:
    def __init__(self, spec: WorkerSpec, layout: Layout, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.world = layout.workers
        self.wl = registry.get(spec.workload)
        self.scale_spec = self.wl.spec(spec.scale)
        self.splits = load_splits(self.wl, spec.scale, spec.data, spec.seed)
        model = self.wl.build(spec.scale, {**self.splits.train.meta, "init_seed": spec.seed})
        self.model = model.to(device).train()
        self.sent = 0  # bytes this rank sends in gradient all-reduces (ring formula)
        optimizer = make_optimizer(self.scale_spec, self.model.parameters(), spec.lr)
        self.net, self.optimizer = self._wrap(self.model, optimizer)
        n = len(self.splits.train) // spec.batch_size
        self.n_steps = n if spec.max_steps is None else min(n, spec.max_steps)

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # noqa: ANN202
        raise NotImplementedError

    def ring_bytes(self, tensor: torch.Tensor) -> int:
        """Bytes one rank sends to all-reduce ``tensor`` with a ring: 2 (W-1)/W per byte."""
        return int(2 * (self.world - 1) / self.world * tensor.numel() * tensor.element_size())

    def _step(self, batch) -> float:  # noqa: ANN001
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.wl.loss(self.net(batch.inputs), batch.targets)
        loss.backward()  # gradients averaged over ranks by the wrapper
        if self.scale_spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.scale_spec.grad_clip)
        self.optimizer.step()
        return float(loss.detach())

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
            loss = self._step(b)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            report.busy_s += time.perf_counter() - t0
            report.losses.append(loss)
            if k == min(self.n_steps, 2) - 1:
                report.warm_done_at = time.time()
        report.end_at = time.time()
        report.allreduce_bytes = self.sent
        report.peak_memory = peak_memory_bytes(self.device)
        report.state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return report
