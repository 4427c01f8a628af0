"""What the two data-parallel baselines (DDP, Horovod) share: one replica of the whole model
per rank, each rank's slice of the same global minibatches, one averaged update per step.

Subclasses wrap the model and optimizer their way (``_wrap``) and may override ``_step``;
everything else (data order, timing, the report the launcher reads) is here once.
"""

from __future__ import annotations

import time

import torch

from core.collectives import ring_allreduce_bytes
from pipedream_impl.runtime import thread_use
from pipedream_impl.runtime.contract import EpochReport, Executor, WorkerPieces, cpu_copy
from workloads.recipe import load_optimizer_state, microbatch

__all__ = ["DataParallelExecutor"]


class DataParallelExecutor(Executor):
    def __init__(self, pieces: WorkerPieces) -> None:
        super().__init__(pieces)
        self.world = self.layout.workers
        self.model = pieces.model.to(self.device).train()
        self.sent = 0  # bytes this rank sends in gradient all-reduces (ring formula)
        self.net, self.optimizer = self._wrap(self.model,
                                             self.optimizer_for(self.model.parameters()))
        self.n_steps = pieces.steps_per_epoch()

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # noqa: ANN202
        raise NotImplementedError

    def ring_bytes(self, tensor: torch.Tensor) -> int:
        """Bytes one rank sends to all-reduce ``tensor`` with a ring."""
        return int(ring_allreduce_bytes(tensor.numel() * tensor.element_size(), self.world))

    def _wait_for_gradients(self) -> None:
        """Block until the averaged gradients are in place (DDP: already, at the end of
        its backward; Horovod: ``synchronize``)."""

    def _update(self) -> None:
        """The optimizer step on averaged gradients (clipped first where the workload
        clips, so clipping sees what one process would)."""
        if self.scale_spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.scale_spec.grad_clip)
        self._optimizer_step()

    def _optimizer_step(self) -> None:
        self.optimizer.step()

    def _step(self, batch, report: EpochReport, k: int) -> float:  # noqa: ANN001
        """Minibatch ``k``, booked as forward (F), backward with the overlapped all-reduces
        (B), the wait for what is still in flight (A) and the update (U), each with what it
        cost this thread (``thread_use``: B's wall time holds the wait for the other ranks'
        gradients, its CPU time does not)."""
        self.begin_action("F", k)
        t0, use0 = time.perf_counter(), thread_use.reading()
        self.optimizer.zero_grad()  # Horovod's takes no arguments (torch's default: to None)
        loss = self.wl.loss(self.net(batch.inputs), batch.targets)
        for kind, work in (("F", None), ("B", loss.backward), ("A", self._wait_for_gradients),
                           ("U", self._update)):
            if work is not None:
                self.begin_action(kind, k, waiting=kind == "A")
                work()
            self.synchronize()
            self.straggle(kind, t0)
            use1 = thread_use.reading()
            t1 = time.perf_counter()
            self.record(report, kind, t0, t1)
            thread_use.add(self.use, kind, use0, use1)
            self.progress.leave(f"{kind}{k}")
            t0 = t1
            use0 = thread_use.reading()  # after t0: CPU time within the wall span
        return float(loss.detach())

    def checkpoint_state(self) -> dict:
        """The replica's weights and optimizer state (every replica holds the same)."""
        return {"model": cpu_copy(self.model.state_dict()),
                "optimizer": cpu_copy(self.optimizer.state_dict())}

    def load_checkpoint(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])

    def run_epoch(self, epoch: int) -> EpochReport:
        report = self.start_epoch(epoch, 0, self.rank)
        for k in range(self.n_steps):
            b = microbatch(self.splits.train, self.wl, self.order, k, self.rank,
                           self.run.batch_size, self.world).to(self.device)
            loss = self._step(b, report, k)
            report.losses.append(loss)
            self.mark_done(report, k)
        report.allreduce_bytes = self.sent
        return self.close_report(report, self.model)
