"""Turn --plan / --config / --workers into stage replicas and layer ranges for the runtime,
and check a run's files and layout before it starts (``check_run``).
Which layout (``harness.layouts.choose``, shared with the simulator): a plan file if given,
else a config, else the planner; straight pipelines default to one stage per worker, data
parallelism to one stage replicated on every worker. Here a config's layers are balanced
on a quick local profile (forward + backward + the optimizer step, each measured per
layer here) and the planner runs on that profile. A split that puts a tied
parameter on two stages runs on our runtime (``pipedream_impl.runtime.ties`` keeps the
copies equal) and is refused for the other engines.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from core.errors import UserInputError, WorkloadError
from harness import layouts, systems
from harness.config import RunConfig
from harness.experiments.link import bandwidth_source, local_bandwidth
from harness.experiments.stage_times import predict
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.plan import load_plan, plan_profile
from pipedream_impl.planner.splits import balanced_bounds
from pipedream_impl.profiling.profiler import profile_workload, update_ms
from pipedream_impl.runtime.ties import check_ties, find_ties
from workloads.base import Workload

__all__ = ["check_run", "layer_count", "pipeline_layout"]


def _updates(workload: Workload, cfg: RunConfig, device: torch.device) -> list[float]:
    """Each layer's optimizer step (ms), measured here: once per minibatch on every stage,
    so it is balanced with the forward and backward (the profile has no update time)."""
    from workloads.recipe import make_optimizer

    splits = workload.default_data(cfg.scale, cfg.seed)
    model = workload.build(cfg.scale, {**splits.train.meta, "init_seed": cfg.seed})
    spec = workload.spec(cfg.scale)
    return update_ms(model, lambda ps: make_optimizer(spec, ps, cfg.lr), device)


def check_run(cfg: RunConfig) -> None:
    """What ``RunConfig`` leaves to the edge, before a run starts: the files it names exist
    (a plan is read) and its layout fits the model (built on the meta device: no memory,
    no data) by the one layout rule, ``harness.layouts.choose``."""
    p, f = cfg.pipeline, cfg.failures
    for flag, path in (("--schedule-file", p.schedule_file), ("plan", p.plan),
                       ("data path", cfg.data.path)):
        if path is not None and not Path(path).exists():
            raise UserInputError(f"{flag} {path} does not exist")
    if f.checkpoint_dir is not None and Path(f.checkpoint_dir).is_file():
        raise UserInputError(f"--checkpoint-dir {f.checkpoint_dir} is a file; give a "
                             f"directory (created if missing)")
    plan = load_plan(p.plan) if p.plan is not None else None
    layouts.choose(cfg.definition, cfg.workers, config=p.config,
                   plan=tuple(s.replicas for s in plan.stages) if plan else None,
                   plan_layers=plan.stages[-1].layers[1] if plan else None,
                   layers=layer_count(cfg.workload, cfg.scale),
                   model=f"{cfg.workload}/{cfg.scale}")


@functools.lru_cache(maxsize=32)
def layer_count(workload: str, scale: str) -> int | None:
    """Layers of ``workload`` at ``scale``, built on the meta device; None where a model
    cannot be built that way (``pipeline_layout`` checks the real model again)."""
    from workloads import registry

    wl = registry.get(workload)  # unknown names and scales: a clear error
    wl.spec(scale)
    try:
        with torch.device("meta"):
            return len(wl.build(scale, {}).layers)
    except Exception:  # noqa: BLE001 - only a shortcut; the run checks again
        return None


def pipeline_layout(cfg: RunConfig, workload: Workload, batch_size: int,
                    device: torch.device) \
        -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], str, list[float] | None,
                 tuple[int, ...] | None]:
    """(replicas per stage, layer range per stage, how it was chosen, each stage's
    predicted compute per minibatch in ms: None for data parallelism, and a plan's
    minibatches in flight per stage: None without a plan); a system that holds
    several stages per worker gets workers x that many unreplicated stages. Which layout is
    ``harness.layouts.choose``'s decision; here the layers are split on a local profile
    (forward + backward + each layer's optimizer step), which also gives each stage's
    predicted time (``stage_times.predict``); a plan file's stages carry their own (its
    profile's compute, no update, scaled from the plan's batch size to the run's minibatch
    in proportion) and take no local profile, which on a GPU would hold the whole model
    that the plan splits."""
    system, p = cfg.definition, cfg.pipeline
    plan = load_plan(p.plan) if p.plan is not None else None
    model = workload.build(cfg.scale, {})
    choice = layouts.choose(system, cfg.workers, config=p.config,
                            plan=tuple(s.replicas for s in plan.stages) if plan else None,
                            plan_layers=plan.stages[-1].layers[1] if plan else None,
                            layers=len(model.layers), model=f"{workload.name}/{cfg.scale}")
    if choice.source == layouts.DATA_PARALLEL:  # every worker a replica of the whole model
        return choice.replicas, ((0, len(model.layers)),), \
            "data parallel (whole model on every worker)", None, None
    depths = None
    if choice.source == layouts.PLAN:
        replicas = choice.replicas
        bounds = tuple(tuple(s.layers) for s in plan.stages)
        how = f"plan {p.plan} ({plan.config})"
        per = batch_size / plan.batch_size if plan.batch_size else 1.0  # the plan's batch
        predicted = [1e3 * s.predicted_time_s * per for s in plan.stages]  # -> this run's
        # a plan's depths are its stages', one per worker where each holds one stage
        depths = plan.depths if plan.depths and len(plan.depths) == len(replicas) else None
    else:
        prof = profile_workload(workload, cfg.scale, batch_size, device, steps=3)
        layer_ms = [n.forward_ms + n.backward_ms + u for n, u in
                    zip(prof.layers, _updates(workload, cfg, device), strict=True)]
        if choice.source == layouts.PLANNER:
            bandwidth = local_bandwidth()
            planned = plan_profile(prof, Cluster((Level(cfg.workers, bandwidth),)))
            replicas = tuple(s.replicas for s in planned.stages)
            bounds = tuple(tuple(s.layers) for s in planned.stages)
            depths = planned.depths or None
            how = f"planned here ({planned.config}) from a local profile at " \
                f"{bandwidth / 1e9:.2g} GB/s between workers ({bandwidth_source()})"
        else:  # --config, or a straight pipeline: one stage per worker
            replicas, per = choice.replicas, choice.stages_per_rank
            bounds = balanced_bounds(layer_ms, (1,) * choice.stages if per > 1 else replicas)
            how = f"config {'-'.join(map(str, replicas))}, layers balanced on a local " \
                "profile" + (f" into {len(bounds)} stages ({per} per worker)"
                             if per > 1 else "")
        predicted = predict(layer_ms, replicas, bounds) if system.stages_per_rank == 1 \
            else None
    ties = find_ties(model, bounds)
    if ties and not system.syncs_ties:
        ours = ", ".join(s.name for s in systems.SYSTEMS if s.syncs_ties)
        raise WorkloadError(f"this split puts a tied parameter ({ties[0].names[0]}) on stages "
                            f"{ties[0].stages[0]} and {ties[0].stages[1]}, and {cfg.system} "
                            f"keeps no tied copies in sync: use {ours}, or keep the tied "
                            "layers on one stage")
    check_ties(model, bounds, replicas)  # what our runtime's tie rule cannot cover
    return replicas, bounds, how, predicted, depths
