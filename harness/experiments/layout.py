"""Turn --plan / --config / --workers into stage replicas and layer ranges for the runtime.
The rule, for the runtime: a plan file if given, else a config (layers balanced on a quick
local profile: forward + backward + the optimizer step, each measured per layer here),
else the planner on a local profile; straight pipelines default to one stage per worker,
data parallelism to one stage replicated on every worker. A split that puts a tied
parameter on two stages runs on our runtime (``pipedream_impl.runtime.ties`` keeps the
copies equal) and is refused for the other engines.
"""

from __future__ import annotations

import torch

from core.errors import WorkloadError
from harness import systems
from harness.config import RunConfig
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.plan import balanced_bounds, load_plan, plan_profile
from pipedream_impl.profiling.profiler import profile_workload, update_ms
from pipedream_impl.runtime import STAGE_EXECUTOR
from pipedream_impl.runtime.ties import check_ties, find_ties
from pipedream_impl.schedule import Layout
from workloads.base import Workload

__all__ = ["LOCAL_BANDWIDTH", "pipeline_layout"]

LOCAL_BANDWIDTH = 1e9  # bytes/s assumed between local worker processes when planning


def _updates(workload: Workload, cfg: RunConfig, device: torch.device) -> list[float]:
    """Each layer's optimizer step (ms), measured here: once per minibatch on every stage,
    so it is balanced with the forward and backward (the profile has no update time)."""
    from workloads.recipe import make_optimizer

    splits = workload.default_data(cfg.scale, cfg.seed)
    model = workload.build(cfg.scale, {**splits.train.meta, "init_seed": cfg.seed})
    spec = workload.spec(cfg.scale)
    return update_ms(model, lambda ps: make_optimizer(spec, ps, cfg.lr), device)


def pipeline_layout(cfg: RunConfig, workload: Workload, batch_size: int,
                    device: torch.device) \
        -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], str]:
    """(replicas per stage, layer range per stage, how it was chosen); a system that holds
    several stages per worker gets workers x that many unreplicated stages.
    ``RunConfig`` has already checked --plan/--config against --workers and the system
    (no layout for data parallelism, no replicas for straight pipelines)."""
    system = cfg.definition
    if system.kind == "data-parallel":  # one stage, every worker a replica of the whole model
        n = len(workload.build(cfg.scale, {}).layers)
        return (cfg.workers,), ((0, n),), "data parallel (whole model on every worker)"
    if cfg.plan is not None:
        plan = load_plan(cfg.plan)
        replicas = tuple(s.replicas for s in plan.stages)
        bounds = tuple(tuple(s.layers) for s in plan.stages)
        how = f"plan {cfg.plan} ({plan.config})"
    else:
        prof = profile_workload(workload, cfg.scale, batch_size, device, steps=3)
        config = cfg.config
        if config is None and system.straight:
            config = "-".join(["1"] * cfg.workers)  # straight: these systems don't replicate
        if config is not None:
            replicas = Layout.from_config(config).replicas
            per = system.stages_per_rank  # torch's interleaved/V schedules: v stages a rank
            bounds = balanced_bounds([n.forward_ms + n.backward_ms + u for n, u in
                                      zip(prof.layers, _updates(workload, cfg, device),
                                          strict=True)],
                                     (1,) * (len(replicas) * per) if per > 1 else replicas)
            how = f"config {config}, layers balanced on a local profile" + (
                f" into {len(bounds)} stages ({per} per worker)" if per > 1 else "")
        else:
            plan = plan_profile(prof, Cluster((Level(cfg.workers, LOCAL_BANDWIDTH),)))
            replicas = tuple(s.replicas for s in plan.stages)
            bounds = tuple(tuple(s.layers) for s in plan.stages)
            how = f"planned here ({plan.config}) from a local profile"
    model = workload.build(cfg.scale, {})
    if bounds[-1][1] != len(model.layers):  # RunConfig checks it too, where its meta-device
        # model could be built
        raise WorkloadError(f"plan covers {bounds[-1][1]} layers, {workload.name}/{cfg.scale} "
                            f"has {len(model.layers)}: was it made for another workload?")
    ties = find_ties(model, bounds)
    if ties and system.executor != STAGE_EXECUTOR:
        ours = ", ".join(s.name for s in systems.SYSTEMS if s.executor == STAGE_EXECUTOR)
        raise WorkloadError(f"this split puts a tied parameter ({ties[0].names[0]}) on stages "
                            f"{ties[0].stages[0]} and {ties[0].stages[1]}, and {cfg.system} "
                            f"keeps no tied copies in sync: use {ours}, or keep the tied "
                            "layers on one stage")
    check_ties(model, bounds, replicas)  # what our runtime's tie rule cannot cover
    return replicas, bounds, how
