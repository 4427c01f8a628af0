"""Peer pipeline engines on our stage boundaries: ``torch-gpipe`` / ``torch-1f1b``
(``torch.distributed.pipelining`` ScheduleGPipe / Schedule1F1B) and ``deepspeed-pipe``
(DeepSpeed ``PipelineModule`` + ``PipelineEngine``: 1F1B with a flush).

They run inside the shared launcher and worker processes (so data, seed, optimizer,
learning rate, minibatches and microbatches are the same as for our ``gpipe``); each rank
holds the same stage (layers [a, b)) our runtime would give it, wrapped for the engine.
Both engines average the microbatch gradients of a minibatch and take one step, so they
compute the same update as our ``gpipe``.

Measured here: step time (``busy_s`` is the whole step: these engines do not expose their
idle time, so no bubble fraction is reported), losses per microbatch on the last stage,
and bytes: every tensor a stage's forward returns (sent to the next stage) and every
floating input gradient (sent back), counted at the stage's boundary by a wrapper.

Limits, said up front rather than failing inside an engine: both engines carry only
floating-point tensors between stages (activations and their gradients), so a split that
passes integer tensors (GNMT's token ids, S2VT's caption ids at some boundaries) is
rejected by ``check_peer_boundaries`` with a clear message.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from core.errors import WorkloadError
from pipedream_impl.runtime.contract import EpochReport, Executor, WorkerPieces, cpu_copy
from workloads.base import Dataset, Workload
from workloads.recipe import microbatch

__all__ = ["DeepSpeedPipeExecutor", "EngineStage", "TorchPipeExecutor",
           "check_peer_boundaries"]


def _tup(x) -> tuple:  # noqa: ANN001
    return x if isinstance(x, tuple) else (x,)


class EngineStage(nn.Module):
    """Our tuple-in/tuple-out stage as an engine layer; counts the bytes at its boundary.

    ``star``: inputs arrive as positional arguments (torch.distributed.pipelining), else as
    one tensor or tuple (DeepSpeed). A one-tensor output is returned bare.
    """

    def __init__(self, inner: nn.Module, star: bool, first: bool, last: bool) -> None:
        super().__init__()
        self.inner, self.star, self.first, self.last = inner, star, first, last
        self.calls: list[tuple[int, int]] = []  # (bytes sent forward, sent back) per call

    def forward(self, *args):  # noqa: ANN002, ANN201
        inputs = tuple(args) if self.star else _tup(args[0])
        back = 0 if self.first else sum(t.numel() * t.element_size() for t in inputs
                                        if t.is_floating_point() and t.requires_grad)
        out = self.inner(inputs)
        fwd = 0 if self.last else sum(t.numel() * t.element_size() for t in out)
        self.calls.append((fwd, back))
        return out[0] if len(out) == 1 else out

    def sent(self, microbatches: int) -> tuple[int, int]:
        """Bytes of the last ``microbatches`` calls: the training forwards (an engine may
        first run a forward of its own to infer shapes; nothing is sent for it)."""
        real = self.calls[len(self.calls) - microbatches:] if microbatches else []
        return sum(f for f, _ in real), sum(b for _, b in real)


def check_peer_boundaries(system: str, workload: Workload, scale: str,
                          bounds: tuple[tuple[int, int], ...], data: Dataset) -> None:
    """Reject splits whose inter-stage tuples hold non-floating tensors (see module doc).
    ``data``: the run's training split (two of its samples go through the stages)."""
    model = workload.build(scale, {**data.meta, "init_seed": 0})
    x = workload.make_batch(data, torch.arange(min(2, len(data)))).inputs
    with torch.no_grad():
        for s, (a, b) in enumerate(bounds[:-1]):
            x = model.stage(a, b)(x)
            bad = [str(t.dtype) for t in x if not t.is_floating_point()]
            if bad:
                raise WorkloadError(
                    f"{system} cannot run {workload.name} on this split: stage {s} sends "
                    f"{', '.join(bad)} tensors to stage {s + 1}, and the engine carries only "
                    f"floating-point activations between stages. Use --system pipedream or "
                    f"gpipe (our runtime sends any tuple), or a split inside the encoder/"
                    f"decoder where only floating tensors cross.")


class PeerExecutor(Executor):
    """The shared loop; subclasses build the engine (``_build``) and run a step (``_step``)."""

    star = True

    def __init__(self, pieces: WorkerPieces) -> None:
        super().__init__(pieces)
        self.stage, _ = self.layout.stage_of(self.rank)
        self.n_stages = len(self.layout.replicas)
        self.first, self.last = self.stage == 0, self.stage == self.n_stages - 1
        a, b = self.system.bounds[self.stage]
        self.module = EngineStage(pieces.model.stage(a, b).to(self.device).train(), self.star,
                                  self.first, self.last)
        self.n_steps = pieces.steps_per_epoch()
        self.m = self.system.microbatches
        self.done = 0  # microbatches trained so far
        self._build(pieces.model)

    def _build(self, full: nn.Module) -> None:
        raise NotImplementedError

    def _step(self, k: int) -> list[float]:
        raise NotImplementedError

    def loss_fn(self, out, targets):  # noqa: ANN001, ANN201
        return self.wl.loss(_tup(out), targets)

    def _micro(self, k: int) -> list:
        return [microbatch(self.splits.train, self.wl, self.order, k, j, self.run.batch_size,
                           self.m).to(self.device) for j in range(self.m)]

    def run_epoch(self, epoch: int) -> EpochReport:
        report = self.start_epoch(epoch, self.stage, 0)
        for k in range(self.n_steps):
            self.begin_action("F", k)  # the engine's whole step: forward to update
            t0 = time.perf_counter()
            losses = self._step(k)
            self.synchronize()
            self.record(report, "step", t0, time.perf_counter())
            self.progress.leave(f"F{k}")
            if self.last:
                report.losses.extend(losses)
                self.mark_warm(report, k)
        r = self.rank
        self.done += self.n_steps * self.m
        fwd, back = self.module.sent(self.done)
        report.payload = {}
        if not self.last:
            report.payload[(r, r + 1)] = fwd
        if not self.first:
            report.payload[(r, r - 1)] = back
        return self.close_report(report, self.module.inner)


class TorchPipeExecutor(PeerExecutor):
    """torch.distributed.pipelining: PipelineStage + ScheduleGPipe or Schedule1F1B."""

    def _build(self, full: nn.Module) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.pipe_stage = PipelineStage(self.module, self.stage, self.n_stages, self.device)
        cls = ScheduleGPipe if self.system.schedule == "flush" else Schedule1F1B
        # scale_grads: gradients averaged over microbatches = the minibatch's mean loss
        self.schedule = cls(self.pipe_stage, self.m, loss_fn=self.loss_fn, scale_grads=True)
        self.optimizer = self.optimizer_for(self.module.parameters())

    def checkpoint_state(self) -> dict:
        return {"module": cpu_copy(self.module.inner.state_dict()),
                "optimizer": cpu_copy(self.optimizer.state_dict())}

    def load_checkpoint(self, state: dict) -> None:
        self.module.inner.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def _step(self, k: int) -> list[float]:
        self.optimizer.zero_grad(set_to_none=True)
        kwargs: dict = {"return_outputs": False}
        mbs = self._micro(k) if (self.first or self.last) else None
        if self.first:
            kwargs["arg_mbs"] = [tuple(b.inputs) for b in mbs]
        losses: list = []
        if self.last:
            kwargs["target_mbs"] = [b.targets for b in mbs]
            kwargs["losses"] = losses
        self.schedule.step(**kwargs)
        if self.scale_spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.scale_spec.grad_clip)
        self.optimizer.step()
        return [float(x.detach()) for x in losses]


class DeepSpeedPipeExecutor(PeerExecutor):
    """DeepSpeed PipelineModule (one layer per stage: our boundaries) + PipelineEngine."""

    star = False

    def _build(self, full: nn.Module) -> None:
        if self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        host, port = self.spec.init_method.removeprefix("tcp://").rsplit(":", 1)
        os.environ.update(RANK=str(self.rank), LOCAL_RANK=str(self.spec.local_rank),
                          WORLD_SIZE=str(self.layout.workers), MASTER_ADDR=host,
                          MASTER_PORT=port)  # DeepSpeed reads these; the group exists
        import deepspeed
        from deepspeed.pipe import PipelineModule

        deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda"
                                   else "gloo")
        layers = []
        for s, (a, b) in enumerate(self.system.bounds):  # one layer per stage, uniform split
            layers.append(self.module if s == self.stage else
                          EngineStage(full.stage(a, b), False, s == 0,
                                      s == self.n_stages - 1))
        pipe = PipelineModule(layers=layers, num_stages=self.n_stages, loss_fn=self.loss_fn,
                              partition_method="uniform", activation_checkpoint_interval=0)
        optimizer = self.optimizer_for(self.module.parameters())
        config = {"train_batch_size": self.run.batch_size,
                  "train_micro_batch_size_per_gpu": self.run.batch_size // self.m,
                  "gradient_accumulation_steps": self.m, "steps_per_print": 1 << 30,
                  "gradient_clipping": self.scale_spec.grad_clip or 0.0,
                  "pipeline": {"activation_checkpoint_interval": 0}}
        self.engine, _, _, _ = deepspeed.initialize(model=pipe, optimizer=optimizer,
                                                    model_parameters=None, config=config)

    def _step(self, k: int) -> list[float]:
        mbs = self._micro(k) if (self.first or self.last) else [None] * self.m
        it = iter([(_ds_in(b.inputs), b.targets) if b is not None else None for b in mbs])
        loss = self.engine.train_batch(data_iter=it)  # mean over the microbatches
        return [float(loss)] * self.m  # one entry per microbatch, as the launcher expects


def _ds_in(inputs: tuple):  # noqa: ANN202
    return inputs[0] if len(inputs) == 1 else inputs
