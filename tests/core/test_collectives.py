"""core/collectives.py: the ring formula against a ring all-reduce run step by step."""

from __future__ import annotations

import numpy as np
import pytest

from core.collectives import ring_allreduce_bytes, ring_factor


def _ring_allreduce(data: list[np.ndarray]) -> tuple[list[np.ndarray], list[int]]:
    """Reduce-scatter then all-gather over n ranks in a ring, one chunk per step; returns
    every rank's result and the bytes each rank sent."""
    n = len(data)
    chunks = [np.array_split(d.copy(), n) for d in data]
    sent = [0] * n
    for step in range(n - 1):  # reduce-scatter: rank r sends chunk (r - step) to r + 1
        msgs = [(r, (r - step) % n, chunks[r][(r - step) % n].copy()) for r in range(n)]
        for r, c, payload in msgs:
            chunks[(r + 1) % n][c] += payload
            sent[r] += payload.nbytes
    for step in range(n - 1):  # all-gather: rank r passes its finished chunk on
        msgs = [(r, (r + 1 - step) % n, chunks[r][(r + 1 - step) % n].copy())
                for r in range(n)]
        for r, c, payload in msgs:
            chunks[(r + 1) % n][c] = payload
            sent[r] += payload.nbytes
    return [np.concatenate(c) for c in chunks], sent


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_each_rank_sends_what_the_formula_says(n: int) -> None:
    rng = np.random.default_rng(n)
    data = [rng.standard_normal(n * 1000) for _ in range(n)]
    out, sent = _ring_allreduce(data)
    total = np.sum(data, axis=0)
    assert all(np.allclose(o, total) for o in out)  # the simulation is an all-reduce
    nbytes = data[0].nbytes
    assert sent == [ring_allreduce_bytes(nbytes, n)] * n
    assert ring_factor(n) * nbytes == ring_allreduce_bytes(nbytes, n)


def test_one_rank_sends_nothing_and_arrays_work_elementwise() -> None:
    assert ring_allreduce_bytes(1e6, 1) == 0
    assert list(ring_factor(np.array([1, 2, 4]))) == [0.0, 1.0, 1.5]
