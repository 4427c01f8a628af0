"""RunConfig: what the user asked for, validated once, so library code can trust it.

In sections (the run itself, its data, the pipeline options, failure handling), keyword
only, each default written once: the runtime's (``pipedream_impl.runtime``, the schedule
package's weight modes, the per-stage lr rules) are read here, and the CLI's flags read
theirs from these classes. Validation is pure: nothing here opens a file or
builds a model; ``harness.experiments.layout.check_run`` does that at the edge, before a
run starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from core.errors import UserInputError
from harness import systems
from pipedream_impl.runtime import (
    LAUNCHERS,
    STAGE_EXECUTOR,
    TIMEOUT_S,
    WARMUP_STEPS,
)
from pipedream_impl.runtime.faults import EVERY, Fault
from pipedream_impl.runtime.stage_lr import STAGE_LR_RULES
from pipedream_impl.schedule import WEIGHT_MODES
from pipedream_impl.schedule import registry as schedules

__all__ = ["DataOptions", "FailureOptions", "PipelineOptions", "RunConfig", "SECTIONS"]



@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """Which data a run reads, and how much of it."""
    path: str | None = None  # a real dataset (--data); None: the built-in, no-download one
    batch_size: int | None = None  # the global minibatch; None: the workload's at this scale
    max_steps_per_epoch: int | None = None  # cap on minibatches per epoch (smoke, benchmarks)


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """The layout and the pipeline systems' own options."""
    plan: str | None = None  # plan JSON (pipebench plan -o)
    config: str | None = None  # replicas per stage, e.g. "2-1-1"
    weights: str = WEIGHT_MODES[0]  # stash | vertical-sync | none
    in_flight: int | None = None  # None: PipeDream's per-stage warm-up; 1: model parallelism
    microbatches: int | None = None  # microbatched pipelines (default: schedule.registry)
    recompute: bool = False  # re-materialise activations in the backward
    stage_lr: str = STAGE_LR_RULES[0]  # replicated stages: PipeDream's rule, or "same"
    schedule_file: str | None = None  # --system custom / torch-custom: torch's CSV


@dataclass(frozen=True, kw_only=True)
class FailureOptions:
    """What bounds a run and how it survives faults."""
    timeout_s: float = TIMEOUT_S  # every receive / all-reduce waits at most this long
    fault: Fault | None = None  # injected fault (tests; --inject-fault)
    stall_timeout_s: float | None = None  # watchdog; None: the workload's default per scale
    checkpoint_dir: str | None = None  # save checkpoints here (--checkpoint-dir)
    checkpoint_every_epochs: int = 1


SECTIONS = {"data": DataOptions, "pipeline": PipelineOptions, "failures": FailureOptions}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What the user asked for, in sections; checked once, without touching files or
    building models (``harness.experiments.layout.check_run`` does that at the edge)."""
    system: str
    workload: str
    scale: str = "tiny"
    epochs: int | None = None  # None: the workload's default budget at this scale
    target: float | None = None  # None: the workload's target at this scale
    lr: float | None = None  # None: the workload's
    seed: int = 0
    workers: int = 1
    threads: int | None = None  # torch threads per worker process; None: cores / workers
    device: str = "auto"  # "auto" picks CUDA when present, else CPU
    warmup_steps: int = WARMUP_STEPS  # excluded from throughput, not from TTA
    experiment: str = "pipebench"
    tags: dict[str, str] = field(default_factory=dict)
    launcher: str = LAUNCHERS[0]  # local | srun (workers across a Slurm allocation's nodes)
    data: DataOptions = field(default_factory=DataOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    failures: FailureOptions = field(default_factory=FailureOptions)

    @classmethod
    def from_flags(cls, **flags: object) -> RunConfig:
        """A config from flat keyword arguments (the CLI's flags, a checkpoint's saved
        config, tests): each name goes to its section (``data`` is the dataset path)."""
        sections: dict[str, dict] = {name: {} for name in SECTIONS}
        owner = {f.name: (name, f.name) for name, kind in SECTIONS.items()
                 for f in fields(kind) if (name, f.name) != ("data", "path")}
        owner["data"] = ("data", "path")
        top: dict = {}
        for key, value in flags.items():
            if key in owner:
                section, name = owner[key]
                sections[section][name] = value
            else:
                top[key] = value
        return cls(**top, **{n: SECTIONS[n](**kw) for n, kw in sections.items()})

    def flat(self) -> dict:
        """The flat form ``from_flags`` reads (what a checkpoint's run.json keeps)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SECTIONS}
        for name in SECTIONS:  # field by field: a Fault stays a Fault (asdict would not)
            section = getattr(self, name)
            for f in fields(section):
                out["data" if (name, f.name) == ("data", "path") else f.name] = \
                    getattr(section, f.name)
        return out

    def __post_init__(self) -> None:
        from workloads.base import SCALES  # torch: not when the CLI starts

        system = systems.get(self.system)  # unknown names: a clear error
        if self.scale not in SCALES:
            raise UserInputError(f"unknown scale {self.scale!r}; choose one of: "
                                 f"{', '.join(SCALES)}")
        if self.epochs is not None and self.epochs < 1:
            raise UserInputError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.data.batch_size is not None and self.data.batch_size < 1:
            raise UserInputError(f"--batch-size must be positive (got {self.data.batch_size})")
        if self.workers < 1:
            raise UserInputError(f"--workers must be at least 1 (got {self.workers})")
        if self.warmup_steps < 0:
            raise UserInputError(f"--warmup-steps must be 0 or more (got {self.warmup_steps})")
        if self.threads is not None and self.threads < 1:
            raise UserInputError(f"--threads must be at least 1 (got {self.threads})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserInputError(f"--device must be auto, cpu or cuda (got {self.device!r})")
        self._check_pipeline(system)
        if not system.multi_process and (self.pipeline.plan or self.pipeline.config
                                         or self.workers > 1):
            raise UserInputError(f"--system {system.name} runs one worker; use a pipeline or "
                                 "data-parallel system with --workers/--plan/--config")
        self._check_resilience(system)
        self._check_ranges()
        self.worker_launcher()  # --launcher against the system

    def worker_launcher(self) -> str | None:
        """The ``module:Class`` that starts this run's workers (None: one process): the
        system's own here, its ``cluster_launcher`` under ``--launcher srun``."""
        own = self.definition.launcher
        if self.launcher not in (LAUNCHERS[0], "srun"):
            raise UserInputError(f"--launcher {self.launcher}: a run itself starts its "
                                 f"workers with local or srun (--launcher slurm submits a "
                                 f"job that runs with srun)")
        if self.launcher == "srun" and own is not None:
            return self.definition.cluster_launcher
        return own

    def _check_pipeline(self, system: systems.System) -> None:
        """The pipeline options against the system (files are checked at the edge)."""
        p = self.pipeline
        if p.stage_lr not in STAGE_LR_RULES:
            raise UserInputError(f"--stage-lr must be one of {', '.join(STAGE_LR_RULES)} "
                                 f"(got {p.stage_lr!r})")
        if p.weights not in WEIGHT_MODES:
            raise UserInputError(f"--weights must be one of {', '.join(WEIGHT_MODES)}")
        if p.recompute:  # a recomputed forward runs on the live weights
            if system.executor != STAGE_EXECUTOR:
                raise UserInputError(f"--recompute: {system.name} does not re-materialise "
                                     "activations (only our runtime's pipelines do); drop "
                                     "--recompute")
            schedules.require_recompute(system.schedule, system.in_flight or p.in_flight,
                                        system.name)
        from_file = system.rules is not None and system.rules.from_file
        if from_file and p.schedule_file is None:
            raise UserInputError(f"--system {system.name} runs a schedule file: give "
                                 "--schedule-file FILE (torch's compute-only CSV)")
        if p.schedule_file is not None and not from_file:
            raise UserInputError(f"--schedule-file: --system {system.name} runs its own "
                                 "schedule; use a system that runs schedule files ("
                                 + ", ".join(s.name for s in systems.SYSTEMS
                                             if s.rules and s.rules.from_file) + ")")
        if p.plan is not None and p.config is not None:
            raise UserInputError("give --plan or --config, not both")

    def _check_resilience(self, system: systems.System) -> None:
        """The watchdog, checkpoint and fault-injection options."""
        import math

        f = self.failures
        if f.stall_timeout_s is not None and not (
                math.isfinite(f.stall_timeout_s) and f.stall_timeout_s > 0):
            raise UserInputError(f"--stall-timeout must be a positive number of seconds "
                                 f"(got {f.stall_timeout_s})")
        if f.checkpoint_every_epochs < 1:
            raise UserInputError(f"--checkpoint-every-epochs must be at least 1 "
                                 f"(got {f.checkpoint_every_epochs})")
        if f.checkpoint_dir is not None and not system.checkpoints:
            raise UserInputError(f"--system {system.name} cannot checkpoint (its engine keeps "
                                 f"state we do not capture); drop --checkpoint-dir")
        if f.fault is not None and not system.multi_process:
            raise UserInputError(f"--inject-fault acts on the workers of a multi-process "
                                 f"system; --system {system.name} has none")
        if f.fault is not None and f.fault.action not in (*system.actions, EVERY):
            raise UserInputError(f"--inject-fault: --system {system.name} has no action "
                                 f"{f.fault.action!r}; its workers act "
                                 f"{', '.join(system.actions)}")
        if f.fault is not None and f.fault.rank >= self.workers:  # (-1: every rank)
            raise UserInputError(f"--inject-fault names rank {f.fault.rank}, but the run "
                                 f"has {self.workers} worker(s)")

    def _check_ranges(self) -> None:
        """Numbers in range: finite, positive where they must be, workers the machine can
        hold (more worker processes than 8 per core only time-share the CPU and exhaust
        memory long before they finish; PIPEBENCH_MAX_WORKERS overrides the cap)."""
        import math

        from core.errors import require_int, require_number

        require_number("--lr", self.lr, example="0.01")
        require_number("--timeout", self.failures.timeout_s, example="120")
        if self.target is not None and not math.isfinite(self.target):
            raise UserInputError(f"--target must be a finite number (got {self.target})")
        require_int("--seed", self.seed, low=0, high=2**32 - 1)
        require_int("--max-steps", self.data.max_steps_per_epoch)
        require_int("--microbatches", self.pipeline.microbatches)
        require_int("--in-flight", self.pipeline.in_flight)
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

    @property
    def definition(self) -> systems.System:
        """The registry's entry for ``system``."""
        return systems.get(self.system)

    def replace(self, **changes: object) -> RunConfig:
        """This config with ``changes``, named flat as in ``from_flags``."""
        return RunConfig.from_flags(**{**self.flat(), **changes})

    def stall_timeout(self) -> float:
        """The watchdog's bound: the flag, else the workload's default at this scale."""
        if self.failures.stall_timeout_s is not None:
            return self.failures.stall_timeout_s
        from workloads import registry  # torch: only when a run starts

        return registry.get(self.workload).stall_timeout_s(self.scale)

    def threads_per_worker(self) -> int:
        """``threads``, else this machine's cores shared by its workers (under ``--launcher
        srun``: the job's CPUs on this node, by the workers of one node)."""
        if self.threads is not None:
            return self.threads
        if self.launcher == "srun":
            cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
            nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1)
            return max(1, cpus // max(1, self.workers // nodes))
        return max(1, (os.cpu_count() or 1) // self.workers)
