"""The planner under ``--allreduce ring|ps|ps-colocated|byteps --cpu-machines k``: the DP
against brute force with the machine-level closed forms written out here, data
parallelism's predicted time and bytes by hand, and the default (ring) plans unchanged."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from core.collectives import Sync
from core.errors import UserInputError
from pipedream_impl.planner.antichain import build_states
from pipedream_impl.planner.cluster import Cluster, Level, parse_cluster
from pipedream_impl.planner.optimizer import solve
from pipedream_impl.planner.plan import plan_profile
from pipedream_impl.planner.sync_cost import data_parallel_time
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile
from tests.pipedream_impl.planner.test_optimizer import brute_force as optimizer_brute_force
from tests.pipedream_impl.planner.test_optimizer import chain


def among(mode: str, k: int, n: int) -> float:
    """Seconds x bandwidth per byte among n machines (BytePS, OSDI 2020, section 3.2)."""
    if n == 1:
        return 0.0
    if mode in ("ring", "ps-colocated"):
        return 2 * (n - 1) / n
    if mode == "ps" or k >= n:
        return max(1.0, n / k)
    return 2 * n * (n - 1) / (n * n + k * n - 2 * k)


def brute_force(times_ms, params, acts, levels, mode: str, k: int) -> float:  # noqa: ANN001
    """Every partition and replica assignment, level by level (the ``pipebench`` model:
    rings inside machines, the mode among the machines of the outermost level)."""
    top = len(levels) - 1

    def ar(level: int, r: int, p: float, bw: float) -> float:
        return (among(mode, k, r) if level == top else 2 * (r - 1) / r) * p / bw

    return optimizer_brute_force(times_ms, params, acts, levels, "pipebench", level_ar=ar)


MODES = [("ps", 1), ("ps", 3), ("ps-colocated", 0), ("byteps", 0), ("byteps", 2),
         ("byteps", 5)]


@pytest.mark.parametrize("mode, k", MODES)
@pytest.mark.parametrize("shape", [((4, 1e9),), ((2, 12e9), (3, 1.25e9))])
def test_dp_equals_brute_force_under_each_mode(mode: str, k: int, shape: tuple) -> None:
    rng = random.Random(zlib.crc32(repr((mode, k, shape)).encode()))
    cluster = Cluster(tuple(Level(w, b) for w, b in shape))
    for _ in range(6):
        n = rng.randint(2, 4)
        t = [rng.uniform(1, 40) for _ in range(n)]
        p = [rng.uniform(0, 4e8) for _ in range(n)]
        a = [rng.uniform(1e6, 3e8) for _ in range(n)]
        got = solve(build_states(chain(t, p, a)), cluster, sync=Sync(mode, k)).time
        assert got == pytest.approx(brute_force(t, p, a, list(shape), mode, k), rel=1e-9)


def test_data_parallel_time_by_hand() -> None:
    g = chain([30.0, 30.0], [3e8, 1e8], [1e6, 1e6])  # 60 ms, 400 MB
    states = build_states(g)
    cl = parse_cluster("A:4x4")  # 4 x 15.75 GB/s inside, 4 machines at 1.25 GB/s
    P, inside = 4e8, 1.5 * 4e8 / 15.75e9
    for mode, k, factor in (("ring", 0, 1.5), ("ps", 4, 1.0), ("ps", 2, 2.0),
                            ("byteps", 2, 1.2), ("ps-colocated", 0, 1.5)):
        sync = Sync(mode, k)
        ar = inside + factor * P / 1.25e9
        assert data_parallel_time(states, cl, "pipebench", sync, overlap=False) == \
            pytest.approx((0.060 + ar) / 16)
        # overlapped: the 30 ms backward hides 30 ms of the all-reduce
        assert data_parallel_time(states, cl, "pipebench", sync) == \
            pytest.approx((0.060 + ar - 0.030) / 16)


def _profile() -> Profile:
    nodes = tuple(Node(f"n{i}", "Op", f, 2 * f, (a,), p) for i, (f, a, p) in
                  enumerate([(5, 4e6, 2e8), (9, 2e6, 1e8), (3, 1e6, 5e8), (7, 1e5, 3e8)]))
    return Profile(nodes, tuple((f"n{i}", f"n{i + 1}") for i in range(3)), batch_size=8)


def test_default_plans_are_the_ring_plans_and_name_no_mode() -> None:
    prof = _profile()
    for spec in ("A:4x4", "B:2x8", "4"):
        cl = parse_cluster(spec)
        default = plan_profile(prof, cl).to_json()
        assert default == plan_profile(prof, cl, sync=Sync("ring")).to_json()
        assert "allreduce" not in json.loads(default)["extra"]
    ps = plan_profile(prof, parse_cluster("A:4x4"), sync=Sync("ps", 4))
    assert ps.extra == {"allreduce": "ps", "cpu_machines": 4}
    # data parallelism: 1.5 P inside each machine + (4 P + 4 x 4P/4) / 16 among machines
    params = sum(n.parameter_bytes for n in prof.layers)
    assert ps.predicted["bytes_per_sample_data_parallel"] * 8 == pytest.approx(2.0 * params)


def test_the_original_cost_model_keeps_its_ring() -> None:
    prof = _profile()
    with pytest.raises(UserInputError, match="needs --cost-model pipebench"):
        plan_profile(prof, parse_cluster("A:4x4"), "pipedream-2019", sync=Sync("byteps", 2))
