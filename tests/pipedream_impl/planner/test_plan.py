"""pipedream_impl/planner/plan.py and cluster.py: plan JSON, ranks, configs, cluster parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import UserInputError
from pipedream_impl.planner.antichain import build_states
from pipedream_impl.planner.cluster import parse_bandwidth, parse_cluster
from pipedream_impl.planner.optimizer import solve
from pipedream_impl.planner.plan import Plan, build_plan, load_plan, plan_profile
from pipedream_impl.profiling.graph import Graph, Node
from pipedream_impl.profiling.profile import Profile, load_profile

SHARED = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"


def test_cluster_presets_and_shapes() -> None:
    a = parse_cluster("A:4x4")
    assert [lv.workers for lv in a.levels] == [4, 4] and a.workers == 16
    assert a.levels[0].bandwidth == 15.75e9 and a.levels[1].bandwidth == 1.25e9
    c = parse_cluster("C:4x1")
    assert len(c.levels) == 1 and c.levels[0].workers == 4 and c.levels[0].bandwidth == 5e9
    flat = parse_cluster("16", "10Gbps")
    assert len(flat.levels) == 1 and flat.levels[0].bandwidth == 1.25e9
    custom = parse_cluster("2x8", "100GB/s,25Gb/s")
    assert custom.levels[1].bandwidth == 25e9 / 8 and custom.levels[0].workers == 8
    assert parse_bandwidth("1.5e9") == 1.5e9 and parse_bandwidth("500MB/s") == 5e8
    for bad in ("Z:4x4", "4y4", "x"):
        with pytest.raises(UserInputError):
            parse_cluster(bad)
    with pytest.raises(UserInputError, match="bandwidth"):
        parse_bandwidth("fast")


def _plan(cluster: str) -> Plan:
    g = Graph.chain([Node(f"l{i}", "Op", t, t, (1e6,), 1e7)
                     for i, t in enumerate([5, 1, 1, 1, 1, 1, 1, 9])])
    return build_plan(solve(build_states(g), parse_cluster(cluster)), batch_size=8)


def test_plan_json_round_trip_and_keys() -> None:
    plan = _plan("A:2x4")
    d = json.loads(plan.to_json())
    assert d["config"] == plan.config and d["noam"] == plan.noam
    for key in ("time_per_minibatch_s", "speedup_vs_one_worker", "speedup_vs_data_parallel",
                "bytes_per_sample", "bytes_per_sample_data_parallel"):
        assert key in d["predicted"]
    assert all("layers" in s and "replicas" in s for s in d["stages"])
    again = Plan.from_json(plan.to_json())
    assert again == plan


@pytest.mark.parametrize("cluster", ["4", "A:2x4", "B:2x8", "A:4x4"])
def test_every_rank_used_once_and_stages_cover_the_model(cluster: str) -> None:
    plan = _plan(cluster)
    ranks = sorted(r for s in plan.stages for r in s.ranks)
    assert ranks == list(range(plan.workers))
    assert plan.stages[0].layers[0] == 0 and plan.stages[-1].layers[1] == 8
    assert plan.noam == -(-plan.workers // plan.stages[0].replicas)
    assert sum(s.replicas for s in plan.stages) == plan.workers


def test_plan_rejects_overlapping_ranks() -> None:
    plan = _plan("4")
    with pytest.raises(ValueError, match="rank"):
        Plan(plan.stages + plan.stages[:1], plan.workers, plan.predicted)


@pytest.mark.skipif(not SHARED.exists(), reason="needs ../shared/pipedream-profiles")
@pytest.mark.parametrize("model", sorted(p.name for p in SHARED.iterdir() if p.is_dir())
                         if SHARED.exists() else [])
def test_every_shared_profile_plans_on_16_workers_in_two_levels(model: str) -> None:
    prof = load_profile(SHARED / model / "graph.txt")
    plan = plan_profile(prof, parse_cluster("A:4x4"))
    assert sorted(r for s in plan.stages for r in s.ranks) == list(range(16))
    assert plan.predicted["speedup_vs_data_parallel"] >= 1 - 1e-9  # DP is a candidate
    assert plan.predicted["speedup_vs_one_worker"] <= 16 + 1e-9


def test_infeasible_memory_limit_is_a_clear_error() -> None:
    g = Graph.chain([Node(f"l{i}", "Op", 1, 1, (1e9,), 1e9) for i in range(3)])
    with pytest.raises(UserInputError, match="memory limit"):
        plan_profile(Profile.from_graph(g), parse_cluster("2x2"), memory_limit=1.0,
                     straight=True)


def test_a_limit_no_partition_fits_is_a_clear_error() -> None:
    """Each layer fits alone (1 GB of weights under 3.5 GB) but no straight pipeline on
    4 workers does once the stashed versions count."""
    g = Graph.chain([Node(f"l{i}", "Op", 1, 1, (1e9,), 1e9) for i in range(4)])
    with pytest.raises(UserInputError, match="every partition exceeds the memory limit"):
        plan_profile(Profile.from_graph(g), parse_cluster("4"), memory_limit=3.5e9,
                     straight=True)


def test_load_plan_round_trips_and_names_the_bad_key(tmp_path: Path) -> None:
    plan = _plan("A:2x4")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert load_plan(str(path)) == plan
    d = json.loads(plan.to_json())
    d["stages"][1]["ranks"][0] = 99
    path.write_text(json.dumps(d))
    with pytest.raises(UserInputError, match=r"plan .*plan.json: rank 99 is not below"):
        load_plan(str(path))


@pytest.mark.parametrize("spec, needle", [("0x4", "has no workers"), ("4x0", "has no workers"),
                                          ("40000", "too large")])
def test_clusters_without_workers_or_too_large_are_refused(spec: str, needle: str) -> None:
    with pytest.raises(UserInputError, match=needle):
        parse_cluster(spec)


def test_a_level_the_planner_cannot_finish_is_refused_before_solving() -> None:
    g = Graph.chain([Node(f"l{i}", "Op", 1, 1, (1e6,), 1e6) for i in range(3)])
    with pytest.raises(UserInputError, match="cannot plan 2000 workers in one level"):
        plan_profile(Profile.from_graph(g), parse_cluster("2000"))
