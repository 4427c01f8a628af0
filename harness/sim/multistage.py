"""Schedules with several stages per worker and a split backward, simulated from the
engine's own action lists: torch.distributed.pipelining's ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble`` (ZB1P), ``ScheduleZBVZeroBubble`` and
``ScheduleDualPipeV``, the peers ``baselines.torch_peers`` runs.

torch's ``pipeline_order`` (``torch_peers.compute_order``: each rank's compute actions in
the order torch's runtime executes them) becomes our action lists with
``pipedream_impl.schedule.compute_order`` (stages per rank looped or V-shaped as torch
places them, messages between ranks, a hand-off within one, one optimizer step per rank
after each step), and runs on the one event engine with the cluster cost model of
``harness.sim.costs``: a stage's F and B from the profile, I and W split by
``StageCost.weight_grad_s``, FIFO links per direction, memory per rank counted by
``costs.memory_per_worker``.
"""

from __future__ import annotations

from harness import systems
from harness.sim.costs import ClusterCosts, StageCost, stage_costs
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.schedule import Action, Schedule, simulate
from pipedream_impl.schedule.compute_order import from_compute_order

__all__ = ["MULTISTAGE_STEPS", "run", "torch_schedule"]

MULTISTAGE_STEPS = 6  # minibatches run for several-stages-per-worker schedules: every
# step flushes, so the steady state (between the first and the last step's end) shows at 2


def torch_schedule(schedule: str, workers: int, microbatches: int, per_rank: int,
                   steps: int) -> Schedule:
    """``steps`` minibatches of the torch schedule (a registry schedule with a
    ``torch_class``) as our action lists."""
    from baselines.torch_peers import compute_order

    one = compute_order(schedule, workers, microbatches, per_rank)
    return from_compute_order([list(row) for row in one], steps, microbatches)


def run(profile: Profile, cluster: Cluster, system: systems.System,
        groups: list[tuple[str, ...]], placement: list[int], steps: int, microbatches: int,
        share: float, compute_factor: float, latency_s: float) \
        -> tuple[Schedule, list[StageCost], ClusterCosts,
                 list[list[tuple[float, float, Action]]]]:
    """Simulate ``steps`` minibatches of ``system`` on ``cluster``: the schedule, the
    stages' costs, the cost model (bytes per level) and the timeline."""
    sched = torch_schedule(system.schedule, len(placement), microbatches,
                           system.stages_per_rank, steps)
    stages = stage_costs(profile, groups)
    costs = ClusterCosts(sched.layout, stages, cluster, placement, share, compute_factor,
                         latency_s, "ring", overlap_allreduce=False)
    return sched, stages, costs, simulate(sched, costs=costs)
