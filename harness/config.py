"""RunConfig: what the user asked for, validated once, so library code can trust it."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserInputError
from harness import systems
from pipedream_impl.runtime import STAGE_EXECUTOR
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.stage_lr import STAGE_LR_RULES
from pipedream_impl.schedule import WEIGHT_MODES
from pipedream_impl.schedule import registry as schedules
from workloads.base import SCALES

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    system: str
    workload: str
    scale: str = "tiny"
    epochs: int | None = None  # None: the workload's default budget at this scale
    target: float | None = None  # None: the workload's target at this scale
    data: str | None = None  # None: the default (no-download) dataset
    batch_size: int | None = None  # None: the workload's default at this scale
    lr: float | None = None
    seed: int = 0
    workers: int = 1
    threads: int | None = None  # torch threads per worker process; None: cores / workers
    device: str = "auto"  # "auto" picks CUDA when present, else CPU
    warmup_steps: int = 2  # excluded from throughput (not from time-to-target)
    experiment: str = "pipebench"
    max_steps_per_epoch: int | None = None  # for smoke tests and benchmarks
    tags: dict[str, str] = field(default_factory=dict)
    # pipeline systems
    plan: str | None = None  # plan JSON (pipebench plan -o)
    config: str | None = None  # replicas per stage, e.g. "2-1-1"
    weights: str = "stash"  # stash | vertical-sync | none
    in_flight: int | None = None  # None: PipeDream's NOAM; 1: model parallelism
    timeout_s: float = 120.0  # every receive / all-reduce waits at most this long
    fault: Fault | None = None  # injected fault (tests; --inject-fault)
    stall_timeout_s: float | None = None  # watchdog; None: the workload's default per scale
    checkpoint_dir: str | None = None  # save checkpoints here (--checkpoint-dir)
    checkpoint_every_epochs: int = 1
    microbatches: int | None = None  # microbatched pipelines (default: schedule.registry)
    recompute: bool = False  # re-materialise activations in the backward (flush schedules)
    stage_lr: str = "replicas"  # replicated stages: PipeDream's per-stage lr rule, or "same"
    schedule_file: str | None = None  # --system custom / torch-custom: torch's CSV

    def __post_init__(self) -> None:
        system = systems.get(self.system)  # unknown names: a clear error
        if self.scale not in SCALES:
            raise UserInputError(f"unknown scale {self.scale!r}; choose one of: "
                                 f"{', '.join(SCALES)}")
        if self.epochs is not None and self.epochs < 1:
            raise UserInputError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.batch_size is not None and self.batch_size < 1:
            raise UserInputError(f"--batch-size must be positive (got {self.batch_size})")
        if self.workers < 1:
            raise UserInputError(f"--workers must be at least 1 (got {self.workers})")
        if self.warmup_steps < 0:
            raise UserInputError(f"--warmup-steps must be 0 or more (got {self.warmup_steps})")
        if self.threads is not None and self.threads < 1:
            raise UserInputError(f"--threads must be at least 1 (got {self.threads})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserInputError(f"--device must be auto, cpu or cuda (got {self.device!r})")
        if self.stage_lr not in STAGE_LR_RULES:
            raise UserInputError(f"--stage-lr must be one of {', '.join(STAGE_LR_RULES)} "
                                 f"(got {self.stage_lr!r})")
        if self.weights not in WEIGHT_MODES:
            raise UserInputError(f"--weights must be one of {', '.join(WEIGHT_MODES)}")
        if self.recompute:  # a recomputed forward runs on the live weights
            if system.executor != STAGE_EXECUTOR:
                raise UserInputError(f"--recompute: {system.name} does not re-materialise "
                                     "activations (only our runtime's pipelines do); drop "
                                     "--recompute")
            schedules.require_recompute(system.schedule, system.in_flight or self.in_flight,
                                        system.name)
        from_file = system.rules is not None and system.rules.from_file
        if from_file and self.schedule_file is None:
            raise UserInputError(f"--system {system.name} runs a schedule file: give "
                                 "--schedule-file FILE (torch's compute-only CSV)")
        if self.schedule_file is not None and not from_file:
            raise UserInputError(f"--schedule-file: --system {system.name} runs its own "
                                 "schedule; use a system that runs schedule files ("
                                 + ", ".join(s.name for s in systems.SYSTEMS
                                             if s.rules and s.rules.from_file) + ")")
        if self.schedule_file is not None and not Path(self.schedule_file).is_file():
            raise UserInputError(f"--schedule-file {self.schedule_file} does not exist")
        if self.plan is not None and self.config is not None:
            raise UserInputError("give --plan or --config, not both")
        if self.plan is not None and not Path(self.plan).exists():
            raise UserInputError(f"plan {self.plan} does not exist")
        if not system.multi_process and (self.plan or self.config or self.workers > 1):
            raise UserInputError(f"--system {system.name} runs one worker; use a pipeline or "
                                 "data-parallel system with --workers/--plan/--config")
        if self.data is not None and not Path(self.data).exists():
            raise UserInputError(f"data path {self.data} does not exist")
        self._check_resilience(system)
        self._check_ranges()
        self._check_layout(system)

    def _check_resilience(self, system: systems.System) -> None:
        """The watchdog, checkpoint and fault-injection options."""
        import math

        if self.stall_timeout_s is not None and not (
                math.isfinite(self.stall_timeout_s) and self.stall_timeout_s > 0):
            raise UserInputError(f"--stall-timeout must be a positive number of seconds "
                                 f"(got {self.stall_timeout_s})")
        if self.checkpoint_every_epochs < 1:
            raise UserInputError(f"--checkpoint-every-epochs must be at least 1 "
                                 f"(got {self.checkpoint_every_epochs})")
        if self.checkpoint_dir is not None and not system.checkpoints:
            raise UserInputError(f"--system {system.name} cannot checkpoint (its engine keeps "
                                 f"state we do not capture); drop --checkpoint-dir")
        if self.checkpoint_dir is not None and Path(self.checkpoint_dir).is_file():
            raise UserInputError(f"--checkpoint-dir {self.checkpoint_dir} is a file; give a "
                                 f"directory (created if missing)")
        if self.fault is not None and not system.multi_process:
            raise UserInputError(f"--inject-fault acts on the workers of a multi-process "
                                 f"system; --system {system.name} has none")
        if self.fault is not None and self.fault.action not in system.actions:
            raise UserInputError(f"--inject-fault: --system {system.name} has no action "
                                 f"{self.fault.action!r}; its workers act "
                                 f"{', '.join(system.actions)}")
        if self.fault is not None and self.fault.rank >= self.workers:
            raise UserInputError(f"--inject-fault names rank {self.fault.rank}, but the run "
                                 f"has {self.workers} worker(s)")

    def _check_ranges(self) -> None:
        """Numbers in range: finite, positive where they must be, workers the machine can
        hold (more worker processes than 8 per core only time-share the CPU and exhaust
        memory long before they finish; PIPEBENCH_MAX_WORKERS overrides the cap)."""
        import math

        from core.errors import require_int, require_number

        require_number("--lr", self.lr, example="0.01")
        require_number("--timeout", self.timeout_s, example="120")
        if self.target is not None and not math.isfinite(self.target):
            raise UserInputError(f"--target must be a finite number (got {self.target})")
        require_int("--seed", self.seed, low=0, high=2**32 - 1)
        require_int("--max-steps", self.max_steps_per_epoch)
        require_int("--microbatches", self.microbatches)
        require_int("--in-flight", self.in_flight)
        cores = os.cpu_count() or 1
        override = os.environ.get("PIPEBENCH_MAX_WORKERS", "")
        if override and not override.isdigit():
            raise UserInputError(f"PIPEBENCH_MAX_WORKERS must be a whole number (got "
                                 f"{override!r})")
        cap = int(override) if override else 8 * cores
        if self.workers > cap:
            raise UserInputError(
                f"--workers {self.workers} would start {self.workers} worker processes on "
                f"{cores} core(s); the limit is {cap}"
                + ("" if override else " (8 per core): more only time-share the CPU")
                + f"; use fewer workers, or set PIPEBENCH_MAX_WORKERS={self.workers} to "
                "allow it")

    def _check_layout(self, system: systems.System) -> None:
        """--config / --plan / --workers against each other and the model, before anything
        starts: a pipeline cannot have more stages than the model has layers."""
        from core.errors import WorkloadError
        from pipedream_impl.planner.plan import load_plan
        from pipedream_impl.schedule import Layout

        if not system.multi_process:
            return
        if system.kind == "data-parallel" and (self.plan or self.config):
            raise UserInputError(f"{self.system} replicates the whole model: drop "
                                 "--plan/--config")
        if system.stages_per_rank > 1 and self.plan:
            raise UserInputError(f"{self.system} splits the model into {system.stages_per_rank}"
                                 " stages per worker itself; drop --plan (a plan has one "
                                 "stage per worker)")
        layers = _layer_count(self.workload, self.scale)
        ranges: tuple[tuple[int, int], ...] = ()
        if self.config is not None:
            replicas = Layout.from_config(self.config).replicas
        elif self.plan is not None:
            plan = load_plan(self.plan)
            replicas = tuple(s.replicas for s in plan.stages)
            ranges = tuple(s.layers for s in plan.stages)
        elif system.straight:
            replicas = (1,) * self.workers
        else:
            return  # data parallel, or the planner's choice (never more stages than layers)
        where = f"--plan {self.plan}" if self.plan else f"--config {self.config}"
        if sum(replicas) != self.workers and (self.config or self.plan):
            raise UserInputError(f"the layout {'-'.join(map(str, replicas))} needs "
                                 f"{sum(replicas)} workers but --workers is {self.workers}; "
                                 f"give --workers {sum(replicas)} or another {where.split()[0]}")
        if system.straight and any(r != 1 for r in replicas):
            raise UserInputError(f"{self.system} runs unreplicated stages; got "
                                 f"{'-'.join(map(str, replicas))} (use e.g. 1-1)")
        if layers is None:
            return
        model = f"{self.workload}/{self.scale}"
        if ranges and ranges[-1][1] != layers:
            raise WorkloadError(f"plan covers {ranges[-1][1]} layers, {model} has {layers}: "
                                "was it made for another workload?")
        if len(replicas) > layers:
            what = "--workers" if not (self.config or self.plan) else where
            raise UserInputError(f"{what} asks for {len(replicas)} pipeline stages but "
                                 f"{model} has only {layers} layers (a stage needs at least "
                                 f"one); use at most {layers} stages")
        per = system.stages_per_rank
        if len(replicas) * per > layers:
            raise UserInputError(f"{self.system} splits {model} into {per} stages per worker, "
                                 f"{len(replicas) * per} stages, but it has only {layers} "
                                 f"layers; use at most {layers // per} workers")

    @property
    def definition(self) -> systems.System:
        """The registry's entry for ``system``."""
        return systems.get(self.system)

    def stall_timeout(self) -> float:
        """The watchdog's bound: the flag, else the workload's default at this scale."""
        if self.stall_timeout_s is not None:
            return self.stall_timeout_s
        from workloads import registry  # torch: only when a run starts

        return registry.get(self.workload).stall_timeout_s(self.scale)

    def threads_per_worker(self) -> int:
        if self.threads is not None:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers)


@functools.lru_cache(maxsize=32)
def _layer_count(workload: str, scale: str) -> int | None:
    """Layers of ``workload`` at ``scale``, built on the meta device (no memory, no data);
    None where a model cannot be built that way (its run checks the layout later)."""
    import torch

    from workloads import registry

    wl = registry.get(workload)  # unknown names and scales: a clear error
    wl.spec(scale)
    try:
        with torch.device("meta"):
            return len(wl.build(scale, {}).layers)
    except Exception:  # noqa: BLE001 - only a shortcut; the run checks again
        return None
