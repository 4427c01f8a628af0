"""The PipeDream worker: executes its action list of a schedule on a real process.

One executor for every pipeline schedule: it walks ``Schedule.actions[rank]`` and does what
each action says (receive, forward with a weight version, send, backward, all-reduce,
step); it holds no scheduling logic. Communication goes through ``comm.Comm`` (counted
bytes, timeouts); weight versions through ``weight_stash.WeightStore``.

Inputs and targets: only stage 0 reads the inputs of a minibatch; the last stage reads its
targets alone (no inputs gathered or decoded) through the same deterministic sampler
(``workloads.recipe.epoch_order`` with the same seed and epoch), so targets never travel
with the activations.

Weight modes: ``stash`` and ``vertical-sync`` keep the forward's autograd graph (built over
the version's snapshot) until the backward; ``none`` (naive pipelining) runs the forward
with the current weights and, at backward time, recomputes it with the then-current
weights on the stored input, so the gradient mixes versions as naive pipelining does.
A forward with no update before its own backward on that worker (every GPipe forward, the
last stage's in 1F1B) and using the current weights runs on the module itself, without a
snapshot: the weights cannot change under its graph. Gradients accumulate (on snapshots or
the module) until the all-reduce or update reads them, once per update.

A split backward (zero-bubble schedules) runs as I, the gradient of the stage's input
(sent back at once; the graph is kept), and later W, the gradient of the weights: W
traverses the kept graph a second time from the same roots with the weights as its only
inputs, so together they cost more than one whole backward (torch's runtime keeps the
intermediate gradients instead).

A replicated stage all-reduces its gradients (the A action) overlapped with the round's
last backward, bucket by bucket, as DDP does (``grad_buckets``); A waits for the buckets.
Gradient clipping, where a workload asks for it, is by the whole model's norm where every
stage updates at one point (``clipping``; its all-reduce before U is booked as an A), else
by each stage's own. Parameters tied across two stages (AWD-LM's embedding and decoder) are kept
equal by ``ties.TieSync``: its ST/RT actions exchange the tied gradients, its
``before_update`` sets the gradient both copies apply (and clips).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from pipedream_impl.runtime import weight_stash
from pipedream_impl.runtime.clipping import clip_by, clips_globally, sq_norm
from pipedream_impl.runtime.comm import Comm, settle_sends
from pipedream_impl.runtime.contract import EpochReport, Executor, WorkerPieces, cpu_copy
from pipedream_impl.runtime.grad_buckets import GradBuckets, bucket_mb, last_backwards
from pipedream_impl.runtime.stage_lr import set_lr, stage_lr_scale
from pipedream_impl.runtime.ties import TieSync, check_ties
from pipedream_impl.runtime.weight_stash import WeightStore, direct_forwards, future_versions
from pipedream_impl.schedule import Action, Schedule
from pipedream_impl.schedule.delivery import delivered, receives_followed
from pipedream_impl.schedule.registry import build
from workloads.base import Batch, to_device
from workloads.recipe import load_optimizer_state, microbatch

__all__ = ["StageExecutor"]


class StageExecutor(Executor):
    """One stage replica: its module, optimizer, weight versions and the action handlers."""

    device_clock = True  # on a GPU, actions are timed by device events (no wait per action)

    def __init__(self, pieces: WorkerPieces) -> None:
        super().__init__(pieces)
        layout, system = self.layout, self.system
        self.comm = Comm(self.rank, self.device, self.run.timeout_s, self.wl.static_shapes)
        self.settle = settle_sends()  # PIPEBENCH_SETTLE_SENDS
        for s, r in enumerate(layout.replicas):  # every rank creates every group, same order
            if r > 1:
                self.comm.allreduce_groups(tuple(layout.rank(s, i) for i in range(r)))
        self.stage, self.replica = layout.stage_of(self.rank)
        self.last = self.stage == len(layout.replicas) - 1
        ties = check_ties(pieces.model, system.bounds, layout.replicas)
        a, b = system.bounds[self.stage]
        self.module = pieces.model.stage(a, b).to(self.device).train()
        self.params = list(self.module.parameters())
        self.clip = self.scale_spec.grad_clip
        self.ties = TieSync.for_stage(ties, self.stage, layout, self.module, self.clip)
        self.clip_globally = not ties and clips_globally(  # ties clip as ties.py says
            system.schedule, system.in_flight, layout.replicas, self.clip)
        self.optimizer = self.optimizer_for(self.params)
        scale = stage_lr_scale(layout.replicas, self.stage, system.stage_lr)
        self.lrs = [g["lr"] * scale for g in self.optimizer.param_groups]  # stage_lr.py
        set_lr(self.optimizer, self.lrs)
        self.store = WeightStore(self.module, layout.replicas[self.stage],
                                 system.weights == "vertical-sync")
        self.replica_ranks = tuple(layout.rank(self.stage, i)
                                   for i in range(layout.replicas[self.stage]))
        n = pieces.steps_per_epoch()
        mb = bucket_mb()  # overlapped all-reduce (grad_buckets.py); tied stages block at A
        self.buckets = (GradBuckets(self.comm, self.replica_ranks, self.params, mb)
                        if len(self.replica_ranks) > 1 and self.ties is None and mb > 0
                        else None)
        self.n_steps = n - n % math.lcm(*layout.replicas)  # same count on every replica
        self.m = system.microbatches
        self.naive = system.weights == "none" or system.recompute  # no graph kept from F to B
        self.handlers = {"RF": self._recv_forward, "F": self._forward, "SF": self._send_forward,
                         "RB": self._recv_backward, "B": self._backward,
                         "SB": self._send_backward, "A": self._allreduce, "U": self._update,
                         "ST": self._send_tie, "RT": self._recv_tie,
                         "I": self._backward_input, "W": self._backward_weight}

    def schedule(self) -> Schedule:
        if self.ties is not None:  # the same lists plus the tie messages (ties.py)
            return self.ties.schedule(self._base_schedule())
        return self._base_schedule()

    def _base_schedule(self) -> Schedule:
        return build(self.system.schedule, self.layout, self.n_steps, self.m,
                     self.system.weights, self.system.in_flight, self.system.order)

    def run_epoch(self, epoch: int) -> EpochReport:
        acts = self.begin_epoch(epoch)
        for pos, act in enumerate(acts):
            self.step(act, pos)
        return self.finish_epoch()

    def begin_epoch(self, epoch: int) -> tuple[Action, ...]:
        """Set up an epoch; returns this rank's actions (``step`` runs them in order).
        ``run_epoch`` is begin, every step, finish; ``pipedream_impl.runtime.local`` interleaves the
        steps of all ranks in one process with the same calls."""
        sched = self.schedule()
        acts = sched.actions[self.rank]
        self.report = self.start_epoch(epoch, self.stage, self.replica)
        self.losses: list[Tensor] = []  # the last stage's, one per unit, on the device
        self.base = self.store.version  # schedule versions count from the epoch's start
        self.future_f = [self.base + v for v in future_versions(acts)]
        self.direct = direct_forwards(acts)
        self.inflight: dict[int, dict] = {}
        self.grads: list[Tensor] | None = None  # gathered at A/U, summed over microbatches
        self.pending: dict[int, dict] = {}  # snapshots holding not yet gathered gradients
        self.act_bytes_peak = 0
        self.overlap_at = last_backwards(acts) if self.buckets is not None else set()
        self.more_to_come = receives_followed(acts)  # receives that may be posted early
        # after these positions' receives, sends known to have arrived are dropped
        self.delivered = delivered(sched.actions, self.rank) if self.settle else {}
        return acts

    def step(self, act: Action, pos: int) -> None:
        if act.kind == "U" and self.clip_globally:  # the norm's sum waits on every rank: A
            self._timed("A", act.mb, self._sum_norm)
        self._timed(act.kind, act.mb, lambda: self._act(act, pos))

    def _timed(self, kind: str, mb: int, run: Callable[[], bool]) -> None:
        self.begin_action(kind, mb, kind in _WAITS)
        self.timed(kind, run, partial(self.record, self.report), waited=bool)
        self.progress.leave(f"{kind}{mb}")

    def _sum_norm(self) -> bool:  # the whole model's gradient norm of this update
        self.norm = self.comm.norm_sum(lambda: sq_norm(self.gather_grads())).sqrt()
        return True

    def _act(self, act: Action, pos: int) -> bool:
        waited = self.handlers[act.kind](act, pos)
        for peer, kind, count in self.delivered.get(pos, ()):
            self.comm.settle(peer, kind, count)
        return waited

    def checkpoint_state(self) -> dict:
        """At an epoch's end (the pipeline drained): the stage's weights, its optimizer
        state and its weight versions (the version count and every stashed snapshot)."""
        return {"module": cpu_copy(self.module.state_dict()),
                "optimizer": cpu_copy(self.optimizer.state_dict()),
                "version": self.store.version,
                "snapshots": {v: cpu_copy(snap) for v, snap in self.store.snapshots.items()}}

    def load_checkpoint(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        set_lr(self.optimizer, self.lrs)  # the run's rule decides, not the saved groups
        self.store.version = state["version"]
        self.store.snapshots = {
            v: {n: t.detach().to(self.device).clone().requires_grad_(True)
                for n, t in snap.items()}
            for v, snap in state["snapshots"].items()}

    def finish_epoch(self) -> EpochReport:
        self.comm.flush()
        r = self.report
        r.payload, r.header = dict(self.comm.stats.payload), dict(self.comm.stats.header)
        r.allreduce_bytes = self.comm.stats.allreduce
        r.stash_weight_bytes = self.store.peak_bytes
        r.stash_activation_bytes = self.act_bytes_peak
        if self.losses:
            r.losses = [v * self.m for v in torch.stack(self.losses).tolist()]
        return self.close_report(r, self.module)

    def _batch(self, unit: int, targets_only: bool = False) -> Batch:
        return microbatch(self.splits.train, self.wl, self.order, unit // self.m,
                          unit % self.m, self.run.batch_size, self.m, targets_only)

    # Each handler returns True when its time was spent waiting on others (idle).
    def _recv_forward(self, act: Action, pos: int) -> bool:
        inputs = self.comm.recv(act.peer, "F", prefetch=self.more_to_come[pos])
        self.inflight[act.mb] = {"x": tuple(t.requires_grad_(t.is_floating_point())
                                            for t in inputs)}
        return True

    def _recv_backward(self, act: Action, pos: int) -> bool:
        self.inflight[act.mb]["g"] = self.comm.recv(act.peer, "B",
                                                    prefetch=self.more_to_come[pos])
        return True

    @staticmethod
    def _sum_order(snaps: list[dict], module_has_grads: bool) -> tuple[dict | None, list[dict]]:
        """The gathered gradient's one rule (``gather_grads``, and the buckets' per-parameter
        ``gathered``): the base (None: the module's own gradients, where it has any or no
        snapshot; else the last snapshot's) and the snapshots added to it, in order."""
        if snaps and not module_has_grads:
            return snaps[-1], snaps[:-1]
        return None, snaps

    def gather_grads(self) -> list[Tensor]:
        """The gradients accumulated since the last update: on the snapshots the backwards
        used (stash/vertical sync) or on the module itself (naive, recompute)."""
        if self.grads is None:
            base, rest = self._sum_order(list(self.pending.values()),
                                         any(p.grad is not None for p in self.params))
            # (naive/recompute and direct forwards accumulate on the module)
            self.grads = self.store.take_grads(base) if base is not None else [
                p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            for snap in rest:
                for g, new in zip(self.grads, self.store.take_grads(snap), strict=True):
                    g += new
            self.pending = {}
        return self.grads

    def _allreduce(self, act: Action, pos: int) -> bool:
        if self.buckets is not None and self.buckets.armed:  # started during the backward
            self.buckets.finish(self.gather_grads())
        else:
            self.comm.allreduce_mean(self.gather_grads(), self.replica_ranks)
        return True

    def _differentiate(self, pos: int, rec: dict, tensors: list[Tensor],
                       grads: list[Tensor] | None, **kw) -> None:
        """The weights' backward of a unit; the round's last one on a replicated stage
        starts the gradient buckets' all-reduces as their gradients become final."""
        if pos not in self.overlap_at:
            torch.autograd.backward(tensors, grads, **kw)
            return
        snap = rec.get("snap")
        order = list(self.pending.values())  # the snapshots gather_grads will sum, in order
        if snap is not None and id(snap) not in self.pending:
            order.append(snap)
        # a backward without a snapshot accumulates on the module: it will have gradients
        base, rest = self._sum_order(
            order, snap is None or any(p.grad is not None for p in self.params))
        names = self.store.names

        def gathered(i: int) -> Tensor:  # gather_grads's sum for parameter i
            if base is None:
                p = self.params[i]
                g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            else:
                t = base[names[i]]
                g = t.grad.clone() if t.grad is not None else t.new_zeros(t.shape)
            for s in rest:
                t = s[names[i]]
                g += t.grad if t.grad is not None else t.new_zeros(t.shape)
            return g

        leaves = [snap[n] for n in names] if snap is not None else self.params
        self.buckets.arm(leaves, gathered)
        try:
            torch.autograd.backward(tensors, grads, **kw)
        finally:
            self.buckets.disarm()

    def _forward(self, act: Action, pos: int) -> bool:
        k = act.mb
        rec = self.inflight.setdefault(k, {})
        batch = None
        if self.stage == 0:  # only stage 0 reads inputs
            batch = self._batch(k)
            rec["x"] = tuple(to_device(t, self.device) for t in batch.inputs)
        if self.naive:
            with torch.no_grad():
                out = self.module(rec["x"])
        elif pos in self.direct and self.base + act.version == self.store.version:
            out = self.module(rec["x"])  # current weights, unchanged until its backward
        else:
            rec["snap"] = self.store.params(self.base + act.version)
            out = self.store.call(rec["snap"], rec["x"])
        if self.last:  # the last stage reads its targets (alone) through the same sampler
            batch = batch or self._batch(k, targets_only=True)
            rec["targets"] = to_device(batch.targets, self.device)
            if not self.naive:
                rec["loss"] = self.wl.loss(out, rec["targets"]) / self.m
        if not (self.naive and self.last):  # a naive last stage recomputes its output at B
            rec["out"] = out
        self.act_bytes_peak = max(self.act_bytes_peak, weight_stash.held_bytes(self.inflight))
        return False

    def _send_forward(self, act: Action, pos: int) -> bool:
        self.comm.send(self.inflight[act.mb]["out"], act.peer, "F")
        if self.naive:
            del self.inflight[act.mb]["out"]
        return False

    def _roots(self, rec: dict) -> tuple[list[Tensor], list[Tensor] | None]:
        """What the backward differentiates: the loss (last stage) or the outputs with the
        gradients received for them; a naive/recomputed forward re-runs here once with the
        current weights (its I and W halves share that graph)."""
        if "roots" not in rec:
            if self.naive:  # recompute with the current weights
                out = self.module(rec["x"])
                roots = (self.wl.loss(out, rec["targets"]) / self.m,) if self.last else out
            else:
                roots = (rec["loss"],) if self.last else rec["out"]
            if self.last:  # read at the epoch's close: no wait for the device here
                self.losses.append(roots[0].detach())
                rec["roots"] = ([roots[0]], None)
            else:
                floats = [o for o in roots if o.is_floating_point()]
                pairs = [(o, g) for o, g in zip(floats, rec["g"], strict=True)
                         if o.requires_grad]
                rec["roots"] = ([o for o, _ in pairs], [g for _, g in pairs])
        return rec["roots"]

    def _backward(self, act: Action, pos: int) -> bool:
        rec = self.inflight[act.mb]
        self._differentiate(pos, rec, *self._roots(rec))
        self._gradient_done(act, rec)
        return False

    def _backward_input(self, act: Action, pos: int) -> bool:
        """I: the gradient of the stage's input only (sent back at once); the graph stays
        for W. Stage 0's input needs none."""
        rec = self.inflight[act.mb]
        inputs = [t for t in rec.get("x", ()) if t.requires_grad]
        tensors, grads = self._roots(rec)
        if inputs:
            torch.autograd.backward(tensors, grads, inputs=inputs, retain_graph=True)
        return False

    def _backward_weight(self, act: Action, pos: int) -> bool:
        """W: the weights' gradient (on the snapshot the forward used, or the module)."""
        rec = self.inflight[act.mb]
        leaves = [t for t in (rec["snap"].values() if "snap" in rec else self.params)
                  if t.requires_grad]
        self._differentiate(pos, rec, *self._roots(rec), inputs=leaves)
        self._gradient_done(act, rec)
        return False

    def _gradient_done(self, act: Action, rec: dict) -> None:
        if "snap" in rec:  # gradients accumulate on the snapshot until A/U reads them
            self.pending[id(rec["snap"])] = rec["snap"]
        rec["done"] = True
        self._release(act.mb, rec)

    def _release(self, mb: int, rec: dict) -> None:
        """Drop a unit's record once its weight gradient is done (B or W) and its input
        gradient sent (SB; stage 0 sends none)."""
        if rec.get("done") and (self.stage == 0 or rec.get("sent")):
            del self.inflight[mb]

    def _send_backward(self, act: Action, pos: int) -> bool:
        rec = self.inflight[act.mb]
        rec["sent"] = True
        self._release(act.mb, rec)
        self.comm.send(tuple(t.grad if t.grad is not None else torch.zeros_like(t)
                             for t in rec["x"] if t.is_floating_point()), act.peer, "B")
        return False

    def _send_tie(self, act: Action, pos: int) -> bool:
        self.ties.send(act, self.gather_grads(), self.comm)
        return False

    def _recv_tie(self, act: Action, pos: int) -> bool:
        self.ties.recv(act, self.comm)
        return True

    def _update(self, act: Action, pos: int) -> bool:
        grads = self.gather_grads()
        if self.ties is not None:  # the tied copies' gradient G(j), clipped (ties.py)
            self.ties.before_update(act.mb // self.m, grads)
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g
        if self.clip_globally:  # one norm over every stage, summed at A (clipping.py)
            clip_by(grads, self.norm, self.clip)
        elif self.clip is not None and self.ties is None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.store.before_update(self.future_f[pos])  # 2BW: the version it replaces
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.grads = None
        self.store.after_update(self.future_f[pos])
        if self.last:
            self.mark_done(self.report, act.mb // self.m)
        return False


_WAITS = ("RF", "RB", "A", "RT")  # actions that wait on other ranks

