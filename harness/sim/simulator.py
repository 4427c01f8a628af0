"""A discrete-event simulator of N minibatches of a training system on a modelled cluster.

Driven by a profile (the project's JSON or PipeDream's ``graph.txt``: per-layer forward
and backward time, output bytes and parameter bytes at the profile's batch size) and a
cluster given as levels (workers per level and bandwidth per level, innermost first), it
executes the *same* schedules the runtime executes (``pipedream_impl.schedule``: 1F1B /
1F1B-RR with its per-stage warm-up, GPipe, one minibatch in flight, data parallelism as
one replicated stage; PipeDream-Flush and PipeDream-2BW) with the schedule
module's event engine and the cost model of ``harness.sim.costs`` (compute from the
profile, FIFO links per level, rings inside machines and, among machines, a ring, a
parameter server (colocated or on k CPU machines) or BytePS, data parallelism's all-reduce
overlapped with the backward or not; measured machine facts where a validation gives
them).

Outputs (``SimResult``): time per minibatch and throughput in steady state (between the
first and last quarter of the minibatches; ``total_s`` is the whole run, fill and drain
included, as an epoch of the runtime is), per-worker utilisation and the
timeline (``gantt`` draws it), bytes per link level, and peak memory per worker: weights
(+ optimizer state, ``optimizer_slots`` copies), stashed weight versions and the
activations of in-flight minibatches, read off the schedule.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from core.collectives import Sync
from core.errors import UserInputError, require_int, require_number
from harness import layouts, systems
from harness.sim import multistage, shared_cores
from harness.sim.costs import (
    AllReduceModel,
    ClusterCosts,
    MachineModel,
    Topology,
    memory_per_worker,
    stage_costs,
    sync_levels,
)
from pipedream_impl.planner.antichain import input_nodes
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.planner.plan import Plan
from pipedream_impl.planner.splits import min_max_split
from pipedream_impl.profiling.profile import Profile, infer_batch_size
from pipedream_impl.schedule import (
    ACTION_NAMES,
    COMPUTE,
    GRADIENT_DONE,
    Action,
    Layout,
    Schedule,
    simulate,
)
from pipedream_impl.schedule import registry as schedules

__all__ = ["NEAR_TIE", "SimLayout", "SimOptions", "SimResult", "build_schedule", "config_groups",
           "gantt", "layout_for", "plan_groups", "simulate_system"]


@dataclass
class SimResult:
    system: str
    config: str
    minibatches: int
    batch_size: int
    total_s: float
    time_per_minibatch_s: float
    throughput_samples_s: float
    utilisation: dict[int, float]
    bytes_per_level: dict[int, float]
    bytes_per_sample: float
    peak_memory: dict[int, dict[str, float]]
    timeline: list[list[tuple[float, float, Action]]] = field(repr=False, default_factory=list)
    layout: Layout | None = None


def build_schedule(system: systems.System, replicas: tuple[int, ...], minibatches: int,
                   microbatches: int, order: tuple | None = None,
                   depths: tuple[int, ...] | None = None) -> Schedule:
    """The runtime's schedule for ``system`` (data parallelism: 1F1B on one replicated
    stage), built by the schedule registry (a schedule file's from its compute ``order``);
    replicated stages run whole rounds; ``depths``: a plan's minibatches in flight per
    stage (``Layout.depths``)."""
    layout = Layout(replicas, depths)
    if system.rules is not None and system.rules.microbatched:
        return schedules.build(system.schedule, layout, minibatches, microbatches,
                               order=order)
    n = minibatches - minibatches % math.lcm(*replicas)
    return schedules.build(schedules.DEFAULT, layout, max(n, math.lcm(*replicas)),
                           in_flight=system.in_flight)


@dataclass(frozen=True)
class SimLayout:
    """What runs where: the profile's nodes of each stage, replicas per stage, and the
    cluster worker of each schedule rank (None: ranks in order)."""
    groups: list[tuple[str, ...]]
    replicas: tuple[int, ...]
    placement: list[int] | None = None
    how: str = ""  # how it was chosen (for people)
    depths: tuple[int, ...] | None = None  # a plan's minibatches in flight per stage


@dataclass(frozen=True)
class SimOptions:
    """How to simulate: ``unit_profiled``: the profile was measured at the unit size (a
    GPipe microbatch), so no linear scaling; ``machine``: measured facts about the machine
    simulated (see ``MachineModel``; default: none)."""
    minibatches: int = 256
    microbatches: int | None = None  # flush pipelines (default: the schedule registry's)
    order: tuple | None = None  # a schedule file's compute order (``schedule.torch_csv``)
    compute_factor: float = 1.0  # device speed relative to the profiled one
    latency_s: float = 0.0  # per message
    allreduce: str = "ring"  # among machines: ring, ps, ps-colocated or byteps
    cpu_machines: int = 0  # k: CPU-only server machines (ps: at least 1; byteps)
    optimizer_slots: int = 1  # optimizer state as copies of the weights
    dp_overlap: bool = True  # data parallelism: all-reduce overlapped with the backward
    # our runtime's replicated pipeline stages: all-reduce overlapped with the round's last
    # backward (``pipedream_impl.runtime.grad_buckets``); False: blocking after it
    pipeline_overlap: bool = True
    unit_profiled: bool = False
    machine: MachineModel | None = None
    # a fitted all-reduce (``harness.sim.calibration``) for every replicated stage, data
    # parallelism's and a pipeline's alike; None: the ideal ``allreduce`` model above
    allreduce_model: AllReduceModel | None = None

    def __post_init__(self) -> None:
        require_int("--minibatches", self.minibatches)
        require_int("--microbatches", self.microbatches)
        require_number("--compute-factor", self.compute_factor, example="2.0 (twice as fast)")
        require_number("--latency", self.latency_s, strict=False, example="5e-6")
        require_int("optimizer_slots", self.optimizer_slots, low=0)
        Sync(self.allreduce, self.cpu_machines)  # a bad mode or k: one line, up front


def simulate_system(profile: Profile, cluster: Cluster, system: str, layout: SimLayout,
                    options: SimOptions | None = None) -> SimResult:
    """Simulate ``options.minibatches`` of ``system`` (a registry name or alias) laid out
    as ``layout`` on ``cluster``."""
    o = options or SimOptions()
    replicas = layout.replicas
    minibatches, microbatches, allreduce, machine = (o.minibatches, o.microbatches,
                                                     o.allreduce, o.machine)
    sys_ = systems.simulated(system)  # registry names and aliases
    kind = sys_.sim
    if sum(replicas) > cluster.workers:
        raise UserInputError(f"config {'-'.join(map(str, replicas))} needs {sum(replicas)} "
                             f"workers; the cluster has {cluster.workers}")
    b = profile.batch_size or infer_batch_size(profile) or 1
    m = schedules.microbatches(sys_.schedule, len(replicas), microbatches) \
        if sys_.microbatched else 1
    if sys_.stages_per_rank > 1:
        return _simulate_multistage(profile, cluster, sys_, layout, o, b, m)
    sched = build_schedule(sys_, replicas, minibatches, m, o.order, layout.depths)
    stages = stage_costs(profile, layout.groups)
    placement = layout.placement or list(range(sum(replicas)))
    share = 1.0 if o.unit_profiled else 1.0 / m
    overlap = o.dp_overlap if kind == "data-parallel" \
        else sys_.overlaps_allreduce and o.pipeline_overlap
    overlap_with = "W" if any(a.kind == "W" for row in sched.actions for a in row) else "B"
    costs: ClusterCosts

    def run(shared: dict) -> list:  # noqa: ANN001 - fresh link and byte counts each run
        nonlocal costs
        costs = ClusterCosts(sched.layout, stages, cluster, placement, share,
                             o.compute_factor, o.latency_s, allreduce,
                             overlap_allreduce=overlap, machine=machine,
                             cpu_machines=o.cpu_machines, model=o.allreduce_model,
                             overlap_with=overlap_with)
        costs.shared = shared
        return simulate(sched, costs=costs)

    cores = machine.cores if machine is not None else None
    oversubscribed = cores is not None and sched.layout.workers > cores
    timeline, shared = shared_cores.stretch(run, cores) if oversubscribed else (run({}), {})
    total = max((e for row in timeline for _, e, _ in row), default=0.0)
    n = sched.minibatches
    # steady state: minibatches finish when stage 0 ends their backward (the last unit's,
    # for GPipe); time per minibatch between the ends of whole rounds (lcm of the replica
    # counts: the schedule repeats per round) near the first and the last quarter
    done = sorted(e for r in range(sched.layout.replicas[0]) for _, e, a in timeline[r]
                  if a.kind in GRADIENT_DONE and (a.mb + 1) % m == 0)
    rnd = math.lcm(*replicas)
    lo, hi = max(1, round(n / 4 / rnd)) * rnd, (3 * n // 4) // rnd * rnd
    steady = (done[hi - 1] - done[lo - 1]) / (hi - lo) if hi > lo else total / n
    if oversubscribed:  # the CPU's capacity bound, on the compute's own (unshared) time
        busy = costs.comm_busy_s + sum((e - s) / shared.get((r, a), 1.0)
                                       for r, row in enumerate(timeline) for s, e, a in row
                                       if a.kind in (*COMPUTE, "U"))
        total = max(total, busy / cores)
        steady = max(steady, busy / cores / n)
    util = {r: sum(e - s for s, e, a in row if a.kind in COMPUTE) / total if total else 0.0
            for r, row in enumerate(timeline)}
    moved = sum(costs.bytes_per_level.values())
    return SimResult(system, "-".join(map(str, replicas)), n, b, total, steady,
                     b / steady if steady else float("inf"), util,
                     dict(costs.bytes_per_level), moved / (n * b),
                     memory_per_worker(sched, stages, share, o.optimizer_slots), timeline,
                     sched.layout)


def _simulate_multistage(profile: Profile, cluster: Cluster, sys_: systems.System,
                         layout: SimLayout, o: SimOptions, b: int, m: int) -> SimResult:
    """A schedule with several stages per worker (``harness.sim.multistage``): every step
    flushes, so time per minibatch is between the first and the last step's end."""
    p = len(layout.replicas)
    n = max(1, min(o.minibatches, multistage.MULTISTAGE_STEPS))
    sched, stages, costs, timeline = multistage.run(
        profile, cluster, sys_, layout.groups, layout.placement or list(range(p)), n, m,
        1.0 if o.unit_profiled else 1.0 / m, o.compute_factor, o.latency_s)
    ends = [max(e for row in timeline for _, e, a in row if a.kind == "U" and a.mb == last)
            for last in range(m - 1, n * m, m)]
    total = ends[-1]
    steady = (ends[-1] - ends[0]) / (n - 1) if n > 1 else total
    util = {r: sum(e - s for s, e, a in row if a.kind in COMPUTE) / total if total else 0.0
            for r, row in enumerate(timeline)}
    moved = sum(costs.bytes_per_level.values())
    return SimResult(sys_.name, f"{p} workers x {sys_.stages_per_rank} stages", n, b, total,
                     steady, b / steady if steady else float("inf"), util,
                     dict(costs.bytes_per_level), moved / (n * b),
                     memory_per_worker(sched, stages, 1.0 if o.unit_profiled else 1.0 / m,
                                       o.optimizer_slots), timeline, Layout(layout.replicas))


def plan_groups(plan: Plan) -> tuple[list[tuple[str, ...]], tuple[int, ...], list[int]]:
    """(nodes per stage, replicas per stage, cluster worker of each schedule rank)."""
    if any(not s.nodes for s in plan.stages):
        raise UserInputError("this plan lists no nodes per stage; make it with `pipebench "
                             "plan` from the same profile")
    placement = [w for s in plan.stages for w in s.ranks]
    return [tuple(s.nodes) for s in plan.stages], tuple(s.replicas for s in plan.stages), \
        placement


def gantt(result: SimResult, path: str, title: str = "") -> None:
    """Worker x time chart of the simulated timeline (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"F": "#4c72b0", "B": "#55a868", "I": "#8fd19e", "W": "#2d6a3e",
               "A": "#dd8452", "U": "#8172b2"}
    n = len(result.timeline)
    fig, ax = plt.subplots(figsize=(12, 0.5 * n + 1.5))
    for rank, row in enumerate(result.timeline):
        for kind in colours:
            bars = [(s * 1e3, (e - s) * 1e3) for s, e, a in row if a.kind == kind and e > s]
            if bars:
                ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=colours[kind],
                               label=kind if rank == 0 or kind == "A" else None)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, [ACTION_NAMES[k] for k in colours], loc="upper right")
    ax.set_yticks(range(n))
    lay = result.layout
    ax.set_yticklabels([f"w{r} s{lay.stage_of(r)[0]}" for r in range(n)] if lay else
                       [f"w{r}" for r in range(n)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"{result.system} {result.config}: "
                 f"{result.time_per_minibatch_s * 1e3:.1f} ms per minibatch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


NEAR_TIE = 0.01  # config_groups: splits this close to the fastest count as tied


def config_groups(profile: Profile, replicas: tuple[int, ...], cluster: Cluster,
                  near_tie: float = NEAR_TIE) -> list[tuple[str, ...]]:
    """Contiguous stages (topological order) for a fixed config, chosen with the planner's
    objective: first the slowest stage's time, a stage taking the longest of (its
    compute + its ideal all-reduce) / r, the transfer of the live activations into it and
    their gradients back, and the same out of it, each 2 x bytes / (bandwidth x r) as the
    planner charges them (``min_max_split``: an exact DP over cut positions); then, among
    the splits within ``near_tie`` of that time (``inf``: among all), the one moving the
    fewest bytes per minibatch (activations and gradients across every cut plus each
    replicated stage's all-reduce bytes: a second exact DP). Input nodes cost no compute
    (the planner's rule)."""
    g = profile.graph()
    ids = g.topological_order()
    n, k = len(ids), len(replicas)
    if k > n:
        raise UserInputError(f"config has {k} stages but the profile has {n} layers")
    pos = {x: i for i, x in enumerate(ids)}
    inputs = set(input_nodes(g))
    comp, par = [0.0], [0.0]
    for x in ids:
        work = 0.0 if x in inputs else g.nodes[x].forward_ms + g.nodes[x].backward_ms
        comp.append(comp[-1] + work / 1e3)
        par.append(par[-1] + g.nodes[x].parameter_bytes)
    live = [0.0] * (n + 1)  # bytes crossing a cut before position i
    for x in ids:
        last = max((pos[m] for m in g.edges.get(x, [])), default=pos[x])
        for c in range(pos[x] + 1, last + 1):
            live[c] += g.nodes[x].activation_bytes
    topo = Topology(cluster, list(range(sum(replicas))))
    offsets = [sum(replicas[:i]) for i in range(k)]
    ar, moved = [], []  # per byte of a stage's weights: seconds, bytes per minibatch
    for i, r in enumerate(replicas):
        levels = sync_levels(topo, tuple(range(offsets[i], offsets[i] + r)), Sync(), 1.0, 0.0)
        ar.append(sum(t for _, t, _ in levels))
        moved.append(sum(b for _, _, b in levels) / r)  # one all-reduce per r minibatches
    inf = float("inf")
    bw = [cluster.levels[topo.level(offsets[i] - 1, offsets[i])].bandwidth
          for i in range(1, k)]  # bw[i - 1]: the link between stages i - 1 and i

    def slowest(i: int, a: int, b: int) -> float:
        t = (comp[b] - comp[a] + ar[i] * (par[b] - par[a])) / replicas[i]
        if i > 0:
            t = max(t, 2 * live[a] / (bw[i - 1] * replicas[i]))
        if i < k - 1:
            t = max(t, 2 * live[b] / (bw[i] * replicas[i]))
        return t

    bounds = min_max_split(n, k, slowest)
    limit = max(slowest(i, a, b) for i, (a, b) in enumerate(bounds)) * (1 + near_tie)
    # fewest bytes among splits whose every stage is within the limit

    def moved_bytes(i: int, a: int, b: int) -> float:
        if slowest(i, a, b) > limit:
            return inf
        return (2 * live[a] if i > 0 else 0.0) + moved[i] * (par[b] - par[a])

    bounds = min_max_split(n, k, moved_bytes, combine=operator.add)
    return [tuple(ids[a:b]) for a, b in bounds]


def _check_plan_nodes(profile: Profile, groups: list[tuple[str, ...]]) -> None:
    """A plan made from another profile names nodes this one lacks. (A plan may leave out
    nodes: the planner drops the input node.)"""
    have = {n.node_id for n in profile.layers}
    unknown = [x for g in groups for x in g if x not in have]
    if unknown:
        raise UserInputError(f"the plan names node {unknown[0]!r}, which the profile does not "
                             "have: make the plan from this profile (pipebench plan --profile "
                             "FILE ... -o plan.json)")


def layout_for(profile: Profile, cluster: Cluster, system: str, config: str | None = None,
               plan: Plan | None = None, stages: int | None = None) -> SimLayout:
    """The layout of a simulated system: which one is ``harness.layouts.choose``'s decision
    (the same as a run's, except that a simulation may leave some of the cluster's workers
    idle); here a config's layers are split on the profile and cluster (``config_groups``)
    and the planner plans for the cluster (a straight pipeline over ``stages`` workers).
    """
    from pipedream_impl.planner.cluster import Level
    from pipedream_impl.planner.plan import plan_profile

    sim = systems.simulated(system)
    choice = layouts.choose(sim, cluster.workers, config=config, exact=False, stages=stages,
                            plan=tuple(s.replicas for s in plan.stages) if plan else None)
    if choice.source == layouts.DATA_PARALLEL:
        nodes = tuple(profile.graph().nodes)
        return SimLayout([nodes], choice.replicas, None,
                         "data parallel: whole model per worker")
    if choice.stages_per_rank > 1:  # p workers x v stages, split as one straight pipeline
        k, p = choice.stages, len(choice.replicas)  # p x v stages
        if choice.source == layouts.PLAN:  # the plan lists all p x v stages
            groups = plan_groups(plan)[0]
            _check_plan_nodes(profile, groups)
            return SimLayout(groups, choice.replicas, None, f"{p} workers x "
                             f"{choice.stages_per_rank} stages, plan ({plan.config})")
        # on the cluster's innermost bandwidth
        flat = Cluster((Level(k, cluster.levels[0].bandwidth),))
        groups = config_groups(profile, (1,) * k, flat)
        return SimLayout(groups, choice.replicas, None, f"{p} workers x "
                         f"{choice.stages_per_rank} stages, split on the profile")
    depths = None  # a plan's minibatches in flight per stage
    if choice.source == layouts.PLAN:
        groups, replicas, placement = plan_groups(plan)
        _check_plan_nodes(profile, groups)
        if max(placement) >= cluster.workers:
            raise UserInputError(f"the plan uses {max(placement) + 1} workers; the cluster has "
                                 f"{cluster.workers}: plan for this cluster")
        how, depths = f"plan ({plan.config})", plan.depths or None
    elif choice.source == layouts.CONFIG:
        replicas = choice.replicas
        groups, placement = config_groups(profile, replicas, cluster), None
        how = f"config {config}, split chosen on the profile and cluster"
    else:  # the planner's (straight: over ``stages`` workers) for this cluster
        straight = choice.source == layouts.STRAIGHT
        target = cluster
        if straight and stages is not None and stages != cluster.workers:
            target = Cluster((Level(stages, cluster.levels[0].bandwidth),))
        p = plan_profile(profile, target, straight=straight)
        groups, replicas, placement = plan_groups(p)
        how = f"planned ({p.config}{', straight' if straight else ''})"
        depths = p.depths or None
    return SimLayout(groups, replicas, placement, how, depths)


