"""The planner's ``pipedream-2019`` model against the original optimizer's own answers.

fixtures/original_optimizer.json holds what msr-fiddle/pipedream's
optimizer_graph_hierarchical.py answered on the authors' profiles for the project's clusters
(made by scripts/original_optimizer_fixtures.py, which runs the original unchanged; one run
per PYTHONHASHSEED). The profiles stay in ../shared/pipedream-profiles; without them these
tests skip.

What is compared:
- the bottleneck time (seconds per minibatch) and the data-parallel time, to 1e-9
  relative, against every recorded run of the original;
- on one-level clusters, the original's own configuration (its cuts, named by the nodes of
  each boundary antichain, and replicas) costed with the formulas written out here: it
  must give the same bottleneck, so the original's choice is an optimum of our states and
  costs. Configurations themselves are not compared: the original's differ between runs
  of the same case (equal optima; it keeps the first found in an order that depends on
  object addresses and the hash seed), and so do ours from its.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import pytest

from pipedream_impl.planner.antichain import States, build_states
from pipedream_impl.planner.cluster import Cluster, parse_cluster
from pipedream_impl.planner.optimizer import MAX_TRIPLES_MULTI_LEVEL
from pipedream_impl.planner.plan import plan_profile
from pipedream_impl.profiling.profile import Profile, load_profile

SHARED = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"
FIXTURE = Path(__file__).with_name("fixtures") / "original_optimizer.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
needs_shared = pytest.mark.skipif(not SHARED.exists(),
                                  reason="needs ../shared/pipedream-profiles")


def _id(case: dict) -> str:
    return f"{case['profile']}-{case['cluster']}-{'straight' if case['straight'] else 'rep'}"


@cache
def _profile(name: str) -> Profile:
    return load_profile(SHARED / name / "graph.txt")


@cache
def _states(name: str, multi: bool) -> States:
    return build_states(_profile(name).graph(),
                        max_triples=MAX_TRIPLES_MULTI_LEVEL if multi else None)


def test_fixture_covers_the_clusters_and_both_kinds() -> None:
    assert len(CASES) >= 41
    assert {c["cluster"] for c in CASES} >= {"A:1x4", "A:2x4", "A:4x4", "B:1x8", "B:2x8",
                                            "C:4x1", "16"}
    assert {c["straight"] for c in CASES} == {False, True}


@needs_shared
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_planner_equals_the_original(case: dict) -> None:
    cluster = parse_cluster(case["cluster"])
    assert [[lv.workers, lv.bandwidth] for lv in cluster.levels] == case["levels"]
    plan = plan_profile(_profile(case["profile"]), cluster, "pipedream-2019",
                        case["straight"])
    assert plan.state_method == "antichain"  # the original's states, not a fallback
    for seed, run in case["runs"].items():
        assert plan.predicted["time_per_minibatch_s"] == pytest.approx(
            run["bottleneck_s"], rel=1e-9), f"PYTHONHASHSEED={seed}"
        assert plan.predicted["data_parallel_time_s"] == pytest.approx(
            run["data_parallel_s"], rel=1e-9), f"PYTHONHASHSEED={seed}"
        assert run["states"] == len(_states(case["profile"], len(cluster.levels) > 1))


def _cost_of(config: list[dict], states: States, cluster: Cluster) -> float:
    """Bottleneck of a one-level configuration under the original's formulas: stage i
    with r replicas costs (C + 4 (r-1) P / (B r)) / r, and after the first stage also its
    input 2 out[k] / (B r) and, unless it ends at the last state, its output."""
    (level,) = cluster.levels
    bw = level.bandwidth
    index = {frozenset(a): i for i, a in enumerate(states.antichains)}
    ends = [index[frozenset(s["cut"])] for s in config]
    worst, prev = 0.0, -1
    for end, stage in zip(ends, config, strict=True):
        (r,) = stage["replicas"]
        assert prev < 0 or states.precedes[prev, end]
        c = states.compute_s[end] - (states.compute_s[prev] if prev >= 0 else 0.0)
        p = states.parameter_bytes[end] - (states.parameter_bytes[prev] if prev >= 0 else 0.0)
        t = (c + 4 * (r - 1) * p / (bw * r)) / r
        if prev >= 0:
            t = max(t, 2 * states.output_bytes[prev] / (bw * r))
            if end != len(states) - 1:
                t = max(t, 2 * states.output_bytes[end] / (bw * r))
        worst, prev = max(worst, t), end
    assert ends[-1] == len(states) - 1
    assert sum(s["replicas"][0] for s in config) == level.workers
    return worst


ONE_LEVEL = [c for c in CASES if len(c["levels"]) == 1]


@needs_shared
@pytest.mark.parametrize("case", ONE_LEVEL, ids=_id)
def test_the_originals_configuration_is_an_optimum_of_our_states(case: dict) -> None:
    cluster = parse_cluster(case["cluster"])
    states = _states(case["profile"], False)
    for seed, run in case["runs"].items():
        cost = _cost_of(run["stages"], states, cluster)
        assert math.isclose(cost, run["bottleneck_s"], rel_tol=1e-9), \
            f"PYTHONHASHSEED={seed}"
