"""PipeDream's hierarchical partitioning dynamic program, vectorised.

Notation: states 0..N-1 from antichain.py; a stage is the range (k, j] of states (row r = k+1
of the range tables; row 0 = from the input); C, P, Act are its compute seconds, parameter
bytes and activation bytes (prefix differences); out[j] the bytes leaving state j; B the
bandwidth of the current level; m' replicas of a stage; M the workers (units of the level
below) at this level.

The recurrence (PipeDream, SOSP'19, section 3.1), for a sub-pipeline from row r to state j
on m units::

    A(r, j, m) = min( T(r, j, m),                                 # one stage, m replicas
                      min_{k, m'} max( A(r, k, m - m'),           # the pipeline before
                                       T(k+1, j, m'),             # the last stage
                                       2 out[k] / (B m'),         # its input transfer
                                       2 out[j] / (B m') ) )      # its output transfer
    T(r, j, m) = (C(r, j) + AR(m, P(r, j))) / m     (``pipebench``: AR less what the
                                                     range's backward hides, below)

where k ranges over the states that precede j in the antichain DAG, and the output transfer
is left out when j is the last state. The factor 2 counts activations forward and gradients
backward; dividing by m' spreads a replicated stage's minibatches over m' links.

Levels: the DP runs on the innermost level first; at the next level a "unit" is a whole
server and C(r, j) becomes A_inner(r, j, G) (the best time of that range on one server),
while P and Act keep their raw sums. The final level needs row 0 only; an inner level needs
the rows the next level can read: under a final level of two units only row 0 and the
ranges ending at the last state, otherwise every row. Splits are visited only over ordered
triples r-1 < k < j of the antichain DAG, vectorised with numpy over many rows at once, and
at the innermost level not at a state whose earlier twin (same prefix sums) is no worse
(search.py: exact, ties included).

Memory limit (optional, per worker): a stage that has w workers after it (at this level)
stashes ``ceil(w / m')`` versions of its weights and activations (the original's count); it
is skipped when (Act + P) times that exceeds the limit. Our runtime's 1F1B-RR warms up
deeper than that where neighbouring stages have uneven replica counts
(``schedule.actions.stage_depths``), so on such plans the limit is a lower bound of what a
worker holds; the search keeps the original's count so that its plans stay the original's.

Relation to the paper's text: the paper describes the transfer term as 2a/B and weight
synchronisation as an all-reduce whose ring cost is 2 (m-1)/m x |w| / B; the original code
charges 4 (m-1)/m x |w| / B instead (twice the ring volume). ``pipebench`` follows the
paper's ring formula, ``pipedream-2019`` the code. The paper's model does not overlap the
all-reduce with compute, although the paper notes that PipeDream's runtime overlaps
communication; ``pipebench`` does by default (below).

Two cost models (``COST_MODELS``), differing only in the weight-synchronisation term AR and
its bandwidth:

- ``pipedream-2019``: the original optimizer (msr-fiddle/pipedream,
  optimizer_graph_hierarchical.py, run with ``--activation_compression_ratio 1``):
  AR(m, P) = 4 (m-1) P / (B m), additionally divided by G (the number of workers per unit of
  the level below) for a single-stage range but *not* in the split branch; data parallelism
  on the same cluster is computed level by level, t <- (t + AR_level / G_prev) / n_level.
  Compute and all-reduce are summed, transfers overlapped (max).
- ``pipebench`` (default): our model of the runtime: AR is a ring all-reduce,
  AR(m, P) = 2 (m-1)/m * P / B, in *both* branches over the range's *effective* parameter
  bytes P_eff: the bytes its units push through their shared link (Cluster-A: one 10 Gbps
  NIC per 4 GPUs) per minibatch. At the innermost level P_eff = P. At an outer level a unit
  runs the range as the level below planned it, stages s with P_s bytes on r_s replicas,
  and a replica synchronises once per minibatch it processes, so a unit moves
  P_eff = sum_s P_eff,s / r_s per minibatch (``sync_cost.next_level_tables``): P / G when
  the range is data parallel on all G workers of the unit (then a single stage replicated on every
  unit costs exactly what data parallelism costs, which the original's split branch
  breaks), P when the unit pipelines it unreplicated (dividing by G there, as an earlier
  version did, made cross-server replication of straight pipelines look G times cheaper
  than the simulator finds it). Data parallelism: (total compute + sum over levels of
  2 (n-1)/n * P / B_level) / workers. Weight synchronisation is hidden by the backward
  as far as it lasts (``overlap``, default): T = (C + max(0, AR - B)) / m for a range
  whose backward takes B, for the pipeline and data parallelism alike, as the runtime
  all-reduces a replicated stage's buckets during the round's last backward
  (``runtime.grad_buckets``), DDP overlaps data parallelism's, and the simulator charges
  them; across levels what the backward leaves over hides the next level's all-reduce
  (``sync_cost``, where the rule lives). ``overlap=False`` sums them with compute, the
  paper's comparison with unoverlapped data parallelism. Point-to-point transfers are
  overlapped with compute (max) in both models. ``sync``
  (``--allreduce ring|ps|ps-colocated|byteps --cpu-machines k``, ``core.collectives.Sync``)
  replaces the ring at the outermost level, where the units are machines with one NIC
  each: AR(m, P_eff) = its closed form for m machines (0 for m = 1); levels inside a
  machine keep the ring (the local reduce). Default: the ring, the plans unchanged.

Where the original indexes a range (r, j) whose start does not precede j (possible in
branching graphs, where its state order is hash-seed dependent), it reads a meaningless
prefix difference; we treat such ranges as invalid. On chains the two agree exactly.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from core.collectives import Sync
from core.errors import UserInputError
from pipedream_impl.planner.antichain import States
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.search import LastStage, Pairs, Twins, forward, reverse
from pipedream_impl.planner.sync_cost import (
    allreduce_time,
    check_sync,
    hidden_allreduce,
    next_level_tables,
)

__all__ = ["COST_MODELS", "INF", "LevelInput", "LevelSolution", "MAX_STATES_MULTI_LEVEL",
           "MAX_TRIPLES_MULTI_LEVEL", "Solution", "SolveOptions", "backward_table",
           "range_tables", "solve", "solve_level"]

COST_MODELS = ("pipebench", "pipedream-2019")
INF = np.inf


@dataclass(frozen=True)
class LevelSolution:
    time: np.ndarray  # [R, N, M] best time; inf where infeasible
    split: np.ndarray  # [R, N, M] k of the last split, -1 for a single stage
    prev_m: np.ndarray  # [R, N, M] index m - m' of the pipeline before the split
    replicas: np.ndarray  # [R, N, M] m' (replicas of the last stage at this level)
    # [R, N, M] the last stage runs data parallel on every worker of its units instead of
    # the level below's fastest plan (``pipebench`` model; always False at level 0)
    inner_dp: np.ndarray | None = None


def _range_table(prefix: np.ndarray, valid: np.ndarray) -> np.ndarray:
    n = prefix.shape[0]
    t = np.empty((n + 1, n))
    t[0] = prefix
    t[1:] = prefix[None, :] - prefix[:, None]
    return np.where(valid, t, np.nan)


def backward_table(states: States, valid: np.ndarray, overlap: bool) -> np.ndarray:
    """B [R, N]: each range's backward seconds, what hides its all-reduce (zeros without
    ``overlap``: nothing hidden, compute and all-reduce summed)."""
    if not overlap:
        return np.where(valid, 0.0, np.nan)
    return _range_table(states.backward_s, valid)


def range_tables(states: States) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """C, P, Act [R=N+1, N] and the validity mask of each range (r, j)."""
    n = len(states)
    valid = np.zeros((n + 1, n), dtype=bool)
    valid[0] = True
    valid[1:] = states.precedes
    tables = [_range_table(prefix, valid) for prefix in
              (states.compute_s, states.parameter_bytes, states.activation_bytes)]
    return tables[0], tables[1], tables[2], valid


@dataclass(frozen=True)
class SolveOptions:
    """What holds for every level of one solve."""
    model: str = "pipebench"  # a cost model of COST_MODELS
    straight: bool = False  # no replication
    memory_limit: float | None = None  # bytes per worker
    sync: Sync | None = None  # among machines (the outermost level); None: ring


@dataclass(frozen=True)
class LevelInput:
    """One level's range tables ([R+1, N], row 0: prefixes, row i: ranges after state i-1;
    NaN where a range is not valid) and the states' output bytes and precedence."""
    compute: np.ndarray
    params: np.ndarray
    acts: np.ndarray
    valid: np.ndarray
    out: np.ndarray
    precedes: np.ndarray
    pairs: Pairs | None = None  # the ordered pairs of ``precedes`` (built when None)
    twins: Twins | None = None  # states of equal prefix sums (innermost level only)


def solve_level(tables: LevelInput, level: Level, inner_units: int, opts: SolveOptions,
                final: bool, sync_params: np.ndarray | None = None,
                dp_inner: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                next_units: int | None = None,
                hide: np.ndarray | None = None) -> LevelSolution:
    """One level's DP over ``level.workers`` units joined at ``level.bandwidth``.
    ``sync_params``: the ``pipebench`` model's P_eff table (default P); ``hide``: the
    backward seconds that hide each range's all-reduce (``sync_cost``; default none);
    ``dp_inner``: (C, P_eff, hide) of each range run data parallel inside a unit, a second
    candidate for every stage; ``inner_units``: G, used only by ``pipedream-2019``;
    ``next_units``: the units of the next level when it is the final one (2: only row 0 and
    the ranges ending at the last state are computed, see search.py), else None (every
    row)."""
    compute, params, acts, valid = tables.compute, tables.params, tables.acts, tables.valid
    out, precedes = tables.out, tables.precedes
    units, bandwidth, sync_bw = level.workers, level.bandwidth, level.sync_rate
    model, straight, memory_limit = opts.model, opts.straight, opts.memory_limit
    rows_total, n = compute.shape
    if sync_params is None:
        sync_params = params
    if hide is None:
        hide = np.zeros_like(params)
    rows = 1 if final else rows_total
    # unit-major arrays (a unit count's table is contiguous), used as [rows, N, units]
    by_unit = [np.full((units, rows, n), fill, dtype=dtype)
               for fill, dtype in ((INF, float), (-1, np.int32), (-1, np.int16),
                                   (0, np.int16), (False, bool))]
    time, split, prev_m, reps, inner_dp = (a.transpose(1, 2, 0) for a in by_unit)
    C, P, Act, _ = compute[:rows], params[:rows], acts[:rows], valid[:rows]
    orig = model == "pipedream-2019"
    PE = P / inner_units if orig else sync_params[:rows]
    sync = opts.sync if final else None  # the outermost level joins machines

    def stage_time(c: np.ndarray, pe: np.ndarray, h: np.ndarray, dp: tuple | None, r: int,
                   sl: slice) -> tuple[np.ndarray, np.ndarray]:
        """(c + what h leaves of AR(r, pe)) / r, or the data-parallel-inside candidate
        where faster."""
        t = (c + hidden_allreduce(allreduce_time(model, r, pe, sync_bw, sync), h)[0]) / r
        t = np.where(np.isfinite(t), t, INF)
        if dp is None:
            return t, np.zeros(t.shape, dtype=bool)
        t_dp = (dp[0][sl] + hidden_allreduce(
            allreduce_time(model, r, dp[1][sl], sync_bw, sync), dp[2][sl])[0]) / r
        t_dp = np.where(np.isfinite(t_dp), t_dp, INF)
        return np.minimum(t, t_dp), t_dp < t

    # Single stages, on valid ranges only (row 0: every state; row k+1: the pairs (k, j)).
    pairs = tables.pairs if tables.pairs is not None else Pairs.build(precedes)
    vr = np.concatenate([np.zeros(n, dtype=np.int64), pairs.k + 1]) if not final \
        else np.zeros(n, dtype=np.int64)
    vj = np.concatenate([np.arange(n), pairs.j]) if not final else np.arange(n)
    base_dp = None if dp_inner is None else tuple(x[vr, vj] for x in dp_inner)
    stash = Act[vr, vj] + P[vr, vj]
    c_v, pe_v, at = C[vr, vj], PE[vr, vj], vr * n + vj  # at: in a unit count's table
    for m in range(1 if straight else units):
        r = m + 1
        t, use_dp = stage_time(c_v, pe_v, hide[vr, vj], base_dp, r, slice(None))
        ok = np.isfinite(t)
        if memory_limit is not None:
            ok &= stash * math.ceil((units - r) / r) <= memory_limit
        np.put(by_unit[0][m], at, np.where(ok, t, INF))
        np.put(by_unit[3][m], at, r)
        np.put(by_unit[4][m], at, ok & use_dp)

    # Last-stage costs of every ordered pair (k, j) (ranges (k, j], rows k+1 of the tables).
    kk, jj = pairs.k, pairs.j
    last_c, last_p, last_a = compute[1:], params[1:], acts[1:]  # [N, N]
    last_pe = last_p if orig else sync_params[1:]  # the original omits /G in this branch
    dp_pairs = None if dp_inner is None else tuple(x[1:][kk, jj] for x in dp_inner)
    h_kj = hide[1:][kk, jj]
    out_t = 2.0 * out.copy()
    out_t[-1] = 0.0  # no output transfer after the last state
    times, flags = {}, {}
    c_kj, pe_kj, out_k, out_j = last_c[kk, jj], last_pe[kk, jj], 2.0 * out[kk], out_t[jj]
    for mp in range(1, 2 if straight else units):
        lt, flags[mp] = stage_time(c_kj, pe_kj, h_kj, dp_pairs, mp, slice(None))
        lt = np.maximum(lt, out_k / (bandwidth * mp))
        times[mp] = np.maximum(lt, out_j / (bandwidth * mp))
    last = LastStage(times, flags, last_a[kk, jj] + last_p[kk, jj], memory_limit)
    tabs = (time, split, prev_m, reps, inner_dp)

    def replica_range(m: int) -> range:
        return range(1, 2 if straight else m + 1)

    every_row = not final and next_units != 2
    forward(tabs, range(rows if every_row else 1), pairs, last, units, replica_range,
            tables.twins)
    if not final and not every_row:  # the next level reads row 0 and ranges to the end
        reverse(tabs, n - 1, pairs, last, units, replica_range)
    return LevelSolution(time, split, prev_m, reps, inner_dp)


@dataclass(frozen=True)
class Solution:
    levels: tuple[LevelSolution, ...]
    cluster: Cluster
    states: States
    model: str
    sync: Sync | None = None
    overlap: bool = True  # the backward hid the all-reduce (``pipebench`` only)

    @property
    def time(self) -> float:
        return float(self.levels[-1].time[0, -1, -1])


def solve(states: States, cluster: Cluster, model: str = "pipebench", straight: bool = False,
          memory_limit: float | None = None, sync: Sync | None = None,
          overlap: bool = True) -> Solution:
    """The best plan of ``states`` on ``cluster``; ``overlap`` (``pipebench`` only): each
    replicated stage's all-reduce hidden by its backward as far as it lasts
    (``sync_cost``), as the runtime and DDP run it; off, summed with compute."""
    if model not in COST_MODELS:
        raise UserInputError(f"unknown cost model {model!r}; choose one of {COST_MODELS}")
    check_sync(model, sync)
    _check_size(len(states), cluster)
    overlap = overlap and model == "pipebench" and states.backward_s is not None
    compute, params, acts, valid = range_tables(states)
    hide = backward_table(states, valid, overlap)
    pairs = Pairs.build(states.precedes)
    sums = (states.compute_s, states.parameter_bytes, states.activation_bytes,
            states.output_bytes) + ((states.backward_s,) if overlap else ())
    twins = Twins.build(states.precedes, *sums)
    opts = SolveOptions(model, straight, memory_limit, sync)
    sols = []
    inner = 1
    peff = params
    dp = (compute, params, hide)  # each range data parallel on every worker of a unit
    for i, level in enumerate(cluster.levels):
        final = i == len(cluster.levels) - 1
        use_dp = model == "pipebench" and i > 0 and not straight
        tables = LevelInput(compute, params, acts, valid, states.output_bytes,
                            states.precedes, pairs, twins if i == 0 else None)
        nxt = cluster.levels[i + 1].workers if i == len(cluster.levels) - 2 else None
        sol = solve_level(tables, level, inner, opts, final, sync_params=peff,
                          dp_inner=dp if use_dp else None, next_units=nxt, hide=hide)
        sols.append(sol)
        if not final:
            compute = np.where(valid, sol.time[:, :, -1], np.nan)
            compute[~np.isfinite(compute)] = np.nan
            if model == "pipebench":  # pipedream-2019 divides by G instead
                peff, hide = next_level_tables(sol, level.sync_rate, model, peff, hide,
                                               dp[1:], valid)
            n_w = level.workers
            wait, spare = hidden_allreduce(allreduce_time(model, n_w, dp[1], level.sync_rate),
                                           dp[2])
            dp = ((dp[0] + wait) / n_w, dp[1] / n_w, spare / n_w)
        inner = level.workers
    return Solution(tuple(sols), cluster, states, model, sync, overlap)


MAX_PLAN_LEVEL_WORKERS = 1024  # the DP loops over (units, replicas) pairs: ~20 s at 1024


def _check_size(n: int, cluster: Cluster) -> None:
    """Refuse a problem the planner cannot finish: more than ``MAX_PLAN_LEVEL_WORKERS`` in a
    level (its time grows with the square of the workers per level), or DP tables (17
    bytes per range, end state and unit count at every level but the last, where one row
    is kept) larger than half of this machine's memory; before allocating any of them."""
    for level in cluster.levels:
        if level.workers > MAX_PLAN_LEVEL_WORKERS:
            raise UserInputError(f"cannot plan {level.workers} workers in one level: the "
                                 f"planner's time grows with the square of the workers per "
                                 f"level; use at most {MAX_PLAN_LEVEL_WORKERS} per level "
                                 "(e.g. --cluster 64x16 for 1024 workers)")
    need = 0
    for i, level in enumerate(cluster.levels):
        rows = 1 if i == len(cluster.levels) - 1 else n + 1
        need += 17 * rows * n * level.workers
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2
    except (ValueError, OSError, AttributeError):
        have = 8 * 2**30
    if need > have:
        raise UserInputError(f"planning {n} states on {cluster.describe()} needs about "
                             f"{need / 2**30:.0f} GiB of tables, more than half of this "
                             "machine's memory; plan for fewer workers per level (e.g. "
                             "--cluster 4x4) or a smaller profile")


# Multi-level solves: an inner level under a final level of three or more units visits
# every ordered triple of states (search.forward), so beyond MAX_TRIPLES_MULTI_LEVEL of them
# (GNMT-16: 22 million, 3.8 million after twins, ~0.2 s here; DenseNet-121: 13 million,
# ~0.25 s) the planner uses topological prefixes instead, and coarsens prefix chains longer
# than MAX_STATES_MULTI_LEVEL to their narrowest half.
MAX_TRIPLES_MULTI_LEVEL = 25_000_000
MAX_STATES_MULTI_LEVEL = 600
