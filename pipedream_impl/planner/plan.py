"""``Plan``: the partitioning the runtime executes, as data (JSON at every hand-off).

A plan lists stages in pipeline order, each with its range of states (for a chain profile,
layers ``[start, stop)``), the profile nodes it holds, its replicas and worker ranks, and
its predicted time per minibatch; NOAM (number of optimal active minibatches) =
ceil(workers / replicas of the input stage), the paper's; ``depths``, the minibatches
each stage holds in flight under 1F1B(-RR), which the runtime and the simulator use: the
schedule's warm-up (``schedule.actions.stage_depths``: more than NOAM's where
neighbouring stages' replica counts differ) and more where the cuts' transfers need it
(``depths``); and the predictions other tools read::

    {"config": "15-1", "config_label": "15-1", "workers": 16, "noam": 2, "depths": [30, 1],
     "stages": [{"layers": [0, 31], "nodes": [...], "replicas": 15, "ranks": [...],
                 "predicted_time_s": ...}, ...],
     "predicted": {"time_per_minibatch_s", "throughput_minibatches_per_s",
                   "single_worker_time_s", "data_parallel_time_s", "speedup_vs_one_worker",
                   "speedup_vs_data_parallel", "bytes_per_sample",
                   "bytes_per_sample_data_parallel"},
     "cluster": ..., "cost_model": ..., "state_method": ..., "batch_size": ...}

Ranks: a server holds consecutive ranks (G per server). An outer stage on r servers runs
its inner partition on each of them; an inner stage with g workers per server therefore has
g x r replicas. Bytes per sample count what crosses links per training sample: activations
forward and gradients backward at every stage boundary (2 x its output bytes per
minibatch), and for a stage with r replicas a ring all-reduce, 2 (r-1)/r x its parameters per
replica per r minibatches, i.e. 2 (r-1)/r x P per minibatch. Data parallelism on W workers:
2 (W-1)/W x all parameters per minibatch. Under another ``sync`` mode (``--allreduce ps``
etc.) the machines' share is that mode's (every NIC's bytes, CPU machines included:
``core.collectives.Sync.machine_bytes``) and ``extra`` records the mode and k.

``load_plan`` reads a plan file and says which key is wrong when one is (a plan edited by
hand, a profile given where a plan belongs, a file that is not JSON).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace

from core.collectives import Sync, ring_factor
from core.errors import ScheduleError, UserInputError, read_text
from pipedream_impl.planner.antichain import MAX_STATES, States, build_states, coarsen
from pipedream_impl.planner.cluster import Cluster
from pipedream_impl.planner.depths import cut_seconds, transfer_depths
from pipedream_impl.planner.optimizer import (
    MAX_STATES_MULTI_LEVEL,
    MAX_TRIPLES_MULTI_LEVEL,
    Solution,
    solve,
)
from pipedream_impl.planner.sync_cost import data_parallel_time
from pipedream_impl.profiling.profile import Profile, infer_batch_size
from pipedream_impl.schedule.actions import Layout

__all__ = ["Plan", "Stage", "build_plan", "load_plan", "plan_profile"]

_PLAN_HINT = "make one with `pipebench plan --profile FILE --cluster C -o plan.json`"
_STAGE_KEYS = ("layers", "replicas", "ranks", "predicted_time_s")


@dataclass(frozen=True)
class Stage:
    layers: tuple[int, int]  # state range [start, stop)
    replicas: int
    ranks: tuple[int, ...]
    predicted_time_s: float  # compute / replicas per minibatch (the bottleneck adds sync)
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    workers: int
    predicted: dict[str, float]
    cluster: str = ""
    cost_model: str = "pipebench"
    state_method: str = "antichain"
    batch_size: int = 0
    profile: str = ""
    extra: dict = field(default_factory=dict)
    depths: tuple[int, ...] = ()  # minibatches in flight per stage (``depths``); (): default

    def __post_init__(self) -> None:
        if not self.stages:
            raise UserInputError("a plan needs at least one stage")
        if self.depths:
            try:
                Layout(tuple(s.replicas for s in self.stages), tuple(self.depths))
            except ScheduleError as e:
                raise UserInputError(f"\"depths\": {e}") from None
        if self.stages[0].layers[0] != 0:
            raise UserInputError(f"the first stage must start at layer 0, not "
                                 f"{self.stages[0].layers[0]}")
        for s in self.stages:
            if not 0 <= s.layers[0] < s.layers[1]:
                raise UserInputError(f"stage layers {list(s.layers)} must be a range [start, "
                                     "stop) with 0 <= start < stop")
        used = sorted(r for s in self.stages for r in s.ranks)
        if len(set(used)) != len(used):
            raise UserInputError(f"a rank appears in two stages: {used}")
        for s in self.stages:
            if s.replicas != len(s.ranks) or s.replicas < 1:
                raise UserInputError(f"stage {s.layers} has {s.replicas} replicas but ranks "
                                     f"{s.ranks}")
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            if a.layers[1] != b.layers[0]:
                raise UserInputError(f"stages {a.layers} and {b.layers} are not contiguous")

    @property
    def config(self) -> str:
        return "-".join(str(s.replicas) for s in self.stages)

    @property
    def config_label(self) -> str:
        """The paper's way: "straight" for an unreplicated pipeline, else the config."""
        if len(self.stages) > 1 and all(s.replicas == 1 for s in self.stages):
            return "straight"
        return self.config

    @property
    def noam(self) -> int:
        return math.ceil(self.workers / self.stages[0].replicas)

    def to_json(self) -> str:
        d = asdict(self)
        d.update(config=self.config, config_label=self.config_label, noam=self.noam)
        return json.dumps(d, indent=1)

    @staticmethod
    def from_json(text: str) -> Plan:
        """The plan in ``text``; a ``UserInputError`` names the key that is wrong."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserInputError(f"not valid JSON (line {e.lineno}, column {e.colno}: "
                                 f"{e.msg}); {_PLAN_HINT}") from None
        if not isinstance(d, dict):
            raise UserInputError(f"expected a JSON object with \"stages\", got a "
                                 f"{type(d).__name__}; {_PLAN_HINT}")
        if "layers" in d and "stages" not in d:
            raise UserInputError(f"this is a profile, not a plan; {_PLAN_HINT}")
        found = ", ".join(map(str, d)) or "none"
        for key in ("stages", "workers", "predicted"):
            if key not in d:
                raise UserInputError(f"no \"{key}\" key (found: {found}); {_PLAN_HINT}")
        if not isinstance(d["stages"], list) or not d["stages"]:
            raise UserInputError(f"\"stages\" must be a non-empty list; {_PLAN_HINT}")
        if not _whole(d["workers"]) or d["workers"] < 1:
            raise UserInputError(f"\"workers\" must be a whole number >= 1 (got "
                                 f"{d['workers']!r})")
        if not isinstance(d["predicted"], dict):
            raise UserInputError("\"predicted\" must be an object of numbers")
        stages = tuple(_stage(i, s) for i, s in enumerate(d["stages"]))
        keep = ("workers", "predicted", "cluster", "cost_model", "state_method",
                "batch_size", "profile", "extra")
        depths = d.get("depths", [])
        if not (isinstance(depths, list) and all(map(_whole, depths))):
            raise UserInputError(f"\"depths\" must be a list of whole numbers, one per "
                                 f"stage (got {depths!r})")
        plan = Plan(stages, **{k: d[k] for k in keep if k in d}, depths=tuple(depths))
        ranks = [r for s in plan.stages for r in s.ranks]
        if max(ranks) >= plan.workers:
            raise UserInputError(f"rank {max(ranks)} is not below \"workers\" "
                                 f"({plan.workers})")
        return plan


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _stage(i: int, s: object) -> Stage:
    """``stages[i]`` of a plan file, checked key by key."""
    where = f"stages[{i}]"
    if not isinstance(s, dict):
        raise UserInputError(f"{where} must be an object with {', '.join(_STAGE_KEYS)}")
    for key in _STAGE_KEYS:
        if key not in s:
            raise UserInputError(f"{where} has no \"{key}\"; each stage needs "
                                 f"{', '.join(_STAGE_KEYS)}; {_PLAN_HINT}")
    layers, ranks, nodes = s["layers"], s["ranks"], s.get("nodes", [])
    if not (isinstance(layers, list) and len(layers) == 2 and all(map(_whole, layers))):
        raise UserInputError(f"{where}: \"layers\" must be [start, stop] (got {layers!r})")
    if not _whole(s["replicas"]) or s["replicas"] < 1:
        raise UserInputError(f"{where}: \"replicas\" must be a whole number >= 1 (got "
                             f"{s['replicas']!r})")
    if not (isinstance(ranks, list) and all(_whole(r) and r >= 0 for r in ranks)):
        raise UserInputError(f"{where}: \"ranks\" must be a list of worker ranks >= 0 "
                             f"(got {ranks!r})")
    t = s["predicted_time_s"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
            or t < 0:
        raise UserInputError(f"{where}: \"predicted_time_s\" must be a number >= 0 (got "
                             f"{t!r})")
    if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
        raise UserInputError(f"{where}: \"nodes\" must be a list of profile node ids")
    try:
        return Stage(tuple(layers), s["replicas"], tuple(ranks), float(t), tuple(nodes))
    except UserInputError as e:
        raise UserInputError(f"{where}: {e}") from None


def load_plan(path: str) -> Plan:
    """A plan file (``pipebench plan -o``), checked; errors name the file and the key."""
    text = read_text(path, "plan", _PLAN_HINT)
    try:
        return Plan.from_json(text)
    except UserInputError as e:
        raise UserInputError(f"plan {path}: {e}") from None


def _segments(sol: Solution, level: int, row: int, end: int, m: int) -> list[tuple]:
    """[(start_row, end_state, units, inner_dp)] of the pipeline A(row, end, m) at
    ``level``; ``inner_dp``: the stage is data parallel on every worker of its units."""
    ls = sol.levels[level]
    out = []
    while True:  # (the final level stores row 0 only, the only row asked of it)
        k = int(ls.split[row, end, m])
        reps = int(ls.replicas[row, end, m])
        dp = ls.inner_dp is not None and bool(ls.inner_dp[row, end, m])
        if k < 0:
            out.append((row, end, reps, dp))
            break
        out.append((k + 1, end, reps, dp))
        end, m = k, int(ls.prev_m[row, end, m])
    return out[::-1]


def _flatten(sol: Solution, level: int, row: int, end: int, m: int) -> list[tuple]:
    """[(start_row, end_state, replicas_per_unit_chain)] down to the innermost level."""
    stages = []
    for start, stop, reps, inner_dp in _segments(sol, level, row, end, m):
        if level == 0:
            stages.append((start, stop, [reps]))
        elif inner_dp:
            stages.append((start, stop, [lv.workers for lv in sol.cluster.levels[:level]]
                           + [reps]))
        else:
            inner_units = sol.cluster.levels[level - 1].workers
            for s, e, inner in _flatten(sol, level - 1, start, stop, inner_units - 1):
                stages.append((s, e, inner + [reps]))
    return stages


def build_plan(sol: Solution, batch_size: int = 0, profile: str = "") -> Plan:
    states: States = sol.states
    cluster = sol.cluster
    if not math.isfinite(sol.time):
        raise UserInputError("no feasible plan (is the memory limit too small?)")
    top = len(cluster.levels) - 1
    flat = _flatten(sol, top, 0, len(states) - 1, cluster.levels[top].workers - 1)
    rank_lists = _assign_ranks(flat, [lv.workers for lv in cluster.levels])
    stages, cuts = [], []  # cuts: seconds of one transfer across the cut after each stage
    bytes_mb = 0.0
    for i, ((start, stop, reps), ranks) in enumerate(zip(flat, rank_lists, strict=True)):
        replicas = math.prod(reps)
        p = _span(states.parameter_bytes, start, stop)
        c = _span(states.compute_s, start, stop)
        sync = ring_factor(replicas) * p if sol.sync is None or sol.sync.mode == "ring" \
            else _sync_bytes(reps, p, sol.sync)
        bytes_mb += sync + (2.0 * states.output_bytes[stop] if stop < len(states) - 1 else 0)
        before = set(states.members[start - 1]) if start else set()
        nodes = tuple(n for n in states.members[stop] if n not in before)
        stages.append(Stage((start, stop + 1), replicas, tuple(ranks), float(c / replicas),
                            nodes))
        if i + 1 < len(flat):
            cuts.append(cut_seconds(cluster, float(states.output_bytes[stop]), tuple(ranks),
                                    tuple(rank_lists[i + 1])))
    total = float(states.compute_s[-1])
    dp = data_parallel_time(states, cluster, sol.model, sol.sync, sol.overlap)
    w = cluster.workers
    dp_bytes = ring_factor(w) * float(states.parameter_bytes[-1])
    extra = {}
    if sol.sync is not None and sol.sync.mode != "ring":
        dp_bytes = _sync_bytes([lv.workers for lv in cluster.levels],
                               float(states.parameter_bytes[-1]), sol.sync)
        extra = {"allreduce": sol.sync.mode, "cpu_machines": sol.sync.cpu_machines}
    if sol.model == "pipebench" and not sol.overlap:
        extra["overlap"] = False  # the all-reduce summed with compute
    b = batch_size if batch_size > 0 else 1
    predicted = {"time_per_minibatch_s": sol.time,
                 "throughput_minibatches_per_s": 1.0 / sol.time,
                 "single_worker_time_s": total, "data_parallel_time_s": dp,
                 "speedup_vs_one_worker": total / sol.time,
                 "speedup_vs_data_parallel": dp / sol.time,
                 "bytes_per_sample": bytes_mb / b,
                 "bytes_per_sample_data_parallel": dp_bytes / b}
    depths = transfer_depths(tuple(s.replicas for s in stages), *_halves(states, stages),
                             cuts, sol.time)
    return Plan(tuple(stages), w, predicted, cluster.describe(), sol.model,
                states.method, batch_size, profile, extra, depths)


def _span(prefix, first: int, last: int) -> float:  # noqa: ANN001 - a States prefix array
    """A prefix-summed ``States`` array over states ``first`` to ``last``, both in."""
    return float(prefix[last] - (prefix[first - 1] if first else 0.0))


def _halves(states: States, stages: list[Stage]) -> tuple[list[float], list[float]]:
    """Each stage's forward and backward seconds per minibatch on one replica (a state
    method without backward times: PipeDream's usual 1:2)."""
    forward, backward = [], []
    for st in stages:
        c = st.predicted_time_s * st.replicas
        b = 2.0 * c / 3.0 if states.backward_s is None else \
            _span(states.backward_s, st.layers[0], st.layers[1] - 1)
        forward.append(c - b)
        backward.append(b)
    return forward, backward


def _sync_bytes(reps: list[int], nbytes: float, sync: Sync) -> float:
    """Bytes per minibatch of a stage of ``nbytes`` on ``reps`` units per level (innermost
    first; the outermost are machines): rings among the ring members of each inner level
    (r / prod(reps[:i]) members at level i, each sending 2 (k-1)/k x the bytes), ``sync``
    among the machines (every NIC's bytes, CPU machines included), over the r replicas
    (one synchronisation per r minibatches)."""
    r = math.prod(reps)
    total = sum(r // math.prod(reps[:i]) * ring_factor(k) * nbytes
                for i, k in enumerate(reps[:-1]))
    return (total + sync.machine_bytes(reps[-1], nbytes)) / r


def _assign_ranks(flat: list[tuple], sizes: list[int]) -> list[list[int]]:
    """Ranks of each stage, in pipeline order; ``reps`` of a stage is its units per level,
    innermost first. One level: consecutive ranks. Two levels: an outer stage takes the next
    ``reps[1]`` whole servers; each of its inner stages takes the next ``reps[0]`` workers on
    every one of those servers (so the inner pipeline repeats on each server)."""
    out: list[list[int]] = []
    if len(sizes) == 1:
        nxt = 0
        for _, _, reps in flat:
            out.append(list(range(nxt, nxt + reps[0])))
            nxt += reps[0]
        return out
    g = sizes[0]
    first_server, servers, used = 0, 0, g  # used == g: the current servers are full
    for _, _, (inner, outer) in flat:
        if used >= g:  # the previous outer stage filled its servers: take fresh ones
            first_server += servers
            servers, used = outer, 0
        out.append([(first_server + srv) * g + used + i for srv in range(outer)
                    for i in range(inner)])
        used += inner
    return out


def plan_profile(profile: Profile, cluster: Cluster, model: str = "pipebench",
                 straight: bool = False, memory_limit: float | None = None,
                 batch_size: int | None = None, sync: Sync | None = None,
                 overlap: bool = True) -> Plan:
    """Profile + cluster -> Plan: the library behind ``pipebench plan``; ``sync``: how
    replicas on different machines synchronise (default: a ring); ``overlap``: the backward
    hides the all-reduce (``optimizer.solve``)."""
    if batch_size is not None and batch_size < 1:
        raise UserInputError(f"--batch-size must be at least 1 (got {batch_size})")
    if memory_limit is not None and not (math.isfinite(memory_limit) and memory_limit > 0):
        raise UserInputError(f"--memory-limit must be a positive size (got {memory_limit})")
    if memory_limit is not None:
        big = max(profile.layers, key=lambda n: n.parameter_bytes)
        if big.parameter_bytes > memory_limit:
            raise UserInputError(f"no feasible plan: the memory limit ({memory_limit:.4g} "
                                 f"bytes per worker) is below the weights of layer "
                                 f"{big.node_id} alone "
                                 f"({big.parameter_bytes:.4g} bytes); raise --memory-limit "
                                 "(e.g. 16GB)")
    multi = len(cluster.levels) > 1
    states = build_states(profile.graph(), max_states=MAX_STATES,
                          max_triples=MAX_TRIPLES_MULTI_LEVEL if multi else None)
    if multi and states.method != "antichain" and len(states) > MAX_STATES_MULTI_LEVEL:
        states = coarsen(states, MAX_STATES_MULTI_LEVEL // 2)
    if straight and cluster.workers > len(states):
        raise UserInputError(f"a straight pipeline on {cluster.workers} workers needs "
                             f"{cluster.workers} stages, but the profile has only "
                             f"{len(states)} layers to split; use at most {len(states)} "
                             "workers")
    sol = solve(states, cluster, model, straight, memory_limit, sync, overlap)
    if not math.isfinite(sol.time):
        raise UserInputError("no feasible plan: every partition exceeds the memory limit "
                             "(raise --memory-limit or add workers)")
    b = batch_size or profile.batch_size or infer_batch_size(profile)
    plan = build_plan(sol, b, profile.source or profile.workload)
    return plan if memory_limit is None else _depths_within(plan, states, memory_limit)


def _depths_within(plan: Plan, states: States, limit: float) -> Plan:
    """``plan`` with PipeDream's default depths where its deeper ones (``depths``) would
    stash more weight versions and activations than ``limit`` bytes on some worker (the
    search counted the default's; a stage of r replicas holds depth / r of them)."""
    def held(stage: Stage, depth: int) -> float:
        first, last = stage.layers[0], stage.layers[1] - 1
        return (_span(states.activation_bytes, first, last)
                + _span(states.parameter_bytes, first, last)) * depth / stage.replicas

    if not plan.depths or all(held(s, d) <= limit
                              for s, d in zip(plan.stages, plan.depths, strict=True)):
        return plan
    return replace(plan, depths=(), extra={**plan.extra, "depths": "default (memory limit)"})
