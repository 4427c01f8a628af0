"""pipedream_impl/planner/search.py: the chunked, twin-pruned search fills every DP table
exactly as the recurrence does when evaluated one row, end and split at a time."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from pipedream_impl.planner import optimizer, search
from pipedream_impl.planner.antichain import build_states
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.optimizer import COST_MODELS, solve
from pipedream_impl.planner.search import Twins
from pipedream_impl.profiling.graph import Graph, Node

# Clusters taking every path: one level (row 0 only, twins at the final level); an inner
# level under 3 units (every row); under 2 units (row 0, then search.reverse); three
# levels (every row of a middle level, where twins do not apply).
CLUSTERS = [Cluster((Level(4, 12e9),)),
            Cluster((Level(2, 15e9), Level(3, 1e8))),
            Cluster((Level(3, 15e9), Level(2, 1e9))),
            Cluster((Level(2, 15e9), Level(2, 1e9), Level(3, 1e8)))]


def slow_forward(tables, rows, pairs, last, units, replica_range, twins) -> None:  # noqa: ANN001
    """The recurrence as written: every row, replica count, end and split on its own; ties
    go to what the tables hold (the single stage), then to fewer replicas, then to the
    first split. ``twins`` is ignored."""
    time, split, prev_m, reps, inner_dp = tables
    n = pairs.precedes.shape[0]
    for r in rows:
        after = np.ones(n, dtype=bool) if r == 0 else pairs.precedes[r - 1]
        for m in range(1, units):
            for mp in replica_range(m):
                for j in np.flatnonzero(after):
                    ks = np.flatnonzero(after & pairs.precedes[:, j])
                    if not ks.size:
                        continue
                    pid = pairs.ids[ks, j]
                    cand = np.maximum(time[r, ks, m - mp], last.time[mp][pid])
                    ok = last.ok(pid, m + 1, mp, units)
                    if ok is not None:
                        cand = np.where(ok, cand, np.inf)
                    f = int(np.argmin(cand))
                    if cand[f] < time[r, j, m]:
                        time[r, j, m], split[r, j, m] = cand[f], ks[f]
                        prev_m[r, j, m], reps[r, j, m] = m - mp, mp
                        inner_dp[r, j, m] = last.inner_dp[mp][pid[f]]


def _graph_with_free_nodes(rng: random.Random) -> Graph:
    """A chain with skip connections and free nodes (no compute, parameters or outputs)
    fanning out from its first layer to later ones, like GNMT's decoder ``__getitem__``
    nodes: cuts that differ only by free nodes are twins."""
    n, free = rng.randint(4, 6), rng.randint(1, 3)
    g = Graph()
    for i in range(1, n + 1):
        g.add_node(Node(f"n{i}", "Op", rng.uniform(0.1, 5), rng.uniform(0.1, 5),
                        (rng.uniform(1e6, 5e7),), rng.uniform(1e6, 1e8)))
    for i in range(free + 1):
        g.add_node(Node(f"f{i}", "Op", 0.0, 0.0, (0.0,), 0.0))
    edges = [(f"n{i}", f"n{i + 1}") for i in range(1, n)]
    edges += [(f"n{a}", f"n{b}") for a in range(1, n) for b in range(a + 2, n + 1)
              if rng.random() < 0.3]
    edges += [("n1", "f0")] + [("f0", f"f{i}") for i in range(1, free + 1)]
    edges += [(f"f{i}", f"n{rng.randint(3, n)}") for i in range(1, free + 1)]
    for a, b in edges:
        g.add_edge(a, b)
    return g


def _tables(sol: optimizer.Solution) -> list[np.ndarray]:
    return [t for lv in sol.levels
            for t in (lv.time, lv.split, lv.prev_m, lv.replicas, lv.inner_dp)]


@pytest.mark.parametrize("chunk", [7, search.CHUNK])
def test_search_fills_the_tables_of_the_plain_recurrence(
        chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact equality, optimum and tie-breaks included, on graphs with twins; ``chunk`` 7
    puts rows and their segments across many numpy passes."""
    rng = random.Random(3)
    twins = 0
    for trial in range(8):
        st = build_states(_graph_with_free_nodes(rng))
        twins += Twins.build(st.precedes, st.compute_s, st.parameter_bytes,
                             st.activation_bytes, st.output_bytes).early.size
        stash = float(st.activation_bytes[-1] + st.parameter_bytes[-1])
        for cluster, model, (straight, limit) in itertools.product(
                CLUSTERS, COST_MODELS, ((False, None), (True, None), (False, stash / 3))):
            if straight and cluster.workers > len(st):
                continue
            with monkeypatch.context() as patch:
                patch.setattr(search, "CHUNK", chunk)
                fast = solve(st, cluster, model, straight, limit)
            with monkeypatch.context() as patch:
                patch.setattr(optimizer, "forward", slow_forward)
                slow = solve(st, cluster, model, straight, limit)
            for a, b in zip(_tables(fast), _tables(slow), strict=True):
                assert np.array_equal(a, b), (trial, cluster.describe(), model, straight,
                                              limit)
    assert twins  # the graphs do exercise the pruning
