"""The torch.distributed.pipelining peers on our stage boundaries, one executor for all:
``ScheduleGPipe`` and ``Schedule1F1B`` (one stage per rank), ``ScheduleInterleaved1F1B``
and ``ScheduleInterleavedZeroBubble`` (v stages per rank, looped: rank r holds stages r,
r + W, r + 2W, ...) and ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` (two stages per
rank, V-shaped: rank r holds stages r and 2W - 1 - r, so rank 0 holds the first and the
last stage and computes the loss).

The model is split into W x v stages by the runtime's own balancing (harness layout); the
executor learns v as ``len(bounds) // workers``. Every schedule averages the microbatch
gradients of a minibatch (``scale_grads``) and takes one optimizer step, so each computes
the same update as single-process training on whole minibatches (up to a token-mean loss's
weighting: docs/systems.md); where the workload clips, by the whole model's norm, one
scalar all-reduce over the ranks before the step (``pipedream_impl.runtime.clipping``).

Stage metadata is given to torch up front (static mode: ``PipelineStage(input_args=...,
output_args=...)``, example tensors from one microbatch run through the preceding layers
once at start-up), not inferred at the first step: torch's dynamic inference runs a stage
on uninitialised tensors built from the metadata, which is harmless for activations but
turns token ids (GNMT's source ids, S2VT's captions) into out-of-range indices. With static
metadata int64 tensors cross the split as they are, bytes and values exactly as our
runtime sends them; torch sends a gradient back only for floating inputs.

Idle time: each compute action torch's schedule runs (F, B, I, W: the stage's
``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) and the
optimizer step (U) are timed; the rest of each step (waiting on a neighbour) is idle, so
these peers report a bubble fraction like our runtime's systems.

Bytes: each stage counts what its forward returns (sent to the next stage) and the
floating inputs' gradients (sent back) at its boundary (``peers.EngineStage``); a boundary
between two stages of the same rank (the V's turn) is a local hand-off, not on any link.
"""

from __future__ import annotations

import datetime
import functools

import torch
from torch import Tensor, nn

from baselines.peers import EngineStage, PeerExecutor
from core.errors import UserInputError
from pipedream_impl.runtime.clipping import clip_by, sq_norm, world_sum
from pipedream_impl.runtime.contract import EpochReport, SystemSettings, WorkerPieces, cpu_copy
from pipedream_impl.schedule import registry as schedules
from workloads.recipe import load_optimizer_state

__all__ = ["TORCH_EXECUTOR", "TorchPipeExecutor", "compute_order", "engine_class",
           "boundary_examples", "check_engine_microbatches", "loss_rank", "stage_ranks"]



def engine_class(schedule: str) -> str:
    """The torch.distributed.pipelining class that runs ``schedule`` (its registry entry's
    ``torch_class``)."""
    cls = schedules.get(schedule).torch_class
    if cls is None:
        raise ValueError(f"torch.distributed.pipelining has no class for {schedule!r}")
    return cls
TORCH_EXECUTOR = f"{__name__}:TorchPipeExecutor"  # the registry's executor for these peers


def stage_ranks(workers: int, stages: int, v_shape: bool) -> tuple[int, ...]:
    """The rank holding each of ``stages`` stages on ``workers`` ranks: looped (stage s on
    rank s mod W) or V-shaped (down the ranks, then back up: rank r holds r and 2W-1-r)."""
    if stages % workers:
        raise ValueError(f"{stages} stages do not divide among {workers} ranks")
    if not v_shape:
        return tuple(s % workers for s in range(stages))
    return tuple(s % workers if (s // workers) % 2 == 0 else workers - 1 - s % workers
                 for s in range(stages))


@functools.cache
def compute_order(schedule: str, workers: int, microbatches: int,
                  per_rank: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """One step of torch's schedule for ``schedule``, per rank: its compute actions as
    (kind, stage, microbatch) in the order torch's runtime runs them (``OVERLAP_F_B`` as
    its two parts in turn), read with torch's own schedule visualiser, which builds the
    schedule's ``pipeline_order`` without processes."""
    import torch.distributed.pipelining as pp
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    cls = engine_class(schedule)
    try:
        ops = get_schedule_ops(getattr(pp, cls), workers, microbatches, per_rank)
    except ValueError as e:  # the schedule's own check (e.g. microbatches vs stages)
        raise UserInputError(f"{cls} with {workers} workers and {microbatches} "
                             f"microbatches: {e}") from None
    return tuple(tuple((part.computation_type.value, part.stage_index, part.microbatch_index)
                       for a in row if a is not None for part in a.sub_actions or (a,))
                 for row in ops)


def loss_rank(system: SystemSettings) -> int:
    """The rank that holds the last stage and computes the loss (rank 0 for a V)."""
    workers = len(system.replicas)
    v_shape = schedules.get(system.schedule).v_shaped
    return stage_ranks(workers, len(system.bounds), v_shape)[-1]


def check_engine_microbatches(schedule: str, workers: int, stages: int,
                              microbatches: int) -> str | None:
    """What the torch schedule would refuse about this many microbatches (None: fine),
    said before any worker starts."""
    need = schedules.get(schedule).torch_microbatches
    if need == "at-least-stages" and microbatches < stages:
        return (f"{engine_class(schedule)} needs at least as many microbatches as stages "
                f"({stages})")
    if need == "whole-rounds":
        rounds = max(1, microbatches // workers)
        if microbatches % rounds:
            return (f"{engine_class(schedule)} needs the microbatches to be a multiple "
                    f"of max(1, microbatches // workers) = {rounds}")
    return None


def boundary_examples(full: nn.Module, bounds: tuple[tuple[int, int], ...], inputs: tuple,
                      device: torch.device) -> list[tuple]:
    """Each stage boundary's tensors for one microbatch (index s: stage s's inputs, the
    last: the model's outputs), as training sees them: dtypes kept (token ids stay int64),
    a received floating tensor requires grad, an output requires grad where autograd says
    so. ``inputs`` (a microbatch) runs through the model once in eval mode (no dropout, no
    batch-norm statistics touched)."""
    was = full.training
    full.eval()
    out = [tuple(t.to(device).contiguous() for t in inputs)]
    with torch.enable_grad():
        for s, (a, b) in enumerate(bounds):
            if s > 0:
                out[-1] = tuple(t.detach().requires_grad_(t.is_floating_point())
                                for t in out[-1])
            y = full.stage(a, b).to(device)(out[-1])
            out.append(tuple(t.contiguous() for t in y))
    full.train(was)
    return [tuple(t.detach().requires_grad_(t.requires_grad) for t in ts) for ts in out]


def _whole_backward(stage: nn.Module):  # noqa: ANN202
    """None (torch splits each backward into an input pass I and a weight pass W, as the
    zero-bubble schedules want), or for a stage with fused recurrent layers an empty W:
    torch 2.14's W pass runs one autograd call per parameter group without keeping the
    graph, and an LSTM's weights share one fused node, so the second group finds it freed.
    Such a stage computes its whole backward at I (gradients exact; the I/W split, and so
    the zero-bubble filling, is lost on that stage only)."""
    if any(isinstance(m, nn.RNNBase) for m in stage.modules()):
        return lambda: (lambda: None)
    return None


def _load_order(schedule, order: tuple) -> None:  # noqa: ANN001 - a torch schedule
    """Give torch's schedule runtime a schedule file's compute order the way torchtitan
    does (``_load_csv``, compute-only: torch lowers it with its messages)."""
    import tempfile

    from pipedream_impl.schedule.torch_csv import write_csv

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/schedule.csv"
        with open(path, "w") as f:
            f.write(write_csv([list(row) for row in order]))
        schedule._load_csv(path, format="compute_only")


class TorchPipeExecutor(PeerExecutor):
    """torch.distributed.pipelining: one PipelineStage per stage this rank holds, and the
    schedule the registry names."""

    device_clock = True  # on a GPU its actions are timed by device events, as ours are

    def __init__(self, pieces: WorkerPieces) -> None:  # noqa: D107 - see the class doc
        self.workers = len(pieces.layout.replicas)
        self.n_model_stages = len(pieces.spec.system.bounds)
        self.kind = pieces.spec.system.schedule
        ranks = stage_ranks(self.workers, self.n_model_stages, schedules.get(self.kind).v_shaped)
        self.stage_rank = ranks
        self.local = [s for s, r in enumerate(ranks) if r == pieces.spec.rank]
        super().__init__(pieces)

    def _build(self, full: nn.Module) -> None:
        import torch.distributed.pipelining as pp

        last = self.n_model_stages - 1
        self.first = 0 in self.local  # this rank feeds the inputs
        self.last = last in self.local  # this rank computes the loss
        self.modules = [self.module] if len(self.local) == 1 else [
            EngineStage(full.stage(*self.system.bounds[s]).to(self.device).train(), True,
                        s == 0, s == last) for s in self.local]
        size = self.run.batch_size // self.m
        sample = self.wl.make_batch(self.splits.train, torch.arange(size)).inputs
        examples = boundary_examples(full, self.system.bounds, sample, self.device)
        stages = [pp.PipelineStage(mod, s, self.n_model_stages, self.device,
                                   input_args=examples[s], output_args=examples[s + 1],
                                   dw_builder=_whole_backward(mod))
                  for s, mod in zip(self.local, self.modules, strict=True)]
        rules = schedules.get(self.kind)
        cls = functools.reduce(getattr, engine_class(self.kind).split("."), pp)
        # scale_grads: gradients averaged over microbatches = the minibatch's mean loss
        one = rules.stages_per_worker == 1 and not rules.from_file  # a single-stage class
        self.schedule = cls(stages[0] if one else stages, self.m, loss_fn=self.loss_fn,
                            scale_grads=True)
        if rules.from_file:  # torch's runtime reads the file and adds the messages itself
            _load_order(self.schedule, self.system.order)
        self.params = [p for mod in self.modules for p in mod.parameters()]
        self.optimizer = self.optimizer_for(self.params)
        self._spans: list[tuple[str, float, float]] = []  # this step's timed actions
        for st in stages:
            self._time(st, "forward_one_chunk", lambda kw: "F")
            self._time(st, "backward_one_chunk",
                       lambda kw: "B" if kw.get("full_backward", True) else "I")
            self._time(st, "backward_weight_one_chunk", lambda kw: "W")

    def _time(self, stage, method: str, kind) -> None:  # noqa: ANN001
        """Wrap ``stage.method`` (what torch's schedules call for each compute action) to
        keep (kind, start, end) of every call: F, B (whole backward), I (input gradient)
        or W (weight gradient)."""
        inner = getattr(stage, method)

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return self.timed(kind(kwargs), lambda: inner(*args, **kwargs), self._keep)

        setattr(stage, method, timed)

    def _keep(self, kind: str, t0: float, t1: float, busy: bool) -> None:
        self._spans.append((kind, t0, t1))

    def _book(self, report: EpochReport, t0: float, t1: float) -> None:
        """The step's compute actions and optimizer step (U) busy, each by its kind; every
        gap between them (waiting for a neighbour's message) idle, as ``wait``. On a GPU
        the actions' device-event spans are read here (the step ends synchronised)."""
        if self.clock is not None:  # device spans, kept inside the step's host-timed bounds
            self._spans += [(kind, min(max(a, t0), t1), min(max(b, t0), t1))
                            for kind, a, b, _ in self.clock.spans()]
        at = t0
        for kind, a, b in sorted(self._spans, key=lambda x: x[1]):
            if a > at:
                self.record(report, "wait", at, a, busy=False)
            self.record(report, kind, a, b)
            at = max(at, b)
        if t1 > at:
            self.record(report, "wait", at, t1, busy=False)
        self._spans = []

    def checkpoint_state(self) -> dict:
        return {"modules": [cpu_copy(m.inner.state_dict()) for m in self.modules],
                "optimizer": cpu_copy(self.optimizer.state_dict())}

    def load_checkpoint(self, state: dict) -> None:
        for mod, st in zip(self.modules, state["modules"], strict=True):
            mod.inner.load_state_dict(st)
        load_optimizer_state(self.optimizer, state["optimizer"])

    def _step(self, k: int) -> list[float]:
        self.optimizer.zero_grad(set_to_none=True)
        kwargs: dict = {"return_outputs": False}
        mbs = self._micro(k, targets_only=not self.first) if (self.first or self.last) \
            else None
        if self.first:
            kwargs["arg_mbs"] = [tuple(b.inputs) for b in mbs]
        losses: list = []
        if self.last:
            kwargs["target_mbs"] = [b.targets for b in mbs]
            kwargs["losses"] = losses
        self.schedule.step(**kwargs)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = self._whole_norm(grads)  # untimed: a wait on the other ranks, booked idle
        self.timed("U", lambda: self._update(grads, norm), self._keep)
        return [float(x.detach()) for x in losses]

    def _whole_norm(self, grads: list[Tensor]) -> Tensor | None:
        """The whole model's gradient norm, ``grads``' squared norm summed over the ranks
        (every torch schedule flushes: ``pipedream_impl.runtime.clipping``); None where
        the workload does not clip."""
        if self.scale_spec.grad_clip is None:
            return None
        return world_sum(sq_norm(grads), self.device, lambda work: work.wait(
            datetime.timedelta(seconds=self.run.timeout_s))).sqrt()

    def _update(self, grads: list[Tensor], norm: Tensor | None) -> None:
        if norm is not None:
            clip_by(grads, norm, self.scale_spec.grad_clip)
        self.optimizer.step()

    def _links(self) -> dict[tuple[int, int], int]:
        """Bytes per (sender, receiver) rank so far: each held stage's boundary tensors,
        forward to the next stage's rank and gradients back to the previous one's."""
        links: dict[tuple[int, int], int] = {}
        for s, mod in zip(self.local, self.modules, strict=True):
            fwd, back = mod.sent(self.done)
            for other, b in ((s + 1, fwd), (s - 1, back)):
                if 0 <= other < self.n_model_stages and self.stage_rank[other] != self.rank:
                    key = (self.rank, self.stage_rank[other])
                    links[key] = links.get(key, 0) + b
        return links

    def close_report(self, report: EpochReport, module: nn.Module) -> EpochReport:
        """The report's weights: every held stage's layers, keyed from the first one's
        start (the trainer loads them at ``bounds[report.stage][0]``; with one stage per
        rank the stage's own state)."""
        report = super().close_report(report, module)
        if len(self.modules) > 1:
            base = self.system.bounds[report.stage][0]
            state = {}
            for s, mod in zip(self.local, self.modules, strict=True):
                shift = self.system.bounds[s][0] - base
                for key, value in mod.inner.state_dict().items():
                    _, idx, rest = key.split(".", 2)
                    state[f"layers.{shift + int(idx)}.{rest}"] = value
            report.state = cpu_copy(state)
        return report
