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

``MachineModel`` holds what a validation measured on the machine it simulates (replacing
the profile's compute, the link model and the ring formula where given); ``Topology``
says which level two ranks share and which rings a hierarchical all-reduce runs;
``memory_per_worker`` reads peak memory off a schedule.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from core.collectives import ring_factor
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.schedule import Action, Layout, Schedule

__all__ = ["ClusterCosts", "MachineModel", "StageCost", "Topology", "memory_per_worker",
           "stage_costs"]


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
