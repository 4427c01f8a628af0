"""The split recurrence of optimizer.py evaluated over valid ranges only, exactly.

Why: the dense form of the recurrence visits every (row, split, end) triple, O(N^3) per
(units, replicas) pair; GNMT-16 has 1,495 antichain states of which only a quarter of the
pairs are ordered, so a two-level solve took minutes and the planner fell back to
topological prefixes (a 1.1% worse optimum than the original's). Here a split k of a range
(r-1, j] is visited only when r-1 precedes k and k precedes j in the antichain DAG
(``Pairs``: the ordered pairs, sorted by end), and a row is computed only where the next
level can read it:

- ``forward``: rows of the recurrence, several rows per numpy pass (``CHUNK``
  candidates); row 0 of every level, every row of an inner level under a next level of
  three or more units. A row's candidates are the pairs (k, j) of its splits k, taken as
  whole blocks of the pairs sorted by start and sorted back by end (an O(candidates)
  build: a per-row submatrix of the precedence relation costs six times more on GNMT-16),
  so that each (row, end) is one segment: segment minima (``np.minimum.reduceat``) per
  replica count of the last stage, then the first split reaching the minimum, searched
  only for the replica count that won.
- Twins (``Twins``): states e < l, e preceding l, with equal prefix sums and output
  bytes (GNMT-16's 1,495 states fall into 69 such classes: its decoder's free
  ``__getitem__`` nodes may be in or out of a cut at no cost). At the innermost level,
  where a range's costs are prefix differences, a last stage (e, j] costs bit for bit
  what (l, j] costs, for every j after l (e precedes it too). So in a row where e is a
  split and the pipeline before e is no slower than the one before l on every unit count
  m' < m, a split at l cannot beat one at e on m units, nor win a tie (the earlier split
  does): l is dropped from that row's candidates for m. The tables stay bit for bit the
  same; GNMT-16's (row, split, end) triples drop from 22.6 to 3.8 million.
- ``reverse``: under a final level of two units (A:2x4, B:2x8), an outer pipeline has at
  most two stages, (0, k] and (k, N-1], so besides row 0 only ranges ending at the last
  state are read; they are computed from the end: a table of the best *tail* of stages
  from each state to the end (``D[k, q]``, q units), then each row's first stage is
  chosen against it. Each found pipeline is written into the tables in the forward
  layout (split, units before, replicas) along its stages, so plans are read as before.

Values are the recurrence's: a pipeline is its first stage (the single-stage cost, with
its memory rule) followed by "last" stages, each with its input and output transfer and
the memory rule for the units up to and including it. Ties go, as when the recurrence is
evaluated split by split (tests/pipedream_impl/planner/test_search.py), to the single
stage, then to the fewest replicas of the last stage, then to the first split.

Speed: ``results/planner.md`` gives each solve's time (``pipebench planner-table``); the
candidate build and the twins are what made GNMT-16's two-level solves fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["CHUNK", "LastStage", "MAX_TWINS", "Pairs", "Twins", "forward", "reverse"]

INF = np.inf
# (row, split, end) candidates per numpy pass: 1 MB float arrays, which stay in cache
# (DenseNet-121 on A:4x4 solved 25% slower with 4 MB ones)
CHUNK = 1 << 17
MAX_TWINS = 512  # states per class of twins


@dataclass(frozen=True)
class Pairs:
    """The ordered pairs (k, j), k preceding j, sorted by j then k; ``ids[k, j]`` their
    index (-1 where k does not precede j). States are in topological order (k < j)."""
    k: np.ndarray
    j: np.ndarray
    ids: np.ndarray
    precedes: np.ndarray
    by_start: np.ndarray  # pair ids sorted by k then j
    block: np.ndarray  # [N+1]: the pairs (k, .) are by_start[block[k]:block[k + 1]]
    after: np.ndarray  # [N]: pairs (k, j) with a preceding k, per state a

    @staticmethod
    def build(precedes: np.ndarray) -> Pairs:
        j, k = np.nonzero(precedes.T)
        ids = np.full(precedes.shape, -1, dtype=np.int64)
        ids[k, j] = np.arange(k.size)
        count = precedes.sum(axis=1)
        return Pairs(k.astype(np.int64), j.astype(np.int64), ids, precedes,
                     ids[np.nonzero(precedes)].astype(np.int32),
                     np.concatenate([[0], np.cumsum(count)]),
                     np.bincount(k, weights=count[j], minlength=count.size).astype(np.int64))


@dataclass(frozen=True)
class Twins:
    """Pairs (early, late) of states with equal prefix sums (compute, parameters,
    activations) and output bytes, early preceding late with no twin in between (chains
    of these link every other pair; any subset of twins keeps the search exact, see the
    module docstring). Classes of more than ``MAX_TWINS`` states are left out (finding
    their covers is cubic in the class size)."""
    early: np.ndarray
    late: np.ndarray

    @staticmethod
    def build(precedes: np.ndarray, *sums: np.ndarray) -> Twins:
        _, cls, size = np.unique(np.stack(sums, axis=1), axis=0, return_inverse=True,
                                 return_counts=True)
        by_class = np.split(np.argsort(cls.ravel(), kind="stable"), np.cumsum(size)[:-1])
        early, late = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        for members in by_class:
            if not 1 < members.size <= MAX_TWINS:
                continue
            below = precedes[np.ix_(members, members)]
            between = np.zeros_like(below)  # (a, b): a twin follows a, precedes b
            for t in range(members.size):
                between[below[:, t]] |= below[t]
            lo, hi = np.nonzero(below & ~between)
            early.append(members[lo])
            late.append(members[hi])
        return Twins(np.concatenate(early), np.concatenate(late))


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


class _Buffers:
    """Arrays by name, reused by every chunk of one ``forward`` call: arrays allocated
    afresh per chunk are page-faulted afresh whenever glibc trims its heap, which made
    DenseNet-121's first solve in a process 2.4x slower than the next."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, size: int, dtype: type = float) -> np.ndarray:
        a = self.arrays.get(name)
        if a is None or a.size < size:
            a = self.arrays[name] = np.empty(max(size, CHUNK), dtype=dtype)
        return a[:size]


@dataclass(frozen=True)
class _Candidates:
    """The (row, split, end) triples of some rows, sorted by row, end, split; a segment
    is one (row, end). Per-triple arrays are views of ``_Buffers``."""
    pid: np.ndarray  # pair (split, end)
    k: np.ndarray  # split
    at: np.ndarray  # row * N + split: the pipeline before the split in a unit's table
    seg: np.ndarray  # segment
    starts: np.ndarray  # first triple of each segment
    row: np.ndarray  # per segment
    end: np.ndarray  # per segment

    @staticmethod
    def build(pairs: Pairs, rows: np.ndarray, splits: np.ndarray,
              buf: _Buffers) -> _Candidates | None:
        """``splits`` [rows, N]: the states each row may split at."""
        ri, k = np.nonzero(splits)
        first, count = pairs.block[k], pairs.block[k + 1] - pairs.block[k]
        some = count > 0
        ri, first, count = ri[some], first[some], count[some]
        if not ri.size:
            return None
        n = int(count.sum())
        pos = _ranges(first, count, buf("pos", n, np.intp))
        by_start = np.take(pairs.by_start, pos, out=buf("by start", n, np.int32), mode="clip")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(ri, weights=count,
                                                            minlength=rows.size))])
        bounds = bounds.astype(np.int64)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            by_start[a:b].sort()  # pair ids are sorted by end, then split
        pid = buf("pid", n, np.intp)
        pid[:] = by_start  # (indexing with int32 would convert it every time)
        jj = np.take(pairs.j, pid, out=buf("end", n, np.intp), mode="clip")
        new = buf("new", n, bool)
        new[0] = True
        np.not_equal(jj[1:], jj[:-1], out=new[1:])
        new[bounds[1:-1][bounds[1:-1] < n]] = True  # a row starts a segment
        starts = np.flatnonzero(new)
        seg = np.cumsum(new, out=buf("seg", n, np.intp))
        seg -= 1
        kk = np.take(pairs.k, pid, out=buf("split", n, np.intp), mode="clip")
        row = rows[np.searchsorted(bounds, starts, side="right") - 1]
        at = np.take(row * pairs.precedes.shape[0], seg, out=buf("at", n, np.intp),
                     mode="clip")
        at += kk
        return _Candidates(pid, kk, at, seg, starts, row, jj[starts])


def _ranges(first: np.ndarray, count: np.ndarray, out: np.ndarray) -> np.ndarray:
    """first[0], first[0] + 1, ..., first[0] + count[0] - 1, first[1], ... (counts > 0)
    in ``out``."""
    out.fill(1)
    out[0] = first[0]
    out[np.cumsum(count)[:-1]] = first[1:] - (first[:-1] + count[:-1]) + 1
    return np.cumsum(out, out=out)


def _chunks(sizes: list[int]) -> Iterator[slice]:
    """Runs of consecutive rows of at most ``CHUNK`` candidates (at least one row)."""
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if total and total + size > CHUNK:
            yield slice(start, i)
            start, total = i, 0
        total += size
    yield slice(start, len(sizes))


def forward(tables: Tables, rows: range, pairs: Pairs, last: LastStage, units: int,
            replica_range: Callable[[int], range], twins: Twins | None) -> None:
    """Rows ``rows`` of the recurrence in place; ``tables`` = (time, split, prev_m, reps,
    inner_dp) [R, N, units], holding the single-stage costs on entry. Row 0 may split at
    any state, row r at the states after r - 1; ``twins``: see the module docstring (None:
    no dominance, as at outer levels, where a range's cost is not a prefix difference)."""
    sizes = [pairs.k.size if r == 0 else int(pairs.after[r - 1]) for r in rows]
    buf = _Buffers()
    for part in _chunks(sizes):
        sub = np.arange(rows.start + part.start, rows.start + part.stop)
        splits = pairs.precedes[np.maximum(sub - 1, 0)]
        splits[sub == 0] = True
        _forward_rows(tables, sub, splits, pairs, last, units, replica_range, twins, buf)


def _forward_rows(tables: Tables, rows: np.ndarray, splits: np.ndarray, pairs: Pairs,
                  last: LastStage, units: int, replica_range: Callable[[int], range],
                  twins: Twins | None, buf: _Buffers) -> None:
    """``forward`` on a chunk of rows, one unit count m at a time (rows are independent;
    unit count m reads m' < m only)."""
    by_unit = tables[0].transpose(2, 0, 1)  # [units, R, N], each unit count contiguous
    live = None if twins is None or not twins.early.size \
        else np.nonzero(splits[:, twins.early])  # (row, twin pair) where early is a split
    cands, dropped, gathered = None, None, set()
    for m in range(1, units):
        drop = None
        if live is not None:  # the twins whose early state is still no slower
            before, at = by_unit[m - 1].reshape(-1), rows[live[0]] * splits.shape[1]
            keep = before[at + twins.early[live[1]]] <= before[at + twins.late[live[1]]]
            live = (live[0][keep], live[1][keep])
            drop = np.zeros(splits.shape, dtype=bool)
            drop[live[0], twins.late[live[1]]] = True
        if cands is None or (drop is not None and not np.array_equal(drop, dropped)):
            keep_splits = splits if drop is None else splits & ~drop
            cands, dropped = _Candidates.build(pairs, rows, keep_splits, buf), drop
            gathered = set()
        if cands is None:
            return
        _unit_count(tables, m, cands, last, units, replica_range(m), buf, gathered)


def _unit_count(tables: Tables, m: int, c: _Candidates, last: LastStage, units: int,
                mps: range, buf: _Buffers, gathered: set) -> None:
    """Unit count m of the candidates' rows: the best split of each (row, end), where
    strictly better than what the tables hold (the single stage); ``gathered``: the
    inputs already in ``buf`` for these candidates (kept across unit counts)."""
    time, split, prev_m, reps, inner_dp = tables
    by_unit = time.transpose(2, 0, 1)
    n = c.pid.size

    def cand(mp: int) -> np.ndarray:
        before, after = buf(f"before {m - mp}", n), buf(f"last {mp}", n)
        if ("before", m - mp) not in gathered:  # final: unit counts below m are done
            np.take(by_unit[m - mp].reshape(-1), c.at, out=before, mode="clip")
            gathered.add(("before", m - mp))
        if ("last", mp) not in gathered:
            np.take(last.time[mp], c.pid, out=after, mode="clip")
            gathered.add(("last", mp))
        value = np.maximum(before, after, out=buf("cand", n))
        ok = last.ok(c.pid, m + 1, mp, units)
        return value if ok is None else np.where(ok, value, INF)

    best = np.stack([np.minimum.reduceat(cand(mp), c.starts) for mp in mps])
    win = best.argmin(axis=0)  # the fewest replicas among equal minima
    value = np.take_along_axis(best, win[None], axis=0)[0]
    better = value < by_unit[m][c.row, c.end]
    for i, mp in enumerate(mps):
        seg = np.flatnonzero(better & (win == i))
        if not seg.size:
            continue
        goal = np.full(c.starts.size, -INF)
        goal[seg] = value[seg]
        reached = np.equal(cand(mp), np.take(goal, c.seg, out=buf("goal", n), mode="clip"),
                           out=buf("reached", n, bool))
        hit = np.flatnonzero(reached)
        of = c.seg[hit]
        first = hit[np.r_[True, of[1:] != of[:-1]]]  # the first split of each segment
        r, j = c.row[seg], c.end[seg]
        time[r, j, m] = value[seg]
        split[r, j, m] = c.k[first]
        prev_m[r, j, m] = m - mp
        reps[r, j, m] = mp
        inner_dp[r, j, m] = last.inner_dp[mp][c.pid[first]]


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
