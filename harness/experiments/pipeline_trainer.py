"""The multi-process systems as the epoch loop sees them: a ``train_epoch`` and ``evaluate``.

``PipelineTrainer`` turns a ``RunConfig`` and a layout (replicas and layer range per stage)
into worker specs, starts the system's launcher (from the registry: our spawn launcher, or
Horovod's under horovodrun) and, each epoch, turns the ranks' reports into the epoch's
statistics and the run's metrics (bytes per link, busy and idle time, memory). After each
epoch it assembles the stages' weights (replica 0 of each stage) into one model and
evaluates it itself, so the quality metric and the target check are the same code as
single-process training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from baselines.torch_peers import TORCH_EXECUTOR, check_engine_microbatches, loss_rank
from core.errors import UserInputError
from core.imports import load
from harness.config import RunConfig
from harness.experiments import steady
from harness.experiments.training import EpochStats
from harness.reporting.progress import Progress
from pipedream_impl.runtime import STAGE_EXECUTOR
from pipedream_impl.runtime.contract import (
    EpochReport,
    RunSettings,
    SystemSettings,
    WorkerSpec,
    cpu_copy,
)
from pipedream_impl.runtime.launcher import Launcher, free_port
from pipedream_impl.runtime.thread_use import FIELDS
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.torch_csv import microbatches_of, read_csv
from workloads.base import DataSplits, Workload

__all__ = ["RUN_TRACE_EVENTS", "PipelineMetrics", "PipelineTrainer", "system_settings"]

RUN_TRACE_EVENTS = 100_000  # trace events kept per worker for a whole run


@dataclass
class PipelineMetrics:
    bytes_sent: int = 0
    samples: int = 0
    busy: dict[int, float] | None = None
    idle: dict[int, float] | None = None
    action_s: dict[int, dict[str, float]] | None = None  # our runtime: seconds per action kind
    # per rank and action kind, what the actions cost their thread (thread_use.FIELDS);
    # not whole for a run resumed from a checkpoint that did not keep it (then not logged)
    action_use: dict[int, dict[str, list[float]]] | None = None
    action_use_whole: bool = True
    peak_memory: dict[int, int] | None = None
    stash_weights: dict[int, int] | None = None
    stash_activations: dict[int, int] | None = None
    links: dict[tuple[int, int], int] | None = None
    events: dict[int, list] | None = None  # per rank, every epoch's trace events (capped)
    events_dropped: int = 0
    last_events: dict[int, list] | None = None  # per rank, the latest epoch's events
    actions: int = 0  # spans booked over the run, every worker (kept in the trace or not)
    placement: dict[int, tuple[int, int]] | None = None  # rank -> (stage, replica)


def system_settings(cfg: RunConfig, replicas: tuple[int, ...],
                    bounds: tuple[tuple[int, int], ...], batch_size: int,
                    depths: tuple[int, ...] | None = None) -> tuple[SystemSettings, dict]:
    """The executor's settings for ``cfg.system`` on this layout (``depths``: a plan's
    minibatches in flight per stage), and the params the run logs about them (the
    registry's static params included)."""
    system = cfg.definition
    params: dict = dict(system.params)
    if system.executor == STAGE_EXECUTOR:  # every pipeline of our runtime
        params["recompute"] = cfg.pipeline.recompute
    order = schedule_file_order(cfg, len(replicas))
    if system.microbatched:
        micro = schedules.microbatches(system.schedule, len(replicas), cfg.pipeline.microbatches) \
            if order is None else microbatches_of(order)
        params.update(microbatches=micro, microbatch_size=batch_size // max(1, micro))
    elif system.kind == "data-parallel":
        micro = cfg.workers  # each rank's slice of a global minibatch counts as one of W
        params["per_worker_batch"] = batch_size // cfg.workers
    else:
        micro = 1
    in_flight = system.in_flight or cfg.pipeline.in_flight
    if system.weight_modes:
        params.update(weights=cfg.pipeline.weights, in_flight=in_flight or (
            "-".join(map(str, depths)) if depths else "per-stage"))
    if system.replicated_stages:
        params["stage_lr"] = cfg.pipeline.stage_lr
    p = cfg.pipeline
    settings = SystemSettings(replicas=replicas, bounds=bounds, executor=system.executor,
                              schedule=system.schedule or schedules.DEFAULT,
                              weights=p.weights, in_flight=in_flight, depths=depths,
                              microbatches=micro,
                              recompute=p.recompute, stage_lr=p.stage_lr, order=order)
    if order is not None:
        params["schedule_file"] = cfg.pipeline.schedule_file
    return settings, params


def schedule_file_order(cfg: RunConfig, stages: int) -> tuple | None:
    """The compute order of ``--schedule-file`` (None without one), checked against the run:
    one stage per worker, stage s on rank s, and --microbatches, if given, as in the file."""
    if cfg.pipeline.schedule_file is None:
        return None
    order = read_csv(cfg.pipeline.schedule_file)
    held = sorted({s for row in order for _, s, _ in row})
    if len(order) != stages or held != list(range(stages)) or any(
            s != rank for rank, row in enumerate(order) for _, s, _ in row):
        raise UserInputError(f"--schedule-file {cfg.pipeline.schedule_file}: {len(order)} rows and "
                             f"stages {held}; this run has {stages} workers holding one stage "
                             "each (row r lists stage r's actions; schedule files with several "
                             "stages per rank are not supported here)")
    m = microbatches_of(order)
    if cfg.pipeline.microbatches is not None and cfg.pipeline.microbatches != m:
        raise UserInputError(f"--microbatches {cfg.pipeline.microbatches}: the schedule file "
                             f"has {m} microbatches per step; drop --microbatches")
    return tuple(tuple(row) for row in order)


def _summed(before: dict[str, list[float]], epoch: dict[str, list[float]]) \
        -> dict[str, list[float]]:
    """One rank's thread use by action kind over the run so far: ``before``'s and this
    epoch's, field by field."""
    kinds = {*before, *epoch}
    return {k: [a + b for a, b in zip(before.get(k, [0.0] * len(FIELDS)),
                                     epoch.get(k, [0.0] * len(FIELDS)), strict=True)]
            for k in kinds}


class PipelineTrainer:
    def __init__(self, cfg: RunConfig, workload: Workload, splits: DataSplits,
                 replicas: tuple[int, ...], bounds: tuple[tuple[int, int], ...],
                 device: torch.device, progress: Progress,
                 depths: tuple[int, ...] | None = None) -> None:
        self.cfg, self.workload, self.splits = cfg, workload, splits
        self.replicas, self.bounds, self.depths = replicas, bounds, depths
        self.spec = workload.spec(cfg.scale)
        self.batch_size = cfg.data.batch_size or self.spec.batch_size
        self.progress = progress
        self.settings, self.params = system_settings(cfg, replicas, bounds, self.batch_size,
                                                     depths)
        self.microbatches = self.settings.microbatches
        if self.batch_size % self.microbatches:
            raise UserInputError(f"--microbatches {self.microbatches} does not divide the "
                                 f"batch size {self.batch_size}")
        self.torch_peer = self.settings.executor == TORCH_EXECUTOR
        refused = check_engine_microbatches(self.settings.schedule, len(replicas), len(bounds),
                                            self.microbatches) if self.torch_peer else None
        if refused:
            raise UserInputError(f"--microbatches {self.microbatches}: {refused}")
        self.model = workload.build(cfg.scale, {**splits.train.meta, "init_seed": cfg.seed})
        self.metrics = PipelineMetrics()
        f = cfg.failures
        run = RunSettings(workload=workload.name, scale=cfg.scale, seed=cfg.seed,
                          batch_size=self.batch_size, lr=cfg.lr, data=cfg.data.path,
                          max_steps=cfg.data.max_steps_per_epoch,
                          threads=cfg.threads_per_worker(), device=device.type,
                          warmup_steps=cfg.warmup_steps, timeout_s=f.timeout_s, fault=f.fault,
                          checkpoint=f.checkpoint_dir is not None)
        init = f"tcp://127.0.0.1:{free_port()}"
        specs = [WorkerSpec(rank, run, self.settings, init) for rank in range(sum(replicas))]
        self.held: list[dict] = []  # every rank's checkpoint state at the last epoch's end
        self.link_base: dict[tuple[int, int], int] = {}  # bytes sent before a resume
        self.bytes_base = 0
        self.launcher: Launcher = load(cfg.worker_launcher())(
            specs, stall_timeout_s=cfg.stall_timeout())

    def train_epoch(self, epoch: int) -> EpochStats:
        t0 = time.time()
        reports = self.launcher.epoch(epoch)
        end = max(r.end_at for r in reports)
        n_last = self.replicas[-1]  # the last stage's replicas: the last ranks (a torch
        # peer's last stage may sit elsewhere: rank 0 in a V)
        last = [reports[loss_rank(self.settings)]] if self.torch_peer else reports[-n_last:]
        losses = [x for r in last for x in r.losses]  # one per microbatch
        steps = sum(len(r.losses) for r in last) // self.microbatches
        if steps == 0:
            self.launcher.fail("an epoch ran no minibatch: fewer training samples than one "
                               "minibatch per replica of every stage")
        samples = steps * self.batch_size
        stats = EpochStats(loss_sum=sum(losses) / self.microbatches, steps=steps,
                           samples=samples, time_s=end - t0)
        warm = [r.warm_done_at for r in last if r.warm_done_at is not None]
        if epoch == 0 and warm and steps > self.cfg.warmup_steps:
            stats.timed_samples = samples - self.cfg.warmup_steps * self.batch_size
            stats.timed_s = end - min(warm)
        elif epoch == 0 and self.cfg.warmup_steps:  # all warm-up: nothing timed, as in
            stats.timed_samples, stats.timed_s = 0, 0.0  # one process (NaN samples/s)
        else:
            stats.timed_samples, stats.timed_s = samples, end - t0
        stamps = [r.done_at for r in last]
        stats.completions = steady.completions(stamps, self.cfg.warmup_steps if epoch == 0 else 0)
        stats.window = steady.window_of(stamps)
        stats.cpu_s = sum(r.cpu_s for r in reports)
        self._absorb(reports)
        self.metrics.samples += samples
        self.held = [r.checkpoint for r in reports]
        return stats

    def checkpoint_states(self) -> tuple[list[dict], dict]:
        """(each rank's state, the launcher's: evaluation model and the run's counters)
        at the last finished epoch's end."""
        m = self.metrics
        counters = {"samples": m.samples, "busy": m.busy, "idle": m.idle,
                    "action_s": m.action_s, "action_use": m.action_use,
                    "actions": m.actions, "links": m.links,
                    "bytes_sent": m.bytes_sent, "events_dropped": m.events_dropped}
        return self.held, {"eval_model": cpu_copy(self.model.state_dict()),
                           "counters": counters,
                           "layout": (self.replicas, self.bounds, self.depths)}

    def restore(self, worker_states: list[dict], trainer_state: dict) -> None:
        """Continue a checkpointed run: every rank loads its state before its next epoch."""
        if len(worker_states) != len(self.launcher.controls):
            raise UserInputError(f"the checkpoint holds {len(worker_states)} worker states, "
                                 f"this run has {len(self.launcher.controls)} workers")
        self.launcher.restore(worker_states)
        self.model.load_state_dict(trainer_state["eval_model"])
        c, m = trainer_state["counters"], self.metrics
        m.samples, m.busy, m.idle, m.action_s = c["samples"], c["busy"], c["idle"], c["action_s"]
        m.action_use = c.get("action_use")  # absent from checkpoints made before it existed
        m.action_use_whole = "action_use" in c
        m.actions, m.events_dropped = c["actions"], c["events_dropped"]
        self.link_base, self.bytes_base = dict(c["links"] or {}), c["bytes_sent"]

    def _absorb(self, reports: list[EpochReport]) -> None:
        m = self.metrics
        m.links = dict(self.link_base)  # bytes sent before a resume
        total = self.bytes_base
        for r in reports:  # comm counters are cumulative per worker (since its start)
            for link, b in r.payload.items():
                m.links[link] = m.links.get(link, 0) + b
                total += b
            total += r.allreduce_bytes
        m.bytes_sent = total
        m.busy = {r.rank: (m.busy or {}).get(r.rank, 0.0) + r.busy_s for r in reports}
        m.idle = {r.rank: (m.idle or {}).get(r.rank, 0.0) + r.idle_s for r in reports}
        before = m.action_s or {}
        m.action_s = {r.rank: {k: before.get(r.rank, {}).get(k, 0.0) + r.action_s.get(k, 0.0)
                               for k in {*r.action_s, *before.get(r.rank, {})}}
                      for r in reports}
        used = m.action_use or {}
        m.action_use = {r.rank: _summed(used.get(r.rank, {}), r.action_use) for r in reports}
        m.peak_memory = {r.rank: r.peak_memory for r in reports}
        m.events = m.events or {}
        for r in reports:
            kept = m.events.setdefault(r.rank, [])
            room = max(0, RUN_TRACE_EVENTS - len(kept))
            kept.extend(r.events[:room])
            m.events_dropped += r.events_dropped + max(0, len(r.events) - room)
        m.placement = {r.rank: (r.stage, r.replica) for r in reports}
        m.last_events = {r.rank: r.events for r in reports}
        m.actions += sum(len(r.events) + r.events_dropped for r in reports)
        m.stash_weights = {r.rank: r.stash_weight_bytes for r in reports}
        m.stash_activations = {r.rank: r.stash_activation_bytes for r in reports}
        self.replica_states = {r.rank: r.state for r in reports}
        for r in reports:
            if r.state is not None and r.replica == 0:
                self.model.load_stage_state(self.bounds[r.stage][0], r.state)

    def evaluate(self) -> float:
        return self.workload.evaluate(self.model, self.splits.valid, max(self.batch_size, 128))

    def close(self, kill: bool = False) -> None:
        self.launcher.close(kill)
