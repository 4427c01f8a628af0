"""The multi-process systems (pipedream, gpipe, model-parallel, ddp): launch, drive, evaluate.

Each rank runs an executor chosen by the system (``pipedream_impl.runtime.StageExecutor``
for the pipelines, ``baselines.ddp.DDPExecutor`` for DDP, which the launcher treats as one
stage with W replicas). The launcher (this process) spawns one process per rank
(``torch.multiprocessing``, spawn start method), tells them to run an epoch, and waits for
every rank's report while watching for errors and dead processes. After each epoch it
assembles the stages' weights (replica 0 of each stage) into one model and evaluates it
itself, so the quality metric and the target check are the same code as single-process
training.

Failure: a worker that raises reports its traceback and exits non-zero; one that dies
silently is noticed by its exit code; a worker stuck in a receive times out inside
``comm`` (every receive and all-reduce waits at most ``timeout_s``). The launcher then
kills every worker, joins them (no orphans) and raises ``PipelineFailure`` with the failing
rank's error, which marks the MLflow run FAILED.

Across machines the same ``worker_main`` runs under torchrun instead of this launcher
(``pipedream_impl.torchrun_worker``, ``env://`` rendezvous); see the README.
"""

from __future__ import annotations

import queue
import socket
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from harness.config import RunConfig
from harness.progress import Progress
from harness.training import EpochStats
from pipedream_impl.runtime import EpochReport, WorkerSpec, worker_main
from workloads.base import DataSplits, Workload, WorkloadError


class PipelineFailure(RuntimeError):
    pass


@dataclass
class PipelineMetrics:
    bytes_sent: int = 0
    samples: int = 0
    busy: dict[int, float] | None = None
    idle: dict[int, float] | None = None
    action_s: dict[int, dict[str, float]] | None = None  # our runtime: seconds per action kind
    peak_memory: dict[int, int] | None = None
    stash_weights: dict[int, int] | None = None
    stash_activations: dict[int, int] | None = None
    links: dict[tuple[int, int], int] | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PipelineTrainer:
    def __init__(self, cfg: RunConfig, workload: Workload, splits: DataSplits,
                 replicas: tuple[int, ...], bounds: tuple[tuple[int, int], ...],
                 weights: str, in_flight: int | None, device: torch.device,
                 progress: Progress, timeout_s: float = 120.0,
                 fail_at: tuple[int, int] | None = None, schedule: str = "1f1b",
                 microbatches: int = 1, recompute: bool = False,
                 executor: str = "pipedream_impl.runtime:StageExecutor") -> None:
        self.cfg, self.workload, self.splits = cfg, workload, splits
        self.replicas, self.bounds = replicas, bounds
        self.spec = workload.spec(cfg.scale)
        self.batch_size = cfg.batch_size or self.spec.batch_size
        self.progress = progress
        self.timeout_s = timeout_s
        self.microbatches = microbatches
        if self.batch_size % microbatches:
            raise WorkloadError(f"--microbatches {microbatches} does not divide the batch "
                                f"size {self.batch_size}")
        self.model = workload.build(cfg.scale, {**splits.train.meta, "init_seed": cfg.seed})
        self.metrics = PipelineMetrics()
        init = f"tcp://127.0.0.1:{free_port()}"
        specs = [WorkerSpec(rank, replicas, bounds, workload.name, cfg.scale, cfg.seed,
                            self.batch_size, cfg.lr, weights, in_flight, cfg.data,
                            cfg.max_steps_per_epoch, init, timeout_s, cfg.threads_per_worker(),
                            device.type, fail_at, schedule=schedule,
                            microbatches=microbatches, recompute=recompute,
                            executor=executor)
                 for rank in range(sum(replicas))]
        self.names = [f"rank {r}" for r in range(len(specs))]
        self._start(specs)

    def _start(self, specs: list[WorkerSpec]) -> None:
        """One spawned process per rank; ``controls[rank]``/``results`` are its queues.

        A subclass may start workers another way (``baselines.horovod`` uses horovodrun):
        it sets ``procs`` (handles with exitcode/is_alive/kill/join, named by ``names``),
        ``controls`` (``put``) and ``results`` (``get(timeout)`` raising ``queue.Empty``).
        """
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.controls = [ctx.Queue() for _ in specs]
        self.procs = []
        for ws in specs:
            p = ctx.Process(target=worker_main, args=(ws, self.controls[ws.rank], self.results),
                            daemon=True)
            p.start()
            self.procs.append(p)

    def _collect(self) -> list[EpochReport]:
        # No overall deadline: an epoch may take hours at full scale. Workers bound every
        # wait themselves (comm timeouts), and a dead worker shows up as an exit code.
        reports: dict[int, EpochReport] = {}
        while len(reports) < len(self.controls):
            try:
                kind, rank, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [(self.names[i], p.exitcode) for i, p in enumerate(self.procs)
                        if p.exitcode not in (None, 0)]
                if dead:
                    self._drain_errors_and_fail(dead)
                continue
            if kind == "error":
                self._fail(f"worker rank {rank} failed:\n{payload}")
            reports[rank] = payload
        return [reports[r] for r in range(len(self.controls))]

    def _drain_errors_and_fail(self, dead: list[tuple[str, int]]) -> None:
        try:
            while True:
                kind, rank, payload = self.results.get(timeout=1.0)
                if kind == "error":
                    self._fail(f"worker rank {rank} failed:\n{payload}")
        except queue.Empty:
            pass
        what = ", ".join(f"{r} exit code {c}" for r, c in dead)
        self._fail(f"pipeline workers stopped: {what}")

    def _fail(self, message: str) -> None:
        """Kill and join every worker, then raise: the one way an epoch ends badly."""
        self.close(kill=True)
        raise PipelineFailure(message)

    def train_epoch(self, epoch: int) -> EpochStats:
        t0 = time.time()
        for q in self.controls:
            q.put(("epoch", epoch))
        reports = self._collect()
        end = max(r.end_at for r in reports)
        n_last = self.replicas[-1]
        last = reports[-n_last:]
        losses = [x for r in last for x in r.losses]  # one per microbatch
        steps = sum(len(r.losses) for r in last) // self.microbatches
        if steps == 0:
            raise PipelineFailure("an epoch ran no minibatch: fewer training samples than "
                                  "one minibatch per replica of every stage")
        samples = steps * self.batch_size
        stats = EpochStats(loss_sum=sum(losses) / self.microbatches, steps=steps,
                           samples=samples, time_s=end - t0)
        warm = [r.warm_done_at for r in last if r.warm_done_at is not None]
        if epoch == 0 and warm and steps > self.cfg.warmup_steps:
            stats.timed_samples = samples - self.cfg.warmup_steps * self.batch_size
            stats.timed_s = end - min(warm)
        else:
            stats.timed_samples, stats.timed_s = samples, end - t0
        self._absorb(reports)
        self.metrics.samples += samples
        return stats

    def _absorb(self, reports: list[EpochReport]) -> None:
        m = self.metrics
        m.links = {}
        total = 0
        for r in reports:  # comm counters are cumulative per worker
            for link, b in r.payload.items():
                m.links[link] = b
                total += b
            total += r.allreduce_bytes
        m.bytes_sent = total
        m.busy = {r.rank: (m.busy or {}).get(r.rank, 0.0) + r.busy_s for r in reports}
        m.idle = {r.rank: (m.idle or {}).get(r.rank, 0.0) + r.idle_s for r in reports}
        before = m.action_s or {}
        m.action_s = {r.rank: {k: before.get(r.rank, {}).get(k, 0.0) + r.action_s.get(k, 0.0)
                               for k in {*r.action_s, *before.get(r.rank, {})}}
                      for r in reports}
        m.peak_memory = {r.rank: r.peak_memory for r in reports}
        m.stash_weights = {r.rank: r.stash_weight_bytes for r in reports}
        m.stash_activations = {r.rank: r.stash_activation_bytes for r in reports}
        self.replica_states = {r.rank: r.state for r in reports}
        for r in reports:
            if r.state is not None and r.replica == 0:
                self.model.load_stage_state(self.bounds[r.stage][0], r.state)

    def evaluate(self) -> float:
        return self.workload.evaluate(self.model, self.splits.valid, max(self.batch_size, 128))

    def close(self, kill: bool = False) -> None:
        for q in self.controls:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            if kill and p.is_alive():
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
