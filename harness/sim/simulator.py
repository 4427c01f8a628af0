"""A discrete-event simulator of N minibatches of a training system on a modelled cluster.

Driven by a profile (the project's JSON or PipeDream's ``graph.txt``: per-layer forward
and backward time, output bytes and parameter bytes at the profile's batch size) and a
cluster given as levels (workers per level and bandwidth per level, innermost first), it
executes the *same* schedules the runtime executes (``pipedream_impl.schedule``: 1F1B /
1F1B-RR with NOAM, GPipe, one minibatch in flight, data parallelism as one replicated
stage) with the schedule module's event engine and this cost model:

- compute: a stage's forward (backward) time is the sum of its layers' profiled times,
  scaled by the unit's share of the profiled batch (a GPipe microbatch of b/M samples
  takes 1/M of the minibatch time: linear scaling) and divided by ``compute_factor``
  (e.g. 2.0 for a device twice as fast as the profiled one); the optimizer step is free
  (the paper's profiles do not measure it) unless a ``MachineModel`` gives measured
  per-action costs, which then replace the profile's compute altogether;
- point-to-point: asynchronous sends, as in the runtime; each directed link carries one
  message at a time (FIFO), a send of t tensors (+ ``header_messages``) takes
  ``(t + header) x latency_s + bytes / bandwidth`` of the innermost level the two ranks
  share; a receive waits for arrival. A ``MachineModel`` may give measured one-way times
  per stage and direction (``transfer_s``), the sender's own time in the send call
  (``send_s``), and ``rendezvous``: the message moves only once the receiver posts its
  receive (gloo);
- all-reduce of a replicated stage (our runtime: after the backward, not overlapped):
  hierarchical ring, as the planner models it: at each level a ring among the k groups
  the replicas form there, ``2 (k-1)/k x bytes / bandwidth`` of that level plus
  ``2 (k-1)`` latencies, summed over levels (``MachineModel.allreduce_fit``: a measured
  fixed + per-byte time instead); ``allreduce="ps"``: one parameter server
  outside the workers, whose link carries every replica's gradient in and weights out:
  ``2 r x bytes / bw``;
- data parallelism (``dp``): DDP/Horovod overlap the all-reduce with the backward, so
  only what the backward does not hide is exposed: ``max(0, allreduce - backward)``
  (``dp_overlap=False``: not overlapped, as PipeDream's optimizer models it).

Outputs (``SimResult``): time per minibatch and throughput in steady state (between the
first and last quarter of the minibatches; ``total_s`` is the whole run, fill and drain
included, as an epoch of the runtime is), per-worker utilisation and the
timeline (``gantt`` draws it), bytes per link level, and peak memory per worker: weights
(+ optimizer state, ``optimizer_slots`` copies), stashed weight versions and the
activations of in-flight minibatches, read off the schedule.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from core.collectives import ring_factor
from core.errors import UserInputError
from harness import systems
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.planner.plan import Plan, min_max_split
from pipedream_impl.profiling.profile import Profile, infer_batch_size
from pipedream_impl.schedule import Action, Layout, Schedule, gpipe, one_f_one_b, simulate

__all__ = ["ClusterCosts", "MachineModel", "SimResult", "StageCost", "Topology", "build_schedule",
           "config_groups", "gantt", "layout_for", "memory_per_worker", "plan_groups",
           "simulate_system", "stage_costs"]


@dataclass(frozen=True)
class MachineModel:
    """What a validation measured on the machine it simulates; the defaults are the
    paper's setting (profile compute only, transfers in the background, ring formula)."""
    # per stage: seconds per unit of each action kind (F, B, U), measured on the runtime's
    # own code path (``pipedream_impl.runtime.local``); replaces the profile's compute when given
    action_s: dict[int, dict[str, float]] | None = None
    # (sending stage, "F" or "B") -> measured one-way seconds of its message (replaces
    # latency and bandwidth for that link; bytes are still counted from the profile)
    transfer_s: dict[tuple[int, str], float] | None = None
    send_s: dict[tuple[int, str], float] | None = None  # the sender's own time per send
    header_messages: int = 0  # extra messages per send (our shape header, unless static)
    # gloo's point-to-point: the payload moves only once the receiver has posted its
    # receive (measured here: a message sent a second earlier still takes its full
    # transfer time after the receive is posted); default: eager, moving at send time
    rendezvous: bool = False
    allreduce_fit: tuple[float, float] | None = None  # measured: fixed s + s per byte
    # CPU cores the workers share (None: one device each). The schedule runs at full speed
    # and the run then takes at least (busy time of all ranks) / cores: a rank only slows
    # others while it computes (model parallelism on 4 workers and 2 cores is not halved)
    cores: int | None = None


@dataclass(frozen=True)
class StageCost:
    nodes: tuple[str, ...]
    forward_s: float  # per profiled minibatch, on the profiled device
    backward_s: float
    parameter_bytes: float
    activation_bytes: float  # outputs of every layer of the stage (what autograd keeps)
    send_bytes: float  # live outputs crossing to the next stage (0 for the last)
    send_tensors: int = 1  # how many tensors carry them (one message each)


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


def stage_costs(profile: Profile, groups: list[tuple[str, ...]]) -> list[StageCost]:
    """Per-stage sums over the profile's nodes; ``groups`` are the nodes of each stage."""
    g = profile.graph()
    where = {n: i for i, grp in enumerate(groups) for n in grp}
    groups = [list(grp) for grp in groups]
    for n in g.nodes:  # nodes a plan leaves out (inputs): with their first consumer
        if n not in where:
            users = [where[m] for m in g.edges.get(n, []) if m in where]
            where[n] = min(users) if users else 0
            groups[where[n]].append(n)
    out = []
    for i, grp in enumerate(groups):
        nodes = [g.nodes[n] for n in grp]
        crossing = [g.nodes[n] for n in where if where[n] <= i
                    and any(where[m] > i for m in g.edges.get(n, []))]
        out.append(StageCost(tuple(grp), sum(n.forward_ms for n in nodes) / 1e3,
                             sum(n.backward_ms for n in nodes) / 1e3,
                             sum(n.parameter_bytes for n in nodes),
                             sum(n.activation_bytes for n in nodes),
                             sum(n.activation_bytes for n in crossing),
                             max(1, sum(len(n.activations) for n in crossing))))
    return out


class Topology:
    """Where schedule ranks sit on the cluster: which level two ranks share, and the rings
    a hierarchical all-reduce over a set of ranks runs at each level."""

    def __init__(self, cluster: Cluster, placement: list[int]) -> None:
        self.cluster = cluster
        self.placement = placement  # schedule rank -> worker index on the cluster
        sizes, acc = [], 1
        for lv in cluster.levels:
            acc *= lv.workers
            sizes.append(acc)
        self.group_sizes = sizes  # workers under one group at each level

    def level(self, a: int, b: int) -> int:
        wa, wb = self.placement[a], self.placement[b]
        for i, size in enumerate(self.group_sizes[:-1]):
            if wa // size == wb // size:
                return i
        return len(self.group_sizes) - 1

    def ring_levels(self, ranks: tuple[int, ...]) -> list[tuple[int, int]]:
        """(level, k) of a hierarchical ring all-reduce over ``ranks``: at each level, a
        ring among the k groups of the level below (k = 1: nothing to do there)."""
        out = []
        below = [self.placement[r] for r in ranks]  # level -1 groups: the workers
        for lv, size in enumerate(self.group_sizes):
            inner = size // self.cluster.levels[lv].workers  # workers per level-(lv-1) group
            groups: dict[int, set[int]] = defaultdict(set)
            for w in below:
                groups[w // size].add(w // inner)
            k = max(len(g) for g in groups.values())
            if k > 1:
                out.append((lv, k))
        return out


class ClusterCosts:
    """The cost model the schedule engine asks (see ``pipedream_impl.schedule.TickCosts``)."""

    def __init__(self, layout: Layout, stages: list[StageCost], cluster: Cluster,
                 placement: list[int], unit_share: float, compute_factor: float,
                 latency_s: float, allreduce: str, overlap_allreduce: bool,
                 machine: MachineModel | None = None) -> None:
        self.layout, self.stages, self.cluster = layout, stages, cluster
        self.topology = Topology(cluster, placement)
        self.unit_share, self.factor = unit_share, compute_factor
        self.latency, self.mode, self.overlap = latency_s, allreduce, overlap_allreduce
        self.machine = machine or MachineModel()
        self.link_free: dict[tuple[int, int], float] = defaultdict(float)
        self.bytes_per_level: dict[int, float] = defaultdict(float)
        self.send_busy_s = 0.0  # senders' own time in their send calls

    def compute(self, rank: int, a: Action) -> float:
        s = self.layout.stage_of(rank)[0]
        if self.machine.action_s is not None:
            return self.machine.action_s[s].get(a.kind, 0.0) / self.factor
        st = self.stages[s]
        return {"F": st.forward_s, "B": st.backward_s}.get(a.kind, 0.0) * self.unit_share \
            / self.factor

    def send(self, src: int, dst: int, a: Action, t: float) -> tuple[float, float]:
        own = (self.machine.send_s or {}).get((self.layout.stage_of(src)[0], a.kind[1]), 0.0)
        t += own / self.factor
        self.send_busy_s += own / self.factor
        if self.machine.rendezvous:  # moves when the receiver asks: see ``receive``
            return t, t
        return t, self._transfer(src, dst, a, t)

    def receive(self, src: int, dst: int, a: Action, token: float, posted: float) -> float:
        if self.machine.rendezvous:
            return self._transfer(src, dst, a, max(token, posted))
        return token

    def _transfer(self, src: int, dst: int, a: Action, t: float) -> float:
        """When a message that may start at ``t`` is in (FIFO per directed link)."""
        s = self.layout.stage_of(src)[0]
        # forward: this stage's live outputs; backward: gradients of the previous cut
        cut = self.stages[s] if a.kind in ("SF", "RF") else self.stages[s - 1]
        nbytes = cut.send_bytes * self.unit_share
        messages = cut.send_tensors + self.machine.header_messages
        lv = self.topology.level(src, dst)
        self.bytes_per_level[lv] += nbytes
        start = max(t, self.link_free[(src, dst)])
        measured = (self.machine.transfer_s or {}).get((s, a.kind[1]))
        done = start + (measured if measured is not None else
                        messages * self.latency + nbytes / self.cluster.levels[lv].bandwidth)
        self.link_free[(src, dst)] = done
        return done

    def allreduce(self, stage: int, ranks: tuple[int, ...], t: float) -> float:
        r = len(ranks)
        nbytes = self.stages[stage].parameter_bytes
        fit = self.machine.allreduce_fit
        if self.mode == "ps" and fit is None:
            lv = max(self.topology.level(ranks[0], x) for x in ranks[1:])
            self.bytes_per_level[lv] += 2 * nbytes  # per replica: gradient in, weights out
            dur = 2 * r * nbytes / self.cluster.levels[lv].bandwidth + 2 * self.latency
        else:  # ring bytes per rank, as the planner models them; time measured or modelled
            rings = self.topology.ring_levels(ranks)
            for lv, k in rings:
                self.bytes_per_level[lv] += ring_factor(k) * nbytes
            dur = fit[0] + fit[1] * nbytes if fit is not None else sum(
                ring_factor(k) * nbytes / self.cluster.levels[lv].bandwidth
                + 2 * (k - 1) * self.latency for lv, k in rings)
        if self.overlap:  # hidden behind the backward that produced the gradients
            dur = max(0.0, dur - self.compute(ranks[0], Action("B", 0)))
        return dur


def memory_per_worker(sched: Schedule, stages: list[StageCost], unit_share: float,
                      optimizer_slots: int) -> dict[int, dict[str, float]]:
    """Peak bytes per rank read off its action list: weights (+ optimizer state), stashed
    versions (distinct versions of in-flight minibatches other than the current one) and
    activations (in-flight units x the stage's activation bytes)."""
    out = {}
    for rank, acts in enumerate(sched.actions):
        st = stages[sched.layout.stage_of(rank)[0]]
        in_flight: dict[int, int] = {}
        current, peak_units, peak_versions = 0, 0, 0
        for a in acts:
            if a.kind == "F":
                in_flight[a.mb] = a.version
            elif a.kind == "B":
                in_flight.pop(a.mb, None)
            elif a.kind == "U":
                current += 1
            peak_units = max(peak_units, len(in_flight))
            if sched.weights != "none":
                peak_versions = max(peak_versions, len(set(in_flight.values()) - {current}))
        out[rank] = {"weights": st.parameter_bytes * (1 + optimizer_slots),
                     "stashed_weights": st.parameter_bytes * peak_versions,
                     "activations": st.activation_bytes * unit_share * peak_units}
        out[rank]["total"] = sum(out[rank].values())
    return out


def build_schedule(kind: str, replicas: tuple[int, ...], minibatches: int,
                   microbatches: int) -> Schedule:
    """The runtime's schedule for a simulator schedule ``kind`` (``System.sim``)."""
    layout = Layout(replicas)
    if kind == "flush":
        return gpipe(layout, minibatches, microbatches)
    if kind == "in-flight-1":
        return one_f_one_b(layout, minibatches, "stash", in_flight=1)
    n = minibatches - minibatches % math.lcm(*replicas)
    return one_f_one_b(layout, max(n, math.lcm(*replicas)), "stash")


@dataclass(frozen=True)
class SimLayout:
    """What runs where: the profile's nodes of each stage, replicas per stage, and the
    cluster worker of each schedule rank (None: ranks in order)."""
    groups: list[tuple[str, ...]]
    replicas: tuple[int, ...]
    placement: list[int] | None = None
    how: str = ""  # how it was chosen (for people)


@dataclass(frozen=True)
class SimOptions:
    """How to simulate: ``unit_profiled``: the profile was measured at the unit size (a
    GPipe microbatch), so no linear scaling; ``machine``: measured facts about the machine
    simulated (see ``MachineModel``; default: none)."""
    minibatches: int = 256
    microbatches: int | None = None  # flush pipelines (default 4 x stages)
    compute_factor: float = 1.0  # device speed relative to the profiled one
    latency_s: float = 0.0  # per message
    allreduce: str = "ring"  # or "ps"
    optimizer_slots: int = 1  # optimizer state as copies of the weights
    dp_overlap: bool = True  # data parallelism: all-reduce overlapped with the backward
    unit_profiled: bool = False
    machine: MachineModel | None = None


def simulate_system(profile: Profile, cluster: Cluster, system: str, layout: SimLayout,
                    options: SimOptions | None = None) -> SimResult:
    """Simulate ``options.minibatches`` of ``system`` (a registry name or alias) laid out
    as ``layout`` on ``cluster``."""
    o = options or SimOptions()
    replicas = layout.replicas
    minibatches, microbatches, allreduce, machine = (o.minibatches, o.microbatches,
                                                     o.allreduce, o.machine)
    kind = systems.simulated(system).sim  # registry names and aliases
    if allreduce not in ("ring", "ps"):
        raise UserInputError("--allreduce must be ring or ps")
    if sum(replicas) > cluster.workers:
        raise UserInputError(f"config {'-'.join(map(str, replicas))} needs {sum(replicas)} "
                            f"workers; the cluster has {cluster.workers}")
    b = profile.batch_size or infer_batch_size(profile) or 1
    m = (microbatches or 4 * len(replicas)) if kind == "flush" else 1
    sched = build_schedule(kind, replicas, minibatches, m)
    stages = stage_costs(profile, layout.groups)
    placement = layout.placement or list(range(sum(replicas)))
    share = 1.0 if o.unit_profiled else 1.0 / m
    costs = ClusterCosts(sched.layout, stages, cluster, placement, share, o.compute_factor,
                         o.latency_s, allreduce,
                         overlap_allreduce=kind == "data-parallel" and o.dp_overlap,
                         machine=machine)
    timeline = simulate(sched, costs=costs)
    total = max((e for row in timeline for _, e, _ in row), default=0.0)
    n = sched.minibatches
    # steady state: minibatches finish when stage 0 ends their backward (the last unit's,
    # for GPipe); time per minibatch between the first and the last quarter of them
    done = sorted(e for r in range(sched.layout.replicas[0]) for _, e, a in timeline[r]
                  if a.kind == "B" and (a.mb + 1) % m == 0)
    lo, hi = n // 4, (3 * n) // 4
    steady = (done[hi] - done[lo]) / (hi - lo) if hi > lo else total / n
    cores = costs.machine.cores
    if cores is not None and sched.layout.workers > cores:  # the CPU's capacity bound
        busy = costs.send_busy_s + sum(e - s for row in timeline for s, e, a in row
                                     if a.kind in ("F", "B", "U", "A"))
        total = max(total, busy / cores)
        steady = max(steady, busy / cores / n)
    util = {r: sum(e - s for s, e, a in row if a.kind in ("F", "B")) / total if total else 0.0
            for r, row in enumerate(timeline)}
    moved = sum(costs.bytes_per_level.values())
    return SimResult(system, "-".join(map(str, replicas)), n, b, total, steady,
                     b / steady if steady else float("inf"), util,
                     dict(costs.bytes_per_level), moved / (n * b),
                     memory_per_worker(sched, stages, share, o.optimizer_slots), timeline,
                     sched.layout)


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

    colours = {"F": "#4c72b0", "B": "#55a868", "A": "#dd8452", "U": "#8172b2"}
    n = len(result.timeline)
    fig, ax = plt.subplots(figsize=(12, 0.5 * n + 1.5))
    for rank, row in enumerate(result.timeline):
        for kind in colours:
            bars = [(s * 1e3, (e - s) * 1e3) for s, e, a in row if a.kind == kind and e > s]
            if bars:
                ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=colours[kind],
                               label=kind if rank == 0 or kind == "A" else None)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, ["forward", "backward", "all-reduce", "update"], loc="upper right")
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


def config_groups(profile: Profile, replicas: tuple[int, ...],
                  cluster: Cluster) -> list[tuple[str, ...]]:
    """Contiguous stages (topological order) for a fixed config that minimise the slowest
    stage under the simulator's own costs: (compute + its hierarchical all-reduce) / r,
    or the transfer of the live activations into it and their gradients back, whichever
    is longer (``min_max_split``: an exact DP over cut positions)."""
    g = profile.graph()
    ids = g.topological_order()
    n, k = len(ids), len(replicas)
    if k > n:
        raise UserInputError(f"config has {k} stages but the profile has {n} layers")
    pos = {x: i for i, x in enumerate(ids)}
    comp, par = [0.0], [0.0]
    for x in ids:
        comp.append(comp[-1] + (g.nodes[x].forward_ms + g.nodes[x].backward_ms) / 1e3)
        par.append(par[-1] + g.nodes[x].parameter_bytes)
    live = [0.0] * (n + 1)  # bytes crossing a cut before position i
    for x in ids:
        last = max((pos[m] for m in g.edges.get(x, [])), default=pos[x])
        for c in range(pos[x] + 1, last + 1):
            live[c] += g.nodes[x].activation_bytes
    topo = Topology(cluster, list(range(sum(replicas))))
    offsets = [sum(replicas[:i]) for i in range(k)]
    ar = []  # seconds per byte of one all-reduce for each stage's replica set
    for i, r in enumerate(replicas):
        ranks = tuple(range(offsets[i], offsets[i] + r))
        ar.append(sum(ring_factor(kk) / cluster.levels[lv].bandwidth
                      for lv, kk in topo.ring_levels(ranks)) if r > 1 else 0.0)
    inf = float("inf")
    bw_in = [inf] + [cluster.levels[topo.level(offsets[i] - 1, offsets[i])].bandwidth
                     for i in range(1, k)]  # the link into each stage
    links = [1] + [min(replicas[i], replicas[i - 1]) for i in range(1, k)]

    def slowest(i: int, a: int, b: int) -> float:
        t = (comp[b] - comp[a] + ar[i] * (par[b] - par[a])) / replicas[i]
        return max(t, 2 * live[a] / bw_in[i] / links[i]) if i > 0 else t

    bounds = min_max_split(n, k, slowest)
    return [tuple(ids[a:b]) for a, b in bounds]


def layout_for(profile: Profile, cluster: Cluster, system: str, config: str | None = None,
               plan: Plan | None = None, stages: int | None = None) -> SimLayout:
    """The layout of a simulated system.

    pipedream: ``plan``, else ``config``, else the planner on this profile and cluster.
    gpipe, mp: unreplicated; ``config``/``plan`` if given, else the planner's straight
    pipeline over ``stages`` workers (default: every worker). dp: one stage, every worker.
    """
    from pipedream_impl.planner.cluster import Level
    from pipedream_impl.planner.plan import plan_profile

    sim = systems.simulated(system)
    if sim.kind == "data-parallel":
        nodes = tuple(profile.graph().nodes)
        return SimLayout([nodes], (cluster.workers,), None,
                         "data parallel: whole model per worker")
    if plan is not None:
        groups, replicas, placement = plan_groups(plan)
        how = f"plan ({plan.config})"
    elif config is not None:
        replicas = Layout.from_config(config).replicas
        if sum(replicas) > cluster.workers:
            raise UserInputError(f"config {config} needs {sum(replicas)} workers; the "
                                f"cluster has {cluster.workers}")
        groups, placement = config_groups(profile, replicas, cluster), None
        how = f"config {config}, split chosen on the profile and cluster"
    else:
        straight = sim.straight
        target = cluster
        if straight and stages is not None and stages != cluster.workers:
            target = Cluster((Level(stages, cluster.levels[0].bandwidth),))
        p = plan_profile(profile, target, straight=straight)
        groups, replicas, placement = plan_groups(p)
        how = f"planned ({p.config}{', straight' if straight else ''})"
    if sim.straight and any(r != 1 for r in replicas):
        raise UserInputError(f"{system} runs unreplicated stages; got "
                            f"{'-'.join(map(str, replicas))}")
    return SimLayout(groups, replicas, placement, how)
