"""harness/experiments/layout.py ``pipeline_layout``: a plan file's in-flight depths reach
a run of a system that holds one stage per worker, and not one that holds several (its plan
lists every model stage: more depths than the run has workers)."""

from __future__ import annotations

import torch

from harness.config import RunConfig
from harness.experiments.layout import pipeline_layout
from pipedream_impl.planner.plan import Plan, Stage
from workloads.registry import get

WL = get("vgg16")  # tiny: 40 layers


def _plan(tmp_path, stages: int, depths: tuple[int, ...]) -> str:
    cut = [40 * i // stages for i in range(stages + 1)]
    plan = Plan(tuple(Stage((a, b), 1, (i,), 1e-3) for i, (a, b) in
                      enumerate(zip(cut, cut[1:], strict=False))), stages,
                {"time_per_minibatch_s": 1e-3}, depths=depths)
    path = tmp_path / f"plan-{stages}.json"
    path.write_text(plan.to_json())
    return str(path)


def _layout(system: str, workers: int, plan: str):  # noqa: ANN202
    cfg = RunConfig.from_flags(system=system, workload="vgg16", scale="tiny",
                               workers=workers, plan=plan)
    return pipeline_layout(cfg, WL, 32, torch.device("cpu"))


def test_a_plans_depths_reach_a_run_with_one_stage_per_worker(tmp_path) -> None:
    replicas, bounds, _, _, depths = _layout("pipedream", 2, _plan(tmp_path, 2, (3, 1)))
    assert (replicas, bounds, depths) == ((1, 1), ((0, 20), (20, 40)), (3, 1))


def test_a_several_stages_per_worker_run_keeps_its_schedules_own_warm_up(tmp_path) -> None:
    replicas, bounds, _, _, depths = _layout("torch-interleaved-1f1b", 2,
                                             _plan(tmp_path, 4, (5, 4, 3, 1)))
    assert replicas == (1, 1) and len(bounds) == 4 and depths is None
