"""The split recurrence of optimizer.py evaluated over valid ranges only, exactly.

Why: the dense form of the recurrence visits every (row, split, end) triple, O(N^3) per
(units, replicas) pair; GNMT-16 has 1,495 antichain states of which only a quarter of the
pairs are ordered, so a two-level solve took minutes and the planner fell back to
topological prefixes (a 1.1% worse optimum than the original's). Here a split k of a range
(r-1, j] is visited only when r-1 precedes k and k precedes j in the antichain DAG
(``Pairs``: the ordered pairs, sorted by end), and a row is computed only where the next
level can read it:

- ``forward``: one row of the recurrence, vectorised over the row's ordered pairs
  (segment minima with ``np.minimum.reduceat``); row 0 of every level, every row of an
  inner level under a next level of three or more units;
- ``reverse``: under a final level of two units (A:2x4, B:2x8), an outer pipeline has at
  most two stages, (0, k] and (k, N-1], so besides row 0 only ranges ending at the last
  state are read; they are computed from the end: a table of the best *tail* of stages
  from each state to the end (``D[k, q]``, q units), then each row's first stage is
  chosen against it. Each found pipeline is written into the tables in the forward
  layout (split, units before, replicas) along its stages, so plans are read as before.

Values are the recurrence's: a pipeline is its first stage (the single-stage cost, with
its memory rule) followed by "last" stages, each with its input and output transfer and
the memory rule for the units up to and including it; the order of evaluation changes
nothing but which of equal optima is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["LastStage", "Pairs", "forward", "reverse"]

INF = np.inf


@dataclass(frozen=True)
class Pairs:
    """The ordered pairs (k, j), k preceding j, sorted by j then k; ``ids[k, j]`` their
    index (-1 where k does not precede j)."""
    k: np.ndarray
    j: np.ndarray
    ids: np.ndarray
    precedes: np.ndarray
    by_start: np.ndarray  # pair ids sorted by k then j

    @staticmethod
    def build(precedes: np.ndarray) -> Pairs:
        j, k = np.nonzero(precedes.T)
        ids = np.full(precedes.shape, -1, dtype=np.int64)
        ids[k, j] = np.arange(k.size)
        return Pairs(k.astype(np.int64), j.astype(np.int64), ids, precedes,
                     ids[np.nonzero(precedes)])


@dataclass(frozen=True)
class LastStage:
    """Cost of (k, j] as a stage after a split, per replica count m': ``time[m']`` and
    ``inner_dp[m']`` over ``Pairs`` order; ``stash`` (activation + parameter bytes) for
    the memory rule, ``limit`` the bytes per worker (None: no limit)."""
    time: dict[int, np.ndarray]
    inner_dp: dict[int, np.ndarray]
    stash: np.ndarray
    limit: float | None

    def ok(self, pid: np.ndarray, upto: int, mp: int, units: int) -> np.ndarray | None:
        """Memory rule for a stage of ``mp`` replicas with ``upto`` units up to and
        including it: ceil((units - upto) / mp) stashed versions must fit."""
        if self.limit is None:
            return None
        return self.stash[pid] * math.ceil((units - upto) / mp) <= self.limit


Tables = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the runs of equal values in sorted ``keys``."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return starts, np.diff(np.r_[starts, keys.size])


def _seg_argmin(cand: np.ndarray, starts: np.ndarray,
                lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum of each segment and the position of its first occurrence."""
    best = np.minimum.reduceat(cand, starts)
    pos = np.where(cand == np.repeat(best, lengths), np.arange(cand.size), cand.size)
    return best, np.minimum.reduceat(pos, starts)


def forward(tables: Tables, row: int, pairs: Pairs, last: LastStage, units: int,
            replica_range: Callable[[int], range], within: np.ndarray | None) -> None:
    """Row ``row`` of the recurrence in place; ``tables`` = (time, split, prev_m, reps,
    inner_dp) [rows, N, units], holding the single-stage costs on entry. ``within``: the
    states after ``row - 1`` (None: every state, for row 0)."""
    time, split, prev_m, reps, inner_dp = tables
    if within is None:
        pid = np.arange(pairs.k.size)
    else:
        ks = np.flatnonzero(within)
        if ks.size < 2:
            return
        jl, kl = np.nonzero(pairs.precedes[np.ix_(ks, ks)].T)
        pid = pairs.ids[ks[kl], ks[jl]]
    if not pid.size:
        return
    kk, jj = pairs.k[pid], pairs.j[pid]
    starts, lengths = _segments(jj)
    ends = jj[starts]
    t = time[row]  # [N, units], a view
    lasts = {mp: last.time[mp][pid] for mp in last.time}
    befores = {0: t[kk, 0]}  # the pipeline before each split, per unit count (final ones)
    for m in range(1, units):
        for mp in replica_range(m):
            cand = np.maximum(befores[m - mp], lasts[mp])
            ok = last.ok(pid, m + 1, mp, units)
            if ok is not None:
                cand = np.where(ok, cand, INF)
            best = np.minimum.reduceat(cand, starts)
            better = best < t[ends, m]
            if not better.any():
                continue
            _, first = _seg_argmin(cand, starts, lengths)
            e, f = ends[better], first[better]
            t[e, m] = best[better]
            split[row, e, m] = kk[f]
            prev_m[row, e, m] = m - mp
            reps[row, e, m] = mp
            inner_dp[row, e, m] = last.inner_dp[mp][pid[f]]
        befores[m] = t[kk, m]


def reverse(tables: Tables, end: int, pairs: Pairs, last: LastStage, units: int,
            replica_range: Callable[[int], range]) -> None:
    """Best pipeline on all ``units`` of every range (r-1, end], r >= 1, in place (see the
    module docstring); the tables hold the single-stage costs of rows >= 1 on entry."""
    time, split, prev_m, reps, inner_dp = tables
    n = pairs.precedes.shape[0]
    before_end = pairs.precedes[:, end]
    # Tail tables: D[k, q] best stages after state k to ``end`` on q units.
    d = np.full((n, units), INF)
    nxt = np.full((n, units), -1, dtype=np.int64)  # next split state, -1: one stage
    nq = np.zeros((n, units), dtype=np.int64)  # units of the tail's first stage
    ks = np.flatnonzero(before_end)
    for q in last.time:  # one stage (k, end] on q units
        d[ks, q] = last.time[q][pairs.ids[ks, end]]
        nq[ks, q] = q
    sel = pairs.by_start[before_end[pairs.j[pairs.by_start]]]  # (k, k'), k' before end
    k_s, k2_s = pairs.k[sel], pairs.j[sel]
    starts, lengths = _segments(k_s) if sel.size else (sel, sel)
    heads = k_s[starts]
    for q in range(2, units):
        for qp in replica_range(q):
            if qp >= q:
                continue
            cand = np.maximum(last.time[qp][sel], d[k2_s, q - qp])
            ok = last.ok(sel, units - q + qp, qp, units)
            if ok is not None:
                cand = np.where(ok, cand, INF)
            if not cand.size:
                continue
            best, first = _seg_argmin(cand, starts, lengths)
            better = best < d[heads, q]
            h, f = heads[better], first[better]
            d[h, q] = best[better]
            nxt[h, q] = k2_s[f]
            nq[h, q] = qp
    # First stage (r-1, k] on units - q, then the tail from k on q.
    a_s, k_s = k_s, k2_s  # the same pairs: (a, k), a = r - 1, k before the end
    if not a_s.size:
        return
    starts, lengths = _segments(a_s)
    heads = a_s[starts]
    best_t = time[heads + 1, end, units - 1].copy()
    best_k = np.full(heads.size, -1, dtype=np.int64)
    best_q = np.zeros(heads.size, dtype=np.int64)
    for q in range(1, units):
        cand = np.maximum(time[a_s + 1, k_s, units - q - 1], d[k_s, q])
        b, f = _seg_argmin(cand, starts, lengths)
        better = b < best_t
        best_t[better], best_k[better], best_q[better] = b[better], k_s[f[better]], q
    for h, t_best, k, q in zip(heads.tolist(), best_t.tolist(), best_k.tolist(),
                               best_q.tolist(), strict=True):
        if k < 0:
            continue  # one stage on every unit is best (already in the table)
        r = h + 1
        used = units - q  # units up to and including the stage that ends at k
        t_run = float(time[r, k, used - 1])
        while True:
            qp, k2 = int(nq[k, q]), int(nxt[k, q])
            stop = end if k2 < 0 else k2
            pid = pairs.ids[k, stop]
            t_run = max(t_run, float(last.time[qp][pid]))
            used += qp
            time[r, stop, used - 1] = t_run
            split[r, stop, used - 1] = k
            prev_m[r, stop, used - 1] = used - qp - 1
            reps[r, stop, used - 1] = qp
            inner_dp[r, stop, used - 1] = last.inner_dp[qp][pid]
            if k2 < 0:
                break
            k, q = k2, q - qp
        time[r, end, units - 1] = t_best
