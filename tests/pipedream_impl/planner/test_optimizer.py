"""pipedream_impl/planner/optimizer.py: the DP against brute force, hand-computed cases, and the
properties a cost model must have."""

from __future__ import annotations

import itertools
import math
import random
import zlib
from functools import cache

import pytest

from pipedream_impl.planner.antichain import build_states
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.optimizer import COST_MODELS, solve
from pipedream_impl.planner.plan import build_plan
from pipedream_impl.planner.sync_cost import data_parallel_time
from pipedream_impl.profiling.graph import Graph, Node


def chain(times_ms: list[float], params: list[float], acts: list[float]) -> Graph:
    return Graph.chain([Node(f"l{i}", "Op", t / 2, t / 2, (a,), p)
                        for i, (t, p, a) in enumerate(zip(times_ms, params, acts, strict=True))])


def compositions(n: int, parts: int) -> list[tuple[int, ...]]:
    return [c for c in itertools.product(range(1, n + 1), repeat=parts) if sum(c) == n]


def brute_force(times_ms, params, acts, levels, model, straight=False,  # noqa: ANN001
                level_ar=None, overlap=True) -> float:
    """Enumerate every partition of the chain and replica assignment, level by level,
    with the cost model written out directly from its definition. ``level_ar(level, r,
    bytes, bandwidth)``: another weight synchronisation (e.g. a parameter server among
    machines, tests/pipedream_impl/planner/test_sync.py) instead of the model's ring.
    ``overlap`` (``pipebench``): a stage's backward (half of each layer's time in
    ``chain``) hides its all-reduce; what it leaves over hides the next level's."""
    n = len(times_ms)
    out = list(acts)
    hides = overlap and model == "pipebench"

    def backward(a: int, b: int) -> float:
        return sum(times_ms[a:b + 1]) / 2000 if hides else 0.0

    def synced(c: float, pe: float, h: float, level: int, r: int, bw: float) -> tuple:
        """(time, P_eff, leftover backward) of compute c on r replicas at ``level``."""
        a = ar(level, r, pe, bw)
        return (c + max(0.0, a - h)) / r, pe, max(0.0, h - a) / r

    def ar(level: int, r: int, p: float, bw: float) -> float:
        if level_ar is not None:
            return level_ar(level, r, p, bw)
        if model == "pipedream-2019":
            return 4 * (r - 1) * p / (bw * r)
        return 2 * (r - 1) / r * p / bw

    @cache
    def data_parallel(level: int, a: int, b: int) -> tuple[float, float, float]:
        """(time, P_eff, leftover backward) of layers a..b data parallel on all workers
        of a level unit."""
        c, pe, h = sum(times_ms[a:b + 1]) / 1000, sum(params[a:b + 1]), backward(a, b)
        for lv, (w, bw) in enumerate(levels[:level + 1]):
            c, _, h = synced(c, pe, h, lv, w, bw)
            pe /= w
        return c, pe, h

    @cache
    def best(level: int, a: int, b: int, units: int) -> tuple[float, float, float]:
        """(time, P_eff, leftover backward: its stages' smallest) of the fastest plan of
        layers a..b on ``units`` units."""
        m_units, bw = levels[level]
        inner = levels[level - 1][0] if level > 0 else 1
        result = (math.inf, 0.0, 0.0)
        for q in range(1, b - a + 2):
            for cuts in itertools.combinations(range(a + 1, b + 1), q - 1):
                bounds = [a, *cuts, b + 1]
                for reps in compositions(units, q):
                    if straight and any(r != 1 for r in reps):
                        continue
                    worst, peff, left = 0.0, 0.0, math.inf
                    for t in range(q):
                        s, e, r = bounds[t], bounds[t + 1] - 1, reps[t]
                        p = sum(params[s:e + 1])
                        c, pe, h = (sum(times_ms[s:e + 1]) / 1000, p, backward(s, e)) \
                            if level == 0 else best(level - 1, s, e, inner)
                        if model == "pipedream-2019":
                            stage = (c + ar(level, r, p, bw) / (inner if t == 0 else 1)) / r
                        else:  # bytes a unit moves per minibatch: P_eff of its inner plan,
                            # or of the range data parallel on all of a unit's workers
                            options = [synced(c, pe, h, level, r, bw)]
                            if level > 0 and not straight:
                                options.append(synced(*data_parallel(level - 1, s, e),
                                                      level, r, bw))
                            stage, pe, spare = min(options, key=lambda o: o[0])
                            left = min(left, spare)
                        peff += pe / r
                        worst = max(worst, stage)
                        if t > 0:
                            worst = max(worst, 2 * out[s - 1] / (bw * r))
                            if e < n - 1:
                                worst = max(worst, 2 * out[e] / (bw * r))
                    result = min(result, (worst, peff, left), key=lambda o: o[:2])
        return result

    top = len(levels) - 1
    return best(top, 0, n - 1, levels[top][0])[0]


def random_chain(rng: random.Random, n: int):
    return ([rng.uniform(1, 40) for _ in range(n)], [rng.uniform(0, 4e8) for _ in range(n)],
            [rng.uniform(1e6, 3e8) for _ in range(n)])


@pytest.mark.parametrize("model", COST_MODELS)
@pytest.mark.parametrize("shape", [((4, 10e9),), ((3, 5e9),), ((2, 12e9), (2, 1.25e9)),
                                   ((2, 15e9), (3, 2e9))])
def test_dp_equals_brute_force_on_random_chains(model: str, shape: tuple) -> None:
    rng = random.Random(zlib.crc32(repr((model, shape)).encode()))
    cluster = Cluster(tuple(Level(w, b) for w, b in shape))
    for _ in range(12):
        t, p, a = random_chain(rng, rng.randint(2, 5))
        st = build_states(chain(t, p, a))
        for straight in (False, True):
            if straight and len(t) < cluster.levels[-1].workers:
                continue
            got = solve(st, cluster, model, straight=straight).time
            want = brute_force(t, p, a, list(shape), model, straight)
            assert got == pytest.approx(want, rel=1e-9), (t, p, a, straight)


def test_hand_computed_two_layers_two_workers() -> None:
    # Two 1 s layers, 1 GB of parameters each, 100 MB of activations between, 1 GB/s.
    st = build_states(chain([1000, 1000], [1e9, 1e9], [1e8, 1e8]))
    cluster = Cluster((Level(2, 1e9),))
    sol = solve(st, cluster, "pipebench")
    # Data parallel: (2 s + ring 2*(1/2)*2 GB / 1 GB/s) / 2 = 2 s per minibatch; with the
    # 1 s backward hiding 1 s of the 2 s all-reduce, (2 + 1) / 2 = 1.5 s.
    # Straight 1-1: max(1 s, 1 s, 2 * 0.1 GB / 1 GB/s) = 1 s.
    assert sol.time == pytest.approx(1.0)
    assert data_parallel_time(st, cluster, "pipebench", overlap=False) == pytest.approx(2.0)
    assert data_parallel_time(st, cluster, "pipebench") == pytest.approx(1.5)
    plan = build_plan(sol, batch_size=10)
    assert plan.config == "1-1" and plan.config_label == "straight"
    assert plan.predicted["speedup_vs_data_parallel"] == pytest.approx(1.5)
    assert plan.predicted["speedup_vs_one_worker"] == pytest.approx(2.0)
    # bytes per sample: activations + gradients across the one boundary, / 10 samples
    assert plan.predicted["bytes_per_sample"] == pytest.approx(2 * 1e8 / 10)
    assert plan.predicted["bytes_per_sample_data_parallel"] == pytest.approx(2e9 / 10)
    # The original's model: DP = (2 + 4*(1)*2e9/(1e9*2)) / 2 = 3 s.
    assert data_parallel_time(st, cluster, "pipedream-2019") == pytest.approx(3.0)


def test_the_backward_hides_the_all_reduce_as_the_simulator_charges_it() -> None:
    # One 300 ms layer (150 ms backward), 1 GB of weights, 2 workers at 4 GB/s: the ring
    # all-reduce takes 2 (1/2) 1 GB / 4 GB/s = 250 ms, of which the backward hides 150.
    st = build_states(chain([300], [1e9], [1e6]))
    cluster = Cluster((Level(2, 4e9),))
    assert solve(st, cluster, overlap=False).time == pytest.approx((0.300 + 0.250) / 2)
    assert solve(st, cluster).time == pytest.approx((0.300 + 0.100) / 2)
    # two levels, 2 x 2 workers, 20 GB/s inside (50 ms), 1 GB/s between (1 GB each way,
    # 1 s): the backward hides the inner 50 ms and, with the 100 ms it leaves, part of the
    # outer: (300 + 50 + 1000 - 150) / 4, data parallelism's closed form
    two = Cluster((Level(2, 20e9), Level(2, 1e9)))
    want = (0.300 + 0.050 + 1.0 - 0.150) / 4
    assert data_parallel_time(st, two, "pipebench") == pytest.approx(want)
    assert solve(st, two).time == pytest.approx(want)
    # the original optimizer's model hides nothing
    assert solve(st, cluster, "pipedream-2019").time == \
        solve(st, cluster, "pipedream-2019", overlap=False).time


def test_free_communication_gives_data_parallelism_its_ideal_speedup() -> None:
    st = build_states(chain([10, 30, 20], [0, 0, 0], [0, 0, 0]))
    sol = solve(st, Cluster((Level(4, 1e9),)), "pipebench")
    assert sol.time == pytest.approx(0.060 / 4)


@pytest.mark.parametrize("model", COST_MODELS)
def test_more_bandwidth_never_predicts_a_slower_plan(model: str) -> None:
    rng = random.Random(3)
    for _ in range(10):
        st = build_states(chain(*random_chain(rng, 8)))
        times = [solve(st, Cluster((Level(4, bw), Level(2, bw / 10))), model).time
                 for bw in (1e9, 2e9, 8e9, 64e9)]
        assert all(a >= b - 1e-12 for a, b in itertools.pairwise(times)), times


def test_straight_never_replicates() -> None:
    rng = random.Random(5)
    for _ in range(5):
        st = build_states(chain(*random_chain(rng, 9)))
        for cluster in (Cluster((Level(4, 1e9),)), Cluster((Level(2, 1e10), Level(2, 1e9)))):
            plan = build_plan(solve(st, cluster, straight=True))
            assert all(s.replicas == 1 for s in plan.stages)
            assert len(plan.stages) == cluster.workers


def _stage_memory(st, plan, workers: int) -> list[float]:
    """(activations + parameters) x stashed versions, the original's count."""
    out, after = [], workers
    for s in plan.stages:
        after -= s.replicas
        lo, hi = s.layers[0] - 1, s.layers[1] - 1
        p = st.parameter_bytes[hi] - (st.parameter_bytes[lo] if lo >= 0 else 0)
        a = st.activation_bytes[hi] - (st.activation_bytes[lo] if lo >= 0 else 0)
        out.append((p + a) * math.ceil(after / s.replicas))
    return out


def test_memory_limit_is_respected() -> None:
    st = build_states(chain([40, 10, 10, 10, 10, 10], [1e8] * 6, [5e8, 1e8, 1e8, 1e8, 1e8, 1e6]))
    cluster = Cluster((Level(4, 1e9),))
    free = build_plan(solve(st, cluster))
    need = _stage_memory(st, free, cluster.workers)
    assert max(need) > 0, free.config  # a pipeline that stashes something
    limit = max(need) * 0.99
    sol = solve(st, cluster, memory_limit=limit)
    plan = build_plan(sol)
    assert plan.config != free.config or plan.stages != free.stages
    assert all(m <= limit for m in _stage_memory(st, plan, cluster.workers))
    assert sol.time >= free.predicted["time_per_minibatch_s"] - 1e-12
