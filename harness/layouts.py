"""Which stages a system runs, and with how many replicas: decided once.

Why this module exists: ``run``, ``compare-run`` and ``bench`` (through
``harness.experiments.layout``) and ``simulate`` (``harness.sim.simulator.layout_for``) each
chose between a plan file, ``--config``, a straight pipeline and the planner, and each
repeated the checks (workers against replicas, replicas on straight pipelines, stages
against layers, a plan for a several-stages-per-worker schedule) with their error texts.
Here that choice is one pure function of the system's registry entry and the user's
layout flags; each caller then splits the layers with its own cost model (a local profile
for a run, the profile and cluster for a simulation), which is the only part that differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import UserInputError, WorkloadError, require_int
from harness import systems
from pipedream_impl.schedule import Layout

__all__ = ["CONFIG", "DATA_PARALLEL", "ONE_PROCESS", "PLAN", "PLANNER", "STRAIGHT",
           "LayoutChoice", "choose"]

ONE_PROCESS = "one process"  # the whole model in one worker
DATA_PARALLEL = "data parallel"  # one stage: the whole model, replicated on every worker
PLAN = "plan"  # a plan file's stages, replicas and layer ranges
CONFIG = "config"  # --config's replicas per stage; the caller balances the layers
STRAIGHT = "straight"  # one unreplicated stage per worker; the caller balances the layers
PLANNER = "planner"  # the planner picks stages and replicas on the caller's profile


@dataclass(frozen=True)
class LayoutChoice:
    source: str  # one of the names above
    replicas: tuple[int, ...] | None  # per worker-stage; None: the planner decides
    stages_per_rank: int = 1  # model stages each worker holds (torch's interleaved/V)

    @property
    def stages(self) -> int | None:
        """Model stages in all (None: the planner decides)."""
        return None if self.replicas is None else len(self.replicas) * self.stages_per_rank


def choose(system: systems.System, workers: int, *, config: str | None = None,
           plan: tuple[int, ...] | None = None, plan_layers: int | None = None,
           layers: int | None = None, model: str = "", exact: bool = True,
           stages: int | None = None) -> LayoutChoice:
    """The layout of ``system`` on ``workers`` workers from the user's flags.

    ``plan``: a plan file's replicas per stage (``plan_layers``: the layers it covers);
    ``layers``: the model's layer count, where known (``model`` names it in errors).
    ``exact``: a run uses every worker (``--workers``); a simulation may leave some of the
    cluster's ``workers`` idle, and ``stages`` picks how many a straight pipeline uses.
    """
    if plan is not None and config is not None:
        raise UserInputError("give --plan or --config, not both")
    v = system.stages_per_rank
    if not system.multi_process:
        return LayoutChoice(ONE_PROCESS, (1,))
    if system.kind == "data-parallel":
        if exact and (plan is not None or config is not None):
            raise UserInputError(f"{system.name} replicates the whole model: drop "
                                 "--plan/--config")
        return LayoutChoice(DATA_PARALLEL, (workers,))
    if not exact:
        require_int("--stages", stages, high=workers, why=f"the cluster has {workers} workers")
    flag = "--plan" if plan is not None else "--config"
    if plan is not None and v > 1:
        choice = _several_per_worker_plan(system, plan, workers, exact)
    elif config is not None or plan is not None:
        replicas = plan if plan is not None else Layout.from_config(config).replicas
        shown = "-".join(map(str, replicas))
        if exact and sum(replicas) != workers:
            raise UserInputError(f"the layout {shown} needs {sum(replicas)} workers but "
                                 f"--workers is {workers}; give --workers {sum(replicas)} "
                                 f"or another {flag}")
        if not exact and sum(replicas) > workers:
            raise UserInputError(f"{flag} {shown} needs {sum(replicas)} workers; the "
                                 f"cluster has {workers}")
        choice = LayoutChoice(PLAN if plan is not None else CONFIG, replicas, v)
    elif system.straight:
        choice = LayoutChoice(STRAIGHT, (1,) * (stages or workers), v)
    else:
        return LayoutChoice(PLANNER, None)  # never more stages than layers
    if system.straight and any(r != 1 for r in choice.replicas):
        raise UserInputError(f"{system.name} runs unreplicated stages; got "
                             f"{'-'.join(map(str, choice.replicas))} (use e.g. 1-1)")
    _check_layers(system, choice, config, plan_layers, layers, model)
    return choice


def _several_per_worker_plan(system: systems.System, plan: tuple[int, ...], workers: int,
                             exact: bool) -> LayoutChoice:
    """A plan for a system that holds ``v`` stages per worker lists every model stage:
    ``workers x v`` unreplicated stages, in model order (the schedule places them on the
    workers); e.g. ``pipebench plan --straight`` for ``workers x v`` workers."""
    v = system.stages_per_rank
    shown = "-".join(map(str, plan))
    held = len(plan) // v
    if any(r != 1 for r in plan) or len(plan) % v or (exact and held != workers) or (
            not exact and held > workers):
        raise UserInputError(f"{system.name} runs {v} unreplicated stages per worker, so "
                             f"its plan lists {v * workers} stages of one replica each on "
                             f"{workers} workers (plan for {v * workers} workers with "
                             f"--straight); this plan has {shown}")
    return LayoutChoice(PLAN, (1,) * held, v)


def _check_layers(system: systems.System, choice: LayoutChoice, config: str | None,
                  plan_layers: int | None, layers: int | None, model: str) -> None:
    """A stage needs at least one layer; a plan must cover the model's layers."""
    if layers is None:
        return
    if plan_layers is not None and plan_layers != layers:
        raise WorkloadError(f"plan covers {plan_layers} layers, {model} has {layers}: was it "
                            "made for another workload?")
    n, v = len(choice.replicas), choice.stages_per_rank
    if n > layers:
        what = {PLAN: "--plan", CONFIG: f"--config {config}"}.get(choice.source, "--workers")
        raise UserInputError(f"{what} asks for {n} pipeline stages but {model} has only "
                             f"{layers} layers (a stage needs at least one); use at most "
                             f"{layers} stages")
    if n * v > layers:
        raise UserInputError(f"{system.name} splits {model} into {v} stages per worker, "
                             f"{n * v} stages, but it has only {layers} layers; use at most "
                             f"{layers // v} workers")
