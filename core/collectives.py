"""The ring all-reduce's traffic: each of n ranks sends 2 (n-1)/n bytes per byte reduced.

One home for the formula every byte counter and cost model uses (the runtime's comm
layer, the DDP and Horovod byte counters, the planner's cost models, the simulator).
"""

from __future__ import annotations

__all__ = ["ring_allreduce_bytes", "ring_factor"]


def ring_factor(n: int | float):  # noqa: ANN201 - int, float or a numpy array of counts
    """Bytes each of ``n`` ranks sends per byte reduced by a ring all-reduce: 2 (n-1)/n
    (reduce-scatter then all-gather). Works element-wise on numpy arrays."""
    return 2 * (n - 1) / n


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends to all-reduce ``nbytes`` over a ring of ``n`` ranks."""
    return ring_factor(n) * nbytes
