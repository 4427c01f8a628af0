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

from pipedream_impl.runtime import EpochReport, WorkerSpec
from pipedream_impl.schedule import Layout
from workloads import registry
from workloads.base import Dataset, Workload, WorkloadError
from workloads.recipe import (
    epoch_order,
    load_splits,
    make_optimizer,
    microbatch,
    peak_memory_bytes,
)

PEERS = ("torch-gpipe", "torch-1f1b", "deepspeed-pipe")


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


class PeerExecutor:
    """The shared loop; subclasses build the engine (``_build``) and run a step (``_step``)."""

    star = True

    def __init__(self, spec: WorkerSpec, layout: Layout, device: torch.device) -> None:
        self.spec, self.layout, self.device = spec, layout, device
        self.stage, _ = layout.stage_of(spec.rank)
        self.n_stages = len(layout.replicas)
        self.first, self.last = self.stage == 0, self.stage == self.n_stages - 1
        self.wl = registry.get(spec.workload)
        self.scale_spec = self.wl.spec(spec.scale)
        self.splits = load_splits(self.wl, spec.scale, spec.data, spec.seed)
        full = self.wl.build(spec.scale, {**self.splits.train.meta, "init_seed": spec.seed})
        a, b = spec.bounds[self.stage]
        self.module = EngineStage(full.stage(a, b).to(device).train(), self.star, self.first,
                                  self.last)
        n = len(self.splits.train) // spec.batch_size
        self.n_steps = n if spec.max_steps is None else min(n, spec.max_steps)
        self.m = spec.microbatches
        self.done = 0  # microbatches trained so far
        self._build(full)

    def _build(self, full: nn.Module) -> None:
        raise NotImplementedError

    def _step(self, k: int) -> list[float]:
        raise NotImplementedError

    def loss_fn(self, out, targets):  # noqa: ANN001, ANN201
        return self.wl.loss(_tup(out), targets)

    def _micro(self, k: int) -> list:
        return [microbatch(self.splits.train, self.wl, self.order, k, j, self.spec.batch_size,
                           self.m).to(self.device) for j in range(self.m)]

    def run_epoch(self, epoch: int) -> EpochReport:
        self.order = epoch_order(len(self.splits.train), self.spec.seed, epoch)
        report = EpochReport(self.spec.rank, self.stage, 0)
        torch.manual_seed(self.spec.seed * 7919 + epoch * 131 + self.spec.rank)
        for k in range(self.n_steps):
            if self.spec.fail_at is not None and self.spec.fail_at == (self.spec.rank, k):
                raise RuntimeError(f"injected failure at minibatch {k}")
            t0 = time.perf_counter()
            losses = self._step(k)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            report.busy_s += time.perf_counter() - t0
            if self.last:
                report.losses.extend(losses)
                if k == min(self.n_steps, 2) - 1:
                    report.warm_done_at = time.time()
        report.end_at = time.time()
        r = self.spec.rank
        self.done += self.n_steps * self.m
        fwd, back = self.module.sent(self.done)
        report.payload = {}
        if not self.last:
            report.payload[(r, r + 1)] = fwd
        if not self.first:
            report.payload[(r, r - 1)] = back
        report.peak_memory = peak_memory_bytes(self.device)
        report.state = {k: v.detach().cpu().clone()
                        for k, v in self.module.inner.state_dict().items()}
        return report


class TorchPipeExecutor(PeerExecutor):
    """torch.distributed.pipelining: PipelineStage + ScheduleGPipe or Schedule1F1B."""

    def _build(self, full: nn.Module) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.pipe_stage = PipelineStage(self.module, self.stage, self.n_stages, self.device)
        cls = ScheduleGPipe if self.spec.schedule == "gpipe" else Schedule1F1B
        # scale_grads: gradients averaged over microbatches = the minibatch's mean loss
        self.schedule = cls(self.pipe_stage, self.m, loss_fn=self.loss_fn, scale_grads=True)
        self.optimizer = make_optimizer(self.scale_spec, self.module.parameters(),
                                        self.spec.lr)

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
        os.environ.update(RANK=str(self.spec.rank), LOCAL_RANK=str(self.spec.local_rank),
                          WORLD_SIZE=str(self.layout.workers), MASTER_ADDR=host,
                          MASTER_PORT=port)  # DeepSpeed reads these; the group exists
        import deepspeed
        from deepspeed.pipe import PipelineModule

        deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda"
                                   else "gloo")
        layers = []
        for s, (a, b) in enumerate(self.spec.bounds):  # one layer per stage, uniform split
            layers.append(self.module if s == self.stage else
                          EngineStage(full.stage(a, b), False, s == 0,
                                      s == self.n_stages - 1))
        pipe = PipelineModule(layers=layers, num_stages=self.n_stages, loss_fn=self.loss_fn,
                              partition_method="uniform", activation_checkpoint_interval=0)
        optimizer = make_optimizer(self.scale_spec, self.module.parameters(), self.spec.lr)
        config = {"train_batch_size": self.spec.batch_size,
                  "train_micro_batch_size_per_gpu": self.spec.batch_size // self.m,
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
