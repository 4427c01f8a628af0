"""harness/sim/simulator.py (and reproduce.py) against closed-form times, byte counts and memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sim.costs import MachineModel
from harness.sim.simulator import (
    SimLayout,
    SimOptions,
    layout_for,
    simulate_system,
)
from pipedream_impl.planner.cluster import Cluster, Level, parse_cluster
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile, load_profile

PROFILES = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"
MB = 1e6


def chain(
    fwd_ms: list[float], act_bytes: list[float], params: list[float], batch: int = 8
) -> Profile:
    nodes = tuple(
        Node(f"n{i}", f"Layer{i}", f, 2 * f, (a,), p)
        for i, (f, a, p) in enumerate(zip(fwd_ms, act_bytes, params, strict=True))
    )
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(len(nodes) - 1))
    return Profile(nodes, edges, batch_size=batch)


# two stages of F = 10 ms, B = 20 ms; the cut carries 1 MB; 4 MB of weights per stage
PROF = chain([10.0, 10.0], [1 * MB, 0.5 * MB], [4 * MB, 4 * MB])
GROUPS = [("n0",), ("n1",)]
BW = 100 * MB  # bytes/s: the 1 MB activation takes 10 ms
FLAT2 = Cluster((Level(2, BW),))


def test_model_parallelism_is_the_sum_of_all_work_and_both_transfers() -> None:
    r = simulate_system(PROF, FLAT2, "mp", SimLayout(GROUPS, (1, 1)), SimOptions(minibatches=10))
    # per minibatch: F0 + send + F1 + B1 + send back + B0 = 10 + 10 + 10 + 20 + 10 + 20
    assert r.time_per_minibatch_s == pytest.approx(0.080)
    assert r.bytes_per_level == {0: pytest.approx(10 * 2 * MB)}
    assert r.bytes_per_sample == pytest.approx(2 * MB / 8)


def test_pipedream_reaches_the_slowest_stage_in_steady_state() -> None:
    n = 200
    fast = Cluster((Level(2, 1e15),))  # transfers free
    r = simulate_system(
        PROF, fast, "pipedream", SimLayout(GROUPS, (1, 1)), SimOptions(minibatches=n)
    )
    # 1F1B keeps both stages busy: F + B = 30 ms per minibatch each, plus the fill (F0)
    # and the drain (B0)
    assert r.total_s == pytest.approx(n * 0.030 + 0.010 + 0.020, rel=1e-3)
    assert r.utilisation[1] > 0.99
    # stage 0 holds two minibatches in flight (NOAM = 2), each seeing an update before its
    # backward: two stashed snapshots (the older version and a copy of the current one)
    # besides the live weights, two minibatches of activations
    m0 = r.peak_memory[0]
    assert m0["stashed_weights"] == 2 * 4 * MB and m0["activations"] == 2 * 1 * MB
    assert r.peak_memory[1]["stashed_weights"] == 0
    # with 10 ms transfers each way, NOAM = 2 no longer hides the round trip: stage 0's
    # period is (its F + B + the round trip F1 + B1 + 2 transfers) / 2 minibatches
    slow = simulate_system(
        PROF, FLAT2, "pipedream", SimLayout(GROUPS, (1, 1)), SimOptions(minibatches=n)
    )
    assert slow.time_per_minibatch_s == pytest.approx((0.030 + 0.030 + 0.020) / 2, rel=0.01)


def test_measured_action_costs_and_rendezvous_transfers() -> None:
    """A MachineModel replaces the profile's compute by measured per-action costs (update
    included); with measured transfers that move only once the receive is posted
    (rendezvous), each stage also waits one transfer per minibatch, and the sender pays
    its own time in the send call."""
    n = 200
    costs = {0: {"F": 0.010, "B": 0.020, "U": 0.002}, 1: {"F": 0.012, "B": 0.022, "U": 0.004}}
    fast = Cluster((Level(2, 1e15),))
    free = simulate_system(
        PROF,
        fast,
        "pipedream",
        SimLayout(GROUPS, (1, 1)),
        SimOptions(minibatches=n, machine=MachineModel(action_s=costs)),
    )
    # 1F1B in steady state: the slowest stage's F + B + U per minibatch
    assert free.time_per_minibatch_s == pytest.approx(0.038, rel=0.01)
    moves = {(0, "F"): 0.001, (1, "B"): 0.001}
    eager = simulate_system(
        PROF,
        fast,
        "pipedream",
        SimLayout(GROUPS, (1, 1)),
        SimOptions(minibatches=n, machine=MachineModel(action_s=costs, transfer_s=moves)),
    )
    assert eager.time_per_minibatch_s == pytest.approx(0.038, rel=0.01)  # hidden by NOAM
    # stage 1 posts its receive when it is done with the previous minibatch, then waits
    # 1 ms for the activations: 38 + 1 ms
    rdv = simulate_system(
        PROF,
        fast,
        "pipedream",
        SimLayout(GROUPS, (1, 1)),
        SimOptions(
            minibatches=n, machine=MachineModel(action_s=costs, transfer_s=moves, rendezvous=True)
        ),
    )
    assert rdv.time_per_minibatch_s == pytest.approx(0.039, rel=0.01)
    own = simulate_system(
        PROF,
        fast,
        "pipedream",
        SimLayout(GROUPS, (1, 1)),
        SimOptions(
            minibatches=n,
            machine=MachineModel(
                action_s=costs,
                transfer_s=moves,
                rendezvous=True,
                send_s={(0, "F"): 0.0, (1, "B"): 0.002},
            ),
        ),
    )
    assert own.time_per_minibatch_s == pytest.approx(0.041, rel=0.01)


def test_more_workers_than_cores_are_bounded_by_the_cpu_capacity() -> None:
    """Four ranks on two cores: 1F1B keeps all four busy, so it takes their summed work
    over two cores; model parallelism keeps one busy at a time and is not slowed."""
    n = 200
    prof = chain([10.0] * 4, [0.0] * 4, [0.0] * 4)
    groups = [(f"n{i}",) for i in range(4)]
    costs = {s: {"F": 0.010, "B": 0.020} for s in range(4)}
    flat4 = Cluster((Level(4, 1e15),))
    shared = MachineModel(action_s=costs, cores=2)
    pd = simulate_system(
        prof,
        flat4,
        "pipedream",
        SimLayout(groups, (1,) * 4),
        SimOptions(minibatches=n, machine=shared),
    )
    assert pd.time_per_minibatch_s == pytest.approx(4 * 0.030 / 2, rel=0.01)
    mp = simulate_system(
        prof, flat4, "mp", SimLayout(groups, (1,) * 4), SimOptions(minibatches=n, machine=shared)
    )
    alone = simulate_system(
        prof,
        flat4,
        "mp",
        SimLayout(groups, (1,) * 4),
        SimOptions(minibatches=n, machine=MachineModel(action_s=costs)),
    )
    assert mp.time_per_minibatch_s == pytest.approx(alone.time_per_minibatch_s)
    assert mp.time_per_minibatch_s == pytest.approx(4 * 0.030)


def test_a_measured_all_reduce_replaces_the_ring_formula() -> None:
    prof = chain([10.0, 10.0], [0.0, 0.0], [40 * MB, 40 * MB])
    four = Cluster((Level(4, BW),))
    dp_layout = layout_for(prof, four, "dp")
    model = MachineModel(action_s={0: {"F": 0.020, "B": 0.040, "U": 0.005}},
                         allreduce_s={0: 0.083})
    r = simulate_system(
        prof, four, "dp", dp_layout, SimOptions(minibatches=40, dp_overlap=False, machine=model)
    )
    # one round (4 minibatches): F + B + U + the measured 83 ms; bytes by the ring formula
    assert r.time_per_minibatch_s == pytest.approx((0.065 + 0.083) / 4)
    assert r.bytes_per_level == {0: pytest.approx(10 * 2 * 3 / 4 * 80 * MB * 4)}


@pytest.mark.parametrize("cpu_s", [None, 0.004, 0.020])
def test_shared_cores_charge_the_allreduce_cpu_time_not_its_elapsed(cpu_s) -> None:
    """4 ranks on 2 cores: data parallelism's ranks compute together, each at half speed,
    then all-reduce; and a run takes at least all ranks' busy time over the cores, where an
    all-reduce counts by the CPU it takes (its elapsed time where that is not measured)."""
    prof = chain([10.0, 10.0], [0.0, 0.0], [MB, MB])
    four = Cluster((Level(4, BW),))
    model = MachineModel(action_s={0: {"F": 0.020, "B": 0.040, "U": 0.005}},
                         allreduce_s={0: 0.083},
                         allreduce_cpu_s=None if cpu_s is None else {0: cpu_s}, cores=2)
    r = simulate_system(prof, four, "dp", layout_for(prof, four, "dp"),
                        SimOptions(minibatches=40, dp_overlap=False, machine=model))
    schedule = (0.065 * 4 / 2 + 0.083) / 4  # a round: 4 minibatches, one a rank
    busy = 4 * (0.065 + (0.083 if cpu_s is None else cpu_s)) / 2 / 4  # per minibatch
    assert r.time_per_minibatch_s == pytest.approx(max(schedule, busy), rel=1e-3)


def test_gpipe_bubble_follows_the_flush_formula() -> None:
    m, n = 4, 20
    prof = chain([10.0, 10.0], [0.0, 0.0], [0.0, 0.0])  # no transfer time, no weights
    r = simulate_system(
        prof, FLAT2, "gpipe", SimLayout(GROUPS, (1, 1)), SimOptions(minibatches=n, microbatches=m)
    )
    f, b = 10.0 / m, 20.0 / m  # ms per microbatch and stage
    # per minibatch: (M + S - 1) forward slots then (M + S - 1) backward slots (S = 2)
    assert r.time_per_minibatch_s * 1e3 == pytest.approx((m + 1) * (f + b))


def test_data_parallel_exposes_only_the_all_reduce_the_backward_does_not_hide() -> None:
    prof = chain([10.0, 10.0], [0.0, 0.0], [40 * MB, 40 * MB])
    four = Cluster((Level(4, BW),))
    dp_layout = layout_for(prof, four, "dp")
    ring = 2 * 3 / 4 * 80 * MB / BW  # 1.2 s per all-reduce of 80 MB over 4 workers
    compute = 0.060  # F + B of the whole model
    over = simulate_system(prof, four, "dp", dp_layout, SimOptions(minibatches=40))
    flat = simulate_system(
        prof, four, "dp", dp_layout, SimOptions(minibatches=40, dp_overlap=False)
    )
    # 4 minibatches per round, one per replica
    assert flat.time_per_minibatch_s == pytest.approx((compute + ring) / 4)
    assert over.time_per_minibatch_s == pytest.approx((compute + ring - 0.040) / 4)
    assert flat.bytes_per_level[0] == pytest.approx(10 * 4 * 2 * 3 / 4 * 80 * MB)


def test_a_replicated_pipeline_stage_hides_its_all_reduce_behind_its_last_backward() -> None:
    """Our runtime all-reduces a replicated stage's gradient buckets during the round's
    last backward (``runtime.grad_buckets``): after the last replica reaches A, only
    max(0, all-reduce - that backward) is left; ``pipeline_overlap=False`` charges it all."""
    three = Cluster((Level(3, BW),))
    ring = 2 * 1 / 2 * 4 * MB / BW  # 40 ms: 4 MB of stage 0's weights between 2 replicas
    backward = 0.020  # B of stage 0 (2 x its 10 ms forward)
    layout = SimLayout(GROUPS, (2, 1))

    def exposed(overlap: bool) -> float:
        r = simulate_system(PROF, three, "pipedream", layout,
                            SimOptions(minibatches=20, pipeline_overlap=overlap))
        spans = [e - s for rank in (0, 1) for s, e, a in r.timeline[rank] if a.kind == "A"]
        assert len(spans) == 20  # one per round of 2 on each of the 2 replicas
        return min(spans)  # the last replica to arrive waits for nobody

    assert exposed(False) == pytest.approx(ring)
    assert exposed(True) == pytest.approx(ring - backward)


def test_transfers_use_the_level_the_two_workers_share() -> None:
    prof = chain([1.0, 1.0], [1 * MB, 0.0], [0.0, 0.0])
    two_servers = Cluster((Level(1, 1e12), Level(2, BW)))  # one worker per server
    same = simulate_system(
        prof,
        Cluster((Level(2, 1e12), Level(1, BW))),
        "mp",
        SimLayout(GROUPS, (1, 1)),
        SimOptions(minibatches=4),
    )
    apart = simulate_system(
        prof, two_servers, "mp", SimLayout(GROUPS, (1, 1)), SimOptions(minibatches=4)
    )
    assert apart.time_per_minibatch_s - same.time_per_minibatch_s == pytest.approx(0.020, rel=1e-3)
    assert set(apart.bytes_per_level) == {1}


@pytest.mark.skipif(
    not (PROFILES / "vgg16" / "graph.txt").exists(), reason="needs ../shared/pipedream-profiles"
)
def test_vgg16_on_cluster_a_simulation_agrees_with_the_planner(tmp_path) -> None:
    """The planner's cost model and the simulator are two implementations of the same
    cluster model (the planner: a formula per stage; the simulator: the runtime's
    schedule, event by event): on the paper's VGG-16 profile they must agree, with the
    all-reduce overlapped with the backward (the planner's default, the runtime's gradient
    buckets, DDP) and blocking (the paper's model, ``overlap=False``), each against data
    parallelism run the same way: to 1% on its 12-2-1-1 plan (1F1B-RR's per-stage warm-up
    loses no time there; NOAM's lost 4%)."""
    from harness.sim.simulator import gantt
    from pipedream_impl.planner.plan import plan_profile

    prof = load_profile(PROFILES / "vgg16" / "graph.txt")
    cl = parse_cluster("A:4x4")
    dp_layout = layout_for(prof, cl, "dp")
    for overlap in (True, False):
        plan = plan_profile(prof, cl, overlap=overlap)
        assert plan.config == "12-2-1-1"
        lay = layout_for(prof, cl, "pipedream", plan=plan)
        pd = simulate_system(prof, cl, "pipedream", lay,
                             SimOptions(pipeline_overlap=overlap))
        dp = simulate_system(prof, cl, "dp", dp_layout, SimOptions(dp_overlap=overlap))
        speedup = pd.throughput_samples_s / dp.throughput_samples_s
        assert speedup == pytest.approx(plan.predicted["speedup_vs_data_parallel"], rel=0.01)
        assert pd.time_per_minibatch_s == pytest.approx(
            plan.predicted["time_per_minibatch_s"], rel=0.01)
    # hierarchical ring, as the time model: each rank sends 2 (4-1)/4 x the weights inside
    # its server, and its server's one NIC 2 (4-1)/4 x the weights among the 4 servers for
    # its 4 GPUs, per minibatch: 2 (16-1)/16 per rank, what a flat ring of 16 moves
    weights = sum(n.parameter_bytes for n in prof.layers)
    assert dp.bytes_per_sample == pytest.approx((1.5 + 1.5 / 4) * weights / dp.batch_size)
    assert dp.bytes_per_sample == pytest.approx(2 * 15 / 16 * weights / dp.batch_size)
    assert pd.bytes_per_sample < 0.3 * dp.bytes_per_sample
    gantt(pd, str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").stat().st_size > 10_000


def _bottleneck(nodes, replicas, cl, topo, bounds) -> float:  # noqa: ANN001
    """The slowest stage of a split, written out directly (the reference): (compute + ring
    all-reduce) / r, and 2 x the activations into and out of the stage / (bandwidth x r)."""
    worst, off = 0.0, 0
    for i, ((a, b), r) in enumerate(zip(bounds, replicas, strict=True)):
        c = sum(x.forward_ms + x.backward_ms for x in nodes[a:b]) / 1e3
        p = sum(x.parameter_bytes for x in nodes[a:b])
        ar = sum(
            2 * (k - 1) / k * p / cl.levels[lv].bandwidth
            for lv, k in topo.ring_levels(tuple(range(off, off + r)))
        )
        t = (c + ar) / r
        if i:
            t = max(t, 2 * nodes[a - 1].activation_bytes / cl.levels[0].bandwidth / r)
        if i < len(bounds) - 1:
            t = max(t, 2 * nodes[b - 1].activation_bytes / cl.levels[0].bandwidth / r)
        worst, off = max(worst, t), off + r
    return worst


def _bytes(nodes, replicas, bounds) -> float:  # noqa: ANN001
    """Bytes per minibatch of a split on one flat level: activations and gradients across
    every cut, plus each replicated stage's ring (r ranks x 2 (r-1)/r x its weights, once
    per r minibatches)."""
    total = 0.0
    for i, ((a, b), r) in enumerate(zip(bounds, replicas, strict=True)):
        if i:
            total += 2 * nodes[a - 1].activation_bytes
        total += 2 * (r - 1) / r * sum(x.parameter_bytes for x in nodes[a:b])
    return total


def test_config_split_is_fastest_then_fewest_bytes_by_brute_force() -> None:
    import itertools
    import random

    from harness.sim.costs import Topology
    from harness.sim.simulator import NEAR_TIE, config_groups

    rng = random.Random(3)
    for trial in range(30):
        n = rng.randint(4, 8)
        prof = chain(
            [rng.choice([1.0, 2.0, 4.0]) for _ in range(n)],  # equal times: many ties
            [rng.uniform(0.1, 3) * MB for _ in range(n)],
            [rng.uniform(0, 50) * MB for _ in range(n)],
        )
        replicas = rng.choice([(1, 1), (2, 1), (1, 2, 1), (3, 1), (2, 1, 1), (1, 1, 1)])
        cl = Cluster((Level(sum(replicas), rng.choice([BW, 10 * BW, 1000 * BW])),))
        topo = Topology(cl, list(range(sum(replicas))))
        nodes = list(prof.layers)
        k = len(replicas)
        splits = [list(zip((0, *cuts), (*cuts, n), strict=True))
                  for cuts in itertools.combinations(range(1, n), k - 1)]
        best = min(_bottleneck(nodes, replicas, cl, topo, b) for b in splits)
        tied = [b for b in splits
                if _bottleneck(nodes, replicas, cl, topo, b) <= best * (1 + NEAR_TIE)]
        bounds, a = [], 0
        for g in config_groups(prof, replicas, cl):
            bounds.append((a, a + len(g)))
            a += len(g)
        assert _bottleneck(nodes, replicas, cl, topo, bounds) <= best * (1 + NEAR_TIE) + 1e-12
        assert _bytes(nodes, replicas, bounds) == pytest.approx(
            min(_bytes(nodes, replicas, b) for b in tied)), trial


def test_input_nodes_cost_no_compute_in_the_simulator_as_in_the_planner() -> None:
    from harness.sim.costs import stage_costs
    from pipedream_impl.planner.antichain import input_nodes, prepare
    from pipedream_impl.planner.plan import plan_profile

    nodes = (Node("in", "Input", 50.0, 0.0, (1 * MB,), 0.0),
             Node("n0", "Linear", 10.0, 20.0, (1 * MB,), 4 * MB),
             Node("n1", "Linear", 10.0, 20.0, (1 * MB,), 4 * MB))
    prof = Profile(nodes, (("in", "n0"), ("n0", "n1")), batch_size=8)
    g = prof.graph()
    assert input_nodes(g) == ["in"]
    assert "in" not in prepare(g).nodes  # the planner drops it ...
    one = stage_costs(prof, [("n0", "n1")])[0]  # ... the simulator charges it nothing
    assert (one.forward_s, one.backward_s) == pytest.approx((0.020, 0.040))
    # a plan leaves it out; the simulated stage still costs what the planner predicts
    plan = plan_profile(prof, Cluster((Level(1, BW),)))
    r = simulate_system(prof, Cluster((Level(1, BW),)), "pipedream",
                        layout_for(prof, Cluster((Level(1, BW),)), "pipedream", plan=plan),
                        SimOptions(minibatches=8))
    assert r.time_per_minibatch_s == pytest.approx(0.060)
    # data parallelism on one worker too: a non-input source is charged as before
    other = Profile((Node("x", "Embedding", 50.0, 0.0, (1 * MB,), 0.0), *nodes[1:]),
                    (("x", "n0"), ("n0", "n1")), batch_size=8)
    assert stage_costs(other, [("x", "n0", "n1")])[0].forward_s == pytest.approx(0.070)


@pytest.mark.cli
def test_simulate_cli_rejects_an_unknown_system(tmp_path: Path) -> None:
    import subprocess
    import sys

    prof = chain([1.0, 1.0], [1.0, 1.0], [1.0, 1.0])
    path = tmp_path / "profile.json"
    path.write_text(prof.to_json())

    def simulate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness.cli", "simulate", "--profile",
                               str(path), "--cluster", "2", *args],
                              capture_output=True, text=True, timeout=120)

    r = simulate("--system", "fsdp")
    ok = simulate("--system", "mp", "--config", "1-1")
    assert r.returncode == 2 and "unknown simulated system 'fsdp'" in r.stderr
    assert ok.returncode == 0 and "time per minibatch" in ok.stdout
    # every data-parallel system of the registry simulates as data parallelism
    dp = [simulate("--system", name).stdout.partition("time per minibatch")[2]
          for name in ("dp", "ddp", "horovod")]
    assert dp[0] == dp[1] == dp[2] and "samples/s" in dp[0]
