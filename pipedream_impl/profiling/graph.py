"""Layer graphs and PipeDream's ``graph.txt`` format.

A ``Graph`` is what the profiler produces and the planner consumes: nodes with forward and
backward time (milliseconds per minibatch), output activation bytes (one number, or several
for a node with several outputs) and parameter bytes, plus directed edges. Our own workloads
profile to chains; the original PipeDream profiles (../shared/pipedream-profiles) branch.

``graph.txt`` (github msr-fiddle/pipedream, profiler output), one node per line::

    node4 -- Conv2d(...) -- forward_compute_time=1.2, backward_compute_time=2.3, \
activation_size=[6291456.0; 131072.0], parameter_size=1180672.000

then one edge per line, ``\\tnode4 -- node5``. An optional ``-- stage_id=N`` suffix (the
original optimizer's output) is accepted and ignored.

Reading checks what the planner relies on, naming the line that breaks it: every number
finite and not negative, node ids unique, edges between known nodes and not repeated, and
no cycle (``Graph.check_acyclic`` names the nodes on it).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import GraphFormatError

__all__ = ["Graph", "Node", "parse_graph", "parse_node"]

_META = re.compile(r"forward_compute_time=([^,]+), backward_compute_time=([^,]+), "
                   r"activation_size=(\[[^\]]*\]|[^,]+), parameter_size=([^\s,]+)")


@dataclass(frozen=True)
class Node:
    node_id: str
    desc: str
    forward_ms: float
    backward_ms: float
    activations: tuple[float, ...]  # bytes of each output, batch dimension included
    parameter_bytes: float

    def __post_init__(self) -> None:
        fields = [("forward time", self.forward_ms), ("backward time", self.backward_ms),
                  ("parameter size", self.parameter_bytes)]
        fields += [("activation size", a) for a in self.activations]
        for what, value in fields:
            if not (math.isfinite(value) and value >= 0):
                raise GraphFormatError(f"node {self.node_id}: {what} {value} must be a finite "
                                       "number, 0 or more (re-run `pipebench profile`)")
        if not self.activations:
            raise GraphFormatError(f"node {self.node_id}: no activation size")

    @property
    def activation_bytes(self) -> float:
        return float(sum(self.activations))

    def to_line(self) -> str:
        if len(self.activations) == 1:
            act = f"{self.activations[0]:.1f}"
        else:
            act = "[" + "; ".join(f"{a:.1f}" for a in self.activations) + "]"
        return (f"{self.node_id} -- {self.desc} -- forward_compute_time={self.forward_ms:.3f}, "
                f"backward_compute_time={self.backward_ms:.3f}, activation_size={act}, "
                f"parameter_size={self.parameter_bytes:.3f}")


@dataclass
class Graph:
    """Nodes in file order; ``edges``/``in_edges`` keep insertion order (it matters for the
    antichain enumeration order, see antichain.py)."""

    nodes: dict[str, Node] = field(default_factory=dict)
    edges: dict[str, list[str]] = field(default_factory=dict)
    in_edges: dict[str, list[str]] = field(default_factory=dict)

    def add_node(self, node: Node) -> None:
        self.nodes[node.node_id] = node

    def add_edge(self, a: str, b: str) -> None:
        for n in (a, b):
            if n not in self.nodes:
                raise GraphFormatError(f"edge {a} -- {b} names unknown node {n}; declare "
                                       f"every node before using it in an edge")
        if b in self.edges.get(a, []):
            raise GraphFormatError(f"edge {a} -- {b} appears twice; keep one")
        self.edges.setdefault(a, []).append(b)
        self.in_edges.setdefault(b, []).append(a)

    def remove_node(self, node_id: str) -> None:
        del self.nodes[node_id]
        for b in self.edges.pop(node_id, []):
            self.in_edges[b].remove(node_id)
        for a in self.in_edges.pop(node_id, []):
            self.edges[a].remove(node_id)

    def sources(self) -> list[str]:
        return [n for n in self.nodes if not self.in_edges.get(n)]

    def sinks(self) -> list[str]:
        return [n for n in self.nodes if not self.edges.get(n)]

    def topological_order(self) -> list[str]:
        """Node ids in a topological order: Kahn's algorithm, ready nodes in file order
        (the planner's states and the simulator's fixed-config splits both use it)."""
        indeg = {n: len(self.in_edges.get(n, [])) for n in self.nodes}
        ready = deque(n for n in self.nodes if indeg[n] == 0)
        order = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for b in self.edges.get(n, []):
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
        if len(order) != len(self.nodes):
            self.check_acyclic()
        return order

    def check_acyclic(self) -> None:
        """Raise ``GraphFormatError`` naming the nodes of a cycle, if there is one."""
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for root in self.nodes:
            if root in state:
                continue
            path, stack = [root], [iter(self.edges.get(root, []))]
            state[root] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    state[path.pop()] = 2
                    stack.pop()
                elif state.get(nxt) == 1:
                    cycle = path[path.index(nxt):] + [nxt]
                    raise GraphFormatError(
                        f"the layer graph has a cycle: {' -> '.join(cycle)}; a profile must be "
                        f"acyclic, remove the edge {cycle[-2]} -- {cycle[-1]}")
                elif nxt not in state:
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(self.edges.get(nxt, [])))

    def is_chain(self) -> bool:
        return all(len(self.edges.get(n, [])) <= 1 and len(self.in_edges.get(n, [])) <= 1
                   for n in self.nodes) and len(self.sources()) == 1

    @staticmethod
    def chain(nodes: list[Node]) -> Graph:
        g = Graph()
        for n in nodes:
            g.add_node(n)
        for a, b in zip(nodes, nodes[1:], strict=False):
            g.add_edge(a.node_id, b.node_id)
        return g

    def to_text(self) -> str:
        lines = [n.to_line() for n in self.nodes.values()]
        for b in self.nodes:
            lines += [f"\t{a} -- {b}" for a in self.in_edges.get(b, [])]
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_text())


def parse_node(line: str, lineno: int = 0) -> Node:
    parts = line.strip().split(" -- ")
    if len(parts) < 3:
        raise GraphFormatError(f"line {lineno}: expected 'nodeN -- desc -- metadata', got "
                               f"{line.strip()[:80]!r}")
    m = _META.search(parts[2])
    if m is None:
        raise GraphFormatError(f"line {lineno}: cannot read the metadata {parts[2][:80]!r}; "
                               "expected 'forward_compute_time=F, backward_compute_time=B, "
                               "activation_size=A, parameter_size=P'")
    names = ("forward_compute_time", "backward_compute_time", "activation_size",
             "parameter_size")

    def number(i: int, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise GraphFormatError(f"line {lineno}: {names[i]}={m.group(i + 1).strip()!r} is "
                                   "not a number") from None

    act = m.group(3).strip()
    acts = tuple(number(2, x) for x in act.strip("[]").split(";")) if act.startswith("[") \
        else (number(2, act),)
    fwd, bwd, params = number(0, m.group(1)), number(1, m.group(2)), number(3, m.group(4))
    try:
        return Node(parts[0].strip(), parts[1], fwd, bwd, acts, params)
    except GraphFormatError as e:
        raise GraphFormatError(f"line {lineno}: {e}") from None


def parse_graph(text: str) -> Graph:
    g = Graph()
    pending: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("\t"):
            ends = line.strip().split(" -- ")
            if len(ends) != 2:
                raise GraphFormatError(f"line {lineno}: expected '\\tnodeA -- nodeB'")
            pending.append((lineno, ends[0], ends[1]))
        else:
            node = parse_node(line, lineno)
            if node.node_id in g.nodes:
                raise GraphFormatError(f"line {lineno}: node {node.node_id} is declared twice; "
                                       "node ids must be unique")
            g.add_node(node)
    for lineno, a, b in pending:
        try:
            g.add_edge(a, b)
        except GraphFormatError as e:
            raise GraphFormatError(f"line {lineno}: {e}") from None
    if not g.nodes:
        raise GraphFormatError("no nodes in graph: expected lines 'nodeN -- desc -- "
                               "forward_compute_time=...' (PipeDream's graph.txt)")
    g.check_acyclic()
    return g
