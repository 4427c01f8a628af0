"""harness/sim/planner_gap.py: the planner's predicted time per minibatch against the plan's
runtime schedule simulated, checked on plans whose times have a closed form."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.sim import planner_gap
from harness.sim.simulator import SimLayout, SimOptions, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.plan import plan_profile
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

MB = 1e6


def chain(fwd_ms: list[float], act_bytes: list[float], params: list[float]) -> Profile:
    """Layers of forward F and backward 2F milliseconds, in a line."""
    nodes = tuple(Node(f"n{i}", f"Layer{i}", f, 2 * f, (a,), p)
                  for i, (f, a, p) in enumerate(zip(fwd_ms, act_bytes, params, strict=True)))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(len(nodes) - 1))
    return Profile(nodes, edges, batch_size=8)


def test_data_parallelism_overlapped_as_the_planner_charges_it() -> None:
    # one layer, F 10 ms + B 20 ms, 4 MB of weights, two workers at 100 MB/s: the ring
    # all-reduce takes 2 (2-1)/2 x 4 MB / 100 MB/s = 40 ms
    prof = chain([10.0], [1 * MB], [4 * MB])
    cl = Cluster((Level(2, 100 * MB),))
    plan = plan_profile(prof, cl)
    assert plan.config == "2"
    row = planner_gap.gap(prof, cl, plan, SimOptions(minibatches=64))
    # a round of 2 minibatches (one per replica) is F + B + the all-reduce left after the
    # last backward (40 - 20): 50 ms, 25 ms per minibatch, predicted and simulated
    assert row["planned_time_per_minibatch_s"] == pytest.approx(0.025)
    assert row["simulated_time_per_minibatch_s"] == pytest.approx(0.025, rel=1e-6)
    assert row["planner_gap"] == "" and planner_gap.label(row) == "1.00x"
    # blocking after the round: (30 + 40) / 2 = 35 ms
    assert row["blocking_over_planned"] == pytest.approx(35 / 25, rel=1e-6)


def test_a_plan_made_with_overlap_off_is_told_by_its_blocking_twin() -> None:
    prof = chain([10.0], [1 * MB], [4 * MB])
    cl = Cluster((Level(2, 100 * MB),))
    plan = plan_profile(prof, cl, overlap=False)
    assert plan.extra["overlap"] is False
    row = planner_gap.gap(prof, cl, plan, SimOptions(minibatches=64))
    assert row["planned_time_per_minibatch_s"] == pytest.approx(0.035)  # (30 + 40) / 2
    assert row["simulated_over_planned"] == pytest.approx(25 / 35, rel=1e-6)
    assert row["blocking_over_planned"] == pytest.approx(1.0, rel=1e-6)
    assert row["planner_gap"].startswith("faster than planned")
    assert planner_gap.label(row).startswith("0.71x: faster")


def test_a_balanced_straight_pipeline_on_free_links_meets_the_prediction() -> None:
    prof = chain([10.0, 10.0], [1 * MB, 0.5 * MB], [4 * MB, 4 * MB])
    cl = Cluster((Level(2, 1e15),))
    plan = plan_profile(prof, cl, straight=True)
    row = planner_gap.gap(prof, cl, plan, SimOptions(minibatches=256))
    assert row["planned_time_per_minibatch_s"] == pytest.approx(0.030, rel=1e-6)
    assert row["simulated_over_planned"] == pytest.approx(1.0, rel=1e-3)
    assert row["planner_gap"] == "" and planner_gap.label(row) == "1.00x"


def test_transfers_the_default_depths_do_not_cover_are_the_schedules_own() -> None:
    # the cut's 1 MB takes 10 ms each way at 100 MB/s, as long as a forward: the planner
    # takes the slowest of compute (30 ms) and transfers (20 ms), as if they overlapped
    prof = chain([10.0, 10.0], [1 * MB, 0.5 * MB], [0.0, 0.0])
    cl = Cluster((Level(2, 100 * MB),))
    plan = plan_profile(prof, cl, straight=True)
    assert plan.predicted["time_per_minibatch_s"] == pytest.approx(0.030)
    # with the plan's depths (3, 1: ``planner.depths``) the schedule runs as planned
    row = planner_gap.gap(prof, cl, plan, SimOptions(minibatches=256))
    assert plan.depths == (3, 1)
    assert row["simulated_over_planned"] == pytest.approx(1.0, rel=1e-3)
    assert row["planner_gap"] == ""
    # PipeDream's default (2, 1) leaves stage 0 waiting for gradients: one round trip of
    # F1 + 10 + F2 + B2 + 10 + B1 = 80 ms per 2 minibatches, 40 ms each
    shallow = replace(plan, depths=())
    row = planner_gap.gap(prof, cl, shallow, SimOptions(minibatches=256))
    # no replicas, so no all-reduce: overlapping it or not is the same schedule
    assert row["blocking_over_planned"] == pytest.approx(row["simulated_over_planned"])
    assert row["simulated_over_planned"] == pytest.approx(40 / 30, rel=1e-3)
    assert row["planner_gap"].startswith("the schedule itself")


def test_a_faster_profile_simulates_as_the_compute_factor_does() -> None:
    prof = chain([10.0, 4.0, 6.0], [1 * MB, 2 * MB, 0.5 * MB], [4 * MB, 1 * MB, 2 * MB])
    fast = prof.faster(4.0)
    assert [n.forward_ms for n in fast.layers] == [2.5, 1.0, 1.5]
    assert [n.backward_ms for n in fast.layers] == [5.0, 2.0, 3.0]
    assert [n.activations for n in fast.layers] == [n.activations for n in prof.layers]
    assert prof.faster(1.0) is prof
    cl = Cluster((Level(3, 100 * MB),))
    layout = SimLayout([("n0",), ("n1",), ("n2",)], (1, 1, 1))
    a = simulate_system(fast, cl, "pipedream", layout, SimOptions(minibatches=32))
    b = simulate_system(prof, cl, "pipedream", layout,
                        SimOptions(minibatches=32, compute_factor=4.0))
    assert a.time_per_minibatch_s == pytest.approx(b.time_per_minibatch_s, rel=1e-9)


def test_the_summary_counts_rows_within_the_tolerance() -> None:
    rows = [{"planner_gap": ""}, {"planner_gap": "faster"}, {"planner_gap": "the schedule"}]
    assert "1 of 3 rows" in planner_gap.summary(rows, "X")
