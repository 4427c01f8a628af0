"""Peer pipeline engines on our stage boundaries: the shared pieces (``EngineStage``, the
``PeerExecutor`` loop) and ``deepspeed-pipe`` (DeepSpeed ``PipelineModule`` +
``PipelineEngine``: 1F1B with a flush); torch.distributed.pipelining's schedules are in
``baselines.torch_peers``.

They run inside the shared launcher and worker processes (so data, seed, optimizer,
learning rate, minibatches and microbatches are the same as for our ``gpipe``); each rank
holds the stage(s) (layers [a, b)) our runtime's balancing gives it, wrapped for the
engine. Every engine averages the microbatch gradients of a minibatch and takes one step,
so it computes the same update as our ``gpipe``.

Measured here: step time (DeepSpeed: ``busy_s`` is the whole step, the engine does not
expose its idle time, so no bubble fraction is reported; torch's schedules: each compute
action and the optimizer step are timed, the rest of the step is idle), losses per
microbatch on the last stage, and bytes: every tensor a stage's forward returns (sent to
the next stage) and every floating input gradient (sent back), counted at the stage's
boundary by a wrapper.

Integer tensors (GNMT's source ids, S2VT's caption ids) cross a split as int64, exactly as
our runtime sends them: DeepSpeed sends every tensor of the tuple with its dtype and a
gradient back only for floating ones; for torch, see ``baselines.torch_peers``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time

from torch import nn

from pipedream_impl.runtime.contract import EpochReport, Executor, WorkerPieces
from workloads.recipe import microbatch

__all__ = ["DeepSpeedPipeExecutor", "EngineStage", "PeerExecutor"]


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
        out = tuple(t.contiguous() for t in self.inner(inputs))  # engines send contiguous
        fwd = 0 if self.last else sum(t.numel() * t.element_size() for t in out)
        self.calls.append((fwd, back))
        return out[0] if len(out) == 1 else out

    def sent(self, microbatches: int) -> tuple[int, int]:
        """Bytes of the last ``microbatches`` calls: the training forwards (an engine may
        first run a forward of its own to infer shapes; nothing is sent for it)."""
        real = self.calls[len(self.calls) - microbatches:] if microbatches else []
        return sum(f for f, _ in real), sum(b for _, b in real)


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

    def _micro(self, k: int, targets_only: bool = False) -> list:
        """Minibatch k's microbatches on the device (``targets_only``: their targets alone,
        for a last stage whose engine takes no inputs there)."""
        return [microbatch(self.splits.train, self.wl, self.order, k, j, self.run.batch_size,
                           self.m, targets_only).to(self.device) for j in range(self.m)]

    def run_epoch(self, epoch: int) -> EpochReport:
        report = self.start_epoch(epoch, self.stage, 0)
        for k in range(self.n_steps):
            self.begin_action("F", k)  # the engine's whole step: forward to update
            t0 = time.perf_counter()
            losses = self._step(k)
            self.synchronize()
            self._book(report, t0, time.perf_counter())
            self.progress.leave(f"F{k}")
            if self.last:
                report.losses.extend(losses)
                self.mark_done(report, k)
        self.done += self.n_steps * self.m
        report.payload = self._links()
        return self.close_report(report, self.module.inner)

    def _book(self, report: EpochReport, t0: float, t1: float) -> None:
        """Book step ``k``'s span: here all of it busy, as ``step`` (an engine that times
        its own actions books them and its idle time instead); a straggler fault on F
        stretches the whole step."""
        self.straggle("F", t0)
        self.record(report, "step", t0, max(t1, time.perf_counter()))

    def _links(self) -> dict[tuple[int, int], int]:
        """Bytes per (sender, receiver) rank so far: forward to the next stage's rank,
        gradients back to the previous one's."""
        r, (fwd, back) = self.rank, self.module.sent(self.done)
        return {**({} if self.last else {(r, r + 1): fwd}),
                **({} if self.first else {(r, r - 1): back})}


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
        # torch warns of a missing CUDA toolkit when DeepSpeed is imported, and DeepSpeed
        # prints its build, seed and topology lines on every worker: noise in a run's
        # output (--quiet included). Imported outside the redirect: DeepSpeed's logger
        # binds its handler to the stdout of import time and keeps warnings and errors.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        import deepspeed  # noqa: F401
        import deepspeed.pipe  # noqa: F401

        with contextlib.redirect_stdout(io.StringIO()):
            self._build_engine(full)

    def _build_engine(self, full: nn.Module) -> None:
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
