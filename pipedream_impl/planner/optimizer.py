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
    T(r, j, m) = (C(r, j) + AR(m, P(r, j))) / m

where k ranges over the states that precede j in the antichain DAG, and the output transfer
is left out when j is the last state. The factor 2 counts activations forward and gradients
backward; dividing by m' spreads a replicated stage's minibatches over m' links.

Levels: the DP runs on the innermost level first; at the next level a "unit" is a whole
server and C(r, j) becomes A_inner(r, j, G) (the best time of that range on one server),
while P and Act keep their raw sums. The final level needs row 0 only; inner levels need
all rows (every range can become an outer stage), so their cost is O(N^3 M^2) elementwise:
we vectorise over (range start, split, stage end) with numpy instead of Python loops.

Memory limit (optional, per worker): a stage that has w workers after it (at this level)
stashes ``ceil(w / m')`` versions of its weights and activations (the original's count); it
is skipped when (Act + P) times that exceeds the limit.

Relation to the paper's text: the paper describes the transfer term as 2a/B and weight
synchronisation as an all-reduce whose ring cost is 2 (m-1)/m x |w| / B; the original code
charges 4 (m-1)/m x |w| / B instead (twice the ring volume). ``pipebench`` follows the
paper's ring formula, ``pipedream-2019`` the code. Neither overlaps the two terms with
compute, although the paper notes that PipeDream's runtime overlaps communication.

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
  P_eff = sum_s P_eff,s / r_s per minibatch (``effective_params``): P / G when the range is
  data parallel on all G workers of the unit (then a single stage replicated on every
  unit costs exactly what data parallelism costs, which the original's split branch
  breaks), P when the unit pipelines it unreplicated (dividing by G there, as an earlier
  version did, made cross-server replication of straight pipelines look G times cheaper
  than the simulator finds it). Data parallelism: (total compute + sum over levels of
  2 (n-1)/n * P / B_level) / workers. Like the runtime, weight synchronisation is not
  overlapped with compute; point-to-point transfers are (max).

Where the original indexes a range (r, j) whose start does not precede j (possible in
branching graphs, where its state order is hash-seed dependent), it reads a meaningless
prefix difference; we treat such ranges as invalid. On chains the two agree exactly.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from core.collectives import ring_factor
from core.errors import UserInputError
from pipedream_impl.planner.antichain import States
from pipedream_impl.planner.cluster import Cluster, Level

__all__ = ["COST_MODELS", "INF", "LevelInput", "LevelSolution", "MAX_STATES_MULTI_LEVEL",
           "Solution", "SolveOptions", "allreduce_time", "data_parallel_time",
           "effective_params", "range_tables", "solve", "solve_level"]

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


def allreduce_time(model: str, replicas: int | np.ndarray, params: np.ndarray,
                   bandwidth: float) -> np.ndarray:
    r = np.asarray(replicas, dtype=float)
    if model == "pipedream-2019":
        return 4.0 * (r - 1) * params / (bandwidth * r)
    return ring_factor(r) * params / bandwidth


def range_tables(states: States) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """C, P, Act [R=N+1, N] and the validity mask of each range (r, j)."""
    n = len(states)
    valid = np.zeros((n + 1, n), dtype=bool)
    valid[0] = True
    valid[1:] = states.precedes
    tables = []
    for prefix in (states.compute_s, states.parameter_bytes, states.activation_bytes):
        t = np.empty((n + 1, n))
        t[0] = prefix
        t[1:] = prefix[None, :] - prefix[:, None]
        tables.append(np.where(valid, t, np.nan))
    return tables[0], tables[1], tables[2], valid


@dataclass(frozen=True)
class SolveOptions:
    """What holds for every level of one solve."""
    model: str = "pipebench"  # a cost model of COST_MODELS
    straight: bool = False  # no replication
    memory_limit: float | None = None  # bytes per worker


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


def solve_level(tables: LevelInput, level: Level, inner_units: int, opts: SolveOptions,
                final: bool, sync_params: np.ndarray | None = None,
                dp_inner: tuple[np.ndarray, np.ndarray] | None = None,
                chunk_elems: int = 1 << 23) -> LevelSolution:
    """One level's DP over ``level.workers`` units joined at ``level.bandwidth``.
    ``sync_params``: the ``pipebench`` model's P_eff table (default P); ``dp_inner``:
    (C, P_eff) of each range run data parallel inside a unit, a second candidate for every
    stage; ``inner_units``: G, used only by ``pipedream-2019``."""
    compute, params, acts, valid = tables.compute, tables.params, tables.acts, tables.valid
    out, precedes = tables.out, tables.precedes
    units, bandwidth = level.workers, level.bandwidth
    model, straight, memory_limit = opts.model, opts.straight, opts.memory_limit
    rows_total, n = compute.shape
    if sync_params is None:
        sync_params = params
    rows = 1 if final else rows_total
    time = np.full((rows, n, units), INF)
    split = np.full((rows, n, units), -1, dtype=np.int32)
    prev_m = np.full((rows, n, units), -1, dtype=np.int16)
    reps = np.zeros((rows, n, units), dtype=np.int16)
    inner_dp = np.zeros((rows, n, units), dtype=bool)
    C, P, Act, V = compute[:rows], params[:rows], acts[:rows], valid[:rows]
    orig = model == "pipedream-2019"
    PE = P / inner_units if orig else sync_params[:rows]

    def stage_time(c: np.ndarray, pe: np.ndarray, dp: tuple | None, r: int,
                   sl: slice) -> tuple[np.ndarray, np.ndarray]:
        """(c + AR(r, pe)) / r, or the data-parallel-inside candidate where faster."""
        t = (c + allreduce_time(model, r, pe, bandwidth)) / r
        t = np.where(np.isfinite(t), t, INF)
        if dp is None:
            return t, np.zeros(t.shape, dtype=bool)
        t_dp = (dp[0][sl] + allreduce_time(model, r, dp[1][sl], bandwidth)) / r
        t_dp = np.where(np.isfinite(t_dp), t_dp, INF)
        return np.minimum(t, t_dp), t_dp < t

    for m in range(1 if straight else units):
        r = m + 1
        t, use_dp = stage_time(C, PE, dp_inner, r, slice(0, rows))
        ok = V & np.isfinite(t)
        if memory_limit is not None:
            ok &= (Act + P) * math.ceil((units - r) / r) <= memory_limit
        time[:, :, m] = np.where(ok, t, INF)
        reps[:, :, m] = r
        inner_dp[:, :, m] = ok & use_dp

    # Last-stage tables for each m': L[k, j] over ranges (k, j], i.e. rows k+1 of the tables.
    last_c, last_p, last_a = compute[1:], params[1:], acts[1:]  # [N, N]
    last_pe = last_p if orig else sync_params[1:]  # the original omits /G in this branch
    out_t = 2.0 * out.copy()
    out_t[-1] = 0.0  # no output transfer after the last state
    for m in range(1, units):
        for mp in range(1, 2 if straight else m + 1):
            L, last_dp = stage_time(last_c, last_pe, dp_inner, mp, slice(1, None))
            L = np.maximum(L, 2.0 * out[:, None] / (bandwidth * mp))
            L = np.maximum(L, out_t[None, :] / (bandwidth * mp))
            ok = precedes & np.isfinite(L)
            if memory_limit is not None:
                ok &= (last_a + last_p) * math.ceil((units - (m + 1)) / mp) <= memory_limit
            L = np.where(ok, L, INF)
            before = time[:, :, m - mp]  # [rows, N(k)]
            step = max(1, chunk_elems // (n * n))
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                # A range starting after state r-1 can only split at k >= r (states are in
                # topological order), so columns before r0 - 1 hold nothing: skip them.
                lo = max(0, r0 - 1)
                cand = np.maximum(before[r0:r1, lo:, None], L[None, lo:, lo:])  # [r, k, j]
                k_best = np.argmin(cand, axis=1)  # [r, j]
                best = np.take_along_axis(cand, k_best[:, None, :], axis=1)[:, 0, :]
                cur = time[r0:r1, lo:, m]
                better = best < cur
                time[r0:r1, lo:, m] = np.where(better, best, cur)
                split[r0:r1, lo:, m] = np.where(better, k_best + lo, split[r0:r1, lo:, m])
                prev_m[r0:r1, lo:, m] = np.where(better, m - mp, prev_m[r0:r1, lo:, m])
                reps[r0:r1, lo:, m] = np.where(better, mp, reps[r0:r1, lo:, m])
                chosen = last_dp[lo:, lo:][k_best, np.arange(n - lo)[None, :]]
                inner_dp[r0:r1, lo:, m] = np.where(better, chosen, inner_dp[r0:r1, lo:, m])
    return LevelSolution(time, split, prev_m, reps, inner_dp)


@dataclass(frozen=True)
class Solution:
    levels: tuple[LevelSolution, ...]
    cluster: Cluster
    states: States
    model: str

    @property
    def time(self) -> float:
        return float(self.levels[-1].time[0, -1, -1])


def solve(states: States, cluster: Cluster, model: str = "pipebench", straight: bool = False,
          memory_limit: float | None = None) -> Solution:
    if model not in COST_MODELS:
        raise UserInputError(f"unknown cost model {model!r}; choose one of {COST_MODELS}")
    _check_size(len(states), cluster)
    compute, params, acts, valid = range_tables(states)
    opts = SolveOptions(model, straight, memory_limit)
    sols = []
    inner = 1
    peff = params
    dp_c, dp_pe = compute, params  # each range data parallel on every worker of a unit
    for i, level in enumerate(cluster.levels):
        final = i == len(cluster.levels) - 1
        use_dp = model == "pipebench" and i > 0 and not straight
        tables = LevelInput(compute, params, acts, valid, states.output_bytes,
                            states.precedes)
        sol = solve_level(tables, level, inner, opts, final, sync_params=peff,
                          dp_inner=(dp_c, dp_pe) if use_dp else None)
        sols.append(sol)
        if not final:
            compute = np.where(valid, sol.time[:, :, -1], np.nan)
            compute[~np.isfinite(compute)] = np.nan
            peff = effective_params(sol, peff, dp_pe, valid)
            n_w = level.workers
            dp_c = (dp_c + allreduce_time(model, n_w, dp_pe, level.bandwidth)) / n_w
            dp_pe = dp_pe / n_w
        inner = level.workers
    return Solution(tuple(sols), cluster, states, model)


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


def effective_params(sol: LevelSolution, peff: np.ndarray, dp_pe: np.ndarray,
                     valid: np.ndarray) -> np.ndarray:
    """P_eff [R, N] one level up: for every range, the sum over the stages of its best plan
    on all units of this level of (their P_eff / their replicas), vectorised over ranges;
    ``dp_pe``: P_eff of a stage data parallel inside its units (``inner_dp``)."""
    rows, n, units = sol.time.shape
    r0, j0 = np.nonzero(valid[:rows] & np.isfinite(sol.time[:, :, -1]))
    jj, mm = j0.copy(), np.full(r0.shape, units - 1)
    acc = np.zeros(r0.shape)
    live = np.ones(r0.shape, dtype=bool)
    for _ in range(units):  # a plan has at most ``units`` stages
        idx = np.flatnonzero(live)
        if not idx.size:
            break
        r, j, m = r0[idx], jj[idx], mm[idx]
        k = sol.split[r, j, m].astype(int)
        single = k < 0
        # the last stage is (k, j] (table row k + 1); a single stage is the whole range
        first = np.where(single, r, k + 1)
        pe = np.where(sol.inner_dp[r, j, m], dp_pe[first, j], peff[first, j])
        acc[idx] += pe / sol.replicas[r, j, m]
        mm[idx] = np.where(single, m, sol.prev_m[r, j, m])
        jj[idx] = np.where(single, j, k)
        live[idx[single]] = False
    out = np.full((rows, n), np.nan)
    out[r0, j0] = acc
    return out


def data_parallel_time(states: States, cluster: Cluster, model: str) -> float:
    """Seconds per minibatch of pure data parallelism on the same cluster."""
    total, params = float(states.compute_s[-1]), float(states.parameter_bytes[-1])
    if model == "pipedream-2019":
        t, inner = total, 1
        for lv in cluster.levels:
            t = (t + float(allreduce_time(model, lv.workers, params, lv.bandwidth)) / inner) \
                / lv.workers
            inner = lv.workers
        return t
    sync = sum(float(allreduce_time(model, lv.workers, params, lv.bandwidth))
               for lv in cluster.levels)
    return (total + sync) / cluster.workers


# Antichain states beyond which a multi-level solve plans over topological prefixes instead:
# inner levels cost O(N^3 M^2) (GNMT-16 has 1,495 antichain states: ~2 minutes).
MAX_STATES_MULTI_LEVEL = 600
