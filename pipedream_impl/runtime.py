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

Gradient clipping, where a workload asks for it, is applied per stage (a global norm would
need another all-reduce across stages). Parameters tied across two stages (AWD-LM's
embedding and decoder) are rejected with a clear error: their copies would drift apart.
"""

from __future__ import annotations

import datetime
import math
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.func import functional_call

from pipedream_impl.comm import Comm
from pipedream_impl.schedule import Layout, gpipe, one_f_one_b
from pipedream_impl.weight_stash import WeightStore
from workloads.base import WorkloadError


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
    from workloads import registry
    from workloads.recipe import (
        epoch_order,
        load_splits,
        make_optimizer,
        microbatch,
        peak_memory_bytes,
    )

    torch.set_num_threads(spec.threads)
    device = torch.device("cpu")
    if spec.device == "cuda":  # one GPU per local rank; NCCL below
        device = torch.device(f"cuda:{spec.local_rank % max(1, torch.cuda.device_count())}")
        torch.cuda.set_device(device)
    layout = Layout(spec.replicas)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=spec.init_method, rank=spec.rank,
                            world_size=layout.workers,
                            timeout=datetime.timedelta(seconds=spec.timeout_s))
    comm = Comm(spec.rank, device, spec.timeout_s)
    for s, r in enumerate(layout.replicas):  # every rank creates every group, same order
        if r > 1:
            comm.group(tuple(layout.rank(s, i) for i in range(r)))
    stage, replica = layout.stage_of(spec.rank)
    last = stage == len(layout.replicas) - 1
    wl = registry.get(spec.workload)
    sspec = wl.spec(spec.scale)
    splits = load_splits(wl, spec.scale, spec.data, spec.seed)
    full = wl.build(spec.scale, {**splits.train.meta, "init_seed": spec.seed})
    check_ties(full, spec.bounds)
    a, b = spec.bounds[stage]
    module = full.stage(a, b).to(device).train()
    del full
    optimizer = make_optimizer(sspec, module.parameters(), spec.lr)
    store = WeightStore(module, layout.replicas[stage], spec.weights == "vertical-sync")
    replica_ranks = tuple(layout.rank(stage, i) for i in range(layout.replicas[stage]))
    n_steps = len(splits.train) // spec.batch_size
    if spec.max_steps is not None:
        n_steps = min(n_steps, spec.max_steps)
    n_steps -= n_steps % math.lcm(*layout.replicas)  # every replica gets the same count
    params = list(module.parameters())

    while True:
        msg = control.get(timeout=spec.timeout_s * 4)
        if msg[0] == "stop":
            return
        epoch = msg[1]
        order = epoch_order(len(splits.train), spec.seed, epoch)
        m = spec.microbatches
        if spec.schedule == "gpipe":
            sched = gpipe(layout, n_steps, m)
        else:
            sched = one_f_one_b(layout, n_steps, spec.weights, spec.in_flight)
        acts = sched.actions[spec.rank]
        report = EpochReport(spec.rank, stage, replica)
        torch.manual_seed(spec.seed * 7919 + epoch * 131 + spec.rank)
        base = store.version  # schedule versions count from the epoch's start
        future_f = [base + v for v in _future_versions(acts)]
        inflight: dict[int, dict] = {}
        grads: list[Tensor] | None = None  # summed over a minibatch's microbatches
        naive = spec.weights == "none" or spec.recompute  # forward without a kept graph
        act_bytes_peak = 0
        warm_target = min(n_steps, 2)
        for pos, act in enumerate(acts):
            k = act.mb
            t0 = time.perf_counter()
            if act.kind == "RF":
                inputs = comm.recv(act.peer, "F")
                inflight[k] = {"x": tuple(t.requires_grad_(t.is_floating_point())
                                          for t in inputs)}
                report.idle_s += time.perf_counter() - t0
                continue
            if act.kind == "RB":
                inflight[k]["g"] = comm.recv(act.peer, "B")
                report.idle_s += time.perf_counter() - t0
                continue
            if act.kind == "A":
                comm.allreduce_mean(grads, replica_ranks)
                report.idle_s += time.perf_counter() - t0
                continue
            if act.kind == "F":
                if spec.fail_at is not None and spec.fail_at == (spec.rank, k):
                    raise RuntimeError(f"injected failure at minibatch {k}")
                rec = inflight.setdefault(k, {})
                if stage == 0:
                    batch = microbatch(splits.train, wl, order, k // m, k % m, spec.batch_size, m)
                    rec["x"] = tuple(t.to(device) for t in batch.inputs)
                if naive:
                    with torch.no_grad():
                        out = module(rec["x"])
                else:
                    rec["snap"] = store.params(base + act.version)
                    out = functional_call(module, rec["snap"], (rec["x"],))
                if last:
                    targets = microbatch(splits.train, wl, order, k // m, k % m,
                                         spec.batch_size, m).targets.to(device)
                    rec["targets"] = targets
                    if not naive:
                        rec["loss"] = wl.loss(out, targets) / m
                rec["out"] = out
                act_bytes_peak = max(act_bytes_peak, _held_bytes(inflight))
            elif act.kind == "SF":
                comm.send(inflight[k]["out"], act.peer, "F")
                if naive:
                    del inflight[k]["out"]
            elif act.kind == "B":
                rec = inflight[k]
                if naive:  # recompute with the current weights
                    rec["snap"] = None
                    out = module(rec["x"])
                    roots = (wl.loss(out, rec["targets"]) / m,) if last else out
                else:
                    roots = (rec["loss"],) if last else rec["out"]
                if last:
                    report.losses.append(float(roots[0].detach()) * m)
                    torch.autograd.backward(roots[0])
                else:
                    pairs = [(o, g) for o, g in zip([o for o in roots if o.is_floating_point()],
                                                    rec["g"], strict=True) if o.requires_grad]
                    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                if naive:
                    new = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                           for p in params]
                    module.zero_grad(set_to_none=True)
                else:
                    new = store.take_grads(rec["snap"])
                grads = new if grads is None else [a + b for a, b in zip(grads, new,
                                                                         strict=True)]
                if stage == 0:
                    del inflight[k]  # nothing to send back
            elif act.kind == "SB":
                rec = inflight.pop(k)
                comm.send(tuple(t.grad if t.grad is not None else torch.zeros_like(t)
                                for t in rec["x"] if t.is_floating_point()), act.peer, "B")
            elif act.kind == "U":
                for p, g in zip(params, grads, strict=True):
                    p.grad = g
                if sspec.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, sspec.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                grads = None
                store.after_update(future_f[pos])
                if last and k // m == warm_target - 1:
                    report.warm_done_at = time.time()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            report.busy_s += time.perf_counter() - t0
        comm.flush()
        report.end_at = time.time()
        report.payload = dict(comm.stats.payload)
        report.header = dict(comm.stats.header)
        report.allreduce_bytes = comm.stats.allreduce
        report.peak_memory = peak_memory_bytes(device)
        report.stash_weight_bytes = store.peak_bytes
        report.stash_activation_bytes = act_bytes_peak
        report.state = {k2: v.detach().cpu().clone() for k2, v in module.state_dict().items()}
        results.put(("epoch", spec.rank, report))


def _future_versions(acts) -> list[int]:  # noqa: ANN001
    """For each position, the oldest version a later forward on this worker uses."""
    out, oldest = [0] * len(acts), 1 << 60
    for i in range(len(acts) - 1, -1, -1):
        out[i] = oldest
        if acts[i].kind == "F":
            oldest = min(oldest, acts[i].version)
    return out


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
