"""Reduce a branching layer graph to PipeDream's chain of antichains ("states").

A pipeline split must cut every path from input to output exactly once, so a stage boundary
is an antichain of the graph (a set of nodes none of which reaches another). Following the
original optimizer (msr-fiddle/pipedream, graph/graph.py), we enumerate the antichains
reachable from the source by advancing one node at a time, *augmented* with the
predecessors whose outputs are still needed later, build the DAG "antichain a can advance to
antichain b", and order it topologically. State i stands for the downward-closed set
``pred(i)`` = every node up to and including its antichain; a stage is ``pred(j) \\ pred(k)``
for a state k that precedes j in the antichain DAG, and its output crosses the wire as the
activations of j's antichain.

For a chain graph the states are simply the layers.

As in the original, a node counts as live (its output crosses the cut) if it has a successor
outside pred(a) + {a} for *some* antichain member a, even when that successor is another
member: the cut after both branches of a diamond is charged the fork's output too. We keep
this over-count so that ``pipedream-2019`` makes the original's decisions.

Differences from the original, none of which changes an optimum:
- predecessor sets are bitmasks (ints), so the big NASNet graphs reduce in seconds;
- the augmented antichain lists its extra nodes in graph order (the original iterates a
  Python set, so its state numbering depends on the hash seed);
- the DP only uses ranges (k, j] with k a predecessor of j (see optimizer.py, search.py).

When a graph has more than ``max_states`` antichains (Inception-v3 has over 200,000, the
NASNets more: the original's N x N tables cannot even be allocated for them), we fall back to
the prefixes of one depth-first topological order: every prefix is downward closed, hence a
valid cut, and a depth-first order keeps each branch together, so every cut between blocks
is among them; likewise beyond ``max_triples`` ordered triples of antichains (the work of a
multi-level solve, ``triples``). ``States.method`` says which was used; the plan reports it.

Input nodes (descriptions starting with "Input") are removed and sinks that are bare
``__getitem__`` nodes are dropped, as the original does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from pipedream_impl.profiling.graph import Graph

__all__ = ["MAX_STATES", "States", "build_states", "coarsen", "input_nodes", "prepare",
           "triples"]


@dataclass(frozen=True)
class States:
    """The chain of antichains with prefix sums, ready for the dynamic program."""

    antichains: tuple[tuple[str, ...], ...]  # augmented antichain of each state
    members: tuple[tuple[str, ...], ...]  # pred(i): nodes up to and including state i
    compute_s: np.ndarray  # [N] forward+backward seconds of pred(i)
    activation_bytes: np.ndarray  # [N] sum of output activations of pred(i)
    parameter_bytes: np.ndarray  # [N] parameters of pred(i)
    output_bytes: np.ndarray  # [N] activations leaving state i (its antichain's outputs)
    precedes: np.ndarray  # [N, N] bool: precedes[k, j] = k is a predecessor of j
    method: str = "antichain"  # or "topological-prefix"
    # [N] backward seconds of pred(i): what can hide a replicated stage's all-reduce
    backward_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.antichains)


def input_nodes(graph: Graph) -> list[str]:
    """The graph's input nodes: sources whose description starts with "Input" (the data a
    minibatch brings, e.g. ``Input``, ``Input0``). The original optimizer zeroes their
    compute and drops them; the planner does the same (``prepare``) and the simulator
    charges them no compute (``harness.sim.costs.stage_costs``): the one rule for both."""
    return [s for s in graph.sources() if graph.nodes[s].desc.startswith("Input")]


def prepare(graph: Graph) -> Graph:
    """Drop input nodes and dangling ``__getitem__`` sinks (as the original optimizer)."""
    g = Graph(dict(graph.nodes), {k: list(v) for k, v in graph.edges.items()},
              {k: list(v) for k, v in graph.in_edges.items()})
    for s in input_nodes(g):
        g.remove_node(s)
    for s in g.sinks():
        if g.nodes[s].desc.startswith("__getitem__"):
            g.remove_node(s)
    return g


class _Bits:
    def __init__(self, g: Graph) -> None:
        self.ids = list(g.nodes)
        self.index = {n: i for i, n in enumerate(self.ids)}
        n = len(self.ids)
        self.out = [0] * n
        for a, bs in g.edges.items():
            for b in bs:
                self.out[self.index[a]] |= 1 << self.index[b]
        self.pred = [0] * n
        self.succ = [0] * n
        order = [self.index[n] for n in g.topological_order()]
        for v in order:
            for b in g.edges.get(self.ids[v], []):
                bi = self.index[b]
                self.pred[bi] |= self.pred[v] | (1 << v)
        for v in reversed(order):
            for b in g.edges.get(self.ids[v], []):
                bi = self.index[b]
                self.succ[v] |= self.succ[bi] | (1 << bi)
        self._frontier: dict[int, int] = {}

    def frontier(self, a: int) -> int:
        """Predecessors of a whose outputs also go somewhere outside pred(a) + {a}."""
        if a not in self._frontier:
            inside = self.pred[a] | (1 << a)
            f, p = 0, self.pred[a]
            while p:
                low = p & -p
                v = low.bit_length() - 1
                if self.out[v] & ~inside:
                    f |= low
                p ^= low
            self._frontier[a] = f
        return self._frontier[a]


def _bits_of(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _TooMany(Exception):
    pass


MAX_STATES = 4000


def build_states(graph: Graph, max_states: int = MAX_STATES,
                 max_triples: float | None = None) -> States:
    """Antichain states, or topological prefixes beyond ``max_states`` antichains or
    ``max_triples`` ordered triples of them (``triples``)."""
    g = prepare(graph)
    b = _Bits(g)
    try:
        states = _antichain_states(g, b, max_states)
    except _TooMany:
        return _prefix_states(g, b)
    if max_triples is not None and triples(states.precedes) > max_triples:
        return _prefix_states(g, b)
    return states


def triples(precedes: np.ndarray) -> int:
    """Ordered triples a < k < j of the states (the work of an inner level's search):
    sum over the middle state k of (its predecessors) x (its successors)."""
    return int(precedes.sum(axis=0) @ precedes.sum(axis=1))


def _prefix_states(g: Graph, b: _Bits) -> States:
    edges = {b.index[a]: [b.index[x] for x in xs] for a, xs in g.edges.items()}
    roots = [b.index[s] for s in g.sources()]
    order = _reverse_postorder(len(b.ids), edges, roots)
    n = len(order)
    nodes = [g.nodes[b.ids[v]] for v in order]
    compute = np.cumsum([(x.forward_ms + x.backward_ms) / 1000.0 for x in nodes])
    backward = np.cumsum([x.backward_ms / 1000.0 for x in nodes])
    act = np.cumsum([x.activation_bytes for x in nodes])
    par = np.cumsum([x.parameter_bytes for x in nodes])
    out = np.zeros(n)
    antichains, members = [], []
    prefix = 0
    for i, v in enumerate(order):
        prefix |= 1 << v
        live = [u for u in _bits_of(prefix) if b.out[u] & ~prefix]
        out[i] = sum(g.nodes[b.ids[u]].activation_bytes for u in live)
        antichains.append(tuple(b.ids[u] for u in live) or (b.ids[v],))
        members.append(tuple(b.ids[u] for u in order[: i + 1]))
    precedes = np.triu(np.ones((n, n), dtype=bool), k=1)
    return States(tuple(antichains), tuple(members), compute, act, par, out, precedes,
                  method="topological-prefix", backward_s=backward)


def _antichain_states(g: Graph, b: _Bits, max_states: int) -> States:

    def augment(antichain: tuple[int, ...]) -> tuple[int, ...]:
        extra = 0
        for a in antichain:
            extra |= b.frontier(a)
        for a in antichain:
            extra &= ~(1 << a)
        return tuple(_bits_of(extra)) + antichain

    def deaugment(aug: list[int]) -> tuple[int, ...]:
        mask = 0
        for x in aug:
            mask |= 1 << x
        out: list[int] = []
        for x in aug:
            if not (b.succ[x] & mask) and x not in out:
                out.append(x)
        return tuple(out)

    def next_antichains(antichain: tuple[int, ...]) -> list[tuple[int, ...]]:
        aug = augment(antichain)
        aug_mask = 0
        for x in aug:
            aug_mask |= 1 << x
        result = []
        for x in aug:
            for nb in g.edges.get(b.ids[x], []):
                n = b.index[nb]
                if n in antichain or (b.succ[n] & aug_mask):
                    continue
                result.append(deaugment([n if y == x else y for y in aug]))
        return result

    start = (b.index[g.sources()[0]],)
    key = frozenset(start)
    ids = {key: 0}
    reps = [start]
    dag_edges: dict[int, list[int]] = {}
    expanded: set[frozenset] = set()
    queue = deque([start])
    while queue:
        ac = queue.popleft()
        k = frozenset(ac)
        if k in expanded:
            continue
        expanded.add(k)
        for nxt in next_antichains(ac):
            nk = frozenset(nxt)
            if nk not in ids:
                ids[nk] = len(reps)
                reps.append(nxt)
                if len(reps) > max_states:
                    raise _TooMany
            dag_edges.setdefault(ids[k], []).append(ids[nk])
            queue.append(nxt)

    order = _reverse_postorder(len(reps), dag_edges)
    n = len(order)
    pos = {s: i for i, s in enumerate(order)}
    precedes = np.zeros((n, n), dtype=bool)
    for s in reversed(order):  # successors before predecessors
        i = pos[s]
        for t in dag_edges.get(s, []):
            j = pos[t]
            precedes[i, j] = True
            precedes[i] |= precedes[j]

    compute, backward, act, par, out = (np.zeros(n) for _ in range(5))
    antichains, members = [], []
    for s in order:
        i = pos[s]
        aug = augment(reps[s])
        closed = 0
        for a in aug:
            closed |= b.pred[a] | (1 << a)
        nodes = [g.nodes[b.ids[v]] for v in _bits_of(closed)]
        compute[i] = sum((x.forward_ms + x.backward_ms) / 1000.0 for x in nodes)
        backward[i] = sum(x.backward_ms / 1000.0 for x in nodes)
        act[i] = sum(x.activation_bytes for x in nodes)
        par[i] = sum(x.parameter_bytes for x in nodes)
        out[i] = sum(g.nodes[b.ids[a]].activation_bytes for a in aug)
        antichains.append(tuple(b.ids[a] for a in aug))
        members.append(tuple(x.node_id for x in nodes))
    return States(tuple(antichains), tuple(members), compute, act, par, out, precedes,
                  backward_s=backward)


def _reverse_postorder(n: int, edges: dict[int, list[int]],
                       roots: list[int] | None = None) -> list[int]:
    """DFS topological order (iterative: the NASNet DAGs are deeper than Python's stack)."""
    marked = [False] * n
    post: list[int] = []
    for root in (roots if roots is not None else []) + list(range(n)):
        if marked[root]:
            continue
        marked[root] = True
        stack = [(root, iter(edges.get(root, [])))]
        while stack:
            node, it = stack[-1]
            for child in it:
                if not marked[child]:
                    marked[child] = True
                    stack.append((child, iter(edges.get(child, []))))
                    break
            else:
                stack.pop()
                post.append(node)
    return post[::-1]


def coarsen(states: States, keep: int) -> States:
    """Keep the ``keep`` narrowest cuts (fewest bytes crossing) of a prefix chain, and the
    end: for the NASNets, whose 900-1,250 prefixes make a two-level solve take a minute."""
    if states.method == "antichain":
        raise ValueError("only prefix chains can be coarsened")
    n = len(states)
    if n <= keep:
        return states
    narrow = np.argsort(states.output_bytes[:-1], kind="stable")[: keep - 1]
    idx = np.sort(np.append(narrow, n - 1))
    return States(tuple(states.antichains[i] for i in idx),
                  tuple(states.members[i] for i in idx), states.compute_s[idx],
                  states.activation_bytes[idx], states.parameter_bytes[idx],
                  states.output_bytes[idx], np.triu(np.ones((keep, keep), dtype=bool), k=1),
                  method=f"topological-prefix, {keep} narrowest of {n} cuts",
                  backward_s=None if states.backward_s is None else states.backward_s[idx])
