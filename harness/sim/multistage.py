"""Schedules with several stages per worker and a split backward, simulated from the
engine's own action lists: torch.distributed.pipelining's ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble`` (ZB1P), ``ScheduleZBVZeroBubble`` and
``ScheduleDualPipeV``, the peers ``baselines.torch_peers`` runs.

Our schedule engine (``pipedream_impl.schedule``) runs one stage per rank with a whole
backward; these schedules hold v stages per rank (looped or V-shaped, ``stage_ranks``) and
split the backward into I (gradient of the input) and W (gradient of the weights), so
this module has its own small event engine over torch's ``pipeline_order`` (each rank's
compute actions in the order torch's runtime executes them, read with torch's
``get_schedule_ops``; ``OVERLAP_F_B`` runs its two parts one after the other). Steps
(minibatches) follow each other, each ending in one optimizer step per rank (a flush).

Costs, as ``harness.sim.costs`` charges them (``action_s``): a stage's F and B from the
profile (its share of the profiled batch, divided by ``compute_factor``); W is
``StageCost.weight_grad_s``, I the rest; a message leaves when its producer ends, one at a time per
directed link, ``tensors x latency + bytes / bandwidth`` of the level the two ranks share;
a hand-off between two stages of one rank (the V's turn) is free.

Memory per rank: its stages' weights (+ optimizer slots), one version (every step
flushes), and activations of the units whose forward ran and whose weight gradient
(W, or B where unsplit) has not: the autograd graph torch keeps until then.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cache

from core.errors import UserInputError
from harness.sim.costs import StageCost, Topology, action_s, stage_costs
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.schedule import Action

__all__ = ["Op", "OrderRun", "as_actions", "engine_order", "simulate_order"]


@dataclass(frozen=True)
class Op:
    kind: str  # F, I (input gradient), W (weight gradient), B (whole backward), U (step)
    stage: int
    mb: int  # microbatch, counted over the whole run (step k's j-th is k * m + j)


@cache
def _torch_order(cls_name: str, workers: int, microbatches: int,
                 per_rank: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    import torch.distributed.pipelining as pp
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    try:
        ops = get_schedule_ops(getattr(pp, cls_name), workers, microbatches, per_rank)
    except ValueError as e:  # the schedule's own check (e.g. microbatches vs stages)
        raise UserInputError(f"{cls_name} with {workers} workers and {microbatches} "
                             f"microbatches: {e}") from None
    out = []
    for row in ops:
        acts = []
        for a in row:
            if a is None:
                continue
            for part in a.sub_actions or (a,):
                acts.append((part.computation_type.value, part.stage_index,
                             part.microbatch_index))
        out.append(tuple(acts))
    return tuple(out)


def engine_order(schedule: str, workers: int, microbatches: int, per_rank: int,
                 steps: int) -> list[list[Op]]:
    """Per rank, its compute actions over ``steps`` minibatches in the order the torch
    schedule (a registry schedule with a ``torch_class``) runs
    them, each step closed by one optimizer step ``U``."""
    from baselines.torch_peers import engine_class

    one = _torch_order(engine_class(schedule), workers, microbatches, per_rank)
    stages = {s for row in one for _, s, _ in row}
    out = []
    for row in one:
        acts = []
        for k in range(steps):
            acts += [Op(kind, s, k * microbatches + j) for kind, s, j in row]
            acts.append(Op("U", -1, (k + 1) * microbatches - 1))
        out.append(acts)
    if len(stages) != workers * per_rank:
        raise UserInputError(f"{engine_class(schedule)} lists {len(stages)} stages, "
                             f"not {workers} x {per_rank}")
    return out


@dataclass
class OrderRun:
    """What ``simulate_order`` returns: per rank (start, end, op); bytes per level; the
    end of each step's optimizer step, latest over ranks; peak memory per rank."""
    timeline: list[list[tuple[float, float, Op]]]
    bytes_per_level: dict[int, float]
    step_ends: list[float]
    peak_memory: dict[int, dict[str, float]]


def simulate_order(order: list[list[Op]], stage_rank: tuple[int, ...], profile: Profile,
                   groups: list[tuple[str, ...]], cluster: Cluster, placement: list[int],
                   share: float, compute_factor: float = 1.0, latency_s: float = 0.0,
                   optimizer_slots: int = 1) -> OrderRun:
    """Run every rank's ``order`` as soon as its inputs are in (see the module docstring).
    ``stage_rank[s]``: the rank holding stage s; ``placement[rank]``: its cluster worker."""
    stages = stage_costs(profile, groups)
    topo = Topology(cluster, placement)
    last = len(stages) - 1

    def cost(op: Op) -> float:
        if op.kind == "U":
            return 0.0
        return action_s(stages[op.stage], op.kind) * share / compute_factor

    arrive: dict[tuple[str, int, int], float] = {}  # ("F"/"B", consumer stage, mb) -> in
    link_free: dict[tuple[int, int], float] = defaultdict(float)
    moved: dict[int, float] = defaultdict(float)

    def deliver(op: Op, t: float) -> None:
        """Send what ``op`` produced to the stage that consumes it."""
        to = op.stage + 1 if op.kind == "F" else op.stage - 1
        if not 0 <= to <= last:
            return
        src, dst = stage_rank[op.stage], stage_rank[to]
        key = ("F" if op.kind == "F" else "B", to, op.mb)
        if src == dst:
            arrive[key] = t
            return
        cut = stages[min(op.stage, to)]
        nbytes = cut.send_bytes * share
        lv = topo.level(src, dst)
        start = max(t, link_free[(src, dst)])
        link_free[(src, dst)] = arrive[key] = (start + cut.send_tensors * latency_s
                                               + nbytes / cluster.levels[lv].bandwidth)
        moved[lv] += nbytes

    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * len(order)
    pc = [0] * len(order)
    timeline: list[list[tuple[float, float, Op]]] = [[] for _ in order]
    step_ends: dict[int, float] = defaultdict(float)

    def ready(op: Op) -> float | None:
        if op.kind == "U":
            return 0.0
        need: list[tuple[dict, tuple]] = []
        if op.kind == "F" and op.stage > 0:
            need.append((arrive, ("F", op.stage, op.mb)))
        if op.kind in ("I", "B"):
            need.append((done, ("F", op.stage, op.mb)))
            if op.stage < last:
                need.append((arrive, ("B", op.stage, op.mb)))
        if op.kind == "W":
            need.append((done, ("I", op.stage, op.mb)))
        times = [table.get(key) for table, key in need]
        return None if None in times else max(times, default=0.0)

    progress = True
    while progress:
        progress = False
        for rank, row in enumerate(order):
            while pc[rank] < len(row):
                op = row[pc[rank]]
                t = ready(op)
                if t is None:
                    break
                start = max(clock[rank], t)
                clock[rank] = end = start + cost(op)
                timeline[rank].append((start, end, op))
                done[(op.kind, op.stage, op.mb)] = end
                if op.kind in ("F", "I", "B"):
                    deliver(op, end)
                if op.kind == "U":
                    step_ends[op.mb] = max(step_ends[op.mb], end)
                pc[rank] += 1
                progress = True
    stuck = [f"rank {r} at {order[r][pc[r]]}" for r in range(len(order)) if pc[r] < len(order[r])]
    if stuck:
        raise UserInputError(f"the schedule deadlocks: {', '.join(stuck)}")
    memory = _memory(timeline, stages, share, optimizer_slots, stage_rank)
    return OrderRun(timeline, dict(moved), [step_ends[k] for k in sorted(step_ends)], memory)


def _memory(timeline: list[list[tuple[float, float, Op]]], stages: list[StageCost],
            share: float, optimizer_slots: int,
            stage_rank: tuple[int, ...]) -> dict[int, dict[str, float]]:
    out = {}
    for rank, row in enumerate(timeline):
        mine = [s for s, r in enumerate(stage_rank) if r == rank]
        live: dict[int, set[int]] = defaultdict(set)
        peak = 0.0
        for _, _, op in row:
            if op.kind == "F":
                live[op.stage].add(op.mb)
            elif op.kind in ("W", "B"):  # the unit's last backward part
                live[op.stage].discard(op.mb)
            peak = max(peak, sum(len(live[s]) * stages[s].activation_bytes * share
                                 for s in mine))
        weights = sum(stages[s].parameter_bytes for s in mine)
        out[rank] = {"weights": weights * (1 + optimizer_slots), "stashed_weights": 0.0,
                     "activations": peak}
        out[rank]["total"] = sum(out[rank].values())
        out[rank]["weight_versions"] = 1
    return out


def as_actions(timeline: list[list[tuple[float, float, Op]]]) \
        -> list[list[tuple[float, float, Action]]]:
    """The timeline in the simulator's ``Action`` form (kind and unit; the stage is lost)."""
    return [[(s, e, Action(op.kind, op.mb)) for s, e, op in row] for row in timeline]
