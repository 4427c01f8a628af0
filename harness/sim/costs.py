"""The simulator's cost model: what each action of a schedule costs on a modelled cluster.

The schedule module's event engine asks a cost model three questions (compute, send,
receive, plus all-reduce); ``ClusterCosts`` answers them from a profile and a cluster:

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
  (``send_s``), the receiver's own time once the message is in (``recv_s``), and
  ``rendezvous``: the message moves only once the receiver posts its receive (gloo);
- all-reduce of a replicated stage, as the planner models it (``sync_levels``): inside
  a machine (every level but the outermost) a ring among the k groups the replicas form
  at each level,
  ``2 (k-1)/k x bytes / bandwidth`` of that level plus ``2 (k-1)`` latencies (the local
  reduce BytePS also does first); among the n machines the replicas span (the outermost
  level, one NIC per machine; on a one-level cluster every worker is a machine) the
  ``Sync`` mode's closed form (``core.collectives``): ``ring`` (2 (n-1)/n, ``2 (n-1)``
  latencies), ``ps`` (k CPU server machines: max(1, n/k)), ``ps-colocated`` (2 (n-1)/n)
  or ``byteps`` (2 n (n-1)/(n^2 + k n - 2k)) x bytes / bandwidth, 2 latencies for the
  last three; summed over levels (``MachineModel.allreduce_s``: a measured time instead,
  bytes still counted by the formula). Bytes per level are what the links of the level
  carry: at each level every member of a ring sends 2 (k-1)/k x bytes, so a machine's NIC
  carries its ring share once, not once per GPU (a hierarchical ring over g x n ranks then
  moves 2 (gn-1)/(gn) x bytes per rank, a flat ring's count), plus the CPU machines'
  traffic under ps and byteps;
- overlap: DDP/Horovod (``dp``) overlap the all-reduce with the backward, and so does our
  runtime's replicated pipeline stage (``pipedream_impl.runtime.grad_buckets``: buckets
  all-reduced during the round's last backward, B or W, the ``overlap_with`` kind), so
  only what that one backward does not hide is exposed after the last replica reaches
  the all-reduce: ``max(0, allreduce - backward)``, the backward of one unit (a
  microbatch where the schedule splits minibatches: only the last one overlaps).
  ``dp_overlap=False`` / ``pipeline_overlap=False``: not overlapped (PipeDream's
  optimizer's model; our runtime before the buckets). Peer engines' pipelines
  (``multistage``) are charged unoverlapped.

``MachineModel`` holds what a validation measured on the machine it simulates (replacing
the profile's compute, the link model and the ring formula where given); ``Topology``
says which level two ranks share and which rings a hierarchical all-reduce runs;
``memory_per_worker`` reads peak memory off a schedule.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from core.collectives import Sync, ring_factor
from pipedream_impl.planner.antichain import input_nodes
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.runtime.weight_stash import snapshots_held, versions_held
from pipedream_impl.schedule import GRADIENT_DONE, Action, Layout, Schedule

__all__ = ["AllReduceModel", "ClusterCosts", "MachineModel", "StageCost", "Topology", "action_s",
           "memory_per_worker", "stage_costs", "sync_levels"]


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
    # (the receiving rank's first stage, as for send_s, "F" or "B") -> the receiver's own
    # time per receive once the message is in (unpacking, posting the next receive,
    # settling sends); default none
    recv_s: dict[tuple[int, str], float] | None = None
    header_messages: int = 0  # extra messages per send (our shape header, unless static)
    # gloo's point-to-point: the payload moves only once the receiver has posted its
    # receive (measured here: a message sent a second earlier still takes its full
    # transfer time after the receive is posted); default: eager, moving at send time
    rendezvous: bool = False
    # per stage: measured seconds of its all-reduce per update (DDP: its gradient buckets
    # all-reduced one after another, ``microbench.measure_allreduce``); replaces the
    # formula's time for that stage
    allreduce_s: dict[int, float] | None = None
    # per stage: the CPU time one rank spends in that all-reduce (all its threads), what
    # it takes from the cores the workers share: gloo waits off core for most of the
    # elapsed time once ranks outnumber cores; default: the elapsed time
    allreduce_cpu_s: dict[int, float] | None = None
    # CPU cores the workers share (None: one device each). With more workers than cores,
    # ranks computing at once share the cores (``harness.sim.shared_cores``) and the run
    # takes at least (busy time of all ranks) / cores: a rank only slows others while it
    # computes or spends CPU in its calls (``ClusterCosts.comm_busy_s``; model
    # parallelism on 4 workers and 2 cores is not halved)
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
    weight_grad_s: float = 0.0  # the part of backward_s spent on weight gradients (W)


def stage_costs(profile: Profile, groups: list[tuple[str, ...]]) -> list[StageCost]:
    """Per-stage sums over the profile's nodes; ``groups`` are the nodes of each stage.
    Input nodes (``antichain.input_nodes``, the planner's rule) cost no compute: the
    planner drops them, as the original optimizer does; their bytes still count."""
    g = profile.graph()
    inputs = set(input_nodes(g))
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
        work = [n for n in nodes if n.node_id not in inputs]
        crossing = [g.nodes[n] for n in where if where[n] <= i
                    and any(where[m] > i for m in g.edges.get(n, []))]
        out.append(StageCost(tuple(grp), sum(n.forward_ms for n in work) / 1e3,
                             sum(n.backward_ms for n in work) / 1e3,
                             sum(n.parameter_bytes for n in nodes),
                             sum(n.activation_bytes for n in nodes),
                             sum(n.activation_bytes for n in crossing),
                             max(1, sum(len(n.activations) for n in crossing)),
                             _weight_grad_s(work)))
    return out


def _weight_grad_s(nodes: list) -> float:  # noqa: ANN001 - profile graph nodes
    """Seconds of a stage's backward spent on weight gradients: half the backward of its
    layers with parameters (a parameter-free layer's backward is all input gradient; for a
    layer with weights dX and dW cost about the same: the zero-bubble paper's T_B = T_W).
    An assumption, not a measurement."""
    return sum(n.backward_ms for n in nodes if n.parameter_bytes > 0) / 2e3


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
        """The level of the link between ranks ``a`` and ``b`` (``Cluster.link_level``)."""
        return self.cluster.link_level(self.placement[a], self.placement[b])

    def ring_groups(self, ranks: tuple[int, ...]) -> list[tuple[int, list[int]]]:
        """(level, sizes) of a hierarchical ring all-reduce over ``ranks``: at each level
        where some ring has 2 or more members, the size of every ring (one per group of
        that level: the groups of the level below it holds)."""
        out = []
        below = [self.placement[r] for r in ranks]  # level -1 groups: the workers
        for lv, size in enumerate(self.group_sizes):
            inner = size // self.cluster.levels[lv].workers  # workers per level-(lv-1) group
            groups: dict[int, set[int]] = defaultdict(set)
            for w in below:
                groups[w // size].add(w // inner)
            sizes = [len(g) for g in groups.values()]
            if max(sizes) > 1:
                out.append((lv, sizes))
        return out

    def ring_levels(self, ranks: tuple[int, ...]) -> list[tuple[int, int]]:
        """(level, k) of a hierarchical ring all-reduce over ``ranks``: at each level, a
        ring among the k groups of the level below (k = 1: nothing to do there)."""
        return [(lv, max(sizes)) for lv, sizes in self.ring_groups(ranks)]


def sync_levels(topology: Topology, ranks: tuple[int, ...], sync: Sync, nbytes: float,
                latency_s: float) -> list[tuple[int, float, float]]:
    """(level, seconds, bytes the level's links carry) of one synchronisation of ``nbytes``
    among ``ranks``: a ring among the groups the ranks form at each level inside a machine,
    ``sync`` among the machines at the outermost level (see the module docstring)."""
    cluster = topology.cluster
    top = len(cluster.levels) - 1
    out = []
    for lv, sizes in topology.ring_groups(ranks):
        k = max(sizes)
        bw = cluster.levels[lv].bandwidth
        if lv < top or sync.mode == "ring":
            secs = ring_factor(k) * nbytes / bw + 2 * (k - 1) * latency_s
            moved = sum(g * ring_factor(g) * nbytes for g in sizes)
        else:  # one group at the top: the k machines, push and pull
            secs = sync.time(k, nbytes, bw) + 2 * latency_s
            moved = sync.machine_bytes(k, nbytes)
        out.append((lv, secs, moved))
    return out


class AllReduceModel(Protocol):
    """A fitted model of one all-reduce implementation (``harness.sim.calibration``): it
    replaces the time of every replicated stage's synchronisation (bytes are still counted
    by ``sync_levels``) and says whether it hides behind the backward (DDP's hooks)."""
    overlap: bool

    def seconds(self, topology: Topology, ranks: tuple[int, ...], nbytes: float) -> float:
        ...

    def planner_cluster(self, cluster: Cluster) -> Cluster:
        """``cluster`` as the planner should see it under this all-reduce."""
        ...


class ClusterCosts:
    """The cost model the schedule engine asks (see ``pipedream_impl.schedule.TickCosts``)."""

    def __init__(self, layout: Layout, stages: list[StageCost], cluster: Cluster,
                 placement: list[int], unit_share: float, compute_factor: float,
                 latency_s: float, allreduce: str, overlap_allreduce: bool,
                 machine: MachineModel | None = None, cpu_machines: int = 0,
                 model: AllReduceModel | None = None, overlap_with: str = "B") -> None:
        self.layout, self.stages, self.cluster = layout, stages, cluster
        self.topology = Topology(cluster, placement)
        self.unit_share, self.factor = unit_share, compute_factor
        self.latency, self.mode, self.overlap = latency_s, allreduce, overlap_allreduce
        self.overlap_with = overlap_with  # the kind of backward that hides the all-reduce
        self.sync = Sync(allreduce, cpu_machines)  # among machines (``sync_levels``)
        self.machine = machine or MachineModel()
        self.model = model  # a calibrated all-reduce (time only), overlapped if it says so
        self.link_free: dict[tuple[int, int], float] = defaultdict(float)
        self.bytes_per_level: dict[int, float] = defaultdict(float)
        # CPU time in communication calls: senders' and receivers' own time, all-reduces'
        self.comm_busy_s = 0.0
        # (rank, compute action) -> how many times as long it takes on time-shared cores
        self.shared: dict[tuple[int, Action], float] = {}

    def compute(self, rank: int, a: Action) -> float:
        s = self.layout.stage_of(rank)[0]
        shared = self.shared.get((rank, a), 1.0)  # time-shared cores (``shared_cores``)
        if self.machine.action_s is not None:
            return self.machine.action_s[s].get(a.kind, 0.0) / self.factor * shared
        st = self.stages[a.stage if a.stage >= 0 else s]
        return action_s(st, a.kind) * self.unit_share / self.factor * shared

    def send(self, src: int, dst: int, a: Action, t: float) -> tuple[float, float]:
        own = (self.machine.send_s or {}).get((self.layout.stage_of(src)[0], a.kind[1]), 0.0)
        t += own / self.factor
        self.comm_busy_s += own / self.factor
        if self.machine.rendezvous:  # moves when the receiver asks: see ``receive``
            return t, t
        return t, self._transfer(src, dst, a, t)

    def receive(self, src: int, dst: int, a: Action, token: float, posted: float) -> float:
        own = (self.machine.recv_s or {}).get((self.layout.stage_of(dst)[0], a.kind[1]),
                                              0.0) / self.factor
        self.comm_busy_s += own
        if self.machine.rendezvous:
            return self._transfer(src, dst, a, max(token, posted)) + own
        return max(token, posted) + own

    def _transfer(self, src: int, dst: int, a: Action, t: float) -> float:
        """When a message that may start at ``t`` is in (FIFO per directed link)."""
        s = self.layout.stage_of(src)[0]  # the sending stage
        if a.stage >= 0:  # several stages per rank: the action names its stage
            s = a.stage + {"RF": -1, "RB": 1}.get(a.kind, 0)
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
        nbytes = self.stages[stage].parameter_bytes
        measured = (self.machine.allreduce_s or {}).get(stage)
        levels = sync_levels(self.topology, ranks, self.sync, nbytes, self.latency)
        for lv, _, moved in levels:  # every replica calls once: each adds its share
            self.bytes_per_level[lv] += moved / len(ranks)
        dur = measured if measured is not None else sum(s for _, s, _ in levels)
        if self.model is not None and measured is None:
            dur = self.model.seconds(self.topology, ranks, nbytes)
        # the CPU it takes (its barrier wait for the other replicas takes none)
        cpu = (self.machine.allreduce_cpu_s or {}).get(stage)
        # hidden behind the backward that produced the gradients
        if self.overlap or (self.model is not None and self.model.overlap):
            dur = max(0.0, dur - self.compute(ranks[0], Action(self.overlap_with, 0)))
        self.comm_busy_s += dur if cpu is None else cpu
        return dur


def action_s(st: StageCost, kind: str) -> float:
    """A compute action's seconds on the profiled batch: F, B, and B's halves I and W."""
    return {"F": st.forward_s, "B": st.backward_s, "I": st.backward_s - st.weight_grad_s,
            "W": st.weight_grad_s}.get(kind, 0.0)


def memory_per_worker(sched: Schedule, stages: list[StageCost], unit_share: float,
                      optimizer_slots: int) -> dict[int, dict[str, float]]:
    """Peak bytes per rank read off its action list: ``weights`` (the live weights +
    ``optimizer_slots`` copies of optimizer state), ``stashed_weights`` (the snapshots the
    runtime holds besides the live weights: distinct versions in flight whose minibatches
    see an update before their backward, the current one included; counted by
    ``weight_stash.snapshots_held``, the rules the runtime's ``stash_weight_bytes`` metric
    measures, versions advancing by the stage's replicas per update), ``activations``
    (in-flight units x the stage's activation bytes); ``total`` is the sum of the three
    peaks; ``weight_versions`` (a count, not bytes) the most distinct versions held at once,
    the live one included (``weight_stash.versions_held``: 2 under PipeDream-2BW)."""
    if sched.stage_ranks:
        return _memory_per_rank(sched, stages, unit_share, optimizer_slots)
    out = {}
    for rank, acts in enumerate(sched.actions):
        stage = sched.layout.stage_of(rank)[0]
        st = stages[stage]
        held = snapshots_held(acts, sched.weights, sched.layout.replicas[stage])
        in_flight: set[int] = set()
        peak_units = 0
        for a in acts:
            if a.kind == "F":
                in_flight.add(a.mb)
            elif a.kind in GRADIENT_DONE:
                in_flight.discard(a.mb)
            peak_units = max(peak_units, len(in_flight))
        out[rank] = {"weights": st.parameter_bytes * (1 + optimizer_slots),
                     "stashed_weights": st.parameter_bytes * max(held, default=0),
                     "activations": st.activation_bytes * unit_share * peak_units}
        out[rank]["total"] = sum(out[rank].values())
        out[rank]["weight_versions"] = max(versions_held(acts, sched.weights,
                                                         sched.layout.replicas[stage]))
    return out


def _memory_per_rank(sched: Schedule, stages: list[StageCost], unit_share: float,
                     optimizer_slots: int) -> dict[int, dict[str, float]]:
    """``memory_per_worker`` for ranks holding several stages (every step flushes: one
    weight version): their stages' weights, and the activations of the units whose forward
    ran and whose weight gradient (W, or B where unsplit) has not, the graph torch keeps."""
    out = {}
    for rank, acts in enumerate(sched.actions):
        mine = sched.stages_of(rank)
        live: dict[int, set[int]] = {s: set() for s in mine}
        peak = 0.0
        for a in acts:
            if a.kind == "F":
                live[a.stage].add(a.mb)
            elif a.kind in GRADIENT_DONE:
                live[a.stage].discard(a.mb)
            peak = max(peak, sum(len(live[s]) * stages[s].activation_bytes * unit_share
                                 for s in mine))
        weights = sum(stages[s].parameter_bytes for s in mine)
        out[rank] = {"weights": weights * (1 + optimizer_slots), "stashed_weights": 0.0,
                     "activations": peak}
        out[rank]["total"] = sum(out[rank].values())
        out[rank]["weight_versions"] = 1
    return out
