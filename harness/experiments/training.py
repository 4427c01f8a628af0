"""The epoch loop every system shares, and single-process training.

``run_training`` owns what must be identical across systems: the epoch budget, evaluation
after every epoch, stopping at the target, timing and what is logged. A system supplies
``train_epoch(epoch) -> EpochStats`` and ``evaluate() -> quality``.

Timing rules (MLPerf's): time-to-target counts everything from the first training step,
evaluation included; throughput (samples/s) counts training steps only and excludes the
first ``warmup_steps`` steps of the run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments import steady
from harness.reporting.progress import Progress
from pipedream_impl.runtime.contract import cpu_copy
from workloads.base import Batch, Dataset, DataSplits, LayerModel, ScaleSpec, Workload
from workloads.recipe import (
    dropout_seed,
    epoch_order,
    load_optimizer_state,
    make_optimizer,
    minibatch,
    reset_peak_memory,
)

__all__ = ["EpochStats", "RunSummary", "SingleTrainer", "minibatches", "resolve_device",
           "run_training", "step_loss", "train_step"]


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    steps: int = 0
    samples: int = 0
    time_s: float = 0.0
    timed_samples: int = 0  # after warm-up
    timed_s: float = 0.0
    # the minibatches' completion times, sorted, warm-up dropped (``steady.completions``),
    # and how many completions make a round (``steady.window_of``)
    completions: list[float] = field(default_factory=list)
    window: int = 1
    cpu_s: float = 0.0  # user + system CPU seconds of every process training the epoch

    @property
    def train_loss(self) -> float:
        return self.loss_sum / max(1, self.steps)

    @property
    def samples_per_s(self) -> float:
        return self.timed_samples / self.timed_s if self.timed_s > 0 else float("nan")


@dataclass
class RunSummary:
    config: RunConfig
    metric: str
    target: float
    qualities: list[float] = field(default_factory=list)
    epochs: list[EpochStats] = field(default_factory=list)
    elapsed_s: list[float] = field(default_factory=list)  # at each epoch's evaluation's end
    time_to_target_s: float | None = None
    epochs_to_target: int | None = None
    total_time_s: float = 0.0
    peak_memory_bytes: dict[int, int] = field(default_factory=dict)
    run_id: str | None = None
    tracking_uri: str | None = None
    data_description: str = ""
    final_metrics: dict[str, float] = field(default_factory=dict)  # as logged to MLflow
    layout_params: dict = field(default_factory=dict)  # config, stages, ... (multi-process)
    num_parameters: int = 0
    batch_size: int = 0  # the (global) minibatch the run used
    # multi-process systems: the last epoch's trace events per rank, and rank placement
    last_epoch_events: dict[int, list] = field(default_factory=dict)
    placement: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def reached(self) -> bool:
        return self.time_to_target_s is not None

    @property
    def throughput(self) -> float:
        rates = [e.samples_per_s for e in self.epochs if not math.isnan(e.samples_per_s)]
        return statistics.median(rates) if rates else float("nan")

    @property
    def steady(self) -> steady.SteadyState:
        return steady.steady_state(((e.completions, e.window) for e in self.epochs),
                                   self.batch_size)

    @property
    def cpu_per_sample(self) -> float:
        samples = sum(e.samples for e in self.epochs)
        return sum(e.cpu_s for e in self.epochs) / samples if samples else float("nan")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda was asked for but no CUDA device is visible")
    return torch.device(name)


def minibatches(data: Dataset, workload: Workload, batch_size: int, seed: int, epoch: int,
                limit: int | None = None) -> Iterator[Batch]:
    """Full minibatches only (fixed shapes for every system); the tail is dropped."""
    order = epoch_order(len(data), seed, epoch)
    steps = len(data) // batch_size
    if limit is not None:
        steps = min(steps, limit)
    for k in range(steps):
        yield minibatch(data, workload, order, k, batch_size)


def train_step(model: LayerModel, workload: Workload, spec: ScaleSpec,
               optimizer: torch.optim.Optimizer, batch: Batch) -> float:
    """One step; its loss read as a number (on a GPU, a wait for the device)."""
    return float(step_loss(model, workload, spec, optimizer, batch))


def step_loss(model: LayerModel, workload: Workload, spec: ScaleSpec,
              optimizer: torch.optim.Optimizer, batch: Batch) -> Tensor:
    """One step; its loss left on the device, unread (nothing waits for the device)."""
    optimizer.zero_grad(set_to_none=True)
    loss = workload.loss(model(batch.inputs), batch.targets)
    loss.backward()
    if spec.grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
    optimizer.step()
    return loss.detach()


def run_training(cfg: RunConfig, workload: Workload, target: float,
                 train_epoch: Callable[[int], EpochStats], evaluate: Callable[[], float],
                 log_epoch: Callable[[int, EpochStats, float, float], None],
                 progress: Progress, resumed: RunSummary | None = None,
                 after_epoch: Callable[[RunSummary], None] | None = None) -> RunSummary:
    """The epoch loop. ``resumed``: the history of a checkpointed run, continued from its
    next epoch (its clock too: time-to-target counts training time, not the downtime);
    ``after_epoch``: called with the summary after each epoch is evaluated and logged."""
    summary = resumed or RunSummary(cfg, workload.metric, target)
    start = time.perf_counter() - (summary.elapsed_s[-1] if summary.elapsed_s else 0.0)
    if summary.reached:
        return summary
    for epoch in range(len(summary.epochs), cfg.epochs):
        stats = train_epoch(epoch)
        t_eval = time.perf_counter()
        quality = evaluate()
        eval_time = time.perf_counter() - t_eval
        summary.epochs.append(stats)
        summary.qualities.append(quality)
        summary.elapsed_s.append(time.perf_counter() - start)
        log_epoch(epoch, stats, quality, eval_time)
        if workload.reached(quality, target):
            summary.time_to_target_s = time.perf_counter() - start
            summary.epochs_to_target = epoch + 1
        if after_epoch is not None:  # before the note: once it is printed, the epoch is
            after_epoch(summary)  # in the checkpoint's hands
        rate = stats.samples_per_s  # NaN: every step of the epoch was warm-up
        progress.note(f"epoch {epoch + 1}/{cfg.epochs}: loss {stats.train_loss:.4f}, "
                      f"{workload.metric} {quality:.4f} (target {target}), " +
                      (f"{rate:.1f} samples/s" if math.isfinite(rate) else "warm-up only"))
        if summary.reached:
            break
    summary.total_time_s = time.perf_counter() - start
    return summary


class SingleTrainer:
    """One process, the whole model: the reference every other system is compared with."""

    def __init__(self, cfg: RunConfig, workload: Workload, splits: DataSplits,
                 device: torch.device, progress: Progress) -> None:
        self.cfg, self.workload, self.splits, self.device = cfg, workload, splits, device
        self.spec = workload.spec(cfg.scale)
        self.batch_size = cfg.data.batch_size or self.spec.batch_size
        reset_peak_memory(device)  # this run's peak, model included
        meta = {**splits.train.meta, "init_seed": cfg.seed}
        self.model = workload.build(cfg.scale, meta).to(device)
        self.optimizer = make_optimizer(self.spec, self.model.parameters(), cfg.lr)
        self.progress = progress
        self.global_step = 0
        self.held: dict | None = None  # state at the last epoch's end (checkpointing)

    def train_epoch(self, epoch: int) -> EpochStats:
        self.model.train()
        stats = EpochStats()
        n_steps = len(self.splits.train) // self.batch_size
        if self.cfg.data.max_steps_per_epoch is not None:
            n_steps = min(n_steps, self.cfg.data.max_steps_per_epoch)
        torch.manual_seed(dropout_seed(self.cfg.seed, epoch))
        batches = minibatches(self.splits.train, self.workload, self.batch_size, self.cfg.seed,
                              epoch, n_steps)
        epoch_start, cpu0 = time.perf_counter(), time.process_time()
        done: list[tuple[int, float]] = []
        with self.progress.task(f"epoch {epoch + 1} train", n_steps) as advance:
            t0 = time.perf_counter()
            for batch in batches:  # the step's time includes fetching its minibatch
                batch = batch.to(self.device)
                loss = train_step(self.model, self.workload, self.spec, self.optimizer, batch)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                t1 = time.perf_counter()
                stats.loss_sum += loss
                stats.steps += 1
                stats.samples += batch.size
                if self.global_step >= self.cfg.warmup_steps:
                    stats.timed_samples += batch.size
                    stats.timed_s += t1 - t0
                done.append((self.global_step, t1))
                self.global_step += 1
                advance(loss)
                t0 = time.perf_counter()
        stats.time_s = time.perf_counter() - epoch_start
        stats.cpu_s = time.process_time() - cpu0
        stats.completions = steady.completions([done], self.cfg.warmup_steps)
        if self.cfg.failures.checkpoint_dir is not None:
            self.held = {"model": cpu_copy(self.model.state_dict()),
                         "optimizer": cpu_copy(self.optimizer.state_dict()),
                         "global_step": self.global_step}
        return stats

    def checkpoint_states(self) -> tuple[list[dict], dict]:
        """(worker states, trainer state) at the last finished epoch's end."""
        return [self.held], {}

    def restore(self, worker_states: list[dict], trainer_state: dict) -> None:  # noqa: ARG002
        (state,) = worker_states
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.global_step = state["global_step"]

    def evaluate(self) -> float:
        return self.workload.evaluate(self.model, self.splits.valid, max(self.batch_size, 128))
