"""The simulator's synchronisation modes (harness/sim/costs.py ``sync_levels``) against
hand-written iteration times and byte counts, and harness/sim/byteps.py's table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.collectives import Sync
from core.errors import UserInputError
from harness.reporting.progress import quiet
from harness.sim.costs import Topology, sync_levels
from harness.sim.simulator import SimOptions, layout_for, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

MB = 1e6
PROFILES = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"
# two layers: F 10 + 10 ms, B 20 + 20 ms (60 ms of compute), 40 MB of weights in all
PROF = Profile((Node("n0", "L0", 10.0, 20.0, (0.0,), 30 * MB),
                Node("n1", "L1", 10.0, 20.0, (0.0,), 10 * MB)), (("n0", "n1"),), batch_size=8)
M = 40 * MB
IN, OUT = 400 * MB, 100 * MB  # bytes/s inside a machine and between machines
# 4 machines of 2 GPUs
CL = Cluster((Level(2, IN), Level(4, OUT)))
COMPUTE = 0.060


def _dp(cluster: Cluster, mode: str, k: int = 0, rounds: int = 8):  # noqa: ANN202
    w = cluster.workers
    return simulate_system(PROF, cluster, "dp", layout_for(PROF, cluster, "dp"),
                           SimOptions(minibatches=4 * w * rounds, allreduce=mode,
                                      cpu_machines=k, dp_overlap=False))


# seconds of one iteration on CL: compute + ring of 2 inside each machine (2 (2-1)/2 M / IN)
# + the mode among the 4 machines, written out from the closed forms with n = 4
CASES = [
    ("ring", 0, 1.5 * M / OUT),
    ("ps-colocated", 0, 1.5 * M / OUT),
    ("ps", 4, M / OUT),  # max(M/B, 4M/(4B))
    ("ps", 2, 2 * M / OUT),  # max(M/B, 4M/(2B)): the two servers are the bottleneck
    ("ps", 1, 4 * M / OUT),
    ("byteps", 0, 1.5 * M / OUT),  # 2*4*3/16 = the ring
    ("byteps", 1, 24 / 18 * M / OUT),  # 2 n (n-1) / (n^2 + k n - 2k) = 24 / 18
    ("byteps", 2, 24 / 20 * M / OUT),
    ("byteps", 3, 24 / 22 * M / OUT),
    ("byteps", 4, M / OUT),  # = PS with k = n
    ("byteps", 6, M / OUT),  # k > n: the CPU machines only
]


@pytest.mark.parametrize("mode, k, among", CASES)
def test_dp_iteration_is_compute_plus_local_ring_plus_the_closed_form(
        mode: str, k: int, among: float) -> None:
    r = _dp(CL, mode, k)
    assert r.time_per_minibatch_s * CL.workers == pytest.approx(COMPUTE + M / IN + among)


# bytes the links carry per iteration: inside machines 8 GPUs x 2 (2-1)/2 M; among machines
# every NIC's sends (GPU machines, then CPU machines)
BYTES = [
    ("ring", 0, 4 * 1.5 * M),
    ("ps", 2, 4 * M + 2 * (4 * M / 2)),
    ("ps-colocated", 0, 4 * 1.5 * M),
    # M_SS_CPU = 0.3 M, M_SS_GPU = 0.1 M: a GPU machine sends M - 0.1 M + 3 x 0.1 M,
    # a CPU machine returns 4 x 0.3 M
    ("byteps", 2, 4 * 1.2 * M + 2 * 4 * 0.3 * M),
]


@pytest.mark.parametrize("mode, k, among", BYTES)
def test_bytes_per_level_are_what_each_level_carries(mode: str, k: int, among: float) -> None:
    r = _dp(CL, mode, k)
    rounds = r.minibatches / CL.workers
    assert r.bytes_per_level[0] / rounds == pytest.approx(8 * M)
    assert r.bytes_per_level[1] / rounds == pytest.approx(among)


def test_on_a_flat_cluster_every_worker_is_a_machine() -> None:
    flat = Cluster((Level(4, OUT),))
    r = _dp(flat, "byteps", 2)
    assert r.time_per_minibatch_s * 4 == pytest.approx(COMPUTE + 1.2 * M / OUT)
    assert _dp(flat, "ring").time_per_minibatch_s * 4 == pytest.approx(COMPUTE + 1.5 * M / OUT)


def test_replicas_inside_one_machine_never_use_the_servers() -> None:
    topo = Topology(Cluster((Level(4, IN), Level(2, OUT))), list(range(8)))
    inside = sync_levels(topo, (0, 1, 2, 3), Sync("ps", 1), M, 0.0)
    assert inside == [(0, pytest.approx(1.5 * M / IN), pytest.approx(4 * 1.5 * M))]
    across = sync_levels(topo, (0, 4), Sync("ps", 1), M, 1e-3)  # one GPU on each machine
    assert across == [(1, pytest.approx(2 * M / OUT + 2e-3), pytest.approx(2 * M + 2 * M))]


def test_bad_modes_are_refused_up_front() -> None:
    with pytest.raises(UserInputError, match="needs its server machines"):
        SimOptions(allreduce="ps")
    with pytest.raises(UserInputError, match="must be one of"):
        SimOptions(allreduce="tree")


@pytest.mark.skipif(not (PROFILES / "vgg16" / "graph.txt").exists(),
                    reason="needs ../shared/pipedream-profiles")
def test_the_byteps_table_on_the_shared_profiles(tmp_path: Path) -> None:
    from harness.sim import byteps
    from harness.sim.profile_source import ProfileSource

    rows = byteps.byteps_rows(ProfileSource(str(PROFILES), quiet()), 64, quiet())
    assert len(rows) == len(byteps.MODELS) * len(byteps.CLUSTERS)
    for r in rows:
        n, g = r.machines, r.gpus_per_machine
        local = 2 * (g - 1) / g * r.parameter_bytes / {4: 15.75e9, 8: 150e9}[g]
        b = {"A:4x4": 1.25e9, "B:2x8": 25e9 / 8}.get(r.cluster, 100e9 / 8)
        base = r.compute_s + local
        assert r.ring_s == pytest.approx(base + 2 * (n - 1) / n * r.parameter_bytes / b)
        assert r.ps_s == pytest.approx(base + r.parameter_bytes / b)
        assert r.byteps_s[0] == pytest.approx(r.ring_s)
        assert r.byteps_s[n] == pytest.approx(r.ps_s)
        assert r.best_k == (n if n > 2 else 0)
    vgg = next(r for r in rows if r.model == "VGG-16" and r.cluster == "A:4x4")
    assert vgg.gain > 1.15  # 1.5x less time among machines, compute unchanged
    out = tmp_path / "b.json"
    byteps.write_json(rows, str(out))
    data = json.loads(out.read_text())
    assert data[0]["model"] == "VGG-16" and len(data[0]["byteps_s"]) == 5
    assert "## A:4x4" in byteps.byteps_markdown(rows, "cmd")
