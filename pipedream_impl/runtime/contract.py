"""The executor contract: what a launcher hands a worker and what every system's worker does.

Every multi-process system (our pipelines, DDP, Horovod, the peer engines) runs the same
worker (``pipedream_impl.runtime.worker``): it builds the worker's pieces once
(``WorkerPieces``: the workload, its data splits, the whole model initialised with the
run's seed, the device and the layout) and hands them to the system's ``Executor``, which
trains one epoch per control message and returns an ``EpochReport``. The base class holds
the scaffolding every executor shares, so it is written once:

- seeding: each rank's dropout stream per epoch (``dropout_seed``);
- warm-up: the first ``RunSettings.warmup_steps`` minibatches of the run are excluded from
  throughput; ``mark_done`` stamps when they are done;
- progress and fault injection: ``begin_action`` stamps where the worker is (on its
  progress board, which the launcher's watchdog reads) and fires ``RunSettings.fault``
  where it hits (``pipedream_impl.runtime.faults``);
- checkpoints: ``checkpoint_state`` / ``load_checkpoint`` (each executor says what its
  state is); with ``RunSettings.checkpoint`` every epoch's report carries that state, and a
  ``("restore", state)`` control message loads it before the next epoch;
- reports: ``start_epoch`` opens one, ``record`` books each timed span (busy or idle,
  by action kind) and keeps it as a trace event, ``timed`` also what each host-timed
  action cost its thread (``thread_use``: CPU, system time, page faults, preemptions),
  ``close_report`` stamps the end, peak memory and the stage's weights.

Trace events are ``(name, start, duration, busy)`` with ``start`` in wall-clock seconds
(``time.time``, comparable across the processes of one machine); at most
``TRACE_EVENTS_PER_EPOCH`` are kept per epoch, and the busy/idle sums count every span
whether kept or not. ``harness.reporting.trace`` turns them into Chrome trace JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import torch

from pipedream_impl.runtime import STAGE_EXECUTOR, TIMEOUT_S, WARMUP_STEPS, thread_use
from pipedream_impl.runtime.device_clock import DeviceClock
from pipedream_impl.runtime.faults import Fault, Progress, board_path
from pipedream_impl.runtime.stage_lr import STAGE_LR_RULES
from pipedream_impl.schedule import WEIGHT_MODES, Layout
from pipedream_impl.schedule import registry as schedules
from workloads import registry
from workloads.base import DataSplits, LayerModel, ScaleSpec, Workload
from workloads.recipe import (
    dropout_seed,
    epoch_order,
    load_splits,
    make_optimizer,
    reset_peak_memory,
)
from workloads.recipe import peak_memory_bytes as _peak_memory_bytes

__all__ = ["TRACE_EVENTS_PER_EPOCH", "EpochReport", "Executor", "RunSettings",
           "SystemSettings", "WorkerPieces", "WorkerSpec", "cpu_copy", "flat_tensors"]

R = TypeVar("R")
TRACE_EVENTS_PER_EPOCH = 20_000  # per worker: a full-scale epoch is not shipped whole


def cpu_copy(obj):  # noqa: ANN001, ANN201
    """A detached CPU copy of the tensors in a (nested) state dict: what a report or a
    checkpoint carries, untouched by later training."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def flat_tensors(obj, prefix: str = "") -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Every tensor of a (nested) state, on the CPU, by its path ("/0/module/w"): how a
    checkpoint is compared with another, tensor by tensor."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj.detach().cpu()}
    out: dict[str, torch.Tensor] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list | tuple) else ()
    for k, v in items:
        out.update(flat_tensors(v, f"{prefix}/{k}"))
    return out


@dataclass(frozen=True)
class RunSettings:
    """What every worker of every system shares: the workload, data, optimizer and timing."""
    workload: str
    scale: str
    seed: int
    batch_size: int  # the global minibatch
    lr: float | None = None  # None: the workload's
    data: str | None = None  # None: the default dataset
    max_steps: int | None = None  # cap on minibatches per epoch
    threads: int = 1  # torch threads per worker
    device: str = "cpu"  # "cpu" or "cuda"
    warmup_steps: int = WARMUP_STEPS  # first minibatches of the run, left out of throughput
    timeout_s: float = TIMEOUT_S  # every receive / all-reduce waits at most this long
    fault: Fault | None = None  # injected fault (tests): see faults.py
    checkpoint: bool = False  # every epoch's report carries the executor's checkpoint state


@dataclass(frozen=True)
class SystemSettings:
    """How the system runs: the layout and its executor's options."""
    replicas: tuple[int, ...]  # replicas per stage
    bounds: tuple[tuple[int, int], ...]  # layer range [a, b) of each stage
    executor: str = STAGE_EXECUTOR  # module:Class every worker runs
    schedule: str = schedules.DEFAULT  # a name in the schedule registry
    weights: str = WEIGHT_MODES[0]  # stash | vertical-sync | none
    in_flight: int | None = None  # None: PipeDream's per-stage warm-up; 1: model parallelism
    depths: tuple[int, ...] | None = None  # a plan's minibatches in flight per stage
    microbatches: int = 1  # per minibatch (flush pipelines; data parallelism: ranks)
    recompute: bool = False  # flush: re-materialise activations in the backward
    stage_lr: str = STAGE_LR_RULES[0]  # replicas: PipeDream's per-stage rate; same: one
    order: tuple | None = None  # a schedule file's compute order (``schedule.torch_csv``)


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    run: RunSettings
    system: SystemSettings
    init_method: str = ""  # torch.distributed rendezvous (tcp://host:port or env://)
    local_rank: int = -1  # rank on this machine (GPU index); -1: same as rank
    progress_dir: str = ""  # where the launcher reads progress boards ("": none)
    launcher_pid: int = 0  # the launcher's process (0: none, e.g. under torchrun)

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
    events: list = field(default_factory=list)  # (name, start wall s, duration s, busy)
    events_dropped: int = 0  # spans beyond TRACE_EVENTS_PER_EPOCH (still counted above)
    payload: dict = field(default_factory=dict)
    header: dict = field(default_factory=dict)
    allreduce_bytes: int = 0
    peak_memory: int = 0
    stash_weight_bytes: int = 0  # peak of weight_stash.WeightStore.stashed_bytes, run so far
    stash_activation_bytes: int = 0
    warm_done_at: float | None = None  # wall clock when its warm-up minibatches finished
    done_at: list = field(default_factory=list)  # (minibatch, wall s) as each completes here
    cpu_s: float = 0.0  # this process's user + system CPU seconds in the epoch
    action_use: dict = field(default_factory=dict)  # kind -> thread_use.FIELDS, timed actions
    end_at: float = 0.0
    state: dict | None = None
    checkpoint: dict | None = None  # the executor's whole state (RunSettings.checkpoint)


@dataclass
class WorkerPieces:
    """What a worker builds once from its spec and hands to its executor."""
    spec: WorkerSpec
    layout: Layout
    device: torch.device
    workload: Workload
    scale_spec: ScaleSpec
    splits: DataSplits
    model: LayerModel  # the whole model, initialised with the run's seed

    @classmethod
    def build(cls, spec: WorkerSpec, device: torch.device,
              own_peak: bool = False) -> WorkerPieces:
        """``own_peak``: this process is the worker's alone, so its peak memory starts
        here, after the data and before the model (as the single trainer's does)."""
        wl = registry.get(spec.run.workload)
        splits = load_splits(wl, spec.run.scale, spec.run.data, spec.run.seed)
        if own_peak:
            reset_peak_memory(device)
        model = wl.build(spec.run.scale, {**splits.train.meta, "init_seed": spec.run.seed})
        return cls(spec, Layout(spec.system.replicas, spec.system.depths), device, wl,
                   wl.spec(spec.run.scale), splits, model)

    def steps_per_epoch(self) -> int:
        n = len(self.splits.train) // self.spec.run.batch_size
        return n if self.spec.run.max_steps is None else min(n, self.spec.run.max_steps)


class Executor:
    """One worker of a system: ``run_epoch`` trains an epoch and reports it."""

    torch_distributed: ClassVar[bool] = True  # the worker joins a torch.distributed group
    # times its actions by device events on a GPU (``device_clock``) rather than waiting
    # for the device after each one; the executor books them through ``timed``
    device_clock: ClassVar[bool] = False
    # its collectives run on gloo's transport threads while it computes (DDP's bucket
    # all-reduces, during the backward): ``transport_yield.crowded``'s ``beside_compute``
    collectives_beside_compute: ClassVar[bool] = False
    clock: DeviceClock | None = None  # this epoch's, where device events time the actions
    n_steps: int  # minibatches per epoch, set by the subclass

    def __init__(self, pieces: WorkerPieces) -> None:
        # the pieces themselves are not kept: their whole model would stay alive on a
        # worker that needs one stage of it
        self.spec, self.layout, self.device = pieces.spec, pieces.layout, pieces.device
        self.run, self.system = pieces.spec.run, pieces.spec.system
        self.rank = pieces.spec.rank
        self.wl, self.scale_spec, self.splits = pieces.workload, pieces.scale_spec, pieces.splits
        self.progress = Progress(self.rank, board_path(pieces.spec.progress_dir, self.rank)
                                 if pieces.spec.progress_dir else None)
        self.epoch = 0
        self._cpu0 = time.process_time()  # reset by each start_epoch
        self.use: dict[str, list[float]] = {}  # this epoch's thread use by action kind

    def optimizer_for(self, params) -> torch.optim.Optimizer:  # noqa: ANN001
        """The workload's optimizer (the run's learning rate) over ``params``."""
        return make_optimizer(self.scale_spec, params, self.run.lr)

    def run_epoch(self, epoch: int) -> EpochReport:
        raise NotImplementedError

    def checkpoint_state(self) -> dict:
        """Everything a resumed worker needs to continue bit for bit from this epoch's end
        (weights, optimizer state, weight versions); plain tensors and numbers."""
        raise NotImplementedError(f"{type(self).__name__} cannot checkpoint")

    def load_checkpoint(self, state: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot resume")

    def begin_action(self, kind: str, minibatch: int, waiting: bool = False) -> None:
        """Stamp the start of action ``kind`` of ``minibatch`` (for the watchdog) and fire
        the injected fault if it is this one. ``waiting``: the action waits on others."""
        self.progress.enter(f"{kind}{minibatch}", waiting)
        fault = self.run.fault
        if fault is not None and fault.hits(self.rank, self.epoch, kind, minibatch):
            fault.fire()

    def straggle(self, kind: str, t0: float) -> None:
        """A straggler fault (``slow``) on this rank's ``kind``: spin until the action,
        begun at ``t0`` (``time.perf_counter``), has taken FACTOR times as long."""
        fault = self.run.fault
        factor = 1.0 if fault is None else fault.slowdown(self.rank, kind)
        if factor > 1.0:
            end = t0 + factor * (time.perf_counter() - t0)
            while time.perf_counter() < end:
                pass

    def start_epoch(self, epoch: int, stage: int, replica: int) -> EpochReport:
        """Seed this rank's epoch, set its sample order and open its report."""
        self.epoch = epoch
        self.progress.begin_epoch(epoch, stage)
        torch.manual_seed(dropout_seed(self.run.seed, epoch, self.rank))
        self.order = epoch_order(len(self.splits.train), self.run.seed, epoch)
        # one anchor per epoch maps perf_counter spans onto the wall clock
        self._wall0, self._perf0 = time.time(), time.perf_counter()
        self._cpu0 = time.process_time()
        self.use = {}
        self.clock = self._device_clock()
        return EpochReport(self.rank, stage, replica)

    def _device_clock(self) -> DeviceClock | None:
        """The epoch's device-event clock, for executors that time their actions by it on a
        GPU (``timed``); none elsewhere."""
        if not (self.device_clock and self.on_gpu()):
            return None
        self.synchronize()
        return DeviceClock(time.perf_counter(), self.event)

    def slowed(self, kind: str) -> bool:
        """This rank's ``kind`` is slowed by a straggler fault (timed on the host)."""
        fault = self.run.fault
        return fault is not None and fault.slowdown(self.rank, kind) > 1.0

    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @staticmethod
    def event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def timed(self, kind: str, run: Callable[[], R], book: Callable[..., None],
              waited: Callable[[R], bool] = lambda result: False) -> R:
        """Do one action and time it: by device events where ``self.clock`` is set (read
        from the clock once the device is synchronised), else on the host clock after
        waiting for the device, handing ``book(kind, t0, t1, busy)`` the span. ``waited``:
        whether the action's time was spent waiting on others (from ``run``'s result). A
        slowed action (straggler fault) is timed on the host, the device waited for on
        both sides so that its span is its own, and kept in its place on the clock. Where
        the host's clock times the action (no device clock this epoch), what it cost this
        thread (``thread_use``) is booked under ``kind`` too: on the device clock a span
        is the device's time, which the host's CPU time says nothing about."""
        clock = self.clock
        if clock is not None and not self.slowed(kind):
            begin = clock.start()
            result = run()
            clock.stop(begin, kind, not waited(result))
            return result
        if clock is not None:
            self.synchronize()
        t0 = time.perf_counter()
        use0 = thread_use.reading() if clock is None else None
        result = run()
        self.synchronize()
        self.straggle(kind, t0)
        use1 = thread_use.reading() if use0 is not None else None
        t1 = time.perf_counter()  # the readings inside the span: its CPU time within it
        (clock.host if clock is not None else book)(kind, t0, t1, not waited(result))
        if use0 is not None:
            thread_use.add(self.use, kind, use0, use1)
        return result

    def record(self, report: EpochReport, name: str, t0: float, t1: float,
               busy: bool = True) -> None:
        """Book the span ``t0..t1`` (``time.perf_counter`` readings) as ``name``: busy or
        idle time, seconds per action kind, and a trace event."""
        dt = t1 - t0
        report.action_s[name] = report.action_s.get(name, 0.0) + dt
        if busy:
            report.busy_s += dt
        else:
            report.idle_s += dt
        if len(report.events) < TRACE_EVENTS_PER_EPOCH:
            report.events.append((name, self._wall0 + (t0 - self._perf0), dt, busy))
        else:
            report.events_dropped += 1

    def mark_done(self, report: EpochReport, minibatch: int) -> None:
        """Stamp minibatch ``minibatch`` (of this epoch's count) complete on this rank (the
        steady-state throughput's clock, ``harness.experiments.steady``), and the end of
        the warm-up once it completes the run's ``warmup_steps``. Where device events
        time the actions, the stamp is an event read at the close (``DeviceClock.mark``):
        when the device finishes the minibatch, not when its last kernels were queued,
        and without waiting for the device here."""
        if self.clock is not None:
            self.clock.mark(minibatch)
        else:
            self._stamp(report, minibatch, time.time())

    def _stamp(self, report: EpochReport, minibatch: int, at: float) -> None:
        report.done_at.append((minibatch, at))
        if minibatch == min(self.n_steps, self.run.warmup_steps) - 1:
            report.warm_done_at = at

    def synchronize(self) -> None:
        """Wait for the device (CUDA kernels run asynchronously) before reading a clock."""
        if self.on_gpu():
            torch.cuda.synchronize(self.device)

    def close_report(self, report: EpochReport, module: torch.nn.Module) -> EpochReport:
        if self.clock is not None:  # the device-timed actions, booked in their order
            self.synchronize()
            for name, t0, t1, busy in self.clock.spans():
                self.record(report, name, t0, t1, busy)
            for minibatch, t in self.clock.stamps():
                self._stamp(report, minibatch, self._wall0 + (t - self._perf0))
        self.progress.end_epoch()
        report.end_at = time.time()
        report.cpu_s = time.process_time() - self._cpu0
        report.action_use = self.use
        report.peak_memory = _peak_memory_bytes(self.device)
        report.state = cpu_copy(module.state_dict())
        return report
