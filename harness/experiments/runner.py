"""Run one system on one workload as one MLflow run: the library behind ``pipebench run``.

``run`` resolves the config's defaults, builds the system's trainer (single process, or
the multi-process trainer on the layout ``layout.pipeline_layout`` chooses), trains with
the shared epoch loop and logs the metrics of ``harness.metrics`` (keys formatted there)
and the artifacts of ``harness.reporting.artifacts`` (tables, figures, trace, plan).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import torch

from core.interrupts import Terminated, on_sigterm
from harness import metrics
from harness.config import RunConfig
from harness.experiments import checkpoint
from harness.experiments.checkpoint import Checkpoint
from harness.experiments.layout import check_run
from harness.experiments.stage_times import gap_note, measure, stage_metrics
from harness.experiments.training import (
    EpochStats,
    RunSummary,
    SingleTrainer,
    resolve_device,
    run_training,
)
from harness.reporting import tracking
from harness.reporting.artifacts import log_artifacts
from harness.reporting.progress import Progress
from pipedream_impl.runtime import STAGE_EXECUTOR, no_halt, processes
from workloads import registry
from workloads.base import DataSplits, Workload, count_parameters
from workloads.recipe import load_splits, peak_memory_bytes

__all__ = ["run"]


def run(cfg: RunConfig, progress: Progress | None = None,
        parent_run_id: str | None = None, resume: Checkpoint | None = None) -> RunSummary:
    """Train ``cfg.system`` on ``cfg.workload`` as one MLflow run (a child of
    ``parent_run_id`` when given: ``compare-run``). ``resume``: continue that checkpoint's
    run (its config is ``cfg``; see ``harness.experiments.checkpoint``)."""
    check_run(cfg)  # its files and layout, before any worker or MLflow run starts
    no_halt.hold()  # PIPEBENCH_NO_HALT (off by default): idle CPUs poll, for the whole run
    progress = progress or Progress()
    workload = registry.get(cfg.workload)
    spec = workload.spec(cfg.scale)
    if cfg.epochs is None:
        cfg = dataclasses.replace(cfg, epochs=spec.epochs)
    target = cfg.target
    if target is None:
        real = cfg.data.path and spec.real_target is not None
        target = spec.real_target if real else spec.target
    device = resolve_device(cfg.device)
    # resolved, so that a checkpoint resumes with the same threads and device elsewhere
    cfg = dataclasses.replace(cfg, threads=cfg.threads_per_worker(), device=device.type)
    if cfg.failures.checkpoint_dir is not None:
        checkpoint.prepare(cfg.failures.checkpoint_dir, resuming=resume is not None)
    torch.set_num_threads(cfg.threads_per_worker())
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    splits = load_splits(workload, cfg.scale, cfg.data.path, cfg.seed)
    progress.note(f"data: {splits.description} (loaded in {time.perf_counter() - t0:.1f}s)")
    processes.ready()  # a fork server started early has done its imports: nothing measured
    # below (a one-process run, a local profile) shares the machine with them
    batch_size = cfg.data.batch_size or spec.batch_size
    own_state = resume.trainer_state() if resume is not None else None
    trainer, layout_params = _trainer(cfg, workload, splits, device, progress, batch_size,
                                      own_state)
    try:
        return _train_tracked(cfg, workload, target, splits, device, batch_size, trainer,
                              layout_params, progress, parent_run_id, resume, own_state)
    except BaseException:  # a failure, Ctrl-C or SIGTERM: stop every worker now
        if cfg.definition.multi_process:
            trainer.close(kill=True)
        raise


def _train_tracked(cfg: RunConfig, workload: Workload, target: float, splits: DataSplits,
                   device: torch.device, batch_size: int, trainer,  # noqa: ANN001
                   layout_params: dict, progress: Progress, parent_run_id: str | None,
                   resume: Checkpoint | None, own_state: dict | None) -> RunSummary:
    """Everything after the workers started: the MLflow run, training, final metrics."""
    run_name = f"{cfg.system}-{workload.name}-{cfg.scale}-w{cfg.workers}-s{cfg.seed}"
    num_parameters = count_parameters(trainer.model)
    if resume is not None:
        trainer.restore(resume.worker_states(), own_state)
        progress.note(f"resuming from {resume.path} ({resume.epochs_done} epochs done)")
    if cfg.launcher == "srun":  # several nodes log their system metrics into this run
        tracking.name_this_node(os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    with tracking.tracked_run(cfg.experiment, run_name, tags=cfg.tags,
                              parent_run_id=parent_run_id, system_metrics=True,
                              resume_run_id=resume.run_id if resume else None) as tracker:
        if resume is not None and tracker.run_id == resume.run_id:  # the same run, reopened:
            tracker.tags({"pipebench.resumed": f"after epoch {resume.epochs_done} "  # params
                          f"from {resume.path}", "pipebench.epochs": str(cfg.epochs)})  # fixed
        else:
            _log_params(tracker, cfg, workload, splits, device, target,
                        {"batch_size": batch_size, "global_batch_size": batch_size,
                         "num_parameters": num_parameters, **layout_params})

        def log_epoch(epoch: int, stats: EpochStats, quality: float, eval_s: float) -> None:
            tracker.metrics({metrics.EPOCH_TIME: stats.time_s,
                             metrics.EPOCH_SAMPLES_PER_S: stats.samples_per_s,
                             metrics.TRAIN_LOSS: stats.train_loss, metrics.QUALITY: quality,
                             metrics.EVAL_TIME: eval_s}, step=epoch)

        if cfg.definition.multi_process and tracker.run_id:
            trainer.launcher.monitor("harness.reporting.node_metrics:NodeMetrics",
                                     tracker.run_id, tracker.uri,
                                     tracking.SYSTEM_METRICS_INTERVAL_S)
        saver = _Saver(cfg, trainer, tracker, progress)
        resumed = resume.summary(cfg, workload.metric, target) if resume else None
        try:
            with on_sigterm():
                summary = run_training(cfg, workload, target, trainer.train_epoch,
                                       trainer.evaluate, log_epoch, progress, resumed,
                                       saver.after_epoch if cfg.failures.checkpoint_dir
                                       else None)
        except Terminated:  # the newest finished epoch, if not on disk yet (the caller
            if cfg.failures.checkpoint_dir:  # then stops the workers)
                saver.save_newest()
            raise
        if cfg.definition.multi_process:
            trainer.close()
        summary.num_parameters, summary.batch_size = num_parameters, batch_size
        final = _final_metrics(cfg, trainer, summary, device, workload)
        final.update(_stage_times(trainer, batch_size, progress))
        summary.data_description = splits.description
        tracker.metrics(final)
        summary.final_metrics, summary.layout_params = final, layout_params
        if cfg.definition.multi_process:
            summary.last_epoch_events = dict(trainer.metrics.last_events or {})
            summary.placement = dict(trainer.metrics.placement or {})
        if tracker.active:
            log_artifacts(tracker, cfg, summary, trainer, workload)
    # read after the run ended: a tracking server lost on the way moves the run (new id)
    summary.run_id, summary.tracking_uri = tracker.run_id, tracker.uri
    return summary


def runtime_switches() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The runtime's switches, the one list: (all of them, in the order ``runtime_env``
    records them; those an engine reads when it is made, or before each epoch, so that
    engines built in one process can differ in them: ``scripts/same_process_ab.py``).
    The others (pinning, no-halt, the fork server) act when a worker process starts. Each
    switch's name lives in the module it switches."""
    from pipedream_impl.runtime.comm import BACKWARD_LINK_ENV, RECV_AHEAD_ENV, SETTLE_ENV
    from pipedream_impl.runtime.grad_buckets import BUCKET_MB_ENV
    from pipedream_impl.runtime.no_halt import NO_HALT_ENV
    from pipedream_impl.runtime.pinning import PIN_ENV
    from pipedream_impl.runtime.processes import FORKSERVER_ENV
    from pipedream_impl.runtime.transport_yield import TRANSPORT_YIELD_ENV
    from workloads.recipe import FUSED_OPTIMIZER_ENV

    every = (RECV_AHEAD_ENV, SETTLE_ENV, BACKWARD_LINK_ENV, BUCKET_MB_ENV, PIN_ENV,
             NO_HALT_ENV, FORKSERVER_ENV, FUSED_OPTIMIZER_ENV, TRANSPORT_YIELD_ENV)
    at_start = (PIN_ENV, NO_HALT_ENV, FORKSERVER_ENV)
    return every, tuple(k for k in every if k not in at_start)


def runtime_env() -> str:
    """The runtime's switches this run's environment sets (``NAME=VALUE``, comma-separated;
    ``defaults`` where none is set): runs that differ in one must not be compared as if
    they were alike. A machine setting asked for that this machine does not allow
    (``PIPEBENCH_NO_HALT`` without root) is recorded as ``NAME=1 (not applied)``."""
    from pipedream_impl.runtime.no_halt import NO_HALT_ENV

    def entry(name: str) -> str:
        value = os.environ[name]
        if name == NO_HALT_ENV and no_halt.no_halt() and not no_halt.applied():
            value += " (not applied)"  # asked for, but the run went without
        return f"{name}={value}"

    set_ = [entry(k) for k in runtime_switches()[0] if k in os.environ]
    return ",".join(set_) or "defaults"


def _log_params(tracker: tracking.Tracker, cfg: RunConfig, workload: Workload,
                splits: DataSplits, device: torch.device, target: float, more: dict) -> None:
    """The run's params (the schema's PARAM_KEYS and the layout's)."""
    spec = workload.spec(cfg.scale)
    tracker.params({
        "system": cfg.system, "workload": workload.name, "scale": cfg.scale,
        "workers": cfg.workers, "seed": cfg.seed, "epochs": cfg.epochs, "target": target,
        "metric": workload.metric, "data": splits.description,
        "optimizer": spec.optimizer, "lr": cfg.lr if cfg.lr is not None else spec.lr,
        "threads": cfg.threads_per_worker(), "device": str(device),
        "warmup_steps": cfg.warmup_steps, "runtime_env": runtime_env(),
        "hardware": tracking.hardware(device), "git_sha": tracking.git_sha(),
        "torch_version": torch.__version__, **more})


class _Saver:
    """Writes the run's checkpoints: every ``checkpoint_every_epochs`` epochs, and the
    newest finished epoch when the run is terminated before it was written. What it
    writes is taken together after each epoch (the workers' states, the trainer's, the
    history), so a signal between two of those steps cannot mix two epochs."""

    def __init__(self, cfg: RunConfig, trainer, tracker: tracking.Tracker,  # noqa: ANN001
                 progress: Progress) -> None:
        self.cfg, self.trainer, self.tracker, self.progress = cfg, trainer, tracker, progress
        self.newest: tuple[RunSummary, list[dict], dict] | None = None
        self.saved = -1  # epochs done at the newest checkpoint written

    def after_epoch(self, summary: RunSummary) -> None:
        workers, own = self.trainer.checkpoint_states()
        self.newest = (_history(summary), workers, own)
        done = len(summary.epochs)
        if done % self.cfg.failures.checkpoint_every_epochs == 0 or summary.reached \
                or done == self.cfg.epochs:
            self.save_newest()

    def save_newest(self) -> None:
        if self.newest is None or self.saved == len(self.newest[0].epochs):
            return
        t0 = time.perf_counter()
        summary, workers, own = self.newest
        path = checkpoint.save(self.cfg.failures.checkpoint_dir, self.cfg, summary,
                               self.tracker.run_id, workers, own)
        self.saved = len(summary.epochs)
        self.progress.note(f"checkpoint of epoch {self.saved} written to {path} "
                           f"({time.perf_counter() - t0:.1f} s)")


def _history(summary: RunSummary) -> RunSummary:
    """A copy of the parts of ``summary`` a checkpoint keeps (the run goes on changing it)."""
    return dataclasses.replace(summary, qualities=list(summary.qualities),
                               epochs=list(summary.epochs), elapsed_s=list(summary.elapsed_s))


def _trainer(cfg: RunConfig, workload: Workload, splits: DataSplits, device: torch.device,
             progress: Progress, batch_size: int, resumed: dict | None):  # noqa: ANN202
    """The system's trainer and the params that describe its layout (a resumed run's
    layout is its checkpoint's: a layout balanced on a local profile may differ)."""
    if not cfg.definition.multi_process:
        return SingleTrainer(cfg, workload, splits, device, progress), {}
    from harness.experiments.layout import pipeline_layout
    from harness.experiments.pipeline_trainer import PipelineTrainer

    predicted = None  # a resumed run's layout was balanced on another run's profile
    if resumed is not None:
        replicas, bounds, *depths = resumed["layout"]  # (older checkpoints: no depths)
        depths = depths[0] if depths else None
        how = "the checkpoint's layout"
    else:
        replicas, bounds, how, predicted, depths = pipeline_layout(cfg, workload, batch_size,
                                                                   device)
    progress.note(f"pipeline {'-'.join(map(str, replicas))} on {cfg.workers} workers, "
                  f"layers {list(bounds)}: {how}")
    trainer = PipelineTrainer(cfg, workload, splits, replicas, bounds, device, progress,
                              depths)
    trainer.predicted_stage_ms = predicted  # stage_times: beside the measured, at the end
    params = dict(trainer.params)
    params.update(config="-".join(map(str, replicas)), stages=list(bounds), layout_source=how)
    return trainer, params


def _stage_times(trainer, batch_size: int, progress: Progress) -> dict[str, float]:  # noqa: ANN001
    """Each stage's compute per minibatch, predicted and measured (``stage_times``), for the
    pipelines of our runtime (the other engines time no compute actions per stage)."""
    m = getattr(trainer, "metrics", None)
    if m is None or not m.action_s or not m.placement or \
            trainer.cfg.definition.executor != STAGE_EXECUTOR or \
            trainer.cfg.definition.stages_per_rank > 1:
        return {}
    measured = measure(m.action_s, m.placement, trainer.replicas, m.samples // batch_size)
    progress.note(gap_note(trainer.predicted_stage_ms, measured))
    return stage_metrics(trainer.predicted_stage_ms, measured)


def _thread_use(rank: int, use: dict[str, list[float]]) -> dict[str, float]:
    """A worker's thread use by action kind (``thread_use.FIELDS``), as metrics."""
    return {metrics.key(name, kind=kind, worker=rank): value
            for kind, values in sorted(use.items())
            for name, value in zip(metrics.THREAD_USE, values, strict=True)}


def _final_metrics(cfg: RunConfig, trainer, summary: RunSummary,  # noqa: ANN001
                   device: torch.device, workload: Workload) -> dict[str, float]:
    """The run's metrics at the end: throughput, quality, time to target, bytes, memory,
    and per-worker busy/idle/action times and stash sizes for multi-process systems."""
    extra: dict[str, float] = {}
    bytes_per_sample = 0.0
    if cfg.definition.multi_process:
        m = trainer.metrics
        summary.peak_memory_bytes = dict(m.peak_memory)
        bytes_per_sample = m.bytes_sent / max(1, m.samples)
        for r in m.busy:
            busy, idle = m.busy[r], m.idle[r]
            extra[metrics.key(metrics.BUSY, worker=r)] = busy
            if cfg.definition.reports_idle:  # the others do not expose their idle time
                extra[metrics.key(metrics.IDLE, worker=r)] = idle
                extra[metrics.key(metrics.BUBBLE_FRACTION, worker=r)] = \
                    idle / max(1e-12, busy + idle)
            for kind, secs in sorted((m.action_s or {}).get(r, {}).items()):
                extra[metrics.key(metrics.ACTION_TIME, kind=kind, worker=r)] = secs
            if m.action_use_whole:  # else it would miss the epochs before a resume
                extra.update(_thread_use(r, (m.action_use or {}).get(r, {})))
            extra[metrics.key(metrics.STASH_WEIGHTS, worker=r)] = m.stash_weights[r]
            extra[metrics.key(metrics.STASH_ACTIVATIONS, worker=r)] = m.stash_activations[r]
        for (a, b), n in m.links.items():
            extra[metrics.key(metrics.LINK_BYTES, src=a, dst=b)] = n
        extra[metrics.ACTIONS_PER_EPOCH] = m.actions / max(1, len(summary.epochs))
        extra[metrics.TRACE_EVENTS_DROPPED] = m.events_dropped  # beyond the trace's cap
    else:
        summary.peak_memory_bytes = {0: peak_memory_bytes(device)}
    steady = summary.steady
    final = {metrics.THROUGHPUT: summary.throughput,
             metrics.STEADY_THROUGHPUT: steady.samples_per_s,
             metrics.STEADY_SPREAD: steady.spread, metrics.STEADY_WINDOWS: steady.windows,
             metrics.CPU_PER_SAMPLE: summary.cpu_per_sample,
             metrics.FINAL_QUALITY: summary.qualities[-1],
             metrics.BEST_QUALITY: (max if workload.higher_is_better else min)(
                 summary.qualities),
             metrics.TOTAL_TIME: summary.total_time_s, metrics.EPOCHS_RUN: len(summary.epochs),
             metrics.BYTES_PER_SAMPLE: bytes_per_sample, **extra,
             metrics.PEAK_MEMORY_MAX: max(summary.peak_memory_bytes.values())}
    final.update({metrics.key(metrics.PEAK_MEMORY, worker=r): b
                  for r, b in summary.peak_memory_bytes.items()})
    if summary.reached:
        final[metrics.TIME_TO_TARGET] = summary.time_to_target_s
        final[metrics.EPOCHS_TO_TARGET] = summary.epochs_to_target
    return final
