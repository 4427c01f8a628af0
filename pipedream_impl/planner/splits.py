"""Contiguous splits of a chain into stages: the exact min-max DP and the balanced split of
a fixed config.

Why apart from ``plan``: these split a list of per-layer costs, with no profile graph,
cluster or plan; the runtime balances a ``--config`` on a local profile with them, the
simulator splits a config on a cluster, and ``plan`` is the DP's home, not theirs.
"""

from __future__ import annotations

from collections.abc import Callable

from core.errors import UserInputError

__all__ = ["balanced_bounds", "min_max_split"]


def min_max_split(n: int, stages: int, cost: Callable[[int, int, int], float],
                  combine: Callable[[float, float], float] = max) \
        -> tuple[tuple[int, int], ...]:
    """Split items ``0..n-1`` into ``stages`` contiguous non-empty ranges that minimise the
    largest ``cost(i, a, b)`` (stage ``i`` holding ``[a, b)``): an exact DP over cut
    positions, O(S n^2). ``combine``: how stage costs add up (``max``: the bottleneck;
    ``operator.add``: a total, e.g. bytes; an infinite cost rules a range out). Ties go to
    the earliest cut."""
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for i in range(1, stages + 1):
        for b in range(i, n - (stages - i) + 1):
            for a in range(i - 1, b):
                if best[i - 1][a] == inf:
                    continue
                v = combine(best[i - 1][a], cost(i - 1, a, b))
                if v < best[i][b]:
                    best[i][b], cut[i][b] = v, a
    bounds, b = [], n
    for i in range(stages, 0, -1):
        bounds.append((cut[i][b], b))
        b = cut[i][b]
    return tuple(reversed(bounds))


def balanced_bounds(layer_ms: list[float],
                    replicas: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Layer ranges for a fixed config (e.g. 2-1-1): minimise max(stage time / replicas)
    over contiguous splits of a chain."""
    n, s = len(layer_ms), len(replicas)
    if s > n:
        raise UserInputError(f"config has {s} stages but the model has only {n} layers")
    prefix = [0.0]
    for t in layer_ms:
        prefix.append(prefix[-1] + t)
    return min_max_split(n, s, lambda i, a, b: (prefix[b] - prefix[a]) / replicas[i])
