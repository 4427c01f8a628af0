"""The PipeDream worker: executes its action list of a schedule on a real process.

One executor for every pipeline schedule: it walks ``Schedule.actions[rank]`` and does what
each action says (receive, forward with a weight version, send, backward, all-reduce,
step); it holds no scheduling logic. Communication goes through ``comm.Comm`` (counted
bytes, timeouts); weight versions through ``weight_stash.WeightStore``.

Inputs and targets: only stage 0 reads the inputs of a minibatch; the last stage reads its
targets itself through the same deterministic sampler (``workloads.recipe.epoch_order``
with the same seed and epoch), so targets never travel with the activations.

Weight modes: ``stash`` and ``vertical-sync`` keep the forward's autograd graph (built over
the version's snapshot) until the backward; ``none`` (naive pipelining) runs the forward
with the current weights and, at backward time, recomputes it with the then-current
weights on the stored input, so the gradient mixes versions as naive pipelining does.
A forward with no update before its own backward on that worker (every GPipe forward, the
last stage's in 1F1B) and using the current weights runs on the module itself, without a
snapshot: the weights cannot change under its graph. Gradients accumulate (on snapshots or
the module) until the all-reduce or update reads them, once per update.

Gradient clipping, where a workload asks for it, is applied per stage (a global norm would
need another all-reduce across stages). Parameters tied across two stages (AWD-LM's
embedding and decoder) are rejected with a clear error: their copies would drift apart.
"""

from __future__ import annotations

import datetime
import importlib
import math
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.func import functional_call

from pipedream_impl.comm import Comm
from pipedream_impl.schedule import Action, Layout, Schedule, gpipe, one_f_one_b
from pipedream_impl.weight_stash import WeightStore
from workloads import registry
from workloads.base import Batch, WorkloadError
from workloads.recipe import (
    epoch_order,
    load_splits,
    make_optimizer,
    microbatch,
    peak_memory_bytes,
)


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    replicas: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]  # layer range [a, b) of each stage
    workload: str
    scale: str
    seed: int
    batch_size: int
    lr: float | None
    weights: str
    in_flight: int | None
    data: str | None
    max_steps: int | None
    init_method: str
    timeout_s: float
    threads: int
    device: str  # "cpu" or "cuda"
    fail_at: tuple[int, int] | None = None  # (rank, minibatch): raise there (tests)
    local_rank: int = -1  # rank on this machine (GPU index); -1: same as rank
    schedule: str = "1f1b"  # or "gpipe"
    microbatches: int = 1  # GPipe: microbatches per minibatch
    recompute: bool = False  # GPipe: re-materialise activations in the backward
    executor: str = "pipedream_impl.runtime:StageExecutor"  # module:class run per epoch

    def __post_init__(self) -> None:
        if self.local_rank < 0:
            object.__setattr__(self, "local_rank", self.rank)


@dataclass
class EpochReport:
    rank: int
    stage: int
    replica: int
    losses: list[float] = field(default_factory=list)
    busy_s: float = 0.0
    idle_s: float = 0.0
    action_s: dict = field(default_factory=dict)  # seconds per action kind (F, B, SF, ...)
    payload: dict = field(default_factory=dict)
    header: dict = field(default_factory=dict)
    allreduce_bytes: int = 0
    peak_memory: int = 0
    stash_weight_bytes: int = 0
    stash_activation_bytes: int = 0
    warm_done_at: float | None = None  # wall clock when its warm-up minibatches finished
    end_at: float = 0.0
    state: dict | None = None


def worker_main(spec: WorkerSpec, control, results) -> None:  # noqa: ANN001 - mp queues
    try:
        _run(spec, control, results)
    except BaseException:  # report, then die non-zero: the launcher stops everyone
        results.put(("error", spec.rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(spec: WorkerSpec, control, results) -> None:  # noqa: ANN001
    torch.set_num_threads(spec.threads)
    device = torch.device("cpu")
    if spec.device == "cuda":  # one GPU per local rank; NCCL below
        device = torch.device(f"cuda:{spec.local_rank % max(1, torch.cuda.device_count())}")
        torch.cuda.set_device(device)
    layout = Layout(spec.replicas)
    module_name, cls_name = spec.executor.split(":")
    executor_cls = getattr(importlib.import_module(module_name), cls_name)
    if getattr(executor_cls, "torch_distributed", True):  # Horovod brings its own
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=spec.init_method, rank=spec.rank,
                                world_size=layout.workers,
                                timeout=datetime.timedelta(seconds=spec.timeout_s))
    executor = executor_cls(spec, layout, device)
    while True:  # between epochs the launcher evaluates: wait long, but not forever (a
        # worker whose launcher was killed must not linger)
        msg = control.get(timeout=max(3600.0, 4 * spec.timeout_s))
        if msg[0] == "stop":
            return
        results.put(("epoch", spec.rank, executor.run_epoch(msg[1])))


class StageExecutor:
    """One stage replica: its module, optimizer, weight versions and the action handlers."""

    def __init__(self, spec: WorkerSpec, layout: Layout, device: torch.device) -> None:
        self.spec, self.layout, self.device = spec, layout, device
        self.wl = registry.get(spec.workload)
        self.comm = Comm(spec.rank, device, spec.timeout_s, self.wl.static_shapes)
        for s, r in enumerate(layout.replicas):  # every rank creates every group, same order
            if r > 1:
                self.comm.group(tuple(layout.rank(s, i) for i in range(r)))
        self.stage, self.replica = layout.stage_of(spec.rank)
        self.last = self.stage == len(layout.replicas) - 1
        self.scale_spec = self.wl.spec(spec.scale)
        self.splits = load_splits(self.wl, spec.scale, spec.data, spec.seed)
        full = self.wl.build(spec.scale, {**self.splits.train.meta, "init_seed": spec.seed})
        check_ties(full, spec.bounds)
        a, b = spec.bounds[self.stage]
        self.module = full.stage(a, b).to(device).train()
        self.params = list(self.module.parameters())
        self.optimizer = make_optimizer(self.scale_spec, self.params, spec.lr)
        self.store = WeightStore(self.module, layout.replicas[self.stage],
                                 spec.weights == "vertical-sync")
        self.replica_ranks = tuple(layout.rank(self.stage, i)
                                   for i in range(layout.replicas[self.stage]))
        n = len(self.splits.train) // spec.batch_size
        if spec.max_steps is not None:
            n = min(n, spec.max_steps)
        self.n_steps = n - n % math.lcm(*layout.replicas)  # same count on every replica
        self.m = spec.microbatches
        self.naive = spec.weights == "none" or spec.recompute  # no graph kept from F to B
        self.handlers = {"RF": self._recv_forward, "F": self._forward, "SF": self._send_forward,
                         "RB": self._recv_backward, "B": self._backward,
                         "SB": self._send_backward, "A": self._allreduce, "U": self._update}

    def schedule(self) -> Schedule:
        if self.spec.schedule == "gpipe":
            return gpipe(self.layout, self.n_steps, self.m)
        return one_f_one_b(self.layout, self.n_steps, self.spec.weights, self.spec.in_flight)

    def run_epoch(self, epoch: int) -> EpochReport:
        acts = self.begin_epoch(epoch)
        for pos, act in enumerate(acts):
            self.step(act, pos)
        return self.finish_epoch()

    def begin_epoch(self, epoch: int) -> tuple[Action, ...]:
        """Set up an epoch; returns this rank's actions (``step`` runs them in order).
        ``run_epoch`` is begin, every step, finish; ``pipedream_impl.local`` interleaves the
        steps of all ranks in one process with the same calls."""
        acts = self.schedule().actions[self.spec.rank]
        self.order = epoch_order(len(self.splits.train), self.spec.seed, epoch)
        self.report = EpochReport(self.spec.rank, self.stage, self.replica)
        torch.manual_seed(self.spec.seed * 7919 + epoch * 131 + self.spec.rank)
        self.base = self.store.version  # schedule versions count from the epoch's start
        self.future_f = [self.base + v for v in _future_versions(acts)]
        self.direct = _direct_forwards(acts)
        self.inflight: dict[int, dict] = {}
        self.grads: list[Tensor] | None = None  # gathered at A/U, summed over microbatches
        self.pending: dict[int, dict] = {}  # snapshots holding not yet gathered gradients
        self.act_bytes_peak = 0
        return acts

    def step(self, act: Action, pos: int) -> None:
        t0 = time.perf_counter()
        waited = self.handlers[act.kind](act, pos)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        self.report.action_s[act.kind] = self.report.action_s.get(act.kind, 0.0) + dt
        if waited:
            self.report.idle_s += dt
        else:
            self.report.busy_s += dt

    def finish_epoch(self) -> EpochReport:
        self.comm.flush()
        r = self.report
        r.end_at = time.time()
        r.payload, r.header = dict(self.comm.stats.payload), dict(self.comm.stats.header)
        r.allreduce_bytes = self.comm.stats.allreduce
        r.peak_memory = peak_memory_bytes(self.device)
        r.stash_weight_bytes = self.store.peak_bytes
        r.stash_activation_bytes = self.act_bytes_peak
        r.state = {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}
        return r

    def _batch(self, unit: int) -> Batch:
        return microbatch(self.splits.train, self.wl, self.order, unit // self.m,
                          unit % self.m, self.spec.batch_size, self.m)

    # Each handler returns True when its time was spent waiting on others (idle).
    def _recv_forward(self, act: Action, pos: int) -> bool:
        inputs = self.comm.recv(act.peer, "F")
        self.inflight[act.mb] = {"x": tuple(t.requires_grad_(t.is_floating_point())
                                            for t in inputs)}
        return True

    def _recv_backward(self, act: Action, pos: int) -> bool:
        self.inflight[act.mb]["g"] = self.comm.recv(act.peer, "B")
        return True

    def _gather_grads(self) -> list[Tensor]:
        """The gradients accumulated since the last update: on the snapshots the backwards
        used (stash/vertical sync) or on the module itself (naive, recompute)."""
        if self.grads is None:
            snaps = list(self.pending.values())
            if snaps and all(p.grad is None for p in self.params):
                self.grads = self.store.take_grads(snaps.pop())
            else:  # naive/recompute and direct forwards accumulate on the module
                self.grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                              for p in self.params]
            for snap in snaps:
                for g, new in zip(self.grads, self.store.take_grads(snap), strict=True):
                    g += new
            self.pending = {}
        return self.grads

    def _allreduce(self, act: Action, pos: int) -> bool:
        self.comm.allreduce_mean(self._gather_grads(), self.replica_ranks)
        return True

    def _forward(self, act: Action, pos: int) -> bool:
        k = act.mb
        if self.spec.fail_at is not None and self.spec.fail_at == (self.spec.rank, k):
            raise RuntimeError(f"injected failure at minibatch {k}")
        rec = self.inflight.setdefault(k, {})
        if self.stage == 0:  # only stage 0 reads inputs
            rec["x"] = tuple(t.to(self.device) for t in self._batch(k).inputs)
        if self.naive:
            with torch.no_grad():
                out = self.module(rec["x"])
        elif pos in self.direct and self.base + act.version == self.store.version:
            out = self.module(rec["x"])  # current weights, unchanged until its backward
        else:
            rec["snap"] = self.store.params(self.base + act.version)
            out = functional_call(self.module, rec["snap"], (rec["x"],))
        if self.last:  # the last stage reads its targets through the same sampler
            rec["targets"] = self._batch(k).targets.to(self.device)
            if not self.naive:
                rec["loss"] = self.wl.loss(out, rec["targets"]) / self.m
        rec["out"] = out
        self.act_bytes_peak = max(self.act_bytes_peak, _held_bytes(self.inflight))
        return False

    def _send_forward(self, act: Action, pos: int) -> bool:
        self.comm.send(self.inflight[act.mb]["out"], act.peer, "F")
        if self.naive:
            del self.inflight[act.mb]["out"]
        return False

    def _backward(self, act: Action, pos: int) -> bool:
        rec = self.inflight[act.mb]
        if self.naive:  # recompute with the current weights
            out = self.module(rec["x"])
            roots = (self.wl.loss(out, rec["targets"]) / self.m,) if self.last else out
        else:
            roots = (rec["loss"],) if self.last else rec["out"]
        if self.last:
            self.report.losses.append(float(roots[0].detach()) * self.m)
            torch.autograd.backward(roots[0])
        else:
            floats = [o for o in roots if o.is_floating_point()]
            pairs = [(o, g) for o, g in zip(floats, rec["g"], strict=True) if o.requires_grad]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if "snap" in rec:  # gradients accumulate on the snapshot until A/U reads them
            self.pending[id(rec["snap"])] = rec["snap"]
        if self.stage == 0:
            del self.inflight[act.mb]  # nothing to send back
        return False

    def _send_backward(self, act: Action, pos: int) -> bool:
        rec = self.inflight.pop(act.mb)
        self.comm.send(tuple(t.grad if t.grad is not None else torch.zeros_like(t)
                             for t in rec["x"] if t.is_floating_point()), act.peer, "B")
        return False

    def _update(self, act: Action, pos: int) -> bool:
        for p, g in zip(self.params, self._gather_grads(), strict=True):
            p.grad = g
        if self.scale_spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.scale_spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.grads = None
        self.store.after_update(self.future_f[pos])
        if self.last and act.mb // self.m == min(self.n_steps, 2) - 1:
            self.report.warm_done_at = time.time()  # warm-up minibatches done
        return False


def _future_versions(acts) -> list[int]:  # noqa: ANN001
    """For each position, the oldest version a later forward on this worker uses."""
    out, oldest = [0] * len(acts), 1 << 60
    for i in range(len(acts) - 1, -1, -1):
        out[i] = oldest
        if acts[i].kind == "F":
            oldest = min(oldest, acts[i].version)
    return out


def _direct_forwards(acts) -> set[int]:  # noqa: ANN001
    """Positions of forwards with no update before their backward: when such a forward
    uses the current weights it can run on the module itself (no snapshot, no
    functional_call), since those weights are still current at its backward."""
    direct, open_f = set(), {}
    for i, a in enumerate(acts):
        if a.kind == "F":
            open_f[a.mb] = i
            direct.add(i)
        elif a.kind == "B":
            open_f.pop(a.mb, None)
        elif a.kind == "U":
            direct -= set(open_f.values())
    return direct


def _held_bytes(inflight: dict) -> int:
    total = 0
    for rec in inflight.values():
        for key in ("x", "out"):
            for t in rec.get(key, ()):
                total += t.numel() * t.element_size()
    return total


def check_ties(model: torch.nn.Module, bounds: tuple[tuple[int, int], ...]) -> None:
    owner: dict[int, int] = {}
    for s, (a, b) in enumerate(bounds):
        for layer in model.layers[a:b]:
            for p in layer.parameters():
                if owner.setdefault(id(p), s) != s:
                    raise WorkloadError("this split puts a tied parameter (e.g. AWD-LM's "
                                        "embedding/decoder) on two stages; the runtime does "
                                        "not synchronise tied copies: keep them in one stage")
