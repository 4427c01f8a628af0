"""pipedream_impl/runtime/comm.py's hierarchical all-reduce: the grouping (hosts.py) as a
pure function against the planner/simulator's ``Topology.ring_levels``; on real gloo processes with
faked hosts (``PIPEBENCH_FAKE_HOSTS``), the average equal to a flat all-reduce's and the
bytes per level equal to the ring formula; a replicated pipeline across two faked hosts
equal to the single-process reference."""

from __future__ import annotations

import datetime
import itertools

import pytest
import torch
import torch.distributed as dist

from core.collectives import Sync
from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from harness.sim.costs import Topology, sync_levels
from pipedream_impl.planner.cluster import parse_cluster
from pipedream_impl.runtime.comm import Comm
from pipedream_impl.runtime.hosts import AMONG_HOSTS, FAKE_HOSTS_ENV, HOST, Hierarchy
from pipedream_impl.schedule import Layout, one_f_one_b
from tests.gloo_ranks import run_ranks
from tests.pipeline_reference import simulate_pipedream
from workloads.registry import get

# -- grouping: a pure function, checked against the simulator's topology ----------------

def test_groups_of_a_hand_made_placement() -> None:
    h = Hierarchy.of((0, 1, 2, 3, 5), ["a", "a", "b", "b", "c", "a"])
    assert h.local == ((0, 1, 5), (2, 3))
    assert h.leaders == (0, 2)
    assert h.groups() == [(0, 1, 5), (2, 3), (0, 2)]
    assert h.ring_levels() == [(HOST, 3), (AMONG_HOSTS, 2)]
    one_host = Hierarchy.of((1, 2, 3), ["x"] * 4)
    assert one_host.groups() == [(1, 2, 3)]  # today's flat group
    assert one_host.ring_levels() == [(HOST, 3)]
    spread = Hierarchy.of((0, 1, 2), ["a", "b", "c"])
    assert spread.groups() == [(0, 1, 2)] and spread.ring_levels() == [(AMONG_HOSTS, 3)]


@pytest.mark.parametrize("cluster", ["2x2", "2x4", "3x2", "4x3", "4x1", "1x4"])
def test_levels_equal_the_topologys_rings_for_every_replica_group(cluster: str) -> None:
    """For every set of 2-4 ranks placed on an SxG cluster (identity and a shuffled
    placement), the runtime's levels are the rings ``Topology.ring_levels`` charges."""
    c = parse_cluster(cluster)
    per_server, n = c.levels[0].workers, c.workers
    shuffled = list(range(n))
    torch.manual_seed(0)
    shuffled = [shuffled[i] for i in torch.randperm(n).tolist()]
    checked = 0
    for placement in (list(range(n)), shuffled):
        topo = Topology(c, placement)
        hosts = [f"server{w // per_server}" for w in placement]
        for size in range(2, min(n, 4) + 1):
            for ranks in itertools.combinations(range(n), size):
                assert Hierarchy.of(ranks, hosts).ring_levels() == topo.ring_levels(ranks)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("cluster", ["2x2", "2x3", "3x4"])
def test_bytes_per_level_summed_over_ranks_equal_the_simulators(cluster: str) -> None:
    """What every rank counts at each level, summed over the group, is what the simulator
    charges that level's links (``sync_levels`` with a ring), for every group of 2-5 ranks."""
    c = parse_cluster(cluster)
    per_server, n, nbytes = c.levels[0].workers, c.workers, 1000
    topo = Topology(c, list(range(n)))
    hosts = [f"server{w // per_server}" for w in range(n)]
    for size in range(2, min(n, 5) + 1):
        for ranks in itertools.combinations(range(n), size):
            h = Hierarchy.of(ranks, hosts)
            counted: dict[int, int] = {}
            for r in ranks:
                for lv, b in h.bytes_sent(r, nbytes).items():
                    counted[lv] = counted.get(lv, 0) + b
            model = {lv: moved for lv, _, moved in sync_levels(topo, ranks, Sync(), nbytes, 0.0)}
            assert counted == pytest.approx(model, abs=len(ranks)), ranks


# -- on real processes -------------------------------------------------------------------

def _random(rank: int) -> torch.Tensor:
    return torch.randn(7, generator=torch.Generator().manual_seed(rank))


def _worker(rank: int, world: int, port: int, hosts: str, groups, out) -> None:  # noqa: ANN001
    import os

    os.environ[FAKE_HOSTS_ENV] = hosts
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        comm = Comm(rank, torch.device("cpu"), 60.0)
        for g in groups:  # every rank, every group, same order
            comm.allreduce_groups(g)
        result = {}
        for g in groups:
            if rank not in g:
                continue
            ints = [torch.arange(12, dtype=torch.float32).view(3, 4) * (rank + 1),
                    torch.full((5,), float(10 * rank))]
            rand = [_random(rank)]
            before = dict(comm.stats.allreduce_levels)
            comm.allreduce_mean(ints, g)
            comm.allreduce_mean(rand, g)
            levels = {lv: b - before.get(lv, 0) for lv, b in comm.stats.allreduce_levels.items()
                      if b != before.get(lv, 0)}
            result[g] = (ints, rand[0], levels)
        out.put((rank, result, sorted(comm._groups)))
    finally:
        dist.destroy_process_group()


def _run(hosts: str, groups: list[tuple[int, ...]]) -> tuple[dict, dict]:
    results, made = {}, {}
    for rank, res, grp in run_ranks(_worker, len(hosts.split(",")), hosts, groups):
        results[rank], made[rank] = res, grp
    return results, made


@pytest.mark.multiprocess
def test_hierarchical_average_equals_the_flat_one_and_bytes_follow_the_rings() -> None:
    """Hosts a,a,b,b,b (faked): a group spanning both hosts reduces inside each, all-reduces
    between the leaders and broadcasts; one inside host b alone is today's flat all-reduce."""
    hosts = "a,a,b,b,b"
    spanning, inside = (0, 1, 2, 3, 4), (2, 3, 4)
    results, made = _run(hosts, [spanning, inside])
    # every rank made the same groups: host a, host b, the leaders (0, 2); b's group serves
    # both replica groups
    assert all(m == sorted([(0, 1), (2, 3, 4), (0, 2)]) for m in made.values())
    for g in (spanning, inside):
        mean_ints = [sum(torch.arange(12, dtype=torch.float32).view(3, 4) * (r + 1)
                         for r in g) / len(g),
                     torch.full((5,), 10.0 * sum(g) / len(g))]
        flat_mean = torch.stack([_random(r).double() for r in g]).mean(0)  # in float64
        for r in g:
            ints, rand, levels = results[r][g]
            for got, want in zip(ints, mean_ints, strict=True):
                assert torch.equal(got, want)  # integer sums: exact in any order
            assert torch.allclose(rand.double(), flat_mean, rtol=1e-6, atol=1e-7)
            # bytes per level: each all-reduce (12 + 5 floats, then 7) at 2 (k-1)/k per
            # byte of a ring of k: inside the host always, among hosts on leaders only
            nbytes = (12 + 5) * 4 + 7 * 4
            host = [x for x in g if hosts.split(",")[x] == hosts.split(",")[r]]
            want = {HOST: 2 * (len(host) - 1) / len(host) * nbytes}
            n_hosts = len({hosts.split(",")[x] for x in g})
            if n_hosts > 1 and r == host[0]:
                want[AMONG_HOSTS] = 2 * (n_hosts - 1) / n_hosts * nbytes
            assert levels == pytest.approx(want, abs=2), (g, r)


@pytest.mark.multiprocess
def test_replicated_stage_across_two_hosts_follows_the_reference(monkeypatch) -> None:
    """3-1 on 4 workers, stage 0's replicas on hosts a, a, b: reduce to rank 0, all-reduce
    between ranks 0 and 2, broadcast to rank 1; the weights equal the update rule's
    reference and the bytes per rank follow the rings."""
    monkeypatch.setenv(FAKE_HOSTS_ENV, "a,a,b,b")
    wl, steps = get("vgg16"), 6
    replicas, bounds = (3, 1), ((0, 20), (20, 40))
    splits = wl.default_data("tiny", 0)
    cfg = RunConfig.from_flags(
        system="pipedream", workload="vgg16", scale="tiny", workers=4, threads=1,
        max_steps_per_epoch=steps, epochs=1, timeout_s=60)
    t = PipelineTrainer(cfg, wl, splits, replicas, bounds, torch.device("cpu"), quiet())
    try:
        reports = t.launcher.epoch(0)
    finally:
        t.close()
    model = wl.build("tiny", {**splits.train.meta, "init_seed": 0})
    ref = simulate_pipedream(wl, "tiny", splits, model, bounds,
                             one_f_one_b(Layout(replicas), steps, "stash"), 32, 0)
    for rep in reports:
        want = ref.stage(*bounds[rep.stage]).state_dict()
        for k, v in want.items():
            assert torch.allclose(rep.state[k], v, rtol=1e-4, atol=1e-6), (rep.rank, k)
    nbytes = sum(p.numel() * 4 for p in model.stage(*bounds[0]).parameters())
    updates = steps // 3  # each replica all-reduces once per round of 3 minibatches
    ring2 = 2 * (2 - 1) / 2 * nbytes  # a ring of two: 2 (k-1)/k per byte
    # rank 0: host a's ring and the leaders' ring; rank 1: host a's ring; rank 2: alone on
    # host b, the leaders' ring only; rank 3: stage 1, unreplicated
    want = [2 * ring2, ring2, ring2, 0]
    assert [r.allreduce_bytes for r in reports] == pytest.approx(
        [w * updates for w in want], abs=8)
