"""RunConfig: what the user asked for, validated once, so library code can trust it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserInputError
from harness import systems
from pipedream_impl.schedule import WEIGHT_MODES
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
    fail_at: tuple[int, int] | None = None  # (rank, minibatch) to raise at: failure tests
    microbatches: int | None = None  # gpipe: default 4 x stages
    recompute: bool = False  # gpipe: re-materialise activations in the backward

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
        if self.weights not in WEIGHT_MODES:
            raise UserInputError(f"--weights must be one of {', '.join(WEIGHT_MODES)}")
        if self.plan is not None and self.config is not None:
            raise UserInputError("give --plan or --config, not both")
        if self.plan is not None and not Path(self.plan).exists():
            raise UserInputError(f"plan {self.plan} does not exist")
        if not system.multi_process and (self.plan or self.config or self.workers > 1):
            raise UserInputError(f"--system {system.name} runs one worker; use a pipeline or "
                                 "data-parallel system with --workers/--plan/--config")
        if self.data is not None and not Path(self.data).exists():
            raise UserInputError(f"data path {self.data} does not exist")

    @property
    def definition(self) -> systems.System:
        """The registry's entry for ``system``."""
        return systems.get(self.system)

    def threads_per_worker(self) -> int:
        if self.threads is not None:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers)
