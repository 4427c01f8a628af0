"""core/collectives.py: the ring formula against a ring all-reduce run step by step; the
parameter-server and BytePS closed forms against their push/pull message patterns run on
numpy arrays (bytes counted per NIC), BytePS's split against a brute-force search."""

from __future__ import annotations

import numpy as np
import pytest

from core.collectives import (
    Sync,
    byteps_split,
    byteps_time,
    ps_colocated_time,
    ps_time,
    ring_allreduce_bytes,
    ring_allreduce_time,
    ring_factor,
    sync_bytes,
    sync_factor,
)
from core.errors import UserInputError


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


def test_one_rank_sends_nothing_and_arrays_work_elementwise() -> None:
    assert ring_allreduce_bytes(1e6, 1) == 0
    assert list(ring_factor(np.array([1, 2, 4]))) == [0.0, 1.0, 1.5]


# ---- machine-level synchronisation: closed forms against message patterns run step by step

def _exchange(data: list[np.ndarray], owners: list[tuple[str, int, slice]],
              gpus: int) -> tuple[list[np.ndarray], dict[tuple[str, int], list[int]]]:
    """A push/pull synchronisation, run: the summation service ``(kind, index)`` of each
    owner sums ``slice`` of every GPU machine's gradient and returns the sum to each. A GPU
    machine's own service reads its own part locally (no message). Returns each GPU
    machine's result and [bytes sent, bytes received] per NIC."""
    nic: dict[tuple[str, int], list[int]] = {}

    def move(src: tuple[str, int], dst: tuple[str, int], payload: np.ndarray) -> np.ndarray:
        if src != dst:
            nic.setdefault(src, [0, 0])[0] += payload.nbytes
            nic.setdefault(dst, [0, 0])[1] += payload.nbytes
        return payload.copy()

    out = [np.zeros_like(data[0]) for _ in range(gpus)]
    for kind, idx, part in owners:
        server = (kind, idx)
        total = sum(move(("gpu", g), server, data[g][part]) for g in range(gpus))  # push
        for g in range(gpus):  # pull
            out[g][part] = move(server, ("gpu", g), total)
    return out, nic


def _run_split(n: int, k: int, cpu_elems: int, gpu_elems: int, seed: int = 0) \
        -> tuple[float, float, float, dict]:
    """Run BytePS's pattern with the given split (elements per CPU / GPU service); return
    (model bytes, time at B = 1 (busiest NIC, one direction), bytes per GPU NIC sent,
    the NIC table). Checks the result is the sum on every GPU machine."""
    rng = np.random.default_rng(seed)
    size = k * cpu_elems + n * gpu_elems
    data = [rng.standard_normal(size) for _ in range(n)]
    owners, at = [], 0
    for j in range(k):
        owners.append(("cpu", j, slice(at, at + cpu_elems)))
        at += cpu_elems
    for j in range(n):
        owners.append(("gpu", j, slice(at, at + gpu_elems)))
        at += gpu_elems
    out, nic = _exchange(data, owners, n)
    assert all(np.allclose(o, np.sum(data, axis=0)) for o in out)
    busiest = max(max(s, r) for s, r in nic.values()) if nic else 0
    return data[0].nbytes, busiest, nic.get(("gpu", 0), [0, 0])[0], nic


@pytest.mark.parametrize("n, k", [(2, 1), (3, 1), (4, 2), (4, 4), (5, 3), (8, 2), (8, 8)])
def test_byteps_split_and_time_match_its_message_pattern(n: int, k: int) -> None:
    d = n * n + k * n - 2 * k
    m, t, gpu_sent, nic = _run_split(n, k, 2 * (n - 1) * 8, (n - k) * 8)  # 8 d elements
    assert m == 8 * d * 8  # float64 bytes
    assert byteps_split(n, k, m) == pytest.approx((2 * (n - 1) * m / d, (n - k) * m / d))
    assert byteps_time(n, k, m, 1.0) == pytest.approx(t)
    assert byteps_time(n, k, m, 1.0) == pytest.approx(2 * n * (n - 1) * m / d)
    gpu, cpu = sync_bytes("byteps", n, k, m)
    assert gpu == pytest.approx(gpu_sent)
    assert cpu == pytest.approx(nic[("cpu", 0)][0])
    assert Sync("byteps", k).machine_bytes(n, m) == pytest.approx(
        sum(s for s, _ in nic.values()))


@pytest.mark.parametrize("n, k", [(2, 1), (4, 1), (4, 2), (4, 4), (3, 6)])
def test_byteps_split_is_the_best_of_every_split(n: int, k: int) -> None:
    """Brute force over the share of the GPU machines' services (50 d elements in all):
    no split has a less busy NIC than the closed form's."""
    d = max(1, n * n + k * n - 2 * k)
    total = 50 * d
    best = min(_run_split(n, k, (total - n * g) // k, g)[1] / (8 * total)
               for g in range(total // n + 1) if (total - n * g) % k == 0)
    assert byteps_time(n, k, 1.0, 1.0) == pytest.approx(best)


@pytest.mark.parametrize("n, k", [(2, 1), (4, 1), (4, 2), (4, 4), (4, 8), (8, 3)])
def test_parameter_server_matches_its_message_pattern(n: int, k: int) -> None:
    m, t, gpu_sent, nic = _run_split(n, k, 24, 0)  # servers only
    assert ps_time(n, k, m, 1.0) == pytest.approx(t)
    assert ps_time(n, k, m, 1.0) == pytest.approx(max(m, n * m / k))
    assert sync_bytes("ps", n, k, m) == pytest.approx((gpu_sent, nic[("cpu", 0)][0]))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_colocated_servers_move_what_the_ring_moves(n: int) -> None:
    m, t, gpu_sent, _ = _run_split(n, 0, 0, 24)  # a server on every GPU machine
    assert ps_colocated_time(n, m, 1.0) == pytest.approx(t)
    assert gpu_sent == pytest.approx(ring_allreduce_bytes(m, n))  # the ring's bytes
    assert ps_colocated_time(n, m, 1.0) == pytest.approx(ring_allreduce_time(n, m, 1.0))
    ring_sent = _ring_allreduce([np.zeros(n * 100) for _ in range(n)])[1]
    assert ring_allreduce_time(n, n * 800, 1.0) == pytest.approx(max(ring_sent))


def test_byteps_limits_and_hand_computed_numbers() -> None:
    m, b = 100.0, 4.0
    for n in (2, 3, 4, 8, 16):
        assert byteps_time(n, 0, m, b) == pytest.approx(2 * (n - 1) * m / (n * b))  # ring
        assert byteps_time(n, n, m, b) == pytest.approx(ps_time(n, n, m, b))  # PS, k = n
        assert byteps_time(n, n, m, b) == pytest.approx(m / b)
        assert byteps_time(n, 3 * n, m, b) == pytest.approx(m / b)  # k > n: CPUs only
        assert byteps_split(n, 3 * n, m) == (m / (3 * n), 0.0)
        times = [byteps_time(n, k, m, b) for k in range(n + 1)]
        assert all(a >= c - 1e-12 for a, c in zip(times, times[1:], strict=False))
    assert all(byteps_time(2, k, m, b) == pytest.approx(m / b) for k in range(5))
    # n = 4, k = 2: n^2 + kn - 2k = 20; M_SS_CPU = 6/20 M, M_SS_GPU = 2/20 M, t = 24/20 M/B
    assert byteps_split(4, 2, 1.0) == pytest.approx((0.3, 0.1))
    assert byteps_time(4, 2, 1.0, 1.0) == pytest.approx(1.2)
    assert ps_time(4, 2, 1.0, 1.0) == 2.0 and ps_time(4, 8, 1.0, 1.0) == 1.0
    assert sync_factor("byteps", 4, 2) == pytest.approx(1.2)
    assert Sync("ps", 1).time(1, m, b) == 0.0  # one machine reduces locally


@pytest.mark.parametrize("mode, k, message", [
    ("bogus", 0, "--allreduce must be one of ring, ps, ps-colocated, byteps"),
    ("byteps", -1, "--cpu-machines must be a whole number >= 0"),
    ("byteps", 1.5, "--cpu-machines must be a whole number >= 0"),
    ("ps", 0, "--allreduce ps needs its server machines"),
    ("ring", 2, "--allreduce ring uses no CPU machines"),
    ("ps-colocated", 1, "--allreduce ps-colocated uses no CPU machines"),
])
def test_bad_sync_choices_say_how_to_fix_them(mode: str, k: int, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        Sync(mode, k)
