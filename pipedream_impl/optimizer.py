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
  AR(m, P) = 2 (m-1)/m * P / B, divided by G in *both* branches. Why G: at an outer level a
  unit is a server whose time C is per minibatch while it processes G minibatches per
  synchronisation round, and its G workers share one link (Cluster-A: one 10 Gbps NIC per 4
  GPUs), so a round costs G*C + AR and a minibatch (C + AR/G). With this, a single stage
  replicated on every unit costs exactly what data parallelism costs, which the original's
  split branch (no /G) breaks. Data parallelism: (total compute + sum over levels of
  2 (n-1)/n * P / B_level) / workers. Like the runtime, weight synchronisation is not
  overlapped with compute; point-to-point transfers are (max).

Where the original indexes a range (r, j) whose start does not precede j (possible in
branching graphs, where its state order is hash-seed dependent), it reads a meaningless
prefix difference; we treat such ranges as invalid. On chains the two agree exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipedream_impl.antichain import States
from pipedream_impl.cluster import Cluster

COST_MODELS = ("pipebench", "pipedream-2019")
INF = np.inf


@dataclass(frozen=True)
class LevelSolution:
    time: np.ndarray  # [R, N, M] best time; inf where infeasible
    split: np.ndarray  # [R, N, M] k of the last split, -1 for a single stage
    prev_m: np.ndarray  # [R, N, M] index m - m' of the pipeline before the split
    replicas: np.ndarray  # [R, N, M] m' (replicas of the last stage at this level)


def allreduce_time(model: str, replicas: int | np.ndarray, params: np.ndarray,
                   bandwidth: float) -> np.ndarray:
    r = np.asarray(replicas, dtype=float)
    if model == "pipedream-2019":
        return 4.0 * (r - 1) * params / (bandwidth * r)
    return 2.0 * (r - 1) / r * params / bandwidth


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


def solve_level(compute: np.ndarray, params: np.ndarray, acts: np.ndarray, valid: np.ndarray,
                out: np.ndarray, precedes: np.ndarray, units: int, bandwidth: float,
                inner_units: int, model: str, straight: bool, memory_limit: float | None,
                final: bool, chunk_elems: int = 1 << 23) -> LevelSolution:
    rows_total, n = compute.shape
    rows = 1 if final else rows_total
    time = np.full((rows, n, units), INF)
    split = np.full((rows, n, units), -1, dtype=np.int32)
    prev_m = np.full((rows, n, units), -1, dtype=np.int16)
    reps = np.zeros((rows, n, units), dtype=np.int16)
    C, P, Act, V = compute[:rows], params[:rows], acts[:rows], valid[:rows]

    for m in range(1 if straight else units):
        r = m + 1
        ar = allreduce_time(model, r, P, bandwidth) / inner_units  # both models here
        t = (C + ar) / r
        ok = V & np.isfinite(t)
        if memory_limit is not None:
            ok &= (Act + P) * math.ceil((units - r) / r) <= memory_limit
        time[:, :, m] = np.where(ok, t, INF)
        reps[:, :, m] = r

    # Last-stage tables for each m': L[k, j] over ranges (k, j], i.e. rows k+1 of the tables.
    last_c, last_p, last_a = compute[1:], params[1:], acts[1:]  # [N, N]
    out_t = 2.0 * out.copy()
    out_t[-1] = 0.0  # no output transfer after the last state
    for m in range(1, units):
        for mp in range(1, 2 if straight else m + 1):
            sync = allreduce_time(model, mp, last_p, bandwidth)
            if model != "pipedream-2019":  # the original omits /G in this branch
                sync = sync / inner_units
            L = (last_c + sync) / mp
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
    return LevelSolution(time, split, prev_m, reps)


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
        raise ValueError(f"unknown cost model {model!r}; choose one of {COST_MODELS}")
    compute, params, acts, valid = range_tables(states)
    sols = []
    inner = 1
    for i, level in enumerate(cluster.levels):
        final = i == len(cluster.levels) - 1
        sol = solve_level(compute, params, acts, valid, states.output_bytes, states.precedes,
                          level.workers, level.bandwidth, inner, model, straight,
                          memory_limit, final)
        sols.append(sol)
        if not final:
            compute = np.where(valid, sol.time[:, :, -1], np.nan)
            compute[~np.isfinite(compute)] = np.nan
        inner = level.workers
    return Solution(tuple(sols), cluster, states, model)


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
