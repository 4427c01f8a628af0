"""What weight synchronisation costs a plan, for the planner's dynamic program.

One home for the all-reduce term of both cost models, for how much of it the backward
hides, for what a range's best plan hands the next level up (the bytes its units
synchronise per minibatch, P_eff, and the backward time its all-reduces leave unused), and
for data parallelism's time on the same cluster, which every plan is compared with.

Overlap (``pipebench`` model, on by default): our runtime all-reduces a replicated stage's
gradient buckets while the round's last backward still runs
(``pipedream_impl.runtime.grad_buckets``), and DDP does the same for data parallelism, so
a stage of compute C, backward B and all-reduce AR on r replicas takes
(C + max(0, AR - B)) / r per minibatch: what the simulator charges
(``harness.sim.costs``). Across levels the backward hides the innermost all-reduce first
and what it leaves, max(0, B - AR_inner) / r_inner per minibatch, hides the next level's:
for a range run as one stage (or data parallel inside its units) the composed time is
exactly (C + max(0, sum of its levels' AR - B)) / replicas; for a unit running an inner
pipeline the leftover is its stages' smallest, the conservative choice (its all-reduces
are charged together through P_eff, not stage by stage). ``pipedream-2019`` hides nothing:
the original optimizer summed compute and synchronisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.collectives import Sync, ring_factor
from core.errors import UserInputError
from pipedream_impl.planner.antichain import States
from pipedream_impl.planner.cluster import Cluster

if TYPE_CHECKING:
    from pipedream_impl.planner.optimizer import LevelSolution

__all__ = ["allreduce_time", "check_sync", "data_parallel_time", "hidden_allreduce",
           "next_level_tables"]


def allreduce_time(model: str, replicas: int | np.ndarray, params: np.ndarray,
                   bandwidth: float, sync: Sync | None = None) -> np.ndarray:
    """Seconds to synchronise ``params`` bytes among ``replicas`` units at one level;
    ``sync``: the mode among machines (``core.collectives.Sync``; None or ring: the ring),
    given for the outermost level only (``pipebench`` model)."""
    if sync is not None and sync.mode != "ring":
        return sync.time(int(replicas), params, bandwidth)
    r = np.asarray(replicas, dtype=float)
    if model == "pipedream-2019":
        return 4.0 * (r - 1) * params / (bandwidth * r)
    return ring_factor(r) * params / bandwidth


def hidden_allreduce(ar: np.ndarray, hide: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(what of the all-reduce ``ar`` the backward time ``hide`` leaves to wait for, what
    of ``hide`` is left over), both before dividing by the replicas."""
    return np.maximum(0.0, ar - hide), np.maximum(0.0, hide - ar)


def check_sync(model: str, sync: Sync | None) -> None:
    if sync is not None and sync.mode != "ring" and model != "pipebench":
        raise UserInputError(f"--allreduce {sync.mode} needs --cost-model pipebench ("
                             f"{model} keeps the original optimizer's all-reduce formula)")


def next_level_tables(sol: LevelSolution, bandwidth: float, model: str, peff: np.ndarray,
                      hide: np.ndarray, dp: tuple[np.ndarray, np.ndarray],
                      valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P_eff, leftover backward) [R, N] one level up, vectorised over ranges: for every
    range, over the stages of its best plan on all units of this level, the sum of (their
    P_eff / their replicas) and the smallest max(0, their backward to hide with - their
    all-reduce) / their replicas; ``dp``: (P_eff, backward to hide with) of a stage data
    parallel inside its units (``inner_dp``)."""
    rows, n, units = sol.time.shape
    r0, j0 = np.nonzero(valid[:rows] & np.isfinite(sol.time[:, :, -1]))
    jj, mm = j0.copy(), np.full(r0.shape, units - 1)
    acc = np.zeros(r0.shape)
    left = np.full(r0.shape, np.inf)
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
        use_dp = sol.inner_dp[r, j, m]
        pe = np.where(use_dp, dp[0][first, j], peff[first, j])
        h = np.where(use_dp, dp[1][first, j], hide[first, j])
        reps = sol.replicas[r, j, m]
        acc[idx] += pe / reps
        _, spare = hidden_allreduce(allreduce_time(model, reps, pe, bandwidth), h)
        left[idx] = np.minimum(left[idx], spare / reps)
        mm[idx] = np.where(single, m, sol.prev_m[r, j, m])
        jj[idx] = np.where(single, j, k)
        live[idx[single]] = False
    out, out_left = np.full((rows, n), np.nan), np.full((rows, n), np.nan)
    out[r0, j0], out_left[r0, j0] = acc, left
    return out, out_left


def data_parallel_time(states: States, cluster: Cluster, model: str,
                       sync: Sync | None = None, overlap: bool = True) -> float:
    """Seconds per minibatch of pure data parallelism on the same cluster (``sync``: the
    mode among machines, at the outermost level; ``overlap``: the all-reduce overlapped
    with the backward as DDP does, ``pipebench`` only)."""
    check_sync(model, sync)
    total, params = float(states.compute_s[-1]), float(states.parameter_bytes[-1])
    if model == "pipedream-2019":
        t, inner = total, 1
        for lv in cluster.levels:
            t = (t + float(allreduce_time(model, lv.workers, params, lv.sync_rate)) / inner) \
                / lv.workers
            inner = lv.workers
        return t
    top = len(cluster.levels) - 1
    ar = sum(float(allreduce_time(model, lv.workers, params, lv.sync_rate,
                                  sync if i == top else None))
             for i, lv in enumerate(cluster.levels))
    backward = float(states.backward_s[-1]) if overlap and states.backward_s is not None \
        else 0.0
    return (total + float(hidden_allreduce(np.float64(ar), np.float64(backward))[0])) \
        / cluster.workers
